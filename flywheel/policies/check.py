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
    from flywheel.run.preflight import PreflightError

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
    return None


def load_checked_policy(policy: str, dtype: str, flag: str, dtype_flag: str) -> tuple[Any, Any]:
    """flywheel.policies.load.load_policy, after checking the dtype and the folder; any problem is a
    PreflightError naming `flag` (or `dtype_flag`), the folder and the file."""
    from flywheel.policies.load import load_policy, resolve_policy
    from flywheel.run.preflight import PreflightError

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
