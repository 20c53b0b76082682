"""Where a run's wall time goes: named sections of one thread's time that, with `other`, add
up to the wall time (issue 35: "see where every second goes").

A section is counted exclusive of the sections opened inside it (the outer one pauses while
an inner one runs), so no second is counted twice and `other = wall - sum(sections)` is what
nothing measured. A part of a section that another clock measures (the generator's own
seconds inside the search) is `carve`d out of it into a section of its own. Time spent on
another thread or process at the same time (a search overlapping training) belongs to no
section of this thread; `add_overlapped` keeps it apart, outside the sum. Work a fit does once
(the base evaluation and screening, the generator's launch) is marked with `once`: it stays in
its sections, and its wall seconds are also counted apart, so that the epochs' pace, which
projects the fit's end, leaves it out.

Pure: no Lightning, no I/O; the clock is injected (tests use a fake one). The callback that
feeds it and reports it is callbacks.wall_time.
"""

from __future__ import annotations

import functools
import time
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Callable, Iterator

Clock = Callable[[], float]

SEARCH, SEARCH_GENERATOR, TRAIN, EVAL, SCREENING = "search", "search_generator", "train", "eval", "screening"
WEIGHT_SYNC, VALUE_MODEL, CHECKPOINT, REBUILD = "weight_sync", "value_model", "checkpoint", "rebuild"
SEARCH_WAIT = "search_wait"
"""An epoch's end waiting for the search ahead (`--data.async_search`)."""
SEARCH_AHEAD, CHECKPOINT_WRITE = "search_ahead", "checkpoint_write"
"""Work beside the trainer's thread (`WallSplit.add_overlapped`): the search ahead, and the
checkpoint files written in the background (`--checkpoint_writes=background`)."""
ONE_TIME = "one_time"
"""Not a section: the wall seconds inside `WallSplit.once` blocks (in `totals()` when any)."""
PARTS = (SEARCH_GENERATOR, "search_bookkeeping", TRAIN, EVAL, SCREENING, WEIGHT_SYNC, VALUE_MODEL, CHECKPOINT, REBUILD)
"""The reported parts, in order; `other` follows them."""


class WallSplit:
    """Cumulative seconds per named section since construction (plus what `load_state_dict`
    restored from earlier parts of the run), and the wall time over the same span."""

    def __init__(self, clock: Clock = time.perf_counter) -> None:
        self.clock = clock
        self.seconds: dict[str, float] = {}
        """Exclusive seconds per section, over the run."""
        self.overlapped: dict[str, float] = {}
        """Seconds of work that ran beside this thread (`add_overlapped`), not part of the wall's split."""
        self._started = clock()
        self._wall_before = 0.0
        self._open: list[list] = []
        """The open sections, innermost last: [name, time its own clock last resumed, its own seconds so far]."""
        self.one_time = 0.0
        """Wall seconds of the `once` blocks over the run (they are also in their sections)."""
        self._once_open = 0

    # ------------------------------------------------------------------ measuring
    def wall(self) -> float:
        """Wall seconds of the run so far, over every resumed part."""
        return self._wall_before + self.clock() - self._started

    def enter(self, name: str) -> None:
        """Open section `name` inside the innermost open one, which pauses until `name` exits."""
        now = self.clock()
        if self._open:
            self._charge(self._open[-1], now)
        self._open.append([name, now, 0.0])

    def exit(self, name: str) -> float:
        """Close section `name` (and any section left open inside it, e.g. by an exception);
        the enclosing one resumes. Returns the seconds `name` itself counted, inner sections
        excluded; 0.0 when `name` is not open."""
        if all(frame[0] != name for frame in self._open):
            return 0.0
        now = self.clock()
        frame = self._open.pop()
        self._charge(frame, now)  # only the innermost section runs; those around it are paused
        while frame[0] != name:
            frame = self._open.pop()
        if self._open:
            self._open[-1][1] = now
        return frame[2]

    def exit_all(self) -> None:
        """Close every open section (the run stopped with an exception)."""
        while self._open:
            self.exit(self._open[0][0])

    @contextmanager
    def section(self, name: str, part: tuple[str, Callable[[], float]] | None = None) -> Iterator[None]:
        """Count the block's time as `name`. `part` = (section, counter): a cumulative seconds
        counter of work done inside this block by its own clock (the generator's); its increase
        over the block is carved out of `name` into that section (at most `name`'s own time,
        so the counter must not run inside sections nested in this one)."""
        counted = part[1]() if part is not None else 0.0
        self.enter(name)
        try:
            yield
        finally:
            own = self.exit(name)
            if part is not None:
                self.carve(name, part[0], min(max(part[1]() - counted, 0.0), own))

    @contextmanager
    def once(self) -> Iterator[None]:
        """Count the block's wall seconds as one-time work, besides the sections it runs in
        (a `once` inside another counts with the outer one)."""
        start = self.clock()
        self._once_open += 1
        try:
            yield
        finally:
            self._once_open -= 1
            if not self._once_open:
                self.one_time += self.clock() - start

    def carve(self, name: str, part: str, seconds: float) -> None:
        """Move `seconds` of section `name` to section `part`."""
        self.seconds[name] = self.seconds.get(name, 0.0) - seconds
        self.seconds[part] = self.seconds.get(part, 0.0) + seconds

    def add_overlapped(self, name: str, seconds: float) -> None:
        """Record `seconds` of work on another thread or process that ran during this wall time."""
        self.overlapped[name] = self.overlapped.get(name, 0.0) + seconds

    def _charge(self, frame: list, now: float) -> None:
        frame[2] += now - frame[1]
        self.seconds[frame[0]] = self.seconds.get(frame[0], 0.0) + now - frame[1]
        frame[1] = now

    # ------------------------------------------------------------------ reading
    def totals(self) -> dict[str, float]:
        """Seconds per section so far (the open innermost one included), `wall` and `other`
        (wall minus every section), `overlapped/<name>`, and `one_time` when any."""
        if self._open:
            self._charge(self._open[-1], self.clock())
        out = dict(self.seconds)
        out["wall"] = self.wall()
        out["other"] = out["wall"] - sum(self.seconds.values())
        out.update({f"overlapped/{k}": v for k, v in self.overlapped.items()})
        if self.one_time:
            out[ONE_TIME] = self.one_time
        return out

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, object]:
        totals = self.totals()
        return {"seconds": dict(self.seconds), "overlapped": dict(self.overlapped), "wall": totals["wall"],
                "one_time": self.one_time}

    def load_state_dict(self, state: dict) -> None:
        """Add an earlier part of the run (its checkpoint's `state_dict`) to this one's counts."""
        for key, value in state["seconds"].items():
            self.seconds[key] = self.seconds.get(key, 0.0) + float(value)
        for key, value in state.get("overlapped", {}).items():
            self.add_overlapped(key, float(value))
        self._wall_before += float(state["wall"])
        self.one_time += float(state.get("one_time", 0.0))  # absent from checkpoints written before it was counted


