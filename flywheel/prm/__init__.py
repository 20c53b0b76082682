"""The process reward (value) model: its network (`model.py`), its training targets from the
search trees (`targets.py`), and `ValueFn`, the one interface every reader of values shares."""

from __future__ import annotations

from typing import Callable, Sequence

ValueFn = Callable[[list[tuple[int, ...]]], Sequence[float]]
"""Token-id sequences (a prompt and the steps of a path so far) -> one value each, the
estimate that the path ends correct: read by the search's node values (PUCT agents), the
self-training path weights and the round protocol, which hands the previous round's value
model to the data module."""
