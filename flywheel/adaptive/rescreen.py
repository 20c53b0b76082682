"""Which training problems one Pass1@K screening measures (deepsearch.md §7).

Under the paper's Eq. 9 (`--data.hard_set.rescreen=hard`) a round's end re-measures the hard
set only, so D_hard(i+1) ⊆ D_hard(i): a problem the policy solved once never comes back,
even if later training makes it fail again. DeepSearch's own continuation from a plateaued
model (issue 32) re-screens the training problems under the current policy every round, and
the tree searches those still below delta. `rescreen=all` does that:

    S_i         = pending ∪ sample(pool \\ pending, screen_problems, seed_i)
    D_hard(i+1) = {x in S_i : Pass1@K(x, pi_i) < delta}      (HardSet.rescreen)

where `pending` are the replay buffer's candidates of round i (the paper rule registers one
only with its post-round rate, so it is always measured) and the sample is the whole rest
of the pool when `screen_problems` is None. D_hard(0) is the same rule with nothing pending.

Cost: K samples per screened problem, i.e. K x (|pending| + min(screen_problems, |pool|))
per round. On 4-number Countdown (4,000 `train` problems) the whole pool is 16,000 samples a
round at K = 4; conf/deepsearch_plateau.yaml screens a sample of 512 (2,048 samples).
"""

from __future__ import annotations

import random
from typing import Iterable, Sequence


def screening_ids(
    pool_ids: Sequence[str], *, sample: int | None, seed: int, always: Iterable[str] = ()
) -> tuple[str, ...]:
    """S_i: the ids of `always` that are in the pool, plus a seeded random sample of `sample`
    of the other pool ids (every one of them when `sample` is None or at least their number),
    in pool order. The same (pool, sample, seed, always) gives the same ids on every rank.

    >>> screening_ids(["a", "b", "c", "d"], sample=None, seed=0, always=["c", "zz"])
    ('a', 'b', 'c', 'd')
    >>> picked = screening_ids(["a", "b", "c", "d", "e"], sample=2, seed=3, always=["d"])
    >>> len(picked), "d" in picked, list(picked) == sorted(picked)
    (3, True, True)
    """
    if sample is not None and sample < 0:
        raise ValueError(f"a screening sample needs sample >= 0 problems, got {sample}")
    pool = tuple(dict.fromkeys(pool_ids))
    must = set(always).intersection(pool)
    rest = [pid for pid in pool if pid not in must]
    chosen = set(rest) if sample is None or sample >= len(rest) else set(random.Random(seed).sample(rest, sample))
    return tuple(pid for pid in pool if pid in must or pid in chosen)
