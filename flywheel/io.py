"""Atomic file writes (a run killed mid-write never leaves a truncated file behind), and the
cache folder."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Iterator


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
