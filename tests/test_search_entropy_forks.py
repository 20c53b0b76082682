"""Entropy forks (search.fork_rule="entropy", flywheel/search/entropy_forks.py) and the
search side of distinct children (search.distinct_children), on scripted generators with
hand-worked trees.

Toy vocabulary (scripted): 1 = EOS, 2 = correct answer "C", 3 = wrong
answer "W", 4 = newline (the step delimiter here), 5.. = filler "x".
"""

from __future__ import annotations

import doctest
from dataclasses import replace
import random

import pytest

import flywheel.search.entropy_forks as entropy_forks_mod
from flywheel.search.config import SearchAblations, RolloutSettings
from flywheel.generation.base import Completion
from flywheel.search import SearchConfig, SearchProblem, run_search
from flywheel.search.entropy_forks import EntropyForkSettings, cut_at_entropy, fork_entropy, open_step, top_entropy_positions
from flywheel.search.flat import flat_rollouts
from flywheel.search.rollout import insert_path, split_steps
from flywheel.search.selection import ForkSettings
from scripted import EOS, NEWLINE, ScriptedGenerator, toy_decode, toy_score
from flywheel.search.tree import SearchTree
from flywheel.tasks.base import StepSpec

STEP = StepSpec(max_tokens=3, delimiter="\n")


def c(tokens, entropies=None, finish="eos") -> Completion:
    ents = tuple(entropies) if entropies is not None else (0.5,) * len(tokens)
    return Completion(tuple(tokens), (-1.0,) * len(tokens), finish, ents)


def test_docstring_examples():
    result = doctest.testmod(entropy_forks_mod)
    assert result.attempted > 0 and result.failed == 0


def test_top_entropy_positions_skip_nan_and_break_ties_to_the_earlier():
    ents = [3.0, 1.0, 2.0, float("nan"), 2.0, 0.5]
    assert top_entropy_positions(ents, 1, 1, 6) == [2]  # 3.0 at 0 is below lo; 2.0 at 2 before 2.0 at 4
    assert top_entropy_positions(ents, 3, 1, 6) == [1, 2, 4]
    assert top_entropy_positions(ents, 9, 0, 6) == [0, 1, 2, 4, 5]  # NaN never
    assert top_entropy_positions(ents, 2, 1, 1) == []


def test_cuts_inside_a_step_and_at_a_step_boundary():
    """Steps x x \\n | W EOS, entropies 0.1 0.9 0.2 | 0.8 0.3. Top 2 after the first token:
    0.9 at token 1 (inside step 1: cut into (5,) mid-step + (6, 4)) and 0.8 at token 3 (the first
    token of step 2: no new piece, the node of (6, 4) is the fork point)."""
    steps = [c((5, 6, NEWLINE), (0.1, 0.9, 0.2), "stop"), c((3, EOS), (0.8, 0.3))]
    pieces, mid, forks = cut_at_entropy(EntropyForkSettings(per_chain=2), steps, 0)
    assert [p.token_ids for p in pieces] == [(5,), (6, NEWLINE), (3, EOS)]
    assert [p.finish_reason for p in pieces] == ["length", "stop", "eos"]
    assert [p.entropies for p in pieces] == [(0.1,), (0.9, 0.2), (0.8, 0.3)]
    assert mid == [True, False, False]
    assert forks == {1: 0.9, 2: 0.8}
    # Only one cut: the 0.9 token. The first token (0.1 here, 5.0 below) is never a cut.
    steps[0] = c((5, 6, NEWLINE), (5.0, 0.9, 0.2), "stop")
    pieces, mid, forks = cut_at_entropy(EntropyForkSettings(per_chain=1), steps, 0)
    assert [p.token_ids for p in pieces] == [(5,), (6, NEWLINE), (3, EOS)] and forks == {1: 0.9}
    # Step 1 repeats an existing node (first_new = 1): only step 2's tokens are candidates.
    pieces, mid, forks = cut_at_entropy(EntropyForkSettings(per_chain=1), steps, 1)
    assert [p.token_ids for p in pieces] == [(5, 6, NEWLINE), (3, EOS)] and mid == [False, False] and forks == {1: 0.8}
    with pytest.raises(RuntimeError, match="fork_rule='entropy' needs per-token entropies"):
        cut_at_entropy(EntropyForkSettings(), [Completion((5, EOS), (-1.0, -1.0), "eos")], 0)


