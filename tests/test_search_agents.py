"""The seed's Countdown MCTS (selection "puct_agents", rest-mcts-and-countdown.md §B): pUCT
with sequence priors and value-initialised Q, virtual loss among agents sharing one tree,
the value backup and the greedy readout, worked by hand."""

from __future__ import annotations

import doctest
import math

import pytest

import flywheel.search.agents as agents_mod
from flywheel.generation.base import Completion
from flywheel.search.agents import add_pending, agent_descend, agent_q, back_up_value, greedy_terminal, open_nodes
from flywheel.search.config import SearchConfig, AgentSettings
from flywheel.search.driver import SearchDriver, SearchProblem
from scripted import EOS, ScriptedGenerator, toy_decode, toy_score
from flywheel.search.tree import SearchTree
from flywheel.tasks.base import StepSpec


def c(tokens, logprob=-1.0, finish="length") -> Completion:
    return Completion(tuple(tokens), (logprob,) * len(tokens), finish)


def test_docstring_examples():
    result = doctest.testmod(agents_mod)
    assert result.attempted > 0 and result.failed == 0


def two_children(lp_a=-1.0, lp_b=-1.0 + math.log(3.0)) -> SearchTree:
    """Root with two steps of one token: summed log-probs -1 and -1 + ln 3, so priors 0.25 / 0.75."""
    tree = SearchTree([0])
    tree.add_children(0, [c((5,), lp_a), c((6,), lp_b)], [False, False], initial_visit=False)
    return tree


def test_priors_order_unvisited_children_then_value_overrides():
    tree = two_children()
    pending = [0, 0, 0]
    # Unvisited, no value: Q = 0 for both; score = 0.5 * P * sqrt(max(N_root, 1)) / 1 -> 0.125 vs 0.375.
    assert agent_descend(tree, pending, 0.5, 1.0) == 2
    # A value model says A is worth 0.4 and B -0.1: 0.4 + 0.125 = 0.525 beats -0.1 + 0.375 = 0.275.
    tree.prm_value[1], tree.prm_value[2] = 0.4, -0.1
    assert agent_descend(tree, pending, 0.5, 1.0) == 1


def test_virtual_loss_sends_the_second_agent_elsewhere():
    tree = two_children()
    tree.visits[:] = [2, 1, 1]
    tree.value[:] = [0.0, 0.2, 0.2]
    tree.add_children(2, [c((7,)), c((8,))], [False, False], initial_visit=False)  # B expanded: nodes 3, 4
    pending = [0] * len(tree)
    # Agent 1: root N = 2: A = 0.2 + 0.5 * 0.25 * sqrt(2) / 2 = 0.288, B = 0.2 + 0.5 * 0.75 * sqrt(2) / 2 = 0.465 -> B,
    # then B's children (Q 0, prior 0.5 each, sqrt(1)): tie, the lower id 3.
    first = agent_descend(tree, pending, 0.5, 1.0)
    assert first == 3
    add_pending(tree, pending, first, 1)
    assert pending == [1, 0, 1, 1, 0]
    # Agent 2: root N = 3; B: Q = (0.2 - 1) / 2 = -0.4, + 0.5 * 0.75 * sqrt(3) / 3 = -0.183;
    # A: 0.2 + 0.5 * 0.25 * sqrt(3) / 2 = 0.308 -> A, an unexpanded leaf.
    assert agent_q(0.2, 1, 1, 1.0, 0.0) == pytest.approx(-0.4)
    assert agent_descend(tree, pending, 0.5, 1.0) == 1
    # Without virtual loss (value 0 per pending visit) B keeps Q = 0.1 and 0.1 + 0.217 > A's 0.308? No:
    # 0.1 + 0.5 * 0.75 * sqrt(3) / 3 = 0.317 > 0.308 -> B again, its free child 4.
    assert agent_descend(tree, pending, 0.5, 0.0) == 4


def test_taken_leaves_are_closed_and_the_root_once_taken():
    tree = two_children()
    pending = [0, 0, 0]
    add_pending(tree, pending, 1, 1)
    add_pending(tree, pending, 2, 1)
    assert open_nodes(tree, pending) == [False, False, False]
    assert agent_descend(tree, pending, 0.5, 1.0) is None
    add_pending(tree, pending, 2, -1)
    assert agent_descend(tree, pending, 0.5, 1.0) == 2
    with pytest.raises(RuntimeError, match="more virtual losses removed"):
        add_pending(tree, pending, 2, -1)


