"""A policy given on the command line (`fit --model.policy`, `eval --policy`), checked before
transformers loads it: a folder missing its tokenizer or weights, or with a broken config.json,
and an unknown dtype, each failed with a transformers or torch traceback (issue 37). Here each
is one line naming the flag, the folder and the missing or broken file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DTYPES = ("float32", "bfloat16", "float16", "float64")
"""Parameter dtypes a policy can be loaded in."""

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "vocab.txt")


def check_dtype(dtype: str, flag: str) -> None:
    from flywheel.run.errors import PreflightError

    if dtype not in DTYPES:
        raise PreflightError(f"{flag}={dtype}: not a parameter dtype; choose one of {', '.join(DTYPES)}")


def policy_folder_problem(folder: Path) -> str | None:
    """What makes `folder` not loadable as a causal LM with its tokenizer, or None."""
    config = folder / "config.json"
    try:
        parsed = json.loads(config.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return "it holds no config.json, so it is not a model folder"
    except UnicodeDecodeError:
        return f"{config.name} is not text"
    except json.JSONDecodeError as err:
        return f"{config.name} is not valid JSON (line {err.lineno}: {err.msg})"
    if not isinstance(parsed, dict) or not (parsed.get("model_type") or parsed.get("architectures")):
        return f"{config.name} names no model_type, so the architecture is unknown"
    if not any((folder / name).is_file() for name in WEIGHT_FILES) and not any(folder.glob("*.safetensors")):
        return f"it holds no weights ({' or '.join(WEIGHT_FILES[::2])})"
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return f"it holds no tokenizer ({' or '.join(TOKENIZER_FILES[:2])}, with tokenizer_config.json)"
    for weights in sorted(folder.glob("*.safetensors")):
        if (problem := safetensors_problem(weights)) is not None:
            return f"{weights.name} {problem}; copy or download the folder again"
    return None


def safetensors_problem(path: Path) -> str | None:
    """What is wrong with a .safetensors file, read from its header alone (8 bytes of length,
    then the JSON of every tensor's byte range): empty, truncated, longer than its tensors, or
    not a safetensors file. None when the tensors' bytes are all there. (The library's own
    error, "incomplete metadata, file not fully covered", came as a traceback, issue 49.)"""
    size = path.stat().st_size
    with path.open("rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            return f"is empty or cut short ({size} bytes): truncated"
        length = int.from_bytes(head, "little")
        if length > size - 8:
            return (f"is truncated or not a safetensors file: its header claims {length:,} bytes, the file has "
                    f"{size:,}")
        try:
            header = json.loads(handle.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return "is damaged: its header is not valid JSON"
    try:
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (TypeError, KeyError, IndexError, ValueError, AttributeError):
        return "is damaged: its header does not list tensors with byte ranges"
    expected = 8 + length + end
    if size < expected:
        return f"is truncated: {size:,} of its {expected:,} bytes are there"
    if size > expected:
        return f"is damaged: {size - expected:,} bytes more than its tensors take"
    return None


def load_checked_policy(policy: str, dtype: str, flag: str, dtype_flag: str) -> tuple[Any, Any]:
    """flywheel.policies.load.load_policy, after checking the dtype and the folder; any problem is a
    PreflightError naming `flag` (or `dtype_flag`), the folder and the file."""
    from flywheel.policies.load import load_policy, resolve_policy
    from flywheel.run.errors import PreflightError

    check_dtype(dtype, dtype_flag)
    try:
        folder = Path(resolve_policy(policy)).resolve()
    except FileNotFoundError as err:
        raise PreflightError(str(err).replace("--model.policy", flag)) from None
    problem = policy_folder_problem(folder)
    if problem is not None:
        raise PreflightError(f"{flag}={policy}: {folder} cannot be loaded: {problem}")
    try:
        return load_policy(policy, dtype)
    except (OSError, ValueError) as err:
        detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise PreflightError(f"{flag}={policy}: {folder} cannot be loaded ({type(err).__name__}: {detail})") from None


def chat_template_warning(task: Any, tokenizer: Any, policy: str, task_flag: str) -> str | None:
    """The warning for a task that formats its prompts with the tokenizer's chat template
    (`chat_template=True`, MathTask's default) given a tokenizer without one:
    its prompts are then plain text, which an instruct model whose folder lost its template
    answers badly without a word (issue 49). flywheel's built-in tiny policies were trained on
    plain prompts: no warning. None when nothing is wrong."""
    from flywheel.policies.load import BUILTIN_POLICIES, resolve_policy
    from flywheel.assets import asset_path

    if not task.chat_template or getattr(tokenizer, "chat_template", None):
        return None
    try:
        folder = resolve_policy(policy).resolve()
    except FileNotFoundError:
        return None
    if any(folder == asset_path(*where).resolve() for where in BUILTIN_POLICIES.values()):
        return None
    return (f"{type(task).__name__} asks for the tokenizer's chat template ({task_flag}=true), but {folder} has "
            "none (no chat_template in tokenizer_config.json or chat_template.jinja): its prompts are plain text. "
            f"An instruct model needs its template back; for a base model say so with {task_flag}=false")
