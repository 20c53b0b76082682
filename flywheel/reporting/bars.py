"""The progress bars of flywheel's own passes (search, screening, evaluation, diagnose) and of
Lightning's loops: a tqdm bar on a terminal; off one (a file, a CI log), a plain log line at most
every `LINE_EVERY_S`. tqdm's carriage-return frames were kept by a log as one line (an 18-minute
evaluation: 714 frames on one 84 KB line).

Either way no ETA is shown before it means something (`eta_known`): from a few seconds and a
few samples the first read like `[00:06<17:12:35]`.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, Callable, TextIO

from tqdm.auto import tqdm

from flywheel.reporting.wall_split import duration

log = logging.getLogger(__name__)

LINE_EVERY_S = 30.0
"""Off a terminal, a bar logs a line at most this often."""
ETA_AFTER_S = 10.0
ETA_AFTER_FRACTION = 0.05
"""An ETA is shown once the bar has run this long and done this share of its total."""


def eta_known(done: float, total: float | None, elapsed: float) -> bool:
    """Whether an ETA from the mean rate so far is worth showing: `ETA_AFTER_S` seconds and
    `ETA_AFTER_FRACTION` of a known total done."""
    return bool(total) and done > 0 and elapsed >= ETA_AFTER_S and done >= ETA_AFTER_FRACTION * total


def is_terminal(stream: TextIO | None) -> bool:
    """Whether `stream` is an interactive terminal (False for a file, a pipe, a closed stream)."""
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):
        return False


def progress_line(desc: str, done: int, total: int | None, elapsed: float, unit: str, postfix: str = "") -> str:
    """One plain progress line: count, share, time so far, mean rate and (`eta_known`) the time left.

    `progress_line("eval", 20, 100, 31.0, "sample")`:
    `eval: 20/100 (20%) after 31 s, 0.645 sample/s, about 2 min 04 s left` (80 left at 20 / 31 a second).
    """
    count = f"{done}/{total} ({100 * done / total:.0f}%)" if total else f"{done}"
    rate = done / elapsed if elapsed > 0 else 0.0
    parts = [f"{desc}: {count} after {duration(elapsed)}"]
    if done:
        parts.append(f"{rate:.3g} {unit}/s")
    if eta_known(done, total, elapsed):
        parts.append(f"about {duration((total - done) / rate)} left")
    return ", ".join(parts) + (f"; {postfix}" if postfix else "")


class LineBar:
    """The part of tqdm's interface flywheel's passes use, as log lines: one at most every
    `LINE_EVERY_S` while the bar moves, and a last one on `close` when it logged any (a pass
    shorter than that logs nothing: the log's other lines say what it did)."""

    def __init__(self, total: int | None, desc: str, unit: str = "it", clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.desc, self.unit, self.clock = total, desc, unit, clock
        self.n = 0
        self.postfix = ""
        self.start = self.logged = clock()
        self.lines = 0
        """Lines logged so far."""

    def update(self, n: int = 1) -> None:
        self.n += n
        self.refresh()

    def refresh(self) -> None:
        """Log a line if `LINE_EVERY_S` passed since the last one (or the start)."""
        now = self.clock()
        if now - self.logged >= LINE_EVERY_S:
            self._line(now)

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s
        if refresh:
            self.refresh()

    def set_postfix(self, ordered_dict: dict[str, Any] | None = None, refresh: bool = True, **kwargs: Any) -> None:
        items = {**(ordered_dict or {}), **kwargs}
        self.set_postfix_str(", ".join(f"{k}={tqdm.format_num(v) if isinstance(v, (int, float)) else v}"
                                       for k, v in items.items()), refresh)

    def close(self) -> None:
        if self.lines:
            now = self.clock()
            self.logged = now
            rate = f", {self.n / (now - self.start):.3g} {self.unit}/s" if now > self.start else ""
            count = f"{self.n}/{self.total}" if self.total else f"{self.n}"
            log.info("%s: %s in %s%s%s", self.desc, count, duration(now - self.start), rate,
                     f"; {self.postfix}" if self.postfix else "")
            self.lines = 0

    def _line(self, now: float) -> None:
        self.logged = now
        self.lines += 1
        log.info("%s", progress_line(self.desc, self.n, self.total, now - self.start, self.unit, self.postfix))

    def __enter__(self) -> LineBar:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class TerminalBar(tqdm):
    """tqdm with the mean rate since the start (generators finish samples in bursts) and no ETA
    before `eta_known`."""

    NO_ETA = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}, {rate_fmt}{postfix}]"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("smoothing", 0.0)
        super().__init__(*args, **kwargs)

    @property
    def format_dict(self) -> dict[str, Any]:
        out = super().format_dict
        if out.get("bar_format") is None and out.get("total") and not eta_known(out["n"], out["total"], out["elapsed"]):
            out["bar_format"] = self.NO_ETA
        return out


def progress_bar(total: int | None, desc: str, unit: str, show: bool, *, terminal: bool | None = None,
                 clock: Callable[[], float] = time.monotonic, **tqdm_options: Any) -> TerminalBar | LineBar:
    """A bar of `total` `unit`s, shown when `show` (rank 0): a TerminalBar when stderr is a
    terminal (`terminal` None: ask stderr), else a LineBar on `clock`. `tqdm_options` go to tqdm."""
    if terminal is None:
        terminal = is_terminal(sys.stderr)
    if terminal or not show:
        return TerminalBar(total=total, desc=desc, unit=unit, disable=not show, **tqdm_options)
    return LineBar(total, desc, unit, clock)
