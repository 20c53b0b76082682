"""Loading a policy: a local Hugging Face folder, or the name of one shipped with flywheel."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

log = logging.getLogger(__name__)

BUILTIN_POLICIES = {
    "tiny-countdown": ("policies", "tiny-countdown"),
    "tiny-countdown-h3": ("policies", "tiny-countdown-h3"),  # head size 32, for vLLM on CPU
}
"""Policies shipped inside the package (flywheel/assets/...), usable by name."""


def resolve_policy(policy: str) -> Path:
    """Map `policy` (a folder path or a built-in name) to an existing model folder.

    Nothing is downloaded: flywheel trains local folders only.
    """
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
            f"({', '.join(sorted(BUILTIN_POLICIES))}); pass the path of a Hugging Face model folder"
        )
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"--model.policy={policy!r}: {path} holds no config.json, so it is not a model folder")
    return path


def load_policy(policy: str, dtype: str = "float32"):
    """Load (model, tokenizer) from `policy`; the model is in train mode on CPU."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_policy(policy)
    torch_dtype = getattr(torch, dtype)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).train()  # from_pretrained returns eval mode
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model.config.vocab_size < len(tokenizer):
        raise ValueError(
            f"{path}: the model's vocab_size {model.config.vocab_size} is smaller than the tokenizer's "
            f"{len(tokenizer)} tokens; the generator could sample ids the tokenizer cannot decode"
        )
    log.info("loaded policy %s (%.2fM parameters, %s)", path, sum(p.numel() for p in model.parameters()) / 1e6, dtype)
    return model, tokenizer
