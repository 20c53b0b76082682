"""Unbiased pass@k (flywheel/reporting/metrics.py) against the closed form 1 - C(n-c, k) / C(n, k) on
hand-worked counts, k = n and c = 0 included; the torchmetric's mean over problems; and the
module's doctests."""

import doctest
import math

import pytest

import flywheel.reporting.metrics as metrics
from flywheel.reporting.metrics import pass_at_k


def test_doctests_run_and_pass():
    result = doctest.testmod(metrics)
    assert result.attempted >= 3 and result.failed == 0


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (8, 3, 1, 3 / 8),  # pass@1 = c / n
        (5, 2, 2, 1 - 3 / 10),  # C(3,2) = 3 of the C(5,2) = 10 pairs are both wrong
        (5, 2, 3, 1 - 1 / 10),  # C(3,3) = 1 of C(5,3) = 10 triples is all wrong
        (10, 3, 5, 1 - 21 / 252),  # C(7,5) = 21, C(10,5) = 252: 11/12
        (6, 1, 3, 1 - 10 / 20),  # C(5,3) = 10, C(6,3) = 20: the one correct is in half the triples
        (4, 1, 4, 1.0),  # k = n: every sample is drawn, so the correct one is too
        (4, 0, 4, 0.0),  # k = n, c = 0: C(4,4) / C(4,4) = 1, nothing to find
        (7, 0, 1, 0.0),  # c = 0
        (7, 0, 5, 0.0),  # c = 0 whatever k
        (7, 7, 1, 1.0),  # all correct
        (9, 6, 4, 1.0),  # n - c = 3 < k = 4: no all-wrong draw exists
    ],
)
def test_pass_at_k_by_hand(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_equals_the_closed_form_on_every_small_count():
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                closed = 1 - math.comb(n - c, k) / math.comb(n, k)  # comb(a, k) = 0 when a < k
                assert pass_at_k(n, c, k) == pytest.approx(closed, abs=1e-12), (n, c, k)


def test_pass_at_k_refuses_impossible_counts():
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(4, 1, 5)  # k > n cannot be estimated from 4 samples
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(4, 1, 0)