def difference(now: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    """Component-wise `now - before` of two `totals()` (a section absent before counts 0)."""
    return {key: value - before.get(key, 0.0) for key, value in now.items()}


def projected_finish(epoch_seconds: list[float], one_time: float, max_epochs: int | None, now: float) -> str | None:
    """A line on when the fit ends at the pace of its closed epochs (each holds its epoch-end
    work: weight push, a round's evaluation, the checkpoint), from `now` (a Unix time).
    `one_time`: the seconds of those epochs spent on work done once (`WallSplit.once`: the base
    evaluation and screening, the generator's launch), left out of the pace (counted in, a
    first epoch of 17 min that held 13 min of it projected a 15-epoch fit at 4 h; it took
    72 min). None when the number of epochs is open (`max_epochs` None or -1), when none has
    closed yet and when none is left.

    `projected_finish([40.0, 50.0], 0.0, 4, now)`: 2 of 4 epochs done at 45 s each, 90 s to go.
    """
    done = len(epoch_seconds)
    if not done or max_epochs is None or max_epochs < 0:
        return None
    left = max_epochs - done
    if left <= 0:
        return None
    spent = sum(epoch_seconds)
    pace = max(spent - one_time, 0.0) / done
    remaining = pace * left
    finish = time.strftime("%H:%M:%S", time.localtime(now + remaining))
    once = f", {duration(one_time)} of it one-time work" if round(one_time) else ""
    return (f"{done} of {max_epochs} epochs done ({duration(spent)}{once}; {duration(pace)} an epoch); "
            f"at that pace the fit ends in about {duration(remaining)}, around {finish}")


def duration(seconds: float) -> str:
    """`45 s`, `3 min 20 s`, `2 h 05 min`."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class Untimed:
    """The wall clock of a run that keeps no split (a data module or callback used without
    callbacks.wall_time.WallTime): every section runs untimed. The same methods as WallTime's
    (flywheel.ports.WallClock)."""

    def section(self, name: str, part: tuple[str, Callable[[], float]] | None = None) -> AbstractContextManager:
        return nullcontext()

    def rebuild(self) -> AbstractContextManager:
        return nullcontext()

    def once(self) -> AbstractContextManager:
        return nullcontext()

    def add_overlapped(self, name: str, seconds: float) -> None:
        pass


UNTIMED = Untimed()


def timed(clock: Any, name: str, fn: Callable) -> Callable:
    """`fn` with each call counted as section `name` of `clock` (a flywheel.ports.WallClock)."""
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        with clock.section(name):
            return fn(*args, **kwargs)

    return call


def search_section(clock: Any, generator: Any) -> AbstractContextManager:
    """The epoch's rollouts on `clock`: `generator`'s own seconds in them are search_generator, the rest bookkeeping."""
    return clock.section(SEARCH, (SEARCH_GENERATOR, lambda: generator.stats.seconds))
