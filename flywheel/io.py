"""Atomic file writes (a run killed mid-write never leaves a truncated file behind), and the
cache folder."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Iterator


WRITE_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT})
"""Why a write fails for the folder's sake, not the data's: read-only, no permission, full."""


class OutputWriteError(OSError):
    """A run's output could not be written (its folder turned read-only, or full): the message
    names the folder and the way out; what was written before is intact."""


def failed_write(err: BaseException | None) -> OSError | None:
    """The OSError of a failed write in `err` or what caused it (Lightning re-raises a
    TensorBoard write error as "you tried to log -0.5 ...", issue 37), or None."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in WRITE_ERRNOS:
            return err
        err = err.__cause__ if err.__cause__ is not None else (None if err.__suppress_context__ else err.__context__)
    return None


def cannot_write_message(err: OSError, resume: str | None = None) -> str:
    """One line: the folder that cannot be written, why, and what to do."""
    name = os.fsdecode(err.filename) if err.filename else None
    if name is None:  # already worded (AtomicCheckpointIO's "no space left on <folder> ...")
        what = err.strerror or str(err)
    else:
        what = f"cannot write {Path(name).parent} ({err.strerror or os.strerror(err.errno)}; writing {Path(name).name})"
    way_out = "make the folder writable (or free space there)"
    return (f"{what}. The run stopped; the files it wrote before are intact: {way_out} and "
            + (f"resume with: {resume}" if resume else "run the command again, or write elsewhere"))


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """Write to a temporary file beside `path`; on a clean exit fsync it and rename it over
    `path` (then fsync the folder, so the rename survives a power cut).

    On an exception the temporary file is removed and `path` is untouched. Temporaries that
    an earlier, killed write left beside `path` are removed after a successful write.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{path.name}."
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=".tmp")
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual mode
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    for stale in path.parent.glob(f"{prefix}*.tmp"):
        stale.unlink(missing_ok=True)


def cache_dir() -> Path:
    """flywheel's cache folder: `$FLYWHEEL_CACHE`, else `$XDG_CACHE_HOME/flywheel`, else
    `~/.cache/flywheel` (compiled kernels, converted policies, downloaded wheels)."""
    root = os.environ.get("FLYWHEEL_CACHE")
    return Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flywheel"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # not every platform opens folders
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` atomically (see `atomic_writer`)."""
    with atomic_writer(path) as fh:
        fh.write(data)


def atomic_write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 2) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=indent, allow_nan=False) + "\n").encode())


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes, read in blocks (a weights file of any size)."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
