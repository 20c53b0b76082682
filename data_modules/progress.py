"""The progress bar of a search, flat sampling or screening pass, which is also where a
SIGTERM stops the pass (flywheel.run.preemption): after every round of generator calls. Off a
terminal the bar is a log line every 30 s (flywheel.reporting.bars)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

from flywheel.reporting.bars import progress_bar
from flywheel.reporting.sample_bar import sample_bar
from flywheel.run.preemption import stop_point


@contextmanager
def progress(total: int, desc: str, trainer: Any, show: bool, generator: Any = None,
             samples: int = 1) -> Iterator[Callable[..., None]]:
    """Yields `advance(problems_done, tokens=None)`: checks for SIGTERM, then moves the bar
    (shown when `show`, i.e. on rank 0). With `generator` (screening: `samples` per problem) the
    bar counts samples as the generator finishes them (flywheel.reporting.sample_bar)."""
    if generator is not None:
        with sample_bar(generator, total, samples, desc, show) as floor:
            def advance_samples(done: int, tokens: int | None = None) -> None:
                stop_point(trainer)
                floor(done)

            yield advance_samples
        return
    bar = progress_bar(total, desc, "problem", show, leave=False)

    def advance(done: int, tokens: int | None = None) -> None:
        stop_point(trainer)
        bar.update(done - bar.n)
        if tokens is not None:
            bar.set_postfix(tokens=tokens, refresh=False)

    try:
        yield advance
    finally:
        bar.close()
