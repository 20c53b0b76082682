"""The weights a sidecar pushes: gathered (DeepSpeed ZeRO-3 too), written as safetensors into
a staging folder only the trainer's user can write, which the servers load from.

Whoever can write the staging folder chooses the weights the servers load at the next sync or
restart, so the folder is created 0700, and a folder the user names (`staging_dir`) that
others can write is refused.
"""

from __future__ import annotations

import os
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from flywheel.generation.vllm.client import SidecarError

STAGING_SETTING = "--data.generator.init_args.staging_dir"


def staging_folder(path: Path | None) -> Path:
    """The staging folder: a fresh private temporary one (None), or `path` created 0700, or
    `path` as it is when nobody but its owner can write it (else SidecarError)."""
    if path is None:
        return Path(tempfile.mkdtemp(prefix="flywheel-vllm-weights-"))  # 0700
    if not path.exists():
        path.mkdir(mode=0o700, parents=True)
        os.chmod(path, 0o700)  # mkdir's mode passes through the umask; this one must not
    check_private(path)
    return path


def check_private(path: Path) -> None:
    """Raise SidecarError, naming the setting and the fix, unless `path` is a folder of this
    user that nobody else can write."""
    info = path.stat()
    if not stat.S_ISDIR(info.st_mode):
        raise SidecarError(f"{STAGING_SETTING}={path} is not a folder; name a folder (it is created 0700 if missing)")
    if info.st_uid != os.getuid():
        raise SidecarError(f"{STAGING_SETTING}={path} belongs to another user, who could swap the weights the vLLM "
                           "servers load; name a folder of your own (one that does not exist yet is created 0700)")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise SidecarError(
            f"{STAGING_SETTING}={path} is writable by other users (mode {stat.filemode(info.st_mode)}): they could "
            f"swap the weights the vLLM servers load. Run `chmod go-w {path}` or name a folder that does not exist "
            "yet (it is created 0700)"
        )


def write_weights(folder: Path, model: Any, state: dict[str, torch.Tensor], tokenizer: Any, adapter: bool,
                  lora: bool) -> None:
    """Write the pushed weights into `folder`, atomically: the model folder a server launches
    from (config, tokenizer, weights; with LoRA the frozen base), or the LoRA adapter folder
    (`folder/adapter`)."""
    from safetensors.torch import save_file

    if adapter:
        target = folder / "adapter" / "adapter_model.safetensors"
        target.parent.mkdir(mode=0o700, exist_ok=True)
        model.peft_config["default"].save_pretrained(str(target.parent))
    else:
        target = folder / "model.safetensors"
        if not (folder / "config.json").is_file():
            base = model.get_base_model() if lora else model
            base.config.save_pretrained(folder)
            if getattr(base, "generation_config", None) is not None:
                base.generation_config.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
    tmp = target.with_suffix(".tmp")
    save_file(state, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, target)


def full_state(model: Any, rank: int, adapter_only: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, CPU tensor) of the weights to push, on rank 0 only (other ranks yield nothing but
    take part in the gathers). Every tensor gets its own name and storage: with tied
    embeddings the LM head is written too (vLLM's in-place reload does not re-tie it).

    With LoRA adapters (a PEFT model): `adapter_only` gives the adapter tensors under the
    names of PEFT's adapter files; otherwise the frozen base weights under the base model's
    names, which is what a server loads at launch (it adds the adapter on top)."""
    lora = hasattr(model, "peft_config")
    for name, tensor in model.state_dict(keep_vars=True).items():
        is_adapter = "lora_" in name
        if lora and is_adapter != adapter_only:
            continue
        if lora:
            name = name.replace(".default.", ".") if adapter_only else (
                name.removeprefix("base_model.model.").replace(".base_layer.", "."))
        with gathered(tensor):
            if rank == 0:
                yield name, tensor.detach().to("cpu").clone().contiguous()


@contextmanager
def gathered(tensor: torch.Tensor) -> Iterator[None]:
    """A DeepSpeed ZeRO-3 partitioned parameter gathered in full on every rank for the block
    (collective); anything else as it is."""
    if hasattr(tensor, "ds_id"):
        import deepspeed

        with deepspeed.zero.GatheredParameters([tensor], modifier_rank=None):
            yield
    else:
        yield
