"""Tree tokens only where flat fails (`--data.batching.flat_first=m`, issue 32 item 4): m flat
samples per problem first; a problem with a correct one trains on that flat group, a problem
with none gets a rollout tree that starts from those m responses as its first chains. On
scripted generators, hand-worked.

Toy vocabulary (scripted): 1 = EOS, 2 = correct answer "C", 3 = wrong answer
"W", 4 = newline (the step delimiter here), 5.. = filler "x".
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from flywheel.search.config import RolloutSettings
from flywheel.generation.base import Completion
from flywheel.objectives.credit import Credit
from flywheel.rewards import Verdict
from flywheel.search import SearchConfig, SearchProblem, run_search
from flywheel.search.flat import flat_responses, flat_rollouts
from scripted import EOS, NEWLINE, ScriptedGenerator, toy_decode, toy_score
from flywheel.tasks.base import Problem, StepSpec

STEP = StepSpec(max_tokens=3, delimiter="\n")
X, W, C = 5, 3, 2


def c(tokens, finish="eos") -> Completion:
    return Completion(tuple(tokens), (-1.0,) * len(tokens), finish)


# Problem "a" (prompt 0 10): its 2 flat samples are "C" and "W": solved once, a flat group.
# Problem "b" (prompt 0 11): "x\n W" (two steps) and "W": 0 of 2, a tree. Its fork from the step
# "x\n" (node 1; the root is full: max_children 2) writes "C".
FLAT = {
    (0, 10): [c((C, EOS)), c((W, EOS))],
    (0, 11): [c((X, NEWLINE, W, EOS)), c((W, EOS))],
}
TREE = {(0, 11, X, NEWLINE): [c((C, EOS))]}
CONFIG = SearchConfig(expansion="rollout", expansion_width=1, trajectories_per_tree=3, max_depth=3, uct_lambda=0.5,
                      rollout=RolloutSettings(max_children=2), overlong_penalty=False)


def test_a_tree_starts_from_its_first_rollouts_and_forks_from_them():
    """Problem b's tree (n = 1, K = 3, d_T = 3, paper gammas max(i / l, 0.1)) from its two flat
    responses, absorbed as the root's first expansion (no request made):
      R1 "x\\n W" is cut at the delimiter: node 1 (x\\n, depth 1), node 2 (W, terminal) -> -1.
        node 2 q -1, N 1; node 1 q 0.5 * -1 = -0.5, N 1+1; root 0.1 * -1 = -0.1, N 1.
      R2 "W": node 3 (depth 1, terminal) -> -1. node 3 q -1, N 1; root -0.2, N 2.
    2 rollouts < K = 3. Fork candidates: the root has max_children = 2 children, node 1 is left.
    Round 1 (the tree's first request): node 1, 2 steps left (max_new_tokens 6): "C" -> node 4
    (depth 2) correct, +1: node 4 q 1, N 1; node 1 was -0.5 < 0 -> 0.5 * 1 = 0.5, N 3; root
    -0.2 < 0 -> 0.1, N 3. 3 rollouts = K: complete.
    """
    flat = flat_rollouts([SearchProblem((0, 11), toy_score, id="b")], ScriptedGenerator(FLAT), n=2, step=STEP,
                         decode=toy_decode, config=CONFIG)
    first = flat_responses(flat[0])
    assert [r.token_ids for r in first] == [(X, NEWLINE, W, EOS), (W, EOS)]  # each chain's steps joined
    assert [r.finish_reason for r in first] == ["eos", "eos"]

    gen = ScriptedGenerator(TREE)
    (res,) = run_search([SearchProblem((0, 11), toy_score, id="b", first_rollouts=first)], gen, CONFIG, step=STEP,
                        decode=toy_decode)
    tree = res.tree
    assert [[(r.prompt_ids, r.n, r.params.max_new_tokens) for r in call] for call in gen.calls] == [
        [((0, 11, X, NEWLINE), 1, 6)]]  # never the root: the flat responses are its first chains
    assert tree.parent == [-1, 0, 1, 0, 1]
    assert tree.tokens[1:] == [(X, NEWLINE), (W, EOS), (W, EOS), (C, EOS)]  # the flat chain's own two steps
    assert tree.visits == [3, 3, 1, 1, 1]
    assert tree.value == pytest.approx([0.1, 0.5, -1.0, -1.0, 1.0])
    assert tree.expanded == [1, 1, 0, 0, 0]  # the root's one "expansion" is the flat samples
    assert res.status == "complete" and res.stats.expansions == 1 and res.stats.rounds == 1
    # The tree's first chains are the flat responses, in their order; then its own rollout.
    assert [t.response_ids for t in res.trajectories] == [(X, NEWLINE, W, EOS), (W, EOS), (X, NEWLINE, C, EOS)]
    assert [t.backup_index for t in res.trajectories] == [0, 1, 2]
    assert [t.kind for t in res.trajectories] == ["incorrect", "incorrect", "correct"]
    # Tokens: the tree holds 4 + 2 reused and 2 of its own; its generator was asked for 2.
    assert (res.stats.generated_tokens, res.stats.reused_tokens, gen.stats.generated_tokens) == (8, 6, 2)
    assert res.stats.tokens_to_first_correct == 8


def test_a_tree_its_first_rollouts_leave_nothing_to_do_finishes_without_a_request():
    # One first rollout "W", max_children 1: the root is full and its only child is terminal, so
    # nothing is left to fork from: the tree is exhausted when it joins and makes no request.
    gen = ScriptedGenerator({})
    cfg = SearchConfig(expansion="rollout", expansion_width=1, trajectories_per_tree=2, max_depth=3,
                       rollout=RolloutSettings(max_children=1),
                       overlong_penalty=False)
    problems = [SearchProblem((0, 11), toy_score, id="b", first_rollouts=(c((W, EOS)),))]
    (res,) = run_search(problems, gen, cfg, step=STEP, decode=toy_decode)
    assert gen.calls == [] and res.status == "exhausted" and res.stats.rounds == 0
    assert [t.response_ids for t in res.trajectories] == [(W, EOS)] and res.stats.reused_tokens == 2


def test_first_rollouts_need_rollout_expansion():
    problems = [SearchProblem((0, 11), toy_score, first_rollouts=(c((W, EOS)),))]
    with pytest.raises(ValueError, match="--data.search.expansion=rollout"):
        run_search(problems, ScriptedGenerator({}), SearchConfig(expansion_width=1), step=STEP, decode=toy_decode)


def test_flat_first_settings_are_checked():
    from data_modules.search import SearchDataModule
    from data_modules.settings import BatchingConfig

    rollout = SearchConfig(expansion="rollout")
    with pytest.raises(ValueError, match="flat_first=-1: must be >= 0"):
        BatchingConfig(flat_first=-1)
    with pytest.raises(ValueError, match="--data.search.expansion=rollout"):
        SearchDataModule(batching=BatchingConfig(flat_first=4))
    with pytest.raises(ValueError, match="must be below --data.search.trajectories_per_tree=8"):
        SearchDataModule(search=rollout, batching=BatchingConfig(flat_first=8))
    with pytest.raises(ValueError, match="--data.rollout=flat builds none"):
        SearchDataModule(rollout="flat", search=rollout, batching=BatchingConfig(flat_first=4))
    assert SearchDataModule(search=rollout, batching=BatchingConfig(flat_first=4)).batching.flat_first == 4


@dataclass(frozen=True)
class ToyTask:
    """The toy vocabulary as a task: the prompt is the problem's question, C is correct."""

    step: StepSpec = STEP
    answer_rules: tuple[str, ...] = ()
    chat_template: bool = False
    system_prompt: str | None = None

    def prompt(self, problem: Problem) -> str:
        return problem.question

    def score(self, problem: Problem, completion: str, *, truncated: bool = False) -> Verdict:
        return toy_score(completion, truncated)


class ToyTokenizer:
    """The prompt "10" is the ids (0, 10); responses decode by the toy vocabulary."""

    eos_token_id = EOS

    def __call__(self, text: str) -> dict:
        return {"input_ids": [0, int(text)]}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return toy_decode(ids)


def test_an_epoch_trains_flat_groups_where_flat_solves_and_trees_where_it_fails():
    """Problems a and b above, with --data.batching.flat_first=2: a (1 of 2 correct) trains on its
    flat group, b (0 of 2) on the tree of the first test, which starts from b's 2 flat responses.

    Node credit (the configured rule) on both groups:
      a, flat: every step scores its reward, mean 0: "C" +1, "W" -1 on every token.
      b, tree: mean final score (-1 - 1 + 1) / 3 = -1/3; node 1's q~ = tanh(0.5) = 0.4621:
        "x\\n W": 0.4621 + 1/3 = 0.7954 on x\\n, -1 + 1/3 = -0.6667 on W EOS;
        "W": -0.6667; "x\\n C": 0.7954 on x\\n, 1 + 1/3 = 1.3333 on C EOS.
    Tokens, counted once: a 2 + 2, b 4 + 2 (the flat stage) and the fork's 2 = 12.
    """
    from data_modules.rollout import FLAT_FIRST_SEED, rollout, search_outcomes
    from flywheel.search.driver import derive_seed

    problems = [Problem("a", "10", "C"), Problem("b", "11", "C")]
    gen = ScriptedGenerator({**FLAT, **TREE})
    out = rollout(problems, generator=gen, task=ToyTask(), tokenizer=ToyTokenizer(), kind="search", search=CONFIG,
                  flat_samples=8, max_concurrent_trees=4, credit=Credit(), flat_first=2)
    # The flat stage (1 round: both prompts, whole responses with room for d_T = 3 steps of 3
    # tokens), then b's tree (1 round: a rollout from node 1, 2 steps left).
    assert [[(r.prompt_ids, r.n, r.params.max_new_tokens) for r in call] for call in gen.calls] == [
        [((0, 10), 2, 9), ((0, 11), 2, 9)], [((0, 11, X, NEWLINE), 1, 6)]]
    flat_seed = derive_seed(CONFIG.seed, FLAT_FIRST_SEED)  # not the trees' root seed: no request seed repeats
    assert gen.calls[0][0].seed == derive_seed(flat_seed, 0, 0) != derive_seed(CONFIG.seed, 0, 0)
    a, b = out.results
    assert (a.problem_id, a.mode, b.problem_id, b.mode) == ("a", "flat", "b", "search")  # only b went to a tree
    assert [t.response_ids for t in b.trajectories] == [(X, NEWLINE, W, EOS), (W, EOS), (X, NEWLINE, C, EOS)]
    assert b.tree.value == pytest.approx([0.1, 0.5, -1.0, -1.0, 1.0])  # the first test's tree
    assert [[row.advantages for row in rows] for rows in out.rows[:1]] == [[(1.0, 1.0), (-1.0, -1.0)]]
    q1 = 0.46211716 + 1 / 3
    expected = [[q1, q1, -2 / 3, -2 / 3], [-2 / 3, -2 / 3], [q1, q1, 4 / 3, 4 / 3]]
    for row, advantages in zip(out.rows[1], expected, strict=True):
        assert row.advantages == pytest.approx(advantages, abs=1e-6)
    assert out.stats.generated_tokens == 12 == sum(r.stats.generated_tokens for r in out.results)
    assert (a.stats.generated_tokens, b.stats.generated_tokens, b.stats.reused_tokens) == (4, 8, 6)
    # Both are their problems' own searches: the replay buffer is offered a's flat group and b's tree.
    assert search_outcomes(problems, out) == [("a", [((C, EOS), "C")], 2), ("b", [((X, NEWLINE, C, EOS), "x\nC")], 3)]


def test_without_flat_first_every_problem_gets_a_tree():
    from data_modules.rollout import rollout

    problems = [Problem("a", "10", "C"), Problem("b", "11", "C")]
    cfg = SearchConfig(expansion="rollout", expansion_width=2, trajectories_per_tree=2, max_depth=3,
                       overlong_penalty=False)
    gen = ScriptedGenerator({(0, 10): [c((C, EOS)), c((W, EOS))], (0, 11): [c((W, EOS)), c((W, EOS))]})
    out = rollout(problems, generator=gen, task=ToyTask(), tokenizer=ToyTokenizer(), kind="search", search=cfg,
                  flat_samples=8, max_concurrent_trees=4, credit=Credit())
    assert [r.mode for r in out.results] == ["search", "search"] and len(gen.calls) == 1
    assert all(r.stats.reused_tokens == 0 for r in out.results)


def test_flat_first_with_the_tiny_policy_splits_by_the_flat_samples(one_thread):
    """The tiny policy on 8 Countdown problems, 4 flat samples first: every problem that solved
    one trains on its 4 samples, every other one on a tree whose first 4 chains are incorrect and
    whose tokens include them; the epoch's tokens are the results' tokens, counted once."""
    from data_modules.rollout import rollout
    from flywheel.generation.hf import HFGenerator
    from flywheel.policies.load import load_policy
    from flywheel.tasks.countdown import CountdownTask

    model, tokenizer = load_policy("tiny-countdown")
    task = CountdownTask()
    search = SearchConfig(expansion="rollout", expansion_width=4, trajectories_per_tree=12, max_depth=8,
                          overlong_max_tokens=task.max_response_tokens, overlong_buffer_tokens=16)
    out = rollout(task.problems("train")[:8], generator=HFGenerator(model, tokenizer), task=task, tokenizer=tokenizer,
                  kind="search", search=search, flat_samples=8, max_concurrent_trees=8, credit=Credit(advantage="subtree"),
                  flat_first=4)
    flat = [r for r in out.results if not r.searched]
    trees = [r for r in out.results if r.searched]
    assert flat and trees, [r.mode for r in out.results]  # both kinds occur on these problems
    assert all(len(r.trajectories) == 4 and any(t.verdict.correct for t in r.trajectories) for r in flat)
    for r in trees:
        first = r.trajectories[:4]
        assert [t.backup_index for t in first] == [0, 1, 2, 3] and not any(t.verdict.correct for t in first)
        assert sum(len(t.response_ids) for t in first) == r.stats.reused_tokens < r.stats.generated_tokens
    assert out.stats.generated_tokens == sum(r.stats.generated_tokens for r in out.results)
    assert len(out.rows) == 8 and out.searched == frozenset(p.id for p in task.problems("train")[:8])
