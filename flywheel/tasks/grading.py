"""The grading guard: a task's verifier run on the policy's responses with a time and memory
limit, so one pathological response can never stall a search, an evaluation or a screening.

`Grader.score` has the signature of `Task.score`. With `isolate` (the default) every call is
answered by a worker process that holds a copy of the task; a call that takes longer than
`timeout_s` gets the worker killed (a new one starts at the next call) and is graded wrong with
reason "timeout"; a verifier that raises, runs out of its `memory_mb` or kills its worker is
graded wrong with reason "error". Without `isolate` the verifier runs in this process: an
exception is still graded "error", and a call is timed, but only after it returns (a stuck
verifier stalls the run; a late verdict is graded "timeout").

The grader counts both outcomes (`counts`) and logs the first few, each with its problem id
and the response's length; the data module logs them per epoch as `search/grading_timeouts`
and `search/grading_errors` and keeps the run's totals in summary.json.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from flywheel.rewards import Verdict
from flywheel.tasks.base import Problem, Task

log = logging.getLogger(__name__)

TIMEOUT, ERROR = "timeout", "error"
"""The reasons of a verdict the guard gave instead of the verifier."""

LOGGED_EVENTS = 5
"""Timeouts and errors logged one by one per grader; later ones are only counted."""


@dataclass(frozen=True)
class GradingConfig:
    """How the task's verifier is run on the policy's responses (`--data.grading.*`).

    Args:
        timeout_s: a verdict that takes longer than this is graded wrong (reason "timeout").
            A verifier answers in milliseconds; the default leaves a wide margin on a loaded
            machine.
        memory_mb: the memory one verdict may take in the worker beyond what the worker holds at
            its start (its address space); a verdict that needs more is graded wrong (reason
            "error"). 0 = no limit. Only with `isolate`.
        isolate: grade in a worker process, so the limits are enforced (a stuck verifier is
            killed). False grades in this process: exceptions are still caught, but a call is
            only timed after it returns.
    """

    timeout_s: float = 10.0
    memory_mb: int = 2048
    isolate: bool = True

    def __post_init__(self) -> None:
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(f"grading.timeout_s={self.timeout_s} (--data.grading.timeout_s of fit, --grading.timeout_s "
                             "of eval) must be a positive number of seconds")
        if self.memory_mb < 0:
            raise ValueError(f"grading.memory_mb={self.memory_mb} (--data.grading.memory_mb of fit, --grading.memory_mb "
                             "of eval) must be >= 0 (0 = no limit)")


def guard_verdict(reason: str) -> Verdict:
    """The verdict of a response the verifier did not grade in time or without failing: wrong,
    no answer read."""
    return Verdict(correct=False, reward=-1.0, answer=None, reason=reason)


class Grader:
    """Grades responses with `task.score` under `config`'s limits (the module docstring);
    thread-safe (one call at a time). `close` ends the worker; a closed grader starts a new one
    when called again."""

    def __init__(self, task: Task, config: GradingConfig = GradingConfig()) -> None:
        self.task, self.config = task, config
        self.timeouts = 0
        self.errors = 0
        self._lock = threading.Lock()
        self._worker: _Worker | None = None

    def counts(self) -> dict[str, int]:
        """The verdicts the guard gave so far: {"timeouts": n, "errors": m}."""
        return {"timeouts": self.timeouts, "errors": self.errors}

    def restore(self, counts: dict[str, int]) -> None:
        """Continue the counts of a resumed run."""
        self.timeouts, self.errors = int(counts.get("timeouts", 0)), int(counts.get("errors", 0))

    def score(self, problem: Problem, completion: str, *, truncated: bool = False) -> Verdict:
        """`task.score(problem, completion, truncated=truncated)`, or the guard's verdict."""
        with self._lock:
            started = time.perf_counter()
            if self.config.isolate:
                verdict, detail = self._isolated(problem, completion, truncated)
            else:
                verdict, detail = self._inline(problem, completion, truncated)
            if verdict.reason in (TIMEOUT, ERROR) and detail is not None:
                self._count(verdict.reason, problem, completion, time.perf_counter() - started, detail)
            return verdict

    def _inline(self, problem: Problem, completion: str, truncated: bool) -> tuple[Verdict, str | None]:
        started = time.perf_counter()
        try:
            verdict = self.task.score(problem, completion, truncated=truncated)
        except Exception as err:  # a verifier must never raise: grade it wrong, say which problem
            return guard_verdict(ERROR), repr(err)
        if time.perf_counter() - started > self.config.timeout_s:
            return guard_verdict(TIMEOUT), f"over the limit of {self.config.timeout_s:g} s (graded in this process)"
        return verdict, None

    def _isolated(self, problem: Problem, completion: str, truncated: bool) -> tuple[Verdict, str | None]:
        if self._worker is None or not self._worker.alive():
            self._worker = _Worker(self.task, self.config.memory_mb)
            weakref.finalize(self, self._worker.stop)
        outcome, value = self._worker.call((problem, completion, truncated), self.config.timeout_s)
        if outcome == "ok":
            return value, None
        if outcome == TIMEOUT:
            self._worker.stop()
            self._worker = None
            return guard_verdict(TIMEOUT), f"over the limit of {self.config.timeout_s:g} s; the worker was restarted"
        if outcome == "died":
            self._worker = None
        return guard_verdict(ERROR), value

    def _count(self, reason: str, problem: Problem, completion: str, seconds: float, detail: str) -> None:
        if reason == TIMEOUT:
            self.timeouts += 1
        else:
            self.errors += 1
        events = self.timeouts + self.errors
        if events <= LOGGED_EVENTS:
            log.warning("grading %s: problem %r, a response of %d characters, %.1f s: %s; graded wrong%s",
                        reason, problem.id, len(completion), seconds, detail,
                        "" if events < LOGGED_EVENTS else " (later ones are only counted: search/grading_timeouts, "
                        "search/grading_errors)")

    def close(self) -> None:
        with self._lock:
            if self._worker is not None:
                self._worker.stop()
                self._worker = None

    def __getstate__(self) -> dict[str, Any]:  # a copy starts its own worker
        return {"task": self.task, "config": self.config, "timeouts": self.timeouts, "errors": self.errors}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["task"], state["config"])
        self.timeouts, self.errors = state["timeouts"], state["errors"]


