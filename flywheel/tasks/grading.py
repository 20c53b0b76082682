"""The grading guard: a task's verifier run on the policy's responses with a time and memory
limit, so one pathological response can never stall a search, an evaluation or a screening.

`Grader.score` has the signature of `Task.score`, and `Grader.respond` that of
`EnvironmentTask.respond` (an environment's answer to an action: flywheel.tasks.environment).
With `isolate` (the default) every call is answered by a worker process that holds a copy of
the task. A verdict is limited by the CPU time
the worker spends on it (`timeout_s`), not by the wall clock, so a busy machine slows a verdict
without making it wrong; the wall clock is only a backstop (`backstop_s`) for a verifier that
waits instead of computing. The outcomes:

- over `timeout_s` of CPU: the worker is killed, the verdict is wrong with reason "timeout";
- over `backstop_s` of wall time, the worker mostly waiting for a CPU (the machine saturated):
  graded again once in a fresh worker, and "timeout" only if that one is starved too;
- over `backstop_s` of wall time otherwise (a verifier that sleeps or blocks): "timeout";
- a verifier that raises, runs out of its `memory_mb` or kills its worker: "error".

An environment's answer is limited the same way: past a limit, or failing, the episode ends lost
with the same reason (`flywheel.tasks.environment.guard_turn`).

A killed worker's replacement starts at once, and a verdict's clock runs only after its worker
has said it is ready, so a worker's start (a fresh interpreter importing the task) is never
counted against a verdict. Without `isolate` the verifier runs in this process: an exception is
still graded "error", and a call is measured the same way, but only after it returns (a stuck
verifier stalls the run).

The grader counts the guard's verdicts (`counts`) and logs the first few, each with its problem
id and the response's length; the data module logs them per epoch as `search/grading_timeouts`
and `search/grading_errors` and keeps the run's totals in summary.json.
"""

from __future__ import annotations

import glob
import logging
import math
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

from flywheel.rewards import Verdict
from flywheel.tasks.base import Problem, Task
from flywheel.tasks.environment import EnvironmentTask, Turn, guard_turn

log = logging.getLogger(__name__)

TIMEOUT, ERROR = "timeout", "error"
"""The reasons of a verdict the guard gave instead of the verifier."""

CALLS = ("score", "respond")
"""The task's methods a worker answers: a verdict, an environment's turn."""

LOGGED_EVENTS = 5
"""Timeouts, errors and retries logged one by one per grader; later ones are only counted."""

STARVED_SHARE = 0.25
"""A call that reached the backstop was starved (not stuck) when its worker spent at least this
share of the wall time runnable but waiting for a CPU."""

START_LIMIT_S = 300.0
"""How long a worker may take to start (a fresh interpreter importing the task) before the run
stops with an error; it starts in well under a second on an idle machine."""

POLL_S = 0.05
"""How often a pending verdict's CPU time is read."""


@dataclass(frozen=True)
class GradingConfig:
    """How the task's verifier is run on the policy's responses (`--data.grading.*`).

    Args:
        timeout_s: the CPU seconds the verifier may spend on one verdict; a verdict that needs
            more is graded wrong (reason "timeout"). A verifier answers in milliseconds. Counted
            on the worker's own CPU time, so a loaded machine does not use it up.
        backstop_s: the wall-clock seconds after which a verdict that has not used its CPU time
            is given up: graded wrong (reason "timeout") if the worker was waiting on something
            else (a verifier that sleeps), graded again once if it was waiting for a CPU (a
            saturated machine). Must be at least `timeout_s`.
        memory_mb: the memory one verdict may take in the worker beyond what the worker holds at
            its start (its address space); a verdict that needs more is graded wrong (reason
            "error"). 0 = no limit. Only with `isolate`.
        isolate: grade in a worker process, so the limits are enforced (a stuck verifier is
            killed). False grades in this process: exceptions are still caught, but a call is
            only measured after it returns.
    """

    timeout_s: float = 10.0
    backstop_s: float = 60.0
    memory_mb: int = 2048
    isolate: bool = True

    def __post_init__(self) -> None:
        for name in ("timeout_s", "backstop_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"grading.{name}={value} (--data.grading.{name} of fit, --grading.{name} of eval) "
                                 "must be a positive number of seconds")
        if self.backstop_s < self.timeout_s:
            raise ValueError(f"grading.backstop_s={self.backstop_s:g} is below grading.timeout_s={self.timeout_s:g}: "
                             "the wall-clock backstop must leave a verdict at least its CPU time "
                             "(--data.grading.backstop_s of fit, --grading.backstop_s of eval)")
        if self.memory_mb < 0:
            raise ValueError(f"grading.memory_mb={self.memory_mb} (--data.grading.memory_mb of fit, --grading.memory_mb "
                             "of eval) must be >= 0 (0 = no limit)")


