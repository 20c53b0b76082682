"""Resuming a DeepSpeed (ZeRO) checkpoint folder on another number of processes.

ZeRO partitions the optimizer state over the data-parallel ranks, one file per rank
(`<tag>/zero_pp_rank_<R>_mp_rank_00_optim_states.pt`), and DeepSpeed loads such a folder only
on as many ranks as wrote it: resumed on 1 process, a 2-rank ZeRO-2 checkpoint fails inside
the engine with "ZeRORuntimeException: The checkpoint being loaded used a DP world size of 2
but the current world size is 1" (measured: DeepSpeed 0.19.8). DeepSpeed's universal
checkpoint (`deepspeed.checkpoint.ds_to_universal`) stores every parameter's fp32 weights and
optimizer moments whole and loads on any world size; `to_universal` converts a folder into one
(tools/zero_to_universal.py), the pre-flight refuses a mismatch before anything runs, naming
that conversion, and `use_universal` tells the engine to load a converted folder.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

UNIVERSAL_TAG = "universal"
"""The converted state's folder inside a universal checkpoint folder (named by `latest_universal`)."""
_OPTIM = re.compile(r"zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt")


def is_universal(folder: str | Path) -> bool:
    """A folder `to_universal` wrote (DeepSpeed reads its tag from `latest_universal`)."""
    return (Path(folder) / "latest_universal").is_file()


def saved_ranks(folder: str | Path) -> int | None:
    """How many data-parallel ranks wrote the DeepSpeed checkpoint `folder` (its `latest` tag's
    optimizer partitions), or None when it is no such folder or holds none."""
    latest = Path(folder) / "latest"
    if not latest.is_file():
        return None
    ranks = {int(m.group(1)) for p in (Path(folder) / latest.read_text().strip()).glob("*.pt") if (m := _OPTIM.fullmatch(p.name))}
    return len(ranks) or None


def world_size_refusal(folder: str | Path, world_size: int) -> str | None:
    """Why DeepSpeed cannot resume `folder` on `world_size` processes, with the way out; None
    when it can (the same world size, a universal folder, no DeepSpeed folder)."""
    saved = saved_ranks(folder)
    if saved is None or saved == world_size or is_universal(folder):
        return None
    return (f"--ckpt_path {folder} is a DeepSpeed checkpoint written by {saved} processes, and this run has {world_size} "
            f"(--trainer.num_nodes x --trainer.devices): ZeRO keeps each rank's share of the optimizer state in its own "
            f"file and DeepSpeed loads them only on {saved} processes. Resume on {saved} processes, or convert it once "
            f"into a universal checkpoint, which loads on any number: python tools/zero_to_universal.py {folder} "
            f"{Path(folder).with_name(Path(folder).name.removesuffix('.ckpt') + '-universal.ckpt')}, then pass that "
            "folder as --ckpt_path")


def use_universal(strategy: Any, folder: str | Path | None) -> bool:
    """Make a DeepSpeed `strategy` load `folder` as a universal checkpoint when it is one
    (its config's `checkpoint.load_universal`, read when the engine starts). Returns whether it did."""
    config = getattr(strategy, "config", None)
    if folder is None or not isinstance(config, dict) or not Path(folder).is_dir() or not is_universal(folder):
        return False
    config.setdefault("checkpoint", {})["load_universal"] = True
    return True


def to_universal(folder: str | Path, out: str | Path, python: str = sys.executable) -> Path:
    """Convert the DeepSpeed checkpoint `folder` (a Lightning one: `latest`, `<tag>/`) into the
    universal checkpoint folder `out`: the converted state in `out/universal`, named by
    `out/latest_universal`; the rest (`latest`, `zero_to_fp32.py`, the original tag) copied, so
    `out` is still a checkpoint tools/export_hf.py reads. Raises ValueError for a folder that is
    not a DeepSpeed checkpoint, FileExistsError for an existing `out`, RuntimeError with
    DeepSpeed's own output when its converter fails."""
    folder, out = Path(folder), Path(out)
    if saved_ranks(folder) is None:
        raise ValueError(f"{folder} is not a DeepSpeed checkpoint folder (no `latest` naming a folder of ZeRO optimizer "
                         "states); pass the folder a DeepSpeed fit wrote, e.g. runs/x/checkpoints/last.ckpt")
    if out.exists():
        raise FileExistsError(f"{out} exists; name a new folder for the universal checkpoint")
    tag = (folder / "latest").read_text().strip()
    partial = out.with_name(f".{out.name}.partial")  # renamed into place once whole: a killed conversion leaves no `out`
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(folder, partial)
    proc = subprocess.run([python, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(folder / tag),
                           "--output_folder", str(partial / UNIVERSAL_TAG), "--num_extract_workers", "1",
                           "--num_merge_workers", "1", "--inject_missing_state"], capture_output=True, text=True)
    if proc.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise RuntimeError(f"DeepSpeed's ds_to_universal failed on {folder / tag} (exit {proc.returncode}):\n"
                           f"{(proc.stdout + proc.stderr)[-3000:]}")
    (partial / "latest_universal").write_text(UNIVERSAL_TAG)  # the converter writes it too; not every version does
    partial.rename(out)
    return out
