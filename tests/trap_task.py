"""A Countdown task whose verifier misbehaves on purpose, once per marker file in `trap_dir`
(tests of the grading guard, flywheel.tasks.grading; `--data.task=trap_task.TrapTask` under
pytest, tests/ being on the path). A file named "sleep.*" makes one call sleep 10 minutes,
"spin.*" compute for 10 minutes, "starve.*" lower its own priority to the least, move to the
first CPU and compute for 0.3 s of CPU time before grading, "raise.*" raise, "exit.*" end its
process, "memory.*" allocate 8 GiB; each file is removed by the call it traps."""

from __future__ import annotations

import os
import time
from pathlib import Path

from flywheel.rewards import Verdict
from flywheel.tasks.base import Problem
from flywheel.tasks.countdown import CountdownTask

TRAPS = ("sleep", "spin", "starve", "raise", "exit", "memory")
STARVE_CPU_S = 0.3


def set_traps(folder: Path, **counts: int) -> None:
    """Lay `counts[trap]` marker files of each trap in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for trap, count in counts.items():
        assert trap in TRAPS, trap
        for i in range(count):
            (folder / f"{trap}.{i}").touch()


def traps_left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def spin(cpu_s: float) -> None:
    """Compute until this thread has used `cpu_s` more seconds of CPU."""
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        pass


class TrapTask(CountdownTask):
    def __init__(self, trap_dir: str = "", **kwargs) -> None:
        super().__init__(**kwargs)
        self.trap_dir = trap_dir

    def score(self, problem: Problem, completion: str, *, truncated: bool = False) -> Verdict:
        trap = self._spring()
        if trap == "sleep":
            time.sleep(600)
        elif trap == "spin":
            spin(600.0)
        elif trap == "starve":
            os.nice(19)
            os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
            spin(STARVE_CPU_S)
        elif trap == "raise":
            raise ArithmeticError("a verifier bug")
        elif trap == "exit":
            os._exit(3)
        elif trap == "memory":
            blob = bytearray(8 * 2**30)
            return Verdict(False, -1.0, None, f"allocated {len(blob)}")
        return super().score(problem, completion, truncated=truncated)

    def _spring(self) -> str | None:
        if not self.trap_dir:
            return None
        for name in sorted(os.listdir(self.trap_dir)):
            try:
                os.remove(os.path.join(self.trap_dir, name))
            except FileNotFoundError:
                continue
            return name.split(".")[0]
        return None