class _Worker:
    """One worker process (a fresh interpreter: none of this process's threads, CUDA state or
    main module in it) answering (problem, completion, truncated) with a verdict over a pipe."""

    def __init__(self, task: Task, memory_mb: int) -> None:
        try:
            payload = pickle.dumps(task)
        except Exception as err:
            raise TypeError(f"the task {type(task).__name__} cannot be copied into the grading worker ({err!r}): make "
                            "it picklable, or grade in this process with --data.grading.isolate=false") from err
        self.process = subprocess.Popen([sys.executable, "-m", "flywheel.tasks.grading"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, close_fds=True)
        self.requests = Connection(os.dup(self.process.stdin.fileno()), readable=False)
        self.replies = Connection(os.dup(self.process.stdout.fileno()), writable=False)
        self.process.stdin.close()
        self.process.stdout.close()
        self.requests.send((list(sys.path), memory_mb))
        self.requests.send_bytes(payload)

    def alive(self) -> bool:
        return self.process.poll() is None

    def call(self, request: tuple, timeout_s: float) -> tuple[str, Any]:
        """("ok", verdict), ("error", why), (TIMEOUT, None) or ("died", why)."""
        try:
            self.requests.send(request)
            if not self.replies.poll(timeout_s):
                return TIMEOUT, None
            return self.replies.recv()
        except (EOFError, OSError) as err:
            try:
                code = self.process.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                code = None
            return "died", f"the grading worker died ({_exit(code)}; {err!r})"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.requests.close()
        self.replies.close()


def _exit(code: int | None) -> str:
    if code is None:
        return "still running"
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


def serve(requests: Connection, replies: Connection) -> None:
    """The worker's loop: take the parent's import path and the memory limit, load the task,
    limit the memory, answer each request until the pipe closes."""
    path, memory_mb = requests.recv()
    sys.path[:] = path
    task = pickle.loads(requests.recv_bytes())
    if memory_mb:
        _limit_memory(memory_mb)
    while True:
        try:
            problem, completion, truncated = requests.recv()
        except (EOFError, OSError):
            return
        try:
            reply: tuple[str, Any] = ("ok", task.score(problem, completion, truncated=truncated))
        except MemoryError:
            reply = ("error", f"the verifier needed more than grading.memory_mb={memory_mb} MB")
        except Exception as err:
            reply = ("error", repr(err)[:500])
        replies.send(reply)


def _limit_memory(memory_mb: int) -> None:
    """Cap the address space at what the worker maps now plus `memory_mb` (Linux: elsewhere the
    worker keeps no memory limit, only the time limit)."""
    try:
        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return
    import resource  # POSIX only, like /proc

    limit = mapped + memory_mb * 2**20
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


if __name__ == "__main__":  # the worker: requests on stdin, verdicts on stdout (what a verifier prints goes to stderr)
    replies_fd = os.dup(1)
    os.dup2(2, 1)
    serve(Connection(os.dup(0), writable=False), Connection(replies_fd, readable=False))
