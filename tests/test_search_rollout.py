"""Rollout expansion (search.expansion="rollout") and the early stop of solved trees, on
scripted generators with hand-worked trees.

Toy vocabulary (scripted): 1 = EOS, 2 = correct answer "C", 3 = wrong
answer "W", 4 = newline (the step delimiter here), 5.. = filler "x".
"""

from __future__ import annotations

import math
import random

import pytest

from flywheel.search.config import SearchAblations
from flywheel.generation.base import Completion
from flywheel.search import SearchConfig, SearchProblem, run_search
from flywheel.search.rollout import UctForkSettings, fork_random, fork_root, fork_uct, insert_path, split_steps
from flywheel.search.selection import ForkSettings, UctSettings, fork_candidates
from scripted import EOS, NEWLINE, ScriptedGenerator, toy_decode, toy_score
from flywheel.search.tree import SearchTree
from flywheel.tasks.base import StepSpec

STEP = StepSpec(max_tokens=3, delimiter="\n")


def c(tokens, logprob=-1.0, finish="eos") -> Completion:
    return Completion(tuple(tokens), (logprob,) * len(tokens), finish)


def is_newline(piece) -> bool:
    return piece[-1] == NEWLINE


def test_split_steps_cuts_at_delimiters_caps_and_max_depth():
    # "x\nxxxx\nC" + EOS: the delimiter ends step 1; step 2 hits the 3-token cap ("length")
    # after x x x; the rest "x\n" is step 3; "C EOS" step 4 keeps the completion's "eos".
    whole = c((5, NEWLINE, 5, 5, 5, 5, NEWLINE, 2, EOS))
    pieces = split_steps(whole, STEP, is_newline, max_steps=8)
    assert [p.token_ids for p in pieces] == [(5, NEWLINE), (5, 5, 5), (5, NEWLINE), (2, EOS)]
    assert [p.finish_reason for p in pieces] == ["stop", "length", "stop", "eos"]
    assert sum(len(p.logprobs) for p in pieces) == 9
    # Two steps left above max depth: the rest is dropped.
    assert [p.token_ids for p in split_steps(whole, STEP, is_newline, max_steps=2)] == [(5, NEWLINE), (5, 5, 5)]
    # Fixed chunks (no delimiter): every 3 tokens, the last piece shorter.
    chunks = split_steps(whole, StepSpec(max_tokens=3), is_newline, max_steps=8)
    assert [p.token_ids for p in chunks] == [(5, NEWLINE, 5), (5, 5, 5), (NEWLINE, 2, EOS)]
    assert chunks[-1].finish_reason == "eos"


def test_insert_path_merges_repeated_steps_into_a_trie():
    tree = SearchTree((0,))
    last, new = insert_path(tree, 0, [c((5, 4), finish="stop"), c((3, EOS))], terminal_last=True, merge=True)
    assert (last, new) == (2, [1, 2]) and tree.terminal[2]
    last, new = insert_path(tree, 0, [c((5, 4), finish="stop"), c((2, EOS))], terminal_last=True, merge=True)
    assert (last, new) == (3, [3]) and tree.children[1] == (2, 3)  # the first step is node 1 again
    last, new = insert_path(tree, 0, [c((5, 4), finish="stop"), c((2, EOS))], terminal_last=True, merge=True)
    assert (last, new) == (3, [])  # the whole path repeats: nothing new
    last, new = insert_path(tree, 0, [c((5, 4), finish="stop")], terminal_last=False, merge=False)
    assert new == [4] and tree.children[0] == (1, 4)  # without merging, a second copy


def test_extending_a_dead_node_revives_it_and_its_ancestors():
    tree = SearchTree((0,))
    (a,) = tree.add_children(0, [c((5,), finish="stop")], [False])
    tree.add_children(a, [c((3, EOS))], [True])  # a's only child is terminal: a and the root die
    assert tree.dead[a] and tree.dead[0]
    (b,) = tree.add_children(a, [c((6,), finish="stop")], [False], extend=True)
    assert not tree.dead[a] and not tree.dead[0] and tree.live_children[0] == 1 and tree.live_children[a] == 1
    assert tree.frontier == {a: [b]}
    with pytest.raises(ValueError, match="already expanded"):
        tree.add_children(a, [c((7,), finish="stop")], [False])


ROLLOUT_SCRIPT = {
    (0,): [c((5, NEWLINE, 6, NEWLINE, 3, EOS)), c((5, NEWLINE, 2, EOS))],
    (0, 5, NEWLINE): [c((6, NEWLINE, 2, EOS)), c((2, EOS))],
}


