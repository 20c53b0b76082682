"""Checkpoint files that survive a kill, and a clear way out when one is damaged anyway.

Lightning's own writer renames a temporary file from the system temp folder, which is a
copy, not an atomic rename, when that folder is on another file system; and a damaged
checkpoint surfaces as a bare unpickling or zip error. `AtomicCheckpointIO` writes beside
the target and renames, and names the file and the alternatives when loading fails.
"""

from __future__ import annotations

import errno
import os
import pickle
import zipfile
from pathlib import Path
from typing import Any, Callable

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from flywheel.io import atomic_writer
from flywheel.run.errors import CheckpointReadError  # noqa: F401  (raised here and imported from here)


_READ_ERRORS = (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError, OSError)


class AtomicCheckpointIO(TorchCheckpointIO):
    """torch.save into a temporary file beside the target, fsync, rename (local paths);
    remote URLs go through Lightning's writer unchanged. A full disk is reported as
    "no space left on <folder>"; the previous checkpoint stays as it was."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        try:
            with atomic_writer(path) as fh:
                torch.save(checkpoint, fh)
        except (OSError, RuntimeError) as err:
            if not _no_space(err):
                raise
            raise OSError(
                errno.ENOSPC,
                f"no space left on {Path(str(path)).parent} while writing checkpoint {Path(str(path)).name}; "
                "the previous checkpoint is intact. Free space there, or write checkpoints elsewhere with "
                "--trainer.callbacks.init_args.dirpath=FOLDER",
            ) from err

    def load_checkpoint(
        self, path: Any, map_location: Callable | None = lambda storage, loc: storage, weights_only: bool | None = None
    ) -> dict[str, Any]:
        if Path(str(path)).is_dir():
            raise CheckpointReadError(folder_given_message(path, "--ckpt_path"))
        try:
            return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        except FileNotFoundError:
            raise
        except _READ_ERRORS as err:
            raise CheckpointReadError(unreadable_checkpoint_message(path, err)) from err


def _no_space(err: BaseException | None) -> bool:
    """torch.save reports a full disk as an OSError(ENOSPC), or as a RuntimeError of its zip
    writer ("unexpected pos") raised while that OSError was being handled."""
    for _ in range(8):  # the chain of exceptions being handled
        if err is None:
            return False
        if getattr(err, "errno", None) == errno.ENOSPC or "No space left" in str(err):
            return True
        err = err.__cause__ or err.__context__
    return False


def read_checkpoint(path: Any, flag: str, mmap: bool = False) -> dict[str, Any]:
    """torch.load of a checkpoint file (all of it, unless `mmap`: then tensors are only mapped),
    with the errors of `AtomicCheckpointIO.load_checkpoint` naming `flag` (the command's
    own name of the checkpoint argument)."""
    if Path(str(path)).is_dir():
        raise CheckpointReadError(folder_given_message(path, flag))
    if not Path(str(path)).exists():
        raise FileNotFoundError(f"{flag} {path}: no such file")
    try:
        return torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)
    except _READ_ERRORS as err:
        raise CheckpointReadError(unreadable_checkpoint_message(path, err, flag)) from err


def readable(path: Path) -> bool:
    """The file opens as a checkpoint (memory-mapped: the weights are not read)."""
    try:
        torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except Exception:  # noqa: BLE001 - any failure means: do not suggest it
        return False
    return True


def folder_given_message(path: Any, flag: str) -> str:
    inside = sorted(Path(str(path)).glob("*.ckpt"), key=os.path.getmtime, reverse=True)
    return f"{flag} {path} is a folder, not a checkpoint file; " + (
        f"pass one of the checkpoints in it (newest first): {', '.join(str(p) for p in inside[:3])}"
        if inside else "it holds no .ckpt files"
    )


def unreadable_checkpoint_message(path: Any, err: BaseException, flag: str = "--ckpt_path") -> str:
    """What went wrong with a checkpoint file, and the ways out: the other checkpoints beside
    it that do open (each one is tried), newest first."""
    path = Path(str(path))
    others = []
    if path.parent.is_dir():
        candidates = sorted((p for p in path.parent.glob("*.ckpt") if p != path and p.is_file()), key=os.path.getmtime, reverse=True)
        others = [p for p in candidates[:6] if readable(p)][:3]
    restart = f"start the run again without {flag}" if flag == "--ckpt_path" else f"pass another {flag}"
    way_out = (
        "use another checkpoint instead (readable, newest first: "
        + ", ".join(f"{flag} {p}" for p in others)
        + f"), or {restart}"
        if others
        else restart
    )
    detail = str(err).splitlines()[0] if str(err) else type(err).__name__
    return (
        f"checkpoint {path} cannot be read: it is truncated or corrupt ({type(err).__name__}: {detail}). "
        f"flywheel writes checkpoints atomically, so a killed run does not cause this; the file was damaged "
        f"or replaced afterwards. Way out: {way_out}."
    )


RUN_KEY = "flywheel_run"
"""Checkpoint key of the run's TensorBoard location, so a resumed run logs where it left off."""


def run_record(trainer: Any) -> dict[str, Any]:
    """What a checkpoint remembers of its run's logging: the TensorBoard version folder."""
    from lightning.pytorch.loggers import TensorBoardLogger

    logger = trainer.logger
    if not isinstance(logger, TensorBoardLogger):
        return {}
    return {"logger_version": logger.version, "log_dir": str(Path(logger.log_dir).resolve())}


def continue_logging(trainer: Any, ckpt_path: Any, chosen_version: Any) -> str | None:
    """Point a resumed run's TensorBoardLogger at the version folder its checkpoint came from,
    so one run is one TensorBoard run (curves continue at the restored global step, and
    summary.json keeps every round). Does nothing when the user chose a version, when the
    run logs elsewhere now, or when the checkpoint holds no record.

    Returns the folder it continues in, or None.
    """
    from lightning.pytorch.loggers import TensorBoardLogger
    from lightning.pytorch.trainer.states import TrainerFn

    logger = trainer.logger
    if ckpt_path is None or chosen_version is not None or not isinstance(logger, TensorBoardLogger):
        return None
    # Lightning resolves "last"/"best" here at fit time; a private API, covered by the resume test.
    path = trainer._checkpoint_connector._parse_ckpt_path(
        TrainerFn.FITTING, ckpt_path, model_provided=True, model_connected=True
    )
    if path is None or not Path(str(path)).is_file():
        return None
    try:
        record = torch.load(path, map_location="cpu", mmap=True, weights_only=False).get(RUN_KEY) or {}
    except Exception:  # noqa: BLE001 - the real load reports a damaged file with its way out
        return None
    version, log_dir = record.get("logger_version"), record.get("log_dir")
    if version is None or log_dir is None:
        return None
    folder = Path(logger.root_dir) / (version if isinstance(version, str) else f"version_{version}")
    if folder.resolve() != Path(log_dir) or not folder.is_dir():
        return None
    logger._version = version
    return str(folder)