def test_value_backup_and_greedy_readout_follow_visits_to_a_terminal():
    tree = SearchTree([0])
    tree.add_children(0, [c((5,)), c((6,))], [False, False], initial_visit=False)  # 1, 2
    tree.add_children(1, [c((2, EOS), finish="eos"), c((3, EOS), finish="eos")], [True, True], initial_visit=False)  # 3, 4
    tree.reward[3], tree.reward[4] = 1.0, -0.9
    back_up_value(tree, 3, 1.0)
    back_up_value(tree, 4, -0.9)
    back_up_value(tree, 4, -0.9)
    assert tree.visits[:5] == [3, 3, 0, 1, 2] and tree.value[1] == pytest.approx(-0.8)
    # Node 2 has no terminal below; at node 1 the most-visited child is 4 (2 visits) though 3 is correct.
    assert greedy_terminal(tree) == 4
    back_up_value(tree, 3, 1.0)  # 2 visits each: the tie goes to the higher Q
    assert greedy_terminal(tree) == 3
    assert greedy_terminal(two_children()) is None


# ------------------------------------------------------------------------------ the driver
SCRIPT = {
    (0,): [c((5, 4), -1.0), c((6, 4), -1.0 + math.log(3.0))],  # A (1), B (2): priors 0.25 / 0.75
    (0, 6, 4): [c((3, EOS), -0.5, "eos"), c((7, 4), -0.5)],  # B -> W (3, wrong), D (4)
    (0, 5, 4): [c((2, EOS), -0.5, "eos"), c((8, 4), -0.5)],  # A -> C (5, correct), E (6)
    (0, 6, 4, 7, 4): [c((2, EOS), -0.5, "eos"), c((2, EOS), -0.5, "eos")],  # D -> C, C (7, 8)
    (0, 5, 4, 8, 4): [c((3, EOS), -0.5, "eos"), c((3, EOS), -0.5, "eos")],  # E -> W, W
}


class Recorder(ScriptedGenerator):
    def __init__(self, script) -> None:
        super().__init__(script)
        self.prefixes: list[list[tuple[int, ...]]] = []

    def sample(self, requests):
        self.prefixes.append([r.prompt_ids for r in requests])
        return super().sample(requests)


def run(agents: int, iterations: int, problems=1, value_fn=None, **kw):
    config = SearchConfig(selection="puct_agents", expansion_width=2, max_depth=4,
                          agents=AgentSettings(count=agents, iterations=iterations), overlong_penalty=False, **kw)
    gen = Recorder(SCRIPT)
    driver = SearchDriver(gen, config, step=StepSpec(max_tokens=4, delimiter="\n"), decode=toy_decode,
                          max_concurrent_trees=problems, value_fn=value_fn)
    results = driver.run([SearchProblem((0,), toy_score, id=f"p{i}") for i in range(problems)])
    return results, gen, driver


def test_two_agents_share_one_tree_in_one_call_per_round():
    """Round 1: the root (one leaf: the second agent finds nothing open). Backup V(root) = 0.
    Round 2 (root N = 1): agent 1 takes B (prior 0.75); agent 2, B pending (Q = -1 / 1 = -1), takes A.
    Both expansions go in one call; A and B back up V = 0 (no value model).
    Round 3 (root N = 3, A and B N = 1, Q 0): agent 1: A 0 + 0.5 * 0.25 * sqrt(3) / 2 = 0.108,
    B 0 + 0.5 * 0.75 * sqrt(3) / 2 = 0.325 -> B; at B (N 1): W (reward -1, prior 0.5): -1 + 0.25 = -0.75,
    D (Q 0) 0.25 -> D, a leaf. Agent 2: B now (0 - 1) / 2 + 0.5 * 0.75 * sqrt(4) / 3 = -0.25, A 0 + 0.5 * 0.25 *
    2 / 2 = 0.125 -> A; at A: C (reward +1): 1 + 0.25 beats E -> C, a terminal: its reward is backed up at once
    and agent 2 is done for the round. One request: D."""
    (result,), gen, driver = run(agents=2, iterations=3)
    assert gen.prefixes[0] == [(0,)]
    assert gen.prefixes[1] == [(0, 6, 4), (0, 5, 4)]
    assert gen.prefixes[2] == [(0, 6, 4, 7, 4)]
    tree = result.tree
    assert result.stats.expansions == 4 and driver.stats.rounds == 3 and driver.stats.requests == 4
    # Visits: root 1 (round 1) + 2 (round 2) + 1 (C) + 1 (D's expansion) = 5.
    assert tree.visits[0] == 5 and tree.visits[5] == 1 and tree.value[5] == 1.0
    # Readout: root's children A (N 2: A's backup + C) and B (N 2: B + D); tie on N, Q(A) = 0.5 > Q(B) = 0 -> A -> C.
    assert [t.response_ids for t in result.trajectories] == [(5, 4, 2, EOS)]
    assert result.trajectories[0].kind == "correct" and result.status == "complete"


