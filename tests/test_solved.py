"""The run's solved training problems (data_modules/solved.py), by hand: the ledger keeps each
problem's first solve and the round's set; an epoch's solved ids are read from the verdicts of
what it generated, so a correct terminal that was not backed up counts and a mixed rollout's
replayed cached solutions do not (a real `rollout` on a scripted generator).

Toy vocabulary (scripted): 1 = EOS, 2 = correct answer "C", 3 = wrong answer "W".
"""

from __future__ import annotations

import pytest

from data_modules.curriculum import Curriculum
from data_modules.solved import FirstSolve, SolvedLedger, solved_ids
from flywheel.adaptive import CachedSolution, HardSetConfig, ReplayConfig
from flywheel.search import SearchConfig, SearchProblem
from flywheel.search.expansion import grade_terminal
from flywheel.search.outputs import TreeResult, TreeStats, build_trajectory
from scripted import EOS, ScriptedGenerator, toy_decode, toy_score
from flywheel.search.tree import ROOT, SearchTree
from flywheel.tasks.base import Problem
from tests.test_flat_first import ToyTask, ToyTokenizer, c

C, W = 2, 3
CONFIG = SearchConfig(max_depth=3, overlong_penalty=False)


def test_the_first_solve_is_kept_and_each_round_counts_its_own():
    ledger = SolvedLedger()
    ledger.add({"b", "a"}, round=0, tokens=100)  # epoch 0: a and b solved, 100 training tokens so far
    ledger.add({"a", "c"}, round=0, tokens=250)  # epoch 1: a again (kept from epoch 0), c new
    assert ledger.first == {"a": FirstSolve(0, 100), "b": FirstSolve(0, 100), "c": FirstSolve(0, 250)}
    assert ledger.round_facts() == {"solved_problems": 3, "first_solved": 3}  # round 0: a, b, c, all new
    ledger.add({"c", "d"}, round=1, tokens=400)  # round 1's first epoch: its set starts empty
    assert ledger.this_round == {"c", "d"} and ledger.first["c"] == FirstSolve(0, 250)
    assert ledger.first["d"] == FirstSolve(1, 400)
    assert ledger.round_facts() == {"solved_problems": 2, "first_solved": 1}  # c was round 0's
    ledger.add(set(), round=2, tokens=500)  # round 2 solves nothing: its set is empty, not round 1's
    assert ledger.round_facts() == {"solved_problems": 0, "first_solved": 0} and len(ledger.first) == 4
    # The file: every problem ever solved, in the order first solved (ties by id).
    assert ledger.to_json() == {"format": "flywheel.solved/v1", "problems": {
        "a": {"round": 1, "tokens": 100}, "b": {"round": 1, "tokens": 100}, "c": {"round": 1, "tokens": 250},
        "d": {"round": 2, "tokens": 400}}}  # the summary rows' rounds (1-based)


def test_the_ledger_state_round_trips():
    ledger = SolvedLedger()
    ledger.add({"a"}, round=0, tokens=10)
    ledger.add({"a", "b"}, round=1, tokens=30)
    back = SolvedLedger()
    back.load_state_dict(ledger.state_dict())
    assert (back.first, back.this_round, back.round) == (ledger.first, {"a", "b"}, 1)
    assert back.state_dict() == ledger.state_dict() and back.round_facts() == {"solved_problems": 2, "first_solved": 1}


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.update(format="x"), "format"),
    (lambda s: s.pop("problems"), "malformed"),
    (lambda s: s["problems"]["a"].pop("tokens"), "malformed"),
    (lambda s: s["problems"]["a"].update(tokens=-1), "'tokens' must be an integer >= 0"),
    (lambda s: s["problems"]["a"].update(round=1.0), "'round' must be an integer >= 0"),
    (lambda s: s.update(round=True), "'round' must be an integer"),
    (lambda s: s.update(this_round=["a", "z"]), r"\['z'\] solved in round 1 but without a first solve"),
    (lambda s: s.update(round=0), "a first solve after the ledger's round 0"),
    (lambda s: s.update(problems={7: {"round": 0, "tokens": 1}}, this_round=[]), "ids must be strings"),
])
def test_a_malformed_ledger_state_is_refused(edit, message):
    ledger = SolvedLedger()
    ledger.add({"a"}, round=0, tokens=10)
    ledger.add({"b"}, round=1, tokens=20)
    state = ledger.state_dict()
    edit(state)
    back = SolvedLedger()
    with pytest.raises(ValueError, match=message):
        back.load_state_dict(state)
    assert back.first == {} and back.round == 0  # nothing restored