def test_a_fork_inside_a_step_continues_that_step():
    # Cap 3: the open step holds 1 token, so the first piece is capped after 2 more ("length").
    whole = c((8, 8, 8, NEWLINE, 2, EOS))
    pieces = split_steps(whole, STEP, lambda p: p[-1] == NEWLINE, max_steps=3, open_step=(6,))
    assert [p.token_ids for p in pieces] == [(8, 8), (8, NEWLINE), (2, EOS)]
    assert [p.finish_reason for p in pieces] == ["length", "stop", "eos"]
    # A two-token delimiter "\n\n" split by the cut: the first new token completes it.
    double = StepSpec(max_tokens=8, delimiter="\n\n")
    ends = lambda p: tuple(p[-2:]) == (NEWLINE, NEWLINE)  # noqa: E731
    pieces = split_steps(c((NEWLINE, 5, EOS)), double, ends, max_steps=3, open_step=(5, NEWLINE))
    assert [p.token_ids for p in pieces] == [(NEWLINE,), (5, EOS)]
    assert [p.token_ids for p in split_steps(c((NEWLINE, 5, EOS)), double, ends, max_steps=3)] == [(NEWLINE, 5, EOS)]


def test_mid_step_nodes_keep_their_parents_depth():
    tree = SearchTree((0,))
    pieces = [c((5, NEWLINE), finish="stop"), c((6,), finish="length"), c((7, NEWLINE), finish="stop")]
    path: list[int] = []
    last, new = insert_path(tree, 0, pieces, False, merge=True, mid_step=[False, True, False], path=path)
    assert path == new == [1, 2, 3] and tree.depth == [0, 1, 1, 2] and tree.mid_step == [False, False, True, False]
    assert open_step(tree, 2) == (6,) and open_step(tree, 3) == () and open_step(tree, 1) == ()
    # A full step with the same tokens as a mid-step node is not that node.
    last, new = insert_path(tree, 1, [c((6,), finish="eos")], True, merge=True, path=path)
    assert new == [4] and tree.depth[4] == 2
    with pytest.raises(ValueError, match="cannot end inside a step"):
        tree.add_children(1, [c((9,))], [True], extend=True, mid_step=[True])


ENTROPY_SCRIPT = {
    # R1 "x\n xx\n W": steps (5 \n) (6 7 \n) (3 EOS); top entropy 2.0 at token 7, inside step 2.
    # R2 "x\n W": steps (5 \n) (3 EOS); step 1 repeats node 1; top entropy 1.5 at W, a step start.
    (0,): [c((5, NEWLINE, 6, 7, NEWLINE, 3, EOS), (0.1, 0.1, 0.3, 2.0, 0.1, 0.2, 0.1)),
           c((5, NEWLINE, 3, EOS), (0.1, 0.1, 1.5, 0.1))],
    # From node 2 (the open step holds 6): "x\n" completes step 2, "C" is step 3.
    (0, 5, NEWLINE, 6): [c((8, NEWLINE, 2, EOS), (0.3, 0.1, 0.2, 0.1))],
}