def test_value_model_scores_every_new_node_once_per_round_and_is_backed_up():
    seen = []

    def value_fn(prefixes):
        seen.append(list(prefixes))
        return [0.5 if p[1] == 5 else -0.5 for p in prefixes]  # A's subtree is worth 0.5

    (result,), gen, _ = run(agents=1, iterations=2, value_fn=value_fn)
    assert seen[0] == [(0, 5, 4), (0, 6, 4)]
    # Round 2: A: 0.5 + 0.5 * 0.25 * 1 / 1 = 0.625 beats B: -0.5 + 0.375 -> A is expanded, then backs up 0.5.
    assert gen.prefixes[1] == [(0, 5, 4)]
    assert result.tree.prm_value[1] == 0.5 and result.tree.value[1] == 0.5 and result.tree.value[0] == 0.5


def test_many_trees_one_call_and_expansion_cap():
    results, gen, _ = run(agents=2, iterations=50, problems=3, max_expansions_per_tree=3)
    assert len(gen.prefixes[1]) == 6  # 3 trees x 2 agents in round 2
    assert all(r.stats.expansions == 3 and r.status == "expansion_cap" for r in results)
    with pytest.raises(ValueError, match="--data.search.agents.count must be >= 1"):
        AgentSettings(count=0)
    with pytest.raises(ValueError, match="--data.search.selection=frontier has no agents"):
        SearchConfig(agents=AgentSettings(count=2))
    with pytest.raises(ValueError, match="expansion=step"):
        SearchConfig(selection="puct_agents", expansion="rollout")


@pytest.mark.parametrize("agents,rounds,eos_prob,seed", [(1, 12, 0.3, 0), (4, 10, 0.3, 1), (16, 6, 0.1, 2), (3, 20, 0.6, 3)])
def test_every_visit_is_one_backup_and_the_readout_is_a_terminal(agents, rounds, eos_prob, seed):
    """On random trees: a node's visits are its own expansion's backup plus its children's visits
    (every backup runs root to node), its value likewise (values: V = 0 without a value model, so
    only terminal revisits add reward), and the readout is a terminal
    reached by most-visited children."""
    from scripted import HashGenerator

    config = SearchConfig(selection="puct_agents", expansion_width=3, max_depth=5,
                          agents=AgentSettings(count=agents, iterations=rounds), overlong_penalty=False, seed=seed)
    trees = []
    driver = SearchDriver(HashGenerator(eos_prob=eos_prob, salt=seed), config, step=StepSpec(max_tokens=4, delimiter="\n"),
                          decode=toy_decode, max_concurrent_trees=3)
    for result in driver.run([SearchProblem((0,), toy_score, id=f"p{i}") for i in range(5)]):
        tree = result.tree
        trees.append(tree)
        for node in range(len(tree)):
            kids = tree.children[node]
            if tree.terminal[node]:  # visited only by revisits, each adding its reward
                assert tree.value[node] == pytest.approx(tree.visits[node] * tree.reward[node])
                continue
            own = 1 if kids else 0  # an expanded node backed its value up once; a leaf never was
            assert tree.visits[node] == own + sum(tree.visits[k] for k in kids)
            assert tree.value[node] == pytest.approx(sum(tree.value[k] for k in kids))
        assert result.stats.expansions <= 1 + (rounds - 1) * agents
        assert len(result.trajectories) == (1 if any(tree.terminal) else 0)
        if result.trajectories:
            path = [s.node_id for s in result.trajectories[0].steps]
            assert tree.terminal[path[-1]]
    assert driver.stats.requests == sum(t.expanded[n] for t in trees for n in range(len(t)))
