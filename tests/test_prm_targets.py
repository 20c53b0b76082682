"""ReST-MCTS* value targets against hand-worked trees, and their invariants on random trees."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flywheel.prm.targets import remaining_steps, value_targets

#        0 (root)
#        |
#        1 s1 ----------- 5 (bad step) -- 6 incorrect
#        |
#        2 s2
#        |
#        3 s3 -- 7 incorrect
#        |
#        4 correct
PARENT = [-1, 0, 1, 2, 3, 1, 5, 3]
CORRECT = [False, False, False, False, True, False, False, False]


def test_remaining_steps_by_hand():
    m = remaining_steps(PARENT, CORRECT)
    assert m[:5] == [4, 3, 2, 1, 0]
    assert math.isinf(m[5]) and math.isinf(m[6]) and math.isinf(m[7])


def test_correct_four_step_path_gives_quarters_and_the_bad_branch_decays():
    v = value_targets(PARENT, CORRECT)
    assert v[:5] == [0.0, 0.25, 0.5, 0.75, 1.0]
    # Node 5: r = 1, m inherited from node 1 (3): w = (1 - 0.25) / 4 * (-1) = -0.1875.
    assert v[5] == pytest.approx(0.0625)
    # Node 6: w = (1 - 0.0625) / 4 * (-1) = -0.234375 -> clipped at 0.
    assert v[6] == 0.0
    # Node 7 (wrong answer after s3): m inherited from node 3 (1): w = (1 - 0.75) / 2 * (-1).
    assert v[7] == pytest.approx(0.625)


def test_no_correct_terminal_no_targets():
    assert value_targets([-1, 0, 1], [False, False, False]) is None


def test_bad_input():
    with pytest.raises(ValueError, match="parents"):
        value_targets([-1, 0], [False])
    with pytest.raises(ValueError, match="before children"):
        value_targets([-1, 2, 0], [False, False, True])


@st.composite
def trees(draw):
    n = draw(st.integers(2, 40))
    parent = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    leaves = {i for i in range(n)} - set(parent)
    correct = [i in leaves and draw(st.booleans()) for i in range(n)]
    return parent, correct


@settings(max_examples=200, deadline=None)
@given(trees())
def test_targets_stay_in_unit_interval_and_correct_paths_climb(tree):
    parent, correct = tree
    v = value_targets(parent, correct)
    if not any(correct):
        assert v is None
        return
    assert all(0.0 <= x <= 1.0 + 1e-12 for x in v)
    m = remaining_steps(parent, correct)
    for node in range(1, len(parent)):
        if not math.isinf(m[node]):  # on the way to a correct answer the value never drops
            assert v[node] >= v[parent[node]] - 1e-12
        if correct[node]:
            assert v[node] == pytest.approx(1.0)
