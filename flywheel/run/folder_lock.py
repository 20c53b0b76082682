"""One fit at a time per checkpoint folder.

Two fits started into the same run folder at once (the same command in two terminals) would both
pass the one-run-per-folder check, both write `last.ckpt` and `epoch=N.ckpt` there, and leave a
folder whose last checkpoint is whichever run wrote last. The first fit takes an exclusive lock
on `.<folder name>.fit.lock` beside the checkpoint folder (outside it: Lightning warns of any file
in a checkpoint folder; `fcntl.flock`, released by the kernel when the process ends,
however it ends: a SIGKILLed fit leaves no stale lock) and holds it for its whole life; a second
fit is refused with the first one's process id and start time.
"""

from __future__ import annotations

import datetime
import fcntl
import os
from pathlib import Path
from typing import IO

from flywheel.run.errors import PreflightError

def lock_file(folder: Path) -> Path:
    """The lock file of checkpoint folder `folder`: `runs/quickstart/.checkpoints.fit.lock`."""
    return folder.parent / f".{folder.name}.fit.lock"


def hold_folder(folder: Path) -> IO[str]:
    """Lock checkpoint folder `folder` for this process; the returned file must stay open for
    as long as the lock is meant to be held. A folder another live process holds raises
    PreflightError naming it."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    path = lock_file(folder)
    path.touch(exist_ok=True)
    # Held through a read-only handle: no file stays open for writing on the run's disk (a
    # writable one would keep that file system from being remounted read-only, and flock does
    # not need write access).
    handle = open(path, encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise PreflightError(
            f"checkpoint folder {folder} is in use by another fit ({holder}): two runs in one folder would overwrite "
            "each other's checkpoints. Wait for it to end, or write elsewhere: --trainer.logger.init_args.name=NEW_NAME"
        ) from None
    started = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    path.write_text(f"pid {os.getpid()}, started {started}", encoding="utf-8")  # closed at once; the lock stays
    return handle