def test_rollout_tree_reproduced_exactly():
    """n = 2, K = 3, d_T = 3, uct_lambda 0.5, paper gammas max(i / l, 0.1).

    expansion 1 (root, max_new_tokens 3 steps x 3 = 9):
      R1 "x\\n x\\n W": nodes 1 (x\\n), 2 (x\\n), 3 (W, terminal, depth 3) -> wrong, -1.
        root q 0.1 * -1 = -0.1, N 0+1; node 1 q -1/3, N 1+1; node 2 q -2/3, N 1+1; node 3 q -1, N 1.
      R2 "x\\n C": its first step is node 1 again; node 4 (C, depth 2) -> correct, +1.
        root q -0.1 < 0 and r > 0 -> 0.1 * 1 = 0.1, N 2; node 1 -> 0.5 * 1 = 0.5, N 3; node 4 q 1, N 1.
    fork: candidates root, 1, 2 (node 2 is at depth 2 < 3). Score Q + 0.5 sqrt(ln N(root) / N), N(root) 2:
      root 0.05 + 0.5 sqrt(0.6931 / 2) = 0.3444; node 1 0.1667 + 0.5 sqrt(0.6931 / 3) = 0.4070;
      node 2 -0.3333 + 0.2944 = -0.0390 -> node 1.
    expansion 2 (node 1, 2 steps left: max_new_tokens 6):
      R3 "x\\n C": first step = node 2; node 5 (C, depth 3) -> +1: root 0.1 + 0.1 = 0.2, N 3;
        node 1 0.5 + 1/3, N 4; node 2 was -2/3 < 0 -> overwritten 2/3 * 1, N 3; node 5 q 1, N 1.
      R4 "C": the same path as node 4 -> nothing new; backed up again (statistics): root 0.3,
        N 4; node 1 1.3333, N 5; node 4 q 2, N 2. Not a new trajectory.
    4 rollouts >= K = 3: complete, with 3 distinct trajectories.
    """
    gen = ScriptedGenerator(ROLLOUT_SCRIPT)
    cfg = SearchConfig(expansion="rollout", expansion_width=2, trajectories_per_tree=3, max_depth=3, uct_lambda=0.5,
                       merge_duplicate_steps=True, overlong_penalty=False)
    problem = SearchProblem((0,), toy_score, id="p")
    (res,) = run_search([problem], gen, cfg, step=STEP, decode=toy_decode)
    tree = res.tree
    assert res.status == "complete" and res.stats.expansions == 2 and res.stats.terminals == 3
    assert [call[0].prompt_ids for call in gen.calls] == [(0,), (0, 5, NEWLINE)]
    assert [call[0].params.max_new_tokens for call in gen.calls] == [9, 6]
    assert all(call[0].params.stop_strings == () for call in gen.calls)
    assert tree.parent == [-1, 0, 1, 2, 1, 2]
    assert tree.children == [(1,), (2, 4), (3, 5), (), (), ()]
    assert tree.visits == [4, 5, 3, 1, 2, 1]
    assert tree.value == pytest.approx([0.3, 4 / 3, 2 / 3, -1.0, 2.0, 1.0])
    assert tree.expanded == [1, 1, 0, 0, 0, 0]
    assert [t.terminal_id for t in res.trajectories] == [3, 4, 5]
    assert [t.kind for t in res.trajectories] == ["incorrect", "correct", "correct"]
    assert res.stats.generated_tokens == 6 + 4 + 4 + 2
    assert res.stats.tokens_to_first_correct == 10  # both rollouts of the first expansion
    assert [t.response_text for t in res.trajectories] == ["x\nx\nW", "x\nC", "x\nx\nC"]


def test_fork_rules_and_the_children_cap():
    tree = SearchTree((0,))
    insert_path(tree, 0, [c((5, 4), finish="stop"), c((6, 4), finish="stop"), c((3, EOS))], True, merge=True)
    cfg = ForkSettings(max_depth=3)
    assert fork_candidates(tree, cfg) == [0, 1, 2]  # the terminal (3) never
    assert fork_candidates(tree, ForkSettings(max_depth=2)) == [0, 1]  # depth 2 is max depth
    capped = ForkSettings(max_depth=3, max_children=1)
    assert fork_candidates(tree, capped) == []
    picks = {fork_random(cfg, tree, random.Random(s)) for s in range(40)}
    assert picks == {0, 1, 2}
    assert fork_root(cfg, tree, random.Random(0)) == 0
    assert fork_root(capped, tree, random.Random(0)) is None  # the root is full: nothing to fork from
    # uct with no backup yet: every Q is 0 and N(root) = 0 gives no bonus: the lowest id.
    assert fork_uct(UctForkSettings(cfg, UctSettings()), tree, random.Random(0)) == 0


def test_rollouts_longer_than_max_depth_end_as_incomplete_terminals():
    # d_T = 2: "x\n x\n x\n C" is cut after 2 steps; the second sits at max depth: terminal,
    # no EOS and no answer in "x\nx\n" -> incomplete (-1).
    gen = ScriptedGenerator({(0,): [c((5, NEWLINE, 5, NEWLINE, 5, NEWLINE, 2, EOS))]})
    cfg = SearchConfig(expansion="rollout", expansion_width=1, trajectories_per_tree=1, max_depth=2, overlong_penalty=False)
    (res,) = run_search([SearchProblem((0,), toy_score)], gen, cfg, step=STEP, decode=toy_decode)
    (traj,) = res.trajectories
    assert traj.kind == "incomplete" and traj.reward == -1.0 and len(traj.steps) == 2
    assert res.stats.generated_tokens == 8  # what was generated is counted, cut or not


