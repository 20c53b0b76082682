"""The mixed rollout of a replay-buffer problem (deepsearch.md §7): its cached correct
solutions take the first places of the n direct samples."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def direct_samples_needed(num_cached: int, n: int = 8) -> int:
    """How many direct samples a mixed rollout of `n` needs beside `num_cached` cached ones:
    n - min(num_cached, n). A caller may generate just these instead of all n.

    >>> direct_samples_needed(3), direct_samples_needed(10), direct_samples_needed(0)
    (5, 0, 8)
    """
    if n < 1:
        raise ValueError(f"a mixed rollout needs n >= 1 samples, got n={n}")
    return n - min(num_cached, n)


def mixed_rollout(cached: Sequence[T], direct: Sequence[T], n: int = 8) -> list[T]:
    """The n responses of a buffered problem (deepsearch.md §7): n direct (flat) samples
    with the first m = min(len(cached), n) replaced by the first m cached correct ones.

    Returns cached[:m] + the last n - m of direct[:n]: with n direct samples that is
    direct[m:n] (the paper's "replace the first m"); a caller that generated only
    `direct_samples_needed(len(cached), n)` samples gets all of them. Generic over the item
    type. Every returned item is then scored by its outcome reward (+ overlong penalty) and
    that scalar goes to every token (no step values), as for a flat rollout.

    >>> mixed_rollout(["c1", "c2", "c3"], ["d0", "d1", "d2", "d3", "d4", "d5", "d6", "d7"])
    ['c1', 'c2', 'c3', 'd3', 'd4', 'd5', 'd6', 'd7']
    """
    m = min(len(cached), n)
    need = direct_samples_needed(len(cached), n)
    pool = list(direct[:n])
    if len(pool) < need:
        raise ValueError(f"mixed rollout of n={n} with {len(cached)} cached needs {need} direct samples, got {len(direct)}")
    return list(cached[:m]) + pool[len(pool) - need :]
