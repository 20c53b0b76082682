"""The progress bar of an evaluation or a screening pass: it counts finished samples and moves
while a generator call is still running (a real model's evaluation sat at 0/16 problems for
minutes when the bar moved once per call), with the tokens generated, tokens/s and an ETA.

The backend reports through `GenerationStats.live` (per decode step in process, per finished
request from a vLLM server); a backend that does not report still moves the bar per finished
problem through `advance`. Off a terminal the bar is a log line every 30 s (flywheel.reporting.bars).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from flywheel.reporting.bars import progress_bar

REFRESH_S = 1.0
"""The bar's token count is redrawn at most this often between finished samples."""


@contextmanager
def sample_bar(generator: Any, problems: int, samples: int, desc: str, show: bool) -> Iterator[Callable[[int], None]]:
    """A bar of `problems * samples` samples listening to `generator`'s stats for the block; yields
    `advance(problems_done)`, the per-problem floor for backends that do not report."""
    bar = progress_bar(problems * samples, desc, "sample", show, leave=False, dynamic_ncols=True)
    stats = getattr(generator, "stats", None)
    before = getattr(stats, "live", None)
    start, tokens, drawn = time.perf_counter(), 0, 0.0

    def postfix() -> None:
        elapsed = max(time.perf_counter() - start, 1e-9)
        bar.set_postfix_str(f"{tokens} tok, {tokens / elapsed:.0f} tok/s", refresh=False)

    def live(new_tokens: int, finished: int) -> None:
        nonlocal tokens, drawn
        tokens += new_tokens
        postfix()
        now = time.perf_counter()
        if finished:
            bar.update(min(finished, bar.total - bar.n))
        elif now - drawn >= REFRESH_S:
            bar.refresh()
        else:
            return
        drawn = now

    def advance(problems_done: int) -> None:
        floor = min(problems_done * samples, bar.total)
        if floor > bar.n:
            bar.update(floor - bar.n)
        bar.refresh()  # once per finished problem: cheap, and never hidden by tqdm's minimum interval

    if stats is not None:
        stats.live = live
    try:
        yield advance
    finally:
        if stats is not None:
            stats.live = before
        bar.close()