def test_entropy_fork_tree_reproduced_exactly():
    """n = 2 at the root, fork_width T = 1, N = 1 cut per rollout, K = 3, d_T = 3, merge on,
    paper gammas max(i / l, 0.1), constrained backup.

    expansion 1 (root, 3 steps x 3 = 9 tokens, entropies asked for):
      R1 -> node 1 (5 \\n, depth 1), node 2 (6, mid-step: depth 1), node 3 (7 \\n, depth 2),
        node 4 (W EOS, depth 3: 3 steps fit d_T = 3 although the path has 4 nodes) -> wrong, -1.
        fork point node 2 (2.0). Backup l = 3: root 0.1 * -1 = -0.1; nodes 1 and 2 (depth 1)
        -1/3; node 3 -2/3; node 4 -1. N: root 1, nodes 1-3 2 (1 at creation), node 4 1.
      R2 -> step 1 is node 1 (not cut: an existing node); node 5 (W EOS, depth 2) -> -1.
        fork point node 1 (1.5, the token after it). Backup l = 2: root -0.2, N 2;
        node 1 -1/3 - 1/2 = -5/6, N 3; node 5 -1.
    fork: untried fork points node 2 (2.0) and node 1 (1.5) -> node 2.
    expansion 2 (node 2, T = 1; 2 steps left minus the open step's 1 token: 5 tokens):
      R3 -> node 6 (8 \\n, completes step 2: depth 2), node 7 (C EOS, depth 3) -> +1.
        fork point node 6 (0.2 at C). Backup l = 3 (constrained: a negative q on a correct
        path becomes gamma * 1): root 0.1, N 3; node 1 1/3, N 4; node 2 1/3, N 3;
        node 6 0 + 2/3, N 2; node 7 1, N 1.
    3 rollouts = K: complete.
    """
    gen = ScriptedGenerator(ENTROPY_SCRIPT)
    cfg = SearchConfig(expansion="rollout", fork_rule="entropy", expansion_width=2,
                       rollout=RolloutSettings(fork_width=1, entropy_forks_per_chain=1), trajectories_per_tree=3, max_depth=3, merge_duplicate_steps=True,
                       overlong_penalty=False)
    (res,) = run_search([SearchProblem((0,), toy_score, id="p")], gen, cfg, step=STEP, decode=toy_decode)
    tree = res.tree
    assert res.status == "complete" and res.stats.expansions == 2
    assert [(r.prompt_ids, r.n, r.params.max_new_tokens) for (r,) in gen.calls] == [((0,), 2, 9), ((0, 5, NEWLINE, 6), 1, 5)]
    assert all(r.params.top_logprobs == cfg.entropy_top_k for (r,) in gen.calls)
    assert tree.parent == [-1, 0, 1, 2, 3, 1, 2, 6]
    assert tree.tokens[1:] == [(5, NEWLINE), (6,), (7, NEWLINE), (3, EOS), (3, EOS), (8, NEWLINE), (2, EOS)]
    assert tree.depth == [0, 1, 1, 2, 3, 2, 2, 3]
    assert tree.mid_step == [False, False, True, False, False, False, False, False]
    assert tree.fork_points == {2: 2.0, 1: 1.5, 6: 0.2}
    assert tree.expanded == [1, 0, 1, 0, 0, 0, 0, 0]
    assert tree.visits == [3, 4, 3, 2, 1, 1, 2, 1]
    assert tree.value == pytest.approx([0.1, 1 / 3, 1 / 3, -2 / 3, -1.0, -1.0, 2 / 3, 1.0])
    assert [(t.terminal_id, t.kind) for t in res.trajectories] == [(4, "incorrect"), (5, "incorrect"), (7, "correct")]
    assert [t.response_text for t in res.trajectories] == ["x\nxx\nW", "x\nW", "x\nxx\nC"]
    # Trajectories: 4 nodes but 3 steps for R1 and R3; depth counts steps, the spans are the nodes.
    assert [len(t.steps) for t in res.trajectories] == [4, 2, 4]
    assert [t.steps[-1].depth for t in res.trajectories] == [3, 2, 3]
    assert res.trajectories[2].response_ids == (5, NEWLINE, 6, 8, NEWLINE, 2, EOS)
    assert res.stats.generated_tokens == 7 + 4 + 4
    # The logged search/depth counts steps too: (3 + 2 + 3) / 3, not the nodes' (4 + 2 + 4) / 3.
    from data_modules.epoch_metrics import epoch_metrics
    from flywheel.search.driver import DriverStats

    assert epoch_metrics([res], DriverStats(), 1.0, 0, None)["search/depth"] == pytest.approx(8 / 3)