def test_the_curriculum_keeps_the_ledger_and_an_old_checkpoint_starts_it_empty():
    c = Curriculum(HardSetConfig(), ReplayConfig(), epochs_per_round=1, seed=0)
    c.count_solved([{"a"}, {"b", "a"}], tokens=64)  # two ranks' ids, merged
    assert c.solved.first == {"a": FirstSolve(0, 64), "b": FirstSolve(0, 64)}
    state = c.state_dict()
    back = Curriculum(HardSetConfig(), ReplayConfig(), epochs_per_round=1, seed=0)
    back.load_state_dict(state)
    assert back.solved.state_dict() == state["solved"]
    del state["solved"]  # a checkpoint from before solved problems were kept
    back.load_state_dict(state)
    assert back.solved.first == {} and back.solved.round_facts() == {"solved_problems": 0, "first_solved": 0}


def graded_tree(problem_id: str, responses: list[tuple[int, ...]], backed_up: int) -> TreeResult:
    """A one-level tree: every response a graded terminal under the root, the first `backed_up`
    of them backed up (the trajectories)."""
    tree = SearchTree((0, 10))
    nodes = tree.add_children(ROOT, [c(r) for r in responses], [True] * len(responses))
    problem = SearchProblem((0, 10), toy_score, id=problem_id)
    for node in nodes:
        grade_terminal(tree, node, problem, toy_decode, True, CONFIG)
    for j, node in enumerate(nodes[:backed_up]):
        tree.backup_index[node] = j
    stats = TreeStats(expansions=1, nodes=len(tree), generated_tokens=0, max_depth=1, terminals=len(nodes), rounds=1,
                      wall_seconds=0.0)
    return TreeResult(0, problem_id, (0, 10), tuple(build_trajectory(tree, n, CONFIG) for n in nodes[:backed_up]),
                      "complete", stats, CONFIG, tree=tree)


def test_a_correct_terminal_solves_its_problem_backed_up_or_not():
    # p: "W" backed up, "C" graded but never backed up (not trained on): solved all the same.
    # q: two wrong answers: not solved. r: "C" backed up: solved.
    p = graded_tree("p", [(W, EOS), (C, EOS)], backed_up=1)
    assert [t.verdict.correct for t in p.trajectories] == [False]
    q = graded_tree("q", [(W, EOS), (W, EOS)], backed_up=2)
    r = graded_tree("r", [(C, EOS)], backed_up=1)
    assert solved_ids([p, q, r]) == {"p", "r"} and solved_ids([]) == frozenset()


def test_a_rollouts_solved_ids_leave_out_replayed_cached_solutions():
    """Flat rollouts of n = 2 (kind "flat") on four problems:
      a: fresh, samples "C" and "W": solved.
      b: one cached correct solution, so 1 direct sample, "W": not solved (the "C" it trains
         on was generated in an earlier epoch).
      d: two cached correct solutions: no direct sample at all, not among the results: not solved.
      e: one cached correct solution and a direct sample "C": solved by the sample.
    """
    problems = [Problem("a", "10", "C"), Problem("b", "11", "C"), Problem("d", "13", "C"), Problem("e", "12", "C")]
    cached = {pid: tuple(CachedSolution(pid, (C, EOS), "C", 0) for _ in range(k)) for pid, k in (("b", 1), ("d", 2), ("e", 1))}
    gen = ScriptedGenerator({(0, 10): [c((C, EOS)), c((W, EOS))], (0, 11): [c((W, EOS))], (0, 12): [c((C, EOS))]})
    from data_modules.rollout import rollout
    from flywheel.objectives.credit import Credit

    out = rollout(problems, generator=gen, task=ToyTask(), tokenizer=ToyTokenizer(), kind="flat",
                  search=SearchConfig(max_depth=3, overlong_penalty=False), flat_samples=2, max_concurrent_trees=4,
                  credit=Credit(), cached=lambda pid: cached.get(pid, ()))
    assert [(r.problem_id, len(r.trajectories)) for r in out.results] == [("a", 2), ("b", 1), ("e", 1)]
    assert [len(rows) for rows in out.rows] == [2, 2, 2, 2]  # b, d and e train on their cached "C" too
    assert out.solved == {"a", "e"}
