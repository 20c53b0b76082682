"""Busy loops beside a test: `with busy_cpus(8): ...` keeps 8 processes computing (load 8),
each ending by itself after `limit_s` if the test's own clean-up never runs."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

LOOP = """
import os, sys, time
if sys.argv[2]:
    os.sched_setaffinity(0, {int(sys.argv[2])})
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    pass
"""


@contextmanager
def busy_cpus(count: int, *, cpu: int | None = None, limit_s: float = 600.0) -> Iterator[None]:
    """`count` processes computing for the block (on CPU `cpu` alone if given)."""
    loops = [subprocess.Popen([sys.executable, "-c", LOOP, str(limit_s), "" if cpu is None else str(cpu)])
             for _ in range(count)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
        for loop in loops:
            loop.wait()
