"""The token split (data_modules/token_split.py): where an epoch's generated tokens went, trees
or flat samples, by hand; and on a real rollout with a replay-buffer problem (and a problem
drawn twice), that the split adds up to the tokens the generator produced."""

from __future__ import annotations

import doctest

import pytest

import data_modules.token_split as token_split_mod
from data_modules.token_split import TokenLedger, TokenSplit


def test_doctests():
    outcome = doctest.testmod(token_split_mod)
    assert outcome.attempted > 0 and outcome.failed == 0


def test_an_epochs_split_by_hand():
    # Two trees (600 + 300 tokens), a flat group (200) and the direct samples of a mixed
    # rollout (100): tree 900, flat 300, tree fraction 900 / 1200 = 0.75.
    split = TokenSplit(tree=600) + TokenSplit(flat=200) + TokenSplit(tree=300) + TokenSplit(flat=100)
    assert split == TokenSplit(tree=900, flat=300, screening=0)
    assert split.epoch_metrics() == {"search/tree_tokens": 900.0, "search/flat_tokens": 300.0,
                                     "search/tree_token_fraction": 0.75}
    assert (split + TokenSplit(screening=64)).round_facts() == {
        "tree_tokens": 900, "flat_tokens": 300, "tree_token_fraction": 0.75, "screening_tokens": 64}


def test_an_epoch_that_generated_nothing_has_no_fraction():
    # Every problem replayed with 8 cached solutions: no direct sample, no tree.
    split = TokenSplit()
    assert split.tree_fraction is None and "search/tree_token_fraction" not in split.epoch_metrics()
    assert split.round_facts()["tree_token_fraction"] is None  # null in summary.json
    assert TokenSplit(flat=50).tree_fraction == 0.0  # a flat baseline: all flat


def test_the_ledger_starts_a_round_at_its_first_count():
    ledger = TokenLedger()
    ledger.add(TokenSplit(tree=10, screening=5), round=0)
    ledger.add(TokenSplit(flat=4), round=0)
    assert ledger.this_round == TokenSplit(tree=10, flat=4, screening=5)
    ledger.add(TokenSplit(tree=1), round=1)  # round 1's first count: its split starts at zero
    assert ledger.this_round == TokenSplit(tree=1) and ledger.total == TokenSplit(tree=11, flat=4, screening=5)
    back = TokenLedger()
    back.load_state_dict(ledger.state_dict())
    assert (back.total, back.this_round, back.round) == (ledger.total, ledger.this_round, 1)


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.update(format="x"), "format"),
    (lambda s: s.pop("total"), "malformed"),
    (lambda s: s["total"].update(tree=-1), "'tree' must be an integer >= 0"),
    (lambda s: s["this_round"].update(trees=1), "malformed"),
    (lambda s: s.update(round=True), "'round' must be an integer"),
])
def test_a_malformed_ledger_state_is_refused(edit, message):
    state = TokenLedger().state_dict()
    edit(state)
    ledger = TokenLedger()
    with pytest.raises(ValueError, match=message):
        ledger.load_state_dict(state)
    assert ledger.total == TokenSplit()  # nothing restored


def test_a_rollout_with_a_cached_problem_splits_its_tokens_between_trees_and_flat_samples(one_thread):
    # Three problems, the first with a cached solution: it gets a mixed rollout (the cached one
    # and 3 direct samples, no tree), the other two get trees. Every generated token is
    # counted once: tree + flat = the generator calls' count.
    from data_modules.rollout import rollout
    from flywheel.adaptive import CachedSolution
    from flywheel.generation.hf import HFGenerator
    from flywheel.objectives.credit import Credit
    from flywheel.policies.load import load_policy
    from flywheel.search.config import SearchConfig
    from flywheel.tasks.countdown import CountdownTask

    model, tokenizer = load_policy("tiny-countdown")
    task = CountdownTask()
    problems = task.problems("train")[:3]
    solution = CachedSolution(problems[0].id, tuple(tokenizer.encode("cached", add_special_tokens=False)), "cached", 0)
    search = SearchConfig(expansion_width=2, trajectories_per_tree=4, max_depth=8, max_expansions_per_tree=8)
    out = rollout(problems, generator=HFGenerator(model, tokenizer), task=task, tokenizer=tokenizer, kind="search",
                  search=search, flat_samples=8, max_concurrent_trees=8, credit=Credit(advantage="outcome"),
                  cached=lambda pid: (solution,) if pid == problems[0].id else ())
    modes = {r.problem_id: r.mode for r in out.results}
    assert modes == {problems[0].id: "flat", problems[1].id: "search", problems[2].id: "search"}
    split = out.tokens
    mixed = next(r for r in out.results if not r.searched)
    assert len(mixed.trajectories) == 3 and split.flat == mixed.stats.generated_tokens > 0
    assert split.tree == sum(r.stats.generated_tokens for r in out.results if r.searched) > 0
    assert split.tree + split.flat == out.stats.generated_tokens and split.screening == 0
    # A problem drawn twice in one epoch (a hard set smaller than --data.batching.problems_per_epoch)
    # is searched twice; both searches' tokens count, though its results share one id.
    twice = rollout([problems[1], problems[1]], generator=HFGenerator(model, tokenizer), task=task, tokenizer=tokenizer,
                    kind="search", search=search, flat_samples=8, max_concurrent_trees=8, credit=Credit(advantage="outcome"))
    assert twice.tokens == TokenSplit(tree=twice.stats.generated_tokens) and twice.tokens.tree > 0
