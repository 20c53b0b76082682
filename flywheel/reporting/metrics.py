"""pass@k with the unbiased estimator (Chen et al. 2021), as a pure function and a torchmetric.

pass@k for one problem with n samples of which c are correct is
    1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n - c + 1}^{n} (1 - k / i),
the probability that k samples drawn without replacement from the n contain a correct one.
pass@1 reduces to c / n.
"""

from __future__ import annotations

import torch
from torchmetrics import Metric


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with `n` samples, `c` of them correct.

    >>> pass_at_k(4, 1, 1)
    0.25
    >>> round(pass_at_k(4, 1, 2), 4)   # 1 - C(3,2)/C(4,2) = 1 - 3/6
    0.5
    >>> pass_at_k(4, 0, 4), pass_at_k(4, 4, 1)
    (0.0, 1.0)
    """
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n (k={k}, n={n}): draw at least k samples per problem")
    if n - c < k:
        return 1.0
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


class PassAtK(Metric):
    """Mean unbiased pass@k over problems; per-problem (n, c) are kept so any k <= min n works.

    Problems may be sharded unevenly across ranks: the states are concatenated on sync, so the
    result equals the single-process one (no padded duplicates are ever counted).
    """

    full_state_update = False
    higher_is_better = True

    def __init__(self, k: int = 1, **kwargs) -> None:
        super().__init__(**kwargs)
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.k = k
        self.add_state("samples", default=[], dist_reduce_fx="cat")
        self.add_state("correct", default=[], dist_reduce_fx="cat")

    def update(self, samples: torch.Tensor, correct: torch.Tensor) -> None:
        """samples, correct: [P] counts per problem."""
        self.samples.append(torch.as_tensor(samples, dtype=torch.long).reshape(-1))
        self.correct.append(torch.as_tensor(correct, dtype=torch.long).reshape(-1))

    def compute(self) -> torch.Tensor:
        samples = _flat(self.samples)
        correct = _flat(self.correct)
        if samples.numel() == 0:
            return torch.tensor(float("nan"))
        values = [pass_at_k(int(n), int(c), self.k) for n, c in zip(samples.tolist(), correct.tolist())]
        return torch.tensor(sum(values) / len(values), dtype=torch.float64)


def _flat(state: list[torch.Tensor] | torch.Tensor) -> torch.Tensor:
    if isinstance(state, torch.Tensor):
        return state.reshape(-1)
    return torch.cat(state) if state else torch.zeros(0, dtype=torch.long)
