"""pass@k with the unbiased estimator (Chen et al. 2021), a pure function.

pass@k for one problem with n samples of which c are correct is
    1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n - c + 1}^{n} (1 - k / i),
the probability that k samples drawn without replacement from the n contain a correct one.
pass@1 reduces to c / n.
"""

from __future__ import annotations



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