def test_the_same_rollout_forked_at_steps_only_has_one_node_per_step():
    """The control: fork_rule uct cuts R1 at its steps only (3 nodes, depths 1, 2, 3); the
    entropy cut adds a node but no depth, so both trees grade R1 as a full 3-step answer."""
    cfg = SearchConfig(expansion="rollout", expansion_width=1, trajectories_per_tree=1, max_depth=3,
                       overlong_penalty=False)
    script = {(0,): ENTROPY_SCRIPT[(0,)][:1]}
    (uct,) = run_search([SearchProblem((0,), toy_score)], ScriptedGenerator(script), cfg, step=STEP, decode=toy_decode)
    (ent,) = run_search([SearchProblem((0,), toy_score)], ScriptedGenerator(script),
                        replace(cfg, fork_rule="entropy", rollout=RolloutSettings(entropy_forks_per_chain=1)),
                        step=STEP, decode=toy_decode)
    assert uct.tree.depth == [0, 1, 2, 3] and ent.tree.depth == [0, 1, 1, 2, 3]
    assert uct.trajectories[0].kind == ent.trajectories[0].kind == "incorrect"
    assert uct.trajectories[0].response_ids == ent.trajectories[0].response_ids


def test_fork_entropy_picks_the_untried_highest_then_the_root():
    tree = SearchTree((0,))
    insert_path(tree, 0, [c((5, NEWLINE), finish="stop"), c((6,), finish="length"), c((7, NEWLINE), finish="stop"),
                          c((3, EOS))], True, merge=False, mid_step=[False, True, False, False])
    rng = random.Random(0)
    cfg = EntropyForkSettings(ForkSettings(max_depth=3))
    assert fork_entropy(cfg, tree, rng) == 0  # no fork point yet: the root
    tree.fork_points.update({1: 0.7, 2: 0.9, 3: 0.9})
    assert fork_entropy(cfg, tree, rng) == 2  # 0.9 tie: the lower id
    tree.expanded[2] = 1
    assert fork_entropy(cfg, tree, rng) == 3
    assert fork_entropy(EntropyForkSettings(ForkSettings(max_depth=2)), tree, rng) == 1  # 3 at d_T
    tree.expanded[3] = tree.expanded[1] = 1
    assert fork_entropy(cfg, tree, rng) == 0  # every fork point tried: fresh rollouts
    capped = EntropyForkSettings(ForkSettings(max_depth=3, max_children=1))
    assert fork_entropy(capped, tree, rng) is None  # and the root is full


def test_config_checks_name_the_flag():
    with pytest.raises(ValueError, match="entropy_forks_per_chain >= 1"):
        SearchConfig(expansion="rollout", fork_rule="entropy", rollout=RolloutSettings(entropy_forks_per_chain=0))
    with pytest.raises(ValueError, match="entropy_top_k >= 1"):
        SearchConfig(expansion="rollout", fork_rule="entropy", entropy_top_k=0)
    with pytest.raises(ValueError, match="--data.search.rollout.fork_width=2 .* --data.search.expansion=rollout"):
        SearchConfig(rollout=RolloutSettings(fork_width=2))
    with pytest.raises(ValueError, match="--data.search.rollout.fork_width must be in"):
        RolloutSettings(fork_width=-1)
    assert SearchConfig(expansion="rollout", rollout=RolloutSettings(fork_width=2)).rollout.fork_width == 2


# ----------------------------------------------------------------- distinct children, search side
def test_distinct_children_reaches_the_tree_requests_only():
    """The switch marks every expansion request of a tree (rollout and step mode); flat rollouts
    (the control, and bench_explore's flat arm) keep independent samples."""
    script = {(0,): [c((2, EOS)), c((3, EOS))]}
    for expansion in ("rollout", "step"):
        for on in (False, True):
            gen = ScriptedGenerator(script)
            cfg = SearchConfig(expansion=expansion, expansion_width=2, trajectories_per_tree=2, max_depth=2,
                               ablations=SearchAblations(backup_all_terminals=True), distinct_children=on, overlong_penalty=False)
            run_search([SearchProblem((0,), toy_score)], gen, cfg, step=StepSpec(max_tokens=2), decode=toy_decode)
            assert [r.params.distinct_first_token for call in gen.calls for r in call] == [on], (expansion, on)
    gen = ScriptedGenerator(script)
    cfg = SearchConfig(distinct_children=True, max_depth=2)
    flat_rollouts([SearchProblem((0,), toy_score)], gen, n=2, step=StepSpec(max_tokens=2), decode=toy_decode, config=cfg)
    assert not any(r.params.distinct_first_token for call in gen.calls for r in call)