class Usage(NamedTuple):
    """What a verdict took: wall seconds, CPU seconds and seconds runnable but waiting for a CPU
    (None where the system does not say)."""

    wall_s: float
    cpu_s: float | None
    waiting_s: float | None


def overrun(usage: Usage, config: GradingConfig) -> str | None:
    """Which limit `usage` is past: "cpu" (the verifier's own time), "starved" (the backstop,
    the worker mostly waiting for a CPU), "stalled" (the backstop, the worker waiting on
    something else), or None. Without CPU figures the wall clock stands in for the CPU time."""
    cpu_s = usage.wall_s if usage.cpu_s is None else usage.cpu_s
    if cpu_s > config.timeout_s:
        return "cpu"
    if usage.wall_s <= config.backstop_s:
        return None
    if usage.waiting_s is not None and usage.waiting_s >= STARVED_SHARE * usage.wall_s:
        return "starved"
    return "stalled"


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
        self.retries = 0
        """Verdicts graded again because the machine starved the first try (logged, not a wrong verdict)."""
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
        value, reason = self._call("score", problem, (completion,), {"truncated": truncated},
                                   f"a response of {len(completion)} characters")
        return value if reason is None else guard_verdict(reason)

    def respond(self, problem: Problem, actions: tuple[str, ...]) -> Turn:
        """`task.respond(problem, actions)` (an environment's answer to the last action), or the
        guard's turn: the episode ends lost, reason "timeout" or "error"."""
        if not isinstance(self.task, EnvironmentTask):
            raise TypeError(f"{type(self.task).__name__} is not an environment (flywheel.tasks.environment.EnvironmentTask)")
        value, reason = self._call("respond", problem, (tuple(actions),), {},
                                   f"an action of {len(actions[-1]) if actions else 0} characters after {len(actions) - 1}")
        return value if reason is None else guard_turn(reason)

    def _call(self, method: str, problem: Problem, args: tuple, kwargs: dict[str, Any], what: str) -> tuple[Any, str | None]:
        """(the task's answer, None), or (None, "timeout" | "error") when the guard answered."""
        with self._lock:
            started = time.perf_counter()
            call = (method, problem, args, kwargs)
            value, reason, detail = self._isolated(call) if self.config.isolate else self._inline(call)
            if reason is not None:
                self._count(reason, problem, what, time.perf_counter() - started, detail)
            return value, reason

    def _inline(self, call: tuple) -> tuple[Any, str | None, str]:
        method, problem, args, kwargs = call
        clock = _Clock(_thread_stats)
        try:
            value = getattr(self.task, method)(problem, *args, **kwargs)
        except Exception as err:  # a verifier must never raise: grade it wrong, say which problem
            return None, ERROR, repr(err)
        usage = clock.usage()
        over = overrun(usage, self.config)
        if over in ("cpu", "stalled"):  # a starved verdict that came back is the verifier's own
            return None, TIMEOUT, f"{_describe(over, usage, self.config)} (graded in this process)"
        return value, None, ""

    def _isolated(self, call: tuple) -> tuple[Any, str | None, str]:
        problem = call[1]
        for attempt in (1, 2):
            worker = self._ready_worker()
            outcome, value = worker.call(call, self.config)
            if outcome == "ok":
                return value, None, ""
            if outcome == "error":
                return None, ERROR, value
            self._replace_worker()
            if outcome == "died":
                return None, ERROR, value
            if outcome == "starved" and attempt == 1:
                self._retried(problem, value)
                continue
            detail = _describe(outcome, value, self.config)
            return None, TIMEOUT, f"{detail}{'; graded twice' if attempt == 2 else ''}; the worker was restarted"
        raise AssertionError("unreachable: the second attempt always returns")

    def _ready_worker(self) -> _Worker:
        if self._worker is None:
            self._worker = _Worker(self.task, self.config.memory_mb)
            weakref.finalize(self, self._worker.stop)
        self._worker.wait_ready()
        return self._worker

    def _replace_worker(self) -> None:
        """Kill the worker and start its replacement now, so it starts while the caller goes on."""
        if self._worker is not None:
            self._worker.stop()
        self._worker = None
        self._worker = _Worker(self.task, self.config.memory_mb)
        weakref.finalize(self, self._worker.stop)

    def _retried(self, problem: Problem, usage: Usage) -> None:
        self.retries += 1
        if self.retries <= LOGGED_EVENTS:
            log.warning("grading retried: problem %r had no verdict after %.1f s while its worker waited %.1f s for a "
                        "CPU (the machine is saturated); graded again in a fresh worker", problem.id, usage.wall_s,
                        usage.waiting_s or 0.0)

    def _count(self, reason: str, problem: Problem, what: str, seconds: float, detail: str) -> None:
        if reason == TIMEOUT:
            self.timeouts += 1
        else:
            self.errors += 1
        events = self.timeouts + self.errors
        if events <= LOGGED_EVENTS:
            log.warning("grading %s: problem %r, %s, %.1f s: %s; graded wrong%s",
                        reason, problem.id, what, seconds, detail,
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


def _describe(outcome: str, usage: Usage, config: GradingConfig) -> str:
    if outcome == "cpu":
        spent = f"{usage.cpu_s:.1f} s of CPU" if usage.cpu_s is not None else f"{usage.wall_s:.1f} s"
        return f"{spent}, over the limit of {config.timeout_s:g} s (grading.timeout_s)"
    waited = f", {usage.waiting_s:.1f} s of it waiting for a CPU" if usage.waiting_s is not None else ""
    what = "the machine saturated" if outcome == "starved" else "the verifier waiting, not computing"
    return f"no verdict after {usage.wall_s:.1f} s{waited} ({what}), past the backstop of {config.backstop_s:g} s " \
           f"(grading.backstop_s)"


class _Clock:
    """A verdict's usage from the moment it is made (or `since_s` before): wall time, and CPU
    and run-queue time from `stats` (a function giving the two totals in seconds, or None)."""

    def __init__(self, stats, since_s: float = 0.0) -> None:
        self.stats = stats
        self.wall = time.perf_counter() - since_s
        self.first = stats()

    def usage(self) -> Usage:
        wall_s = time.perf_counter() - self.wall
        now = self.stats()
        if now is None or self.first is None:
            return Usage(wall_s, None, None)
        return Usage(wall_s, now[0] - self.first[0], now[1] - self.first[1])


def _schedstat(paths: list[str]) -> tuple[float, float] | None:
    """The summed (CPU seconds, seconds waiting on a run queue) of the threads whose
    /proc/.../schedstat files are `paths`, or None where the system has no such files."""
    cpu = waiting = 0
    for path in paths:
        try:
            with open(path) as f:
                fields = f.read().split()
        except OSError:  # a thread that ended between the listing and the read
            continue
        cpu, waiting = cpu + int(fields[0]), waiting + int(fields[1])
    return (cpu / 1e9, waiting / 1e9) if paths else None


def _process_stats(pid: int):
    return lambda: _schedstat(glob.glob(f"/proc/{pid}/task/*/schedstat"))


def _thread_stats() -> tuple[float, float] | None:
    return _schedstat(["/proc/thread-self/schedstat"] if os.path.exists("/proc/thread-self/schedstat") else [])


class _Worker:
    """One worker process (a fresh interpreter: none of this process's threads, CUDA state or
    main module in it; its own process group, so a Ctrl-C at the terminal reaches only the run)
    answering the task's calls (`CALLS`: a verdict, an environment's turn) over a pipe. It starts when made;
    `wait_ready` waits until it has loaded the task."""

    def __init__(self, task: Task, memory_mb: int) -> None:
        try:
            payload = pickle.dumps(task)
        except Exception as err:
            raise TypeError(f"the task {type(task).__name__} cannot be copied into the grading worker ({err!r}): make "
                            "it picklable, or grade in this process with --data.grading.isolate=false") from err
        self.process = subprocess.Popen([sys.executable, "-m", "flywheel.tasks.grading"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, close_fds=True, process_group=0)
        self.requests = Connection(os.dup(self.process.stdin.fileno()), readable=False)
        self.replies = Connection(os.dup(self.process.stdout.fileno()), writable=False)
        self.process.stdin.close()
        self.process.stdout.close()
        self.requests.send((list(sys.path), memory_mb, os.getpid()))
        self.requests.send_bytes(payload)
        self.ready = False
        self.stats = _process_stats(self.process.pid)

    def wait_ready(self) -> None:
        """Block until the worker has loaded the task; raise if it cannot."""
        if self.ready:
            return
        try:
            if not self.replies.poll(START_LIMIT_S):
                raise RuntimeError(f"the grading worker did not start in {START_LIMIT_S:g} s")
            status, detail = self.replies.recv()
        except (EOFError, OSError) as err:
            raise RuntimeError(f"the grading worker died while starting ({_exit(self._code())}; {err!r})") from err
        if status != "ready":
            raise RuntimeError(f"the grading worker could not load the task: {detail}; grade in this process with "
                               "--data.grading.isolate=false to see the whole error")
        self.ready = True

    def call(self, request: tuple, config: GradingConfig) -> tuple[str, Any]:
        """`request` is (method, problem, args, kwargs). ("ok", the answer), ("error", why), ("died", why), or ("cpu" | "starved" | "stalled",
        Usage) when the verdict ran past a limit (`overrun`)."""
        try:
            self.requests.send(request)
            if self.replies.poll(POLL_S):  # nearly every verdict: no clock read at all
                return self.replies.recv()
            clock = _Clock(self.stats, since_s=POLL_S)  # the first POLL_S uncounted: a limit's error under 0.05 s
            while not self.replies.poll(POLL_S):
                usage = clock.usage()
                over = overrun(usage, config)
                if over is not None:
                    return over, usage
            return self.replies.recv()
        except (EOFError, OSError) as err:
            return "died", f"the grading worker died ({_exit(self._code())}; {err!r})"

    def _code(self) -> int | None:
        try:
            return self.process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return None

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
    """The worker's loop: take the parent's import path, the memory limit and the parent's pid,
    load the task, limit the memory, say it is ready, answer each request until the pipe closes
    (or the parent is gone)."""
    path, memory_mb, parent = requests.recv()
    sys.path[:] = path
    try:
        task = pickle.loads(requests.recv_bytes())
    except Exception as err:
        replies.send(("failed", repr(err)[:500]))
        return
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    if memory_mb:
        _limit_memory(memory_mb)
    replies.send(("ready", None))
    while True:
        try:
            method, problem, args, kwargs = requests.recv()
        except (EOFError, OSError):
            return
        try:
            if method not in CALLS:
                raise ValueError(f"the grading worker answers {CALLS}, not {method!r}")
            reply: tuple[str, Any] = ("ok", getattr(task, method)(problem, *args, **kwargs))
        except MemoryError:
            reply = ("error", f"the verifier needed more than grading.memory_mb={memory_mb} MB")
        except Exception as err:
            reply = ("error", repr(err)[:500])
        replies.send(reply)


def _exit_with_parent(parent: int) -> None:
    """End the worker once its parent is gone, even while a verifier is stuck in it."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


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
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the run stops it; a Ctrl-C is the run's to report
    replies_fd = os.dup(1)
    os.dup2(2, 1)
    serve(Connection(os.dup(0), writable=False), Connection(replies_fd, readable=False))
