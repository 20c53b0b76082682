"""The search's rules are injected functions looked up once by their config names in the rule
tables (flywheel/search/rule_table.py): a rule registered from this file alone, without touching
the search package, is a valid `selection` (in SearchConfig and on the command line) and drives
a search.

Toy vocabulary (scripted): 1 = EOS, 2 = correct answer "C", 3 = wrong
answer "W", 5.. = filler "x"; toy_score grades the last answer letter.
"""

from __future__ import annotations

import re

import pytest

from flywheel.generation.base import Completion
from flywheel.search import SearchConfig, SearchProblem, run_search
from flywheel.search.rule_table import EXPANSION, FORK, SELECTION, TABLES, SearchRule
from scripted import EOS, ScriptedGenerator, toy_decode, toy_score
from flywheel.tasks.base import StepSpec


def c(tokens, finish="length") -> Completion:
    return Completion(tuple(tokens), (-1.0,) * len(tokens), finish)


calls: list[tuple[int, bool]] = []
"""(expanded, produced_terminal) of every call of the rule below."""


def breadth_first(tree, expanded, produced_terminal, rng):
    """A selection rule the package does not have: the lowest-id node that is neither terminal
    nor expanded, so the tree grows level by level."""
    calls.append((expanded, produced_terminal))
    for node in range(len(tree)):
        if not tree.terminal[node] and not tree.children[node]:
            return node
    return None


SCRIPT = {
    (0,): [c((5, 5)), c((6, 6))],  # A (1), B (2)
    (0, 5, 5): [c((7, 7)), c((8, 8))],  # A1 (3), A2 (4): no terminal
    (0, 6, 6): [c((2, EOS), "eos"), c((3, EOS), "eos")],  # B's: correct (5), wrong (6)
    (0, 5, 5, 7, 7): [c((2, EOS), "eos"), c((9, 9))],  # depth 3 = d_T: correct (7), incomplete (8)
}


def test_a_rule_registered_from_a_test_drives_the_search(monkeypatch):
    """n = 2, K = 2, d_T = 3, steps of 2 tokens, the rule above.

    round 1: expand the root -> A(1), B(2); the rule is asked after (root, no terminal): the
             lowest open node is A.
    round 2: expand A -> A1(3), A2(4); the default rule would dive to A1 by local UCT, this
             one goes on with the first level: B.
    round 3: expand B -> correct(5), wrong(6); the correct one is backed up (1 trajectory);
             asked after (B, terminal): A1.
    round 4: expand A1 at depth 2 -> its children sit at d_T: correct(7), incomplete(8);
             the correct one is backed up: K = 2, the tree is complete (no more asking).
    """
    calls.clear()
    monkeypatch.setitem(SELECTION, "breadth_first", SearchRule("breadth_first", breadth_first))
    cfg = SearchConfig(selection="breadth_first", expansion_width=2, trajectories_per_tree=2, max_depth=3,
                       overlong_penalty=False)
    gen = ScriptedGenerator(SCRIPT)
    (res,) = run_search([SearchProblem((0,), toy_score)], gen, cfg, step=StepSpec(2), decode=toy_decode)
    assert [call[0].prompt_ids for call in gen.calls] == [(0,), (0, 5, 5), (0, 6, 6), (0, 5, 5, 7, 7)]
    assert calls == [(0, False), (1, False), (2, True)]
    assert res.status == "complete"
    assert res.tree.parent == [-1, 0, 0, 1, 1, 2, 2, 3, 3]
    assert [t.terminal_id for t in res.trajectories] == [5, 7]
    assert [t.kind for t in res.trajectories] == ["correct", "correct"]


def test_the_default_rule_dives_where_the_registered_one_does_not():
    """The same script under the paper's rule: round 2 adds no terminal, so local UCT picks a
    child of A (tie at Q = 0 -> the lowest id, A1) instead of B."""
    gen = ScriptedGenerator(SCRIPT)
    cfg = SearchConfig(expansion_width=2, trajectories_per_tree=1, max_depth=3, overlong_penalty=False)
    run_search([SearchProblem((0,), toy_score)], gen, cfg, step=StepSpec(2), decode=toy_decode)
    assert [call[0].prompt_ids for call in gen.calls] == [(0,), (0, 5, 5), (0, 5, 5, 7, 7)]


def test_a_name_is_valid_exactly_while_a_rule_is_registered_under_it(monkeypatch):
    with pytest.raises(ValueError, match=re.escape(f"--data.search.selection must be one of {SELECTION.names()}, "
                                                   "got 'breadth_first'")):
        SearchConfig(selection="breadth_first")
    monkeypatch.setitem(SELECTION, "breadth_first", SearchRule("breadth_first", breadth_first))
    assert SearchConfig(selection="breadth_first").selection == "breadth_first"
    monkeypatch.setitem(FORK, "deepest", SearchRule("deepest", lambda tree, rng: None))
    assert SearchConfig(expansion="rollout", fork_rule="deepest").fork_rule == "deepest"


def test_a_rule_declares_what_it_needs():
    """Capabilities, not names, decide: the agents rule's expansion mode and value head, the
    entropy fork's entropies and cut, rollout expansion's whole continuations."""
    assert [name for name, rule in SELECTION.items() if rule.agents] == ["puct_agents"]
    with pytest.raises(ValueError, match="grows the tree by step expansion"):
        SearchConfig(selection="puct_agents", expansion="rollout")
    assert SearchConfig(expansion="rollout", fork_rule="entropy").needs_entropy
    assert not SearchConfig(expansion="rollout").needs_entropy
    assert [name for name, rule in EXPANSION.items() if rule.whole_rollouts] == ["rollout"]
    assert set(TABLES) == {"selection", "fork_rule", "expansion"}
