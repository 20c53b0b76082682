"""Checkpoint files that survive a kill, and a clear way out when one is damaged anyway.

Lightning's own writer renames a temporary file from the system temp folder, which is a
copy, not an atomic rename, when that folder is on another file system; and a damaged
checkpoint surfaces as a bare unpickling or zip error. `AtomicCheckpointIO` writes beside
the target and renames, and names the file and the alternatives when loading fails.
`BackgroundCheckpointIO` (the default of `flywheel fit`, `--checkpoint_writes=background`)
does the same write on a thread of its own, so the run goes on while a checkpoint is written.
"""

from __future__ import annotations

import copy
import errno
import os
import pickle
import time
import zipfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from flywheel.io import atomic_writer
from flywheel.run.errors import CheckpointReadError  # noqa: F401  (raised here and imported from here)


CHECKPOINT_WRITES = ("background", "blocking")
"""The values of `--checkpoint_writes`, the default first: a checkpoint written on a thread of its
own while the run goes on (BackgroundCheckpointIO), or by the trainer's thread before it goes on."""

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


class BackgroundCheckpointIO(AtomicCheckpointIO):
    """AtomicCheckpointIO with the files written by a thread of its own, one at a time, in order.

    `save_checkpoint` copies every tensor of the checkpoint to CPU memory on the caller's thread
    (a point-in-time snapshot: the optimizer may step at once) and queues the write. A tensor
    unchanged since the previous snapshot (the same memory, shape and in-place version) is not
    copied again, so the two files of one epoch (`epoch=N.ckpt` and `last.ckpt`) share one
    snapshot; a snapshot with new tensors first waits for the writes queued before it, so at
    most one snapshot's tensors are held beside the model. `remove_checkpoint` is queued after
    the writes before it: an older checkpoint is deleted only once the newer one is complete on
    disk. A kill during a write leaves the previous file of that name as it was (each write
    renames a finished temporary file). `flush()` waits for the queue and raises the first
    failure; the trainer's teardown (a fit's end or failure) and a SIGTERM's checkpoint call it,
    and a failed write is raised at the next save at the latest. `on_written(seconds)` hears
    each finished write on the caller's thread (the run's wall split keeps them as
    `overlapped/checkpoint_write_s`).
    """

    def __init__(self, on_written: Callable[[float], None] | None = None) -> None:
        super().__init__()
        self.on_written = on_written
        self._pool: ThreadPoolExecutor | None = None
        self._queued: list[Future] = []
        self._copies: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        """The last snapshot's tensors: their key -> (the source tensor, held so its memory is
        not reused while it is a key; its CPU copy)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        self._collect(wait=False)
        copies: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        if any(_key(t) not in self._copies for t in _tensors(checkpoint)):
            self.flush()  # a new snapshot: the previous one's writes finish first
        snapshot = _snapshot(checkpoint, self._copies, copies)
        self._copies = copies
        self._submit(lambda: AtomicCheckpointIO.save_checkpoint(self, snapshot, path, storage_options))

    def remove_checkpoint(self, path: Any) -> None:
        self._collect(wait=False)
        self._submit(lambda: AtomicCheckpointIO.remove_checkpoint(self, path))

    def flush(self) -> None:
        """Wait for every queued write and removal; raise the first failure."""
        self._collect(wait=True)

    def teardown(self) -> None:
        try:
            self.flush()
        finally:
            self._copies = {}
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
            super().teardown()

    def _submit(self, work: Callable[[], None]) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flywheel-checkpoint-write")

        def timed() -> float:
            start = time.perf_counter()
            work()
            return time.perf_counter() - start

        self._queued.append(self._pool.submit(timed))

    def _collect(self, wait: bool) -> None:
        """Hand on the finished tasks' seconds and raise the first failure (every queued task
        with `wait`, else the finished ones)."""
        done = self._queued if wait else [f for f in self._queued if f.done()]
        self._queued = [f for f in self._queued if f not in done]
        error = None
        for future in done:
            try:
                seconds = future.result()
            except BaseException as err:  # the write's own error, raised on the trainer's thread
                error = error or err
                continue
            if self.on_written is not None:
                self.on_written(seconds)
        if error is not None:
            raise error


def _key(t: torch.Tensor) -> tuple:
    """What identifies a tensor's contents while it is held: its memory, layout and in-place
    version. A tensor that lacks one of them (an inference-mode tensor has no version; a sparse
    or wrapper tensor no data pointer) gets a key equal to no other: it is copied every time."""
    try:
        return (t.device, t.data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype, t._version)
    except (RuntimeError, NotImplementedError, AttributeError):
        return (object(),)


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for v in value:
            yield from _tensors(v)


_IMMUTABLE = (str, bytes, int, float, complex, bool, type(None))


def _snapshot(value: Any, previous: dict, copies: dict) -> Any:
    """A copy of a checkpoint whose tensors are in CPU memory (taken from `previous` when
    unchanged; every tensor's entry goes into `copies`) and whose containers and other mutable
    leaves are copies too, so that nothing the run changes after the call reaches the file."""
    if isinstance(value, torch.Tensor):
        key = _key(value)
        entry = previous.get(key) or copies.get(key) or (value.detach(), value.detach().to("cpu", copy=True))
        copies[key] = entry
        return entry[1]
    if isinstance(value, _IMMUTABLE):
        return value
    if isinstance(value, dict):  # a dict subclass keeps its type and attributes (a state_dict's _metadata)
        out = {} if type(value) is dict else copy.copy(value)
        for k, v in value.items():
            out[k] = _snapshot(v, previous, copies)
        return out
    if type(value) in (list, tuple, set, frozenset):
        return type(value)(_snapshot(v, previous, copies) for v in value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*(_snapshot(v, previous, copies) for v in value))
    return copy.deepcopy(value)


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