def test_stop_when_solved_ends_a_solved_tree_early_and_keeps_unsolved_ones_going():
    # Step mode, n = 2, K = 4: the root's two children are terminal; the solved tree stops
    # with its 2 trajectories... only once it holds stop_when_solved = 2 of them.
    solved = {(0,): [c((2, EOS)), c((3, EOS))]}
    gen = ScriptedGenerator(solved)
    cfg = SearchConfig(expansion_width=2, trajectories_per_tree=4, max_depth=2, ablations=SearchAblations(backup_all_terminals=True),
                       stop_when_solved=2, overlong_penalty=False)
    (res,) = run_search([SearchProblem((0,), toy_score)], gen, cfg, step=StepSpec(max_tokens=2), decode=toy_decode)
    assert res.status == "solved" and res.complete and len(res.trajectories) == 2
    # Unsolved: both wrong; nothing else to expand -> exhausted (short), not "solved".
    gen = ScriptedGenerator({(0,): [c((3, EOS)), c((3, 3, EOS)[:2])]})
    (res,) = run_search([SearchProblem((0,), toy_score)], gen, cfg, step=StepSpec(max_tokens=2), decode=toy_decode)
    assert res.status == "exhausted" and not res.complete
    with pytest.raises(ValueError, match="stop_when_solved"):
        SearchConfig(stop_when_solved=-1)


def test_rollout_mode_reaches_every_generated_token_to_a_terminal():
    """With a random generator, every node of a rollout tree lies on a root-to-terminal path
    (no dangling partial steps), and tokens = the distinct nodes' tokens + what merged copies cost."""
    from scripted import HashGenerator

    gen = HashGenerator(eos_prob=0.3, correct_prob=0.2, salt=3)
    cfg = SearchConfig(expansion="rollout", expansion_width=4, trajectories_per_tree=12, max_depth=6,
                       max_expansions_per_tree=20, overlong_penalty=False)
    problems = [SearchProblem((0, i), toy_score, id=str(i)) for i in range(6)]
    for res in run_search(problems, gen, cfg, step=StepSpec(max_tokens=4, delimiter="\n"), decode=toy_decode):
        tree = res.tree
        for v in range(1, len(tree)):
            assert tree.terminal[v] or tree.children[v], f"node {v} is a dangling partial step"
        stored = sum(len(t) for t in tree.tokens)
        assert res.stats.generated_tokens >= stored
        assert all(math.isfinite(tree.value[v]) for v in range(len(tree)))


def test_train_all_terminals_and_subtree_rows():
    """The driver's small step-mode tree (tests/test_search_driver.py): root -> A(1), B(2);
    A -> C(3) correct, D(4) wrong; B -> E(5), F(6) wrong. K = 2 backs up C and F; D is graded
    but never backed up. With train_all_terminals D is trained on too (backup_index -1).

    Subtree credit over C, F, D (finals +1, -1, -1): V(root) = -1/3; V(A) = 0 (2 below it);
    V(B) = V(F) = V(D) = -1; V(C) = 1.
      C row: A ((0 + 1/3) * 2) / sqrt(2) = 0.4714, C (1 - 0) + (1 + 1/3) = 2.3333
      F row: B (-2/3) * 2 = -1.3333, F (-1 + 1) + (-1 + 1/3) = -0.6667
      D row: A 0.4714, D (-1 - 0) + (-1 + 1/3) = -1.6667
    Every step is 2 tokens long.
    """
    from flywheel.objectives.credit import Credit, Group, credit_groups
    from tests.test_search_driver import SMALL_SCRIPT

    cfg = SearchConfig(expansion_width=2, trajectories_per_tree=2, max_depth=3, overlong_penalty=False,
                       ablations=SearchAblations(train_all_terminals=True))
    (res,) = run_search([SearchProblem((0,), toy_score)], ScriptedGenerator(SMALL_SCRIPT), cfg,
                        step=StepSpec(max_tokens=2), decode=toy_decode)
    assert [(t.terminal_id, t.backup_index) for t in res.trajectories] == [(3, 0), (6, 1), (4, -1)]
    rows = credit_groups([Group.of(res)], Credit(advantage="subtree")).rows[0]
    expected = [[0.471405, 2.333333], [-1.333333, -0.666667], [0.471405, -1.666667]]
    for row, steps in zip(rows, expected):
        assert row.advantages == pytest.approx([a for a in steps for _ in range(2)], abs=1e-6)
    # Without the switch only the K backed-up terminals are trained on.
    (res,) = run_search([SearchProblem((0,), toy_score)], ScriptedGenerator(SMALL_SCRIPT),
                        SearchConfig(expansion_width=2, trajectories_per_tree=2, max_depth=3, overlong_penalty=False),
                        step=StepSpec(max_tokens=2), decode=toy_decode)
    assert [t.terminal_id for t in res.trajectories] == [3, 6]
