"""The batched multi-tree driver and the flat sampler, on scripted generators.

Toy vocabulary (scripted): 1 = EOS, 2 = correct answer "C", 3 = wrong
answer "W", 4 = newline, 5.. = filler "x"; toy_score grades the last answer letter.
"""

from __future__ import annotations

import json
import math

import pytest

from flywheel.search.config import SearchAblations
from flywheel.generation.base import Completion, GenerationRequest, GenerationStats
from flywheel.rewards import Verdict
from flywheel.search import SearchConfig, SearchDriver, SearchProblem, derive_seed, flat_rollouts, run_search
from scripted import EOS, HashGenerator, ScriptedGenerator, toy_decode, toy_score
from flywheel.tasks.base import StepSpec


def c(tokens, logprob=-1.0, finish="length") -> Completion:
    return Completion(tuple(tokens), (logprob,) * len(tokens), finish)


def problem(prompt=(0,), pid="p") -> SearchProblem:
    return SearchProblem(prompt_ids=tuple(prompt), score=toy_score, id=pid)


# ------------------------------------------------------------------- a small tree, reproduced exactly
SMALL_SCRIPT = {
    (0,): [c((5, 5), -1.0), c((6, 6), -0.5)],  # A (id 1), B (id 2): ordinary steps
    (0, 5, 5): [c((2, EOS), -2.0, "eos"), c((3, EOS), -0.1, "eos")],  # C correct, D wrong
    (0, 6, 6): [c((7, 7), -1.0), c((3, EOS), -0.3, "eos")],  # E ordinary, F wrong
}


def test_scripted_small_tree_reproduced_exactly():
    """n = 2, K = 2, d_T = 3, steps of 2 tokens.

    round 1: expand root -> A(1), B(2); no terminal; local UCT: Q = 0 and ln N(root) = 0 for
             both, tie -> A.
    round 2: expand A -> C(3) correct, D(4) wrong; correct beats wrong, back up C (l = 2):
             gammas root max(0/2, 0.1) = 0.1, A 1/2, C 1 -> q: root 0.1, A 0.5, C 1;
             N: root 1, A 1 + 1 = 2, C 1. Frontier = {B}: -> B.
    round 3: expand B -> E(5), F(6) wrong; back up F (l = 2): root q_old 0.1 > 0, r < 0 ->
             stays 0.1 (N 2); B q_old 0 -> 0 + 0.5 * -1 = -0.5 (N 2); F -1 (N 1). K = 2: done.
    """
    gen = ScriptedGenerator(SMALL_SCRIPT)
    cfg = SearchConfig(expansion_width=2, trajectories_per_tree=2, max_depth=3, overlong_penalty=False)
    (res,) = run_search([problem()], gen, cfg, step=StepSpec(max_tokens=2), decode=toy_decode)
    tree = res.tree
    assert res.status == "complete" and res.complete
    assert [len(call) for call in gen.calls] == [1, 1, 1]
    assert [call[0].prompt_ids for call in gen.calls] == [(0,), (0, 5, 5), (0, 6, 6)]
    assert [call[0].seed for call in gen.calls] == [derive_seed(0, 0, e) for e in range(3)]
    assert gen.calls[0][0].params.max_new_tokens == 2 and gen.calls[0][0].params.stop_strings == ()
    assert tree.parent == [-1, 0, 0, 1, 1, 2, 2]
    assert tree.children == [(1, 2), (3, 4), (5, 6), (), (), (), ()]
    assert tree.visits == [2, 2, 2, 1, 0, 1, 1]  # D was never backed up: N 0
    assert tree.value == pytest.approx([0.1, 0.5, -0.5, 1.0, 0.0, 0.0, -1.0])
    assert tree.kind == [None, None, None, "correct", "incorrect", None, "incorrect"]
    assert tree.backup_index == [-1, -1, -1, 0, -1, -1, 1]
    assert tree.frontier == {2: [5]}

    t0, t1 = res.trajectories
    assert (t0.terminal_id, t0.kind, t0.reward, t0.response_text) == (3, "correct", 1.0, "xxC")
    assert t0.response_ids == (5, 5, 2, EOS) and t0.step_lengths == (2, 2)
    assert [s.q for s in t0.steps] == pytest.approx([0.5, 1.0])
    assert [s.q_soft for s in t0.steps] == pytest.approx([math.tanh(0.5), 1.0])
    assert (t1.terminal_id, t1.kind, t1.reward) == (6, "incorrect", -1.0)
    assert [s.q_soft for s in t1.steps] == pytest.approx([math.tanh(-0.5), -1.0])
    assert t1.response_logprobs == (-0.5, -0.5, -0.3, -0.3)
    assert t0.overlong_penalty == 0.0 and t0.final_score == 1.0
    assert (res.stats.expansions, res.stats.nodes, res.stats.generated_tokens, res.stats.terminals) == (3, 7, 12, 3)


def test_max_depth_terminals_incomplete_incorrect_and_truncated_correct():
    """d_T = 2: depth-2 children are terminal without EOS. Kinds by §2:
    (5, 5) no answer -> incomplete; (3, 5) has a wrong answer -> incorrect; (2, 5) holds a
    correct answer -> correct (+1) although cut. Priority picks the correct one."""
    script = {
        (0,): [c((5, 5)), c((6, 6))],
        (0, 5, 5): [c((5, 5), -0.1), c((3, 5), -0.2), c((2, 5), -3.0)],
    }
    cfg = SearchConfig(expansion_width=3, trajectories_per_tree=1, max_depth=2, overlong_penalty=False)
    script[(0,)].append(c((7, 7)))
    (res,) = run_search([problem()], ScriptedGenerator(script), cfg, step=StepSpec(2), decode=toy_decode)
    tree = res.tree
    assert tree.kind[4:7] == ["incomplete", "incorrect", "correct"]
    assert tree.reward[4:7] == [-1.0, -1.0, 1.0]
    assert [t.terminal_id for t in res.trajectories] == [6]


def test_incorrect_preferred_over_incomplete_then_lowest_nll():
    script = {
        (0,): [c((5, 5)), c((6, 6))],
        (0, 5, 5): [c((5, 5), -0.01), c((3, 5), -0.9), c((3, 6), -0.5)],
    }
    script[(0,)].append(c((7, 7)))
    cfg = SearchConfig(
        expansion_width=3, trajectories_per_tree=1, max_depth=2, incomplete_reward=-0.7, overlong_penalty=False
    )
    (res,) = run_search([problem()], ScriptedGenerator(script), cfg, step=StepSpec(2), decode=toy_decode)
    # incorrect ones: node 5 (path NLL mean (1+1+0.9+0.9)/4 = 0.95) and node 6 ((1+1+0.5+0.5)/4 = 0.75) -> 6
    assert [t.terminal_id for t in res.trajectories] == [6]
    assert res.tree.reward[4] == -0.7  # incomplete_reward


def test_delimiter_steps_request_stop_strings_and_capped_step_is_not_terminal():
    script = {
        (0,): [c((5, 4), finish="stop"), c((5, 5, 5), finish="length")],  # both ordinary
        (0, 5, 4): [c((2, EOS), finish="eos"), c((5, 4), finish="stop")],
    }
    gen = ScriptedGenerator(script)
    cfg = SearchConfig(expansion_width=2, trajectories_per_tree=1, max_depth=8)
    (res,) = run_search([problem()], gen, cfg, step=StepSpec(3, delimiter="\n"), decode=toy_decode)
    params = gen.calls[0][0].params
    assert params.stop_strings == ("\n",) and params.max_new_tokens == 3
    assert res.tree.terminal[1:3] == [False, False]
    assert res.trajectories[0].response_text == "x\nC"


def test_eos_token_ids_count_as_eos():
    script = {(0,): [c((3, 9), finish="stop"), c((5,), finish="length")]}
    cfg = SearchConfig(expansion_width=2, trajectories_per_tree=1, max_depth=8)
    (res,) = run_search(
        [problem()], ScriptedGenerator(script), cfg, step=StepSpec(2), decode=toy_decode, eos_token_ids=[9]
    )
    assert res.tree.terminal[1:] == [True, False]
    assert res.trajectories[0].kind == "incorrect"


# --------------------------------------------------------------------- stopping rules
def test_expansion_cap_finishes_with_fewer_than_k_and_is_flagged():
    gen = HashGenerator(eos_prob=0.0)  # never EOS: no terminal before depth 50
    cfg = SearchConfig(expansion_width=2, trajectories_per_tree=3, max_depth=50, max_expansions_per_tree=5)
    (res,) = run_search([problem()], gen, cfg, step=StepSpec(4), decode=toy_decode)
    assert res.status == "expansion_cap" and not res.complete
    assert res.trajectories == () and res.stats.expansions == 5


def test_expansion_cap_keeps_trajectories_found_so_far():
    # d_T = 2 and no EOS: every second expansion yields terminals (incomplete) at depth 2
    gen = HashGenerator(eos_prob=0.0)
    cfg = SearchConfig(expansion_width=2, trajectories_per_tree=8, max_depth=2, max_expansions_per_tree=3)
    (res,) = run_search([problem()], gen, cfg, step=StepSpec(4), decode=toy_decode)
    # expansions: root, child 1 (2 terminals -> 1 backed up), child 2 (idem) -> cap
    assert res.status == "expansion_cap"
    assert len(res.trajectories) == 2 and all(t.kind == "incomplete" for t in res.trajectories)


def test_exhausted_tree_and_backup_all_terminals():
    gen = HashGenerator(eos_prob=0.0)
    cfg = SearchConfig(expansion_width=3, trajectories_per_tree=5, max_depth=1)
    (res,) = run_search([problem()], gen, cfg, step=StepSpec(4), decode=toy_decode)
    assert res.status == "exhausted" and len(res.trajectories) == 1  # one terminal per expansion
    cfg_all = SearchConfig(expansion_width=3, trajectories_per_tree=5, max_depth=1,
                           ablations=SearchAblations(backup_all_terminals=True))
    (res_all,) = run_search([problem()], gen, cfg_all, step=StepSpec(4), decode=toy_decode)
    assert res_all.status == "exhausted" and len(res_all.trajectories) == 3
    cfg_k2 = SearchConfig(expansion_width=3, trajectories_per_tree=2, max_depth=1,
                           ablations=SearchAblations(backup_all_terminals=True))
    (res_k2,) = run_search([problem()], gen, cfg_k2, step=StepSpec(4), decode=toy_decode)
    assert res_k2.status == "complete" and len(res_k2.trajectories) == 2  # never more than K


def test_merge_duplicate_steps_keeps_one_child_per_distinct_step():
    # Three samples of one step line, two of them equal; under each line the answers repeat too.
    script = {
        (0,): [c((5, 4)), c((5, 4)), c((6, 4))],
        (0, 5, 4): [c((2, EOS), -0.1, "eos"), c((2, EOS), -0.1, "eos"), c((3, EOS), -0.2, "eos")],
        (0, 6, 4): [c((3, EOS), -0.1, "eos"), c((3, EOS), -0.1, "eos"), c((3, EOS), -0.1, "eos")],
    }
    cfg = SearchConfig(expansion_width=3, trajectories_per_tree=4, merge_duplicate_steps=True)
    (res,) = run_search([problem()], ScriptedGenerator(script), cfg, step=StepSpec(4), decode=toy_decode)
    tree = res.tree
    assert [tree.tokens[i] for i in tree.children[0]] == [(5, 4), (6, 4)]
    responses = [t.response_ids for t in res.trajectories]
    assert len(responses) == len(set(responses)) == 2  # every trajectory a different path
    assert res.status == "exhausted"
    # Every sampled token is still paid for: 3 expansions x 3 samples x 2 tokens.
    assert res.stats.generated_tokens == 18

    plain = SearchConfig(expansion_width=3, trajectories_per_tree=4)
    (res_plain,) = run_search([problem()], ScriptedGenerator(script), plain, step=StepSpec(4), decode=toy_decode)
    assert len(res_plain.tree.children[0]) == 3
    assert len({t.response_ids for t in res_plain.trajectories}) < len(res_plain.trajectories)


def test_value_model_scores_new_nodes_once_per_round_and_steers_selection():
    calls = []

    def value_fn(prefixes):
        calls.append(list(prefixes))
        return [1.0 if prefix[-1] == 6 else 0.0 for prefix in prefixes]  # likes B (6, 6)

    def first_requests(config, value):
        gen = CountingGenerator(ScriptedGenerator(SMALL_SCRIPT))
        driver = SearchDriver(gen, config, step=StepSpec(4), decode=toy_decode, value_fn=value)
        (result,) = driver.run([problem()])
        return [b[0].prompt_ids for b in gen.batches], result, driver.stats

    plain = SearchConfig(expansion_width=2, trajectories_per_tree=2)
    order, _, _ = first_requests(plain, None)
    assert order[1] == (0, 5, 5)  # tie between A and B: the lowest id, A
    guided = SearchConfig(expansion_width=2, trajectories_per_tree=2, prm_weight=1.0)
    order, result, stats = first_requests(guided, value_fn)
    assert order[1] == (0, 6, 6)  # the value model prefers B
    assert calls[0] == [(0, 5, 5), (0, 6, 6)]  # one call per round, new non-terminal nodes only
    assert all(len(batch) >= 1 for batch in calls) and stats.value_calls == len(calls)
    assert result.tree.prm_value[2] == 1.0 and result.tree.prm_value[1] == 0.0
    assert result.to_json()["nodes"][2]["prm_value"] == 1.0
    # B's branch has no correct answer, so A's (with C) is found later: after 3 expansions of 2 x 2 tokens.
    assert result.stats.tokens_to_first_correct == 12 and order[:3] == [(0,), (0, 6, 6), (0, 5, 5)]


# --------------------------------------------------------------------- batching, determinism
class CountingGenerator:
    """Wraps a generator and records the batch of every call."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.stats = GenerationStats()
        self.batches: list[list[GenerationRequest]] = []

    def sample(self, requests):
        self.batches.append(list(requests))
        return self.inner.sample(requests)


def test_one_call_per_round_and_continuous_batching():
    gen = CountingGenerator(HashGenerator(eos_prob=0.2))
    problems = [problem((0, 100 + i), pid=f"p{i}") for i in range(7)]
    cfg = SearchConfig(expansion_width=4, trajectories_per_tree=3, max_depth=6)
    seen = []
    driver = SearchDriver(gen, cfg, step=StepSpec(3), decode=toy_decode, max_concurrent_trees=3, progress=seen.append)
    results = driver.run(problems)
    sizes = [len(b) for b in gen.batches]
    assert driver.stats.rounds == len(gen.batches) == len(seen)
    assert max(sizes) == 3 and sizes == sorted(sizes, reverse=True)
    # the batch stays full (3) until every problem has joined
    first_short = next((i for i, s in enumerate(sizes) if s < 3), len(sizes))
    joined = {r.prompt_ids[1] for b in gen.batches[:first_short] for r in b}
    assert joined == set(range(100, 107))
    assert [r.index for r in results] == list(range(7)) and [r.problem_id for r in results][0] == "p0"
    assert all(r.complete and len(r.trajectories) == 3 for r in results)
    assert sum(r.stats.expansions for r in results) == sum(sizes) == driver.stats.expansions
    assert seen[-1].trees_done == 7 and seen[-1].trees_total == 7 and seen[-1].trees_live == 0
    assert seen[-1].trajectories == 21
    assert [p.trees_done for p in seen] == sorted(p.trees_done for p in seen)
    assert driver.stats.generated_tokens == sum(r.stats.generated_tokens for r in results) > 0
    assert 0 <= driver.stats.overhead_pct <= 100


def _dump(res) -> str:
    d = res.to_json(toy_decode)
    d["stats"].pop("wall_seconds")
    return json.dumps(d, sort_keys=True, allow_nan=False)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"selection": "vanilla_uct", "ablations": SearchAblations(uct_sampling="softmax")},
        {"selection": "puct", "terminal_choice": "random"},
        {"frontier_lambda2": 0.3, "ablations": SearchAblations(depth_bonus="log"), "backup": "vanilla", "gamma_rule": "code"},
    ],
)
def test_same_seed_same_outputs_identical_trees_at_any_concurrency(overrides):
    cfg = SearchConfig(expansion_width=3, trajectories_per_tree=4, max_depth=8, seed=7, **overrides)
    problems = [problem((0, 50 + i), pid=str(i)) for i in range(5)]
    step = StepSpec(4, delimiter="\n")
    a = run_search(problems, HashGenerator(0.15, salt=3), cfg, step=step, decode=toy_decode, max_concurrent_trees=5)
    b = run_search(problems, HashGenerator(0.15, salt=3), cfg, step=step, decode=toy_decode, max_concurrent_trees=2)
    assert [_dump(x) for x in a] == [_dump(y) for y in b]
    other = SearchConfig(expansion_width=3, trajectories_per_tree=4, max_depth=8, seed=8, **overrides)
    d = run_search(problems, HashGenerator(0.15, salt=3), other, step=step, decode=toy_decode)
    assert [_dump(x) for x in a] != [_dump(y) for y in d]


def test_iter_run_yields_in_completion_order_with_input_index():
    problems = [problem((0, 10 + i)) for i in range(6)]
    driver = SearchDriver(
        HashGenerator(0.3), SearchConfig(expansion_width=2, trajectories_per_tree=2, max_depth=5),
        step=StepSpec(2), decode=toy_decode, max_concurrent_trees=6,
    )
    got = list(driver.iter_run(iter(problems)))  # a plain iterator: no len()
    assert sorted(r.index for r in got) == list(range(6))
    assert [r.stats.rounds for r in got] == sorted(r.stats.rounds for r in got)


# ------------------------------------------------------------------------ entropy, NaN, errors
def test_entropy_terminal_choice_uses_entropies_and_requests_them():
    ent_low, ent_high = (0.1, 0.1), (3.0, 3.0)
    script = {
        (0,): [
            Completion((3, EOS), (-0.1, -0.1), "eos", ent_high),  # confident by NLL, high entropy
            Completion((3, EOS), (-3.0, -3.0), "eos", ent_low),
        ]
    }
    gen = ScriptedGenerator(script)
    cfg = SearchConfig(expansion_width=2, trajectories_per_tree=1, terminal_choice="entropy", entropy_top_k=5)
    (res,) = run_search([problem()], gen, cfg, step=StepSpec(2), decode=toy_decode)
    assert gen.calls[0][0].params.top_logprobs == 5
    assert res.trajectories[0].terminal_id == 2
    (res_nll,) = run_search(
        [problem()], ScriptedGenerator(script), SearchConfig(expansion_width=2, trajectories_per_tree=1),
        step=StepSpec(2), decode=toy_decode,
    )
    assert res_nll.trajectories[0].terminal_id == 1


def test_entropy_choice_without_entropies_fails_with_the_fix():
    script = {(0,): [c((3, EOS), finish="eos")]}
    cfg = SearchConfig(expansion_width=1, trajectories_per_tree=1, terminal_choice="entropy")
    with pytest.raises(RuntimeError, match="terminal_choice='mean_nll'"):
        run_search([problem()], ScriptedGenerator(script), cfg, step=StepSpec(2), decode=toy_decode)


def test_nan_logprobs_sort_last_and_dump_as_null():
    script = {(0,): [c((3, EOS), math.nan, "eos"), c((3, EOS), -5.0, "eos")]}
    cfg = SearchConfig(expansion_width=2, trajectories_per_tree=1)
    (res,) = run_search([problem()], ScriptedGenerator(script), cfg, step=StepSpec(2), decode=toy_decode)
    assert res.trajectories[0].terminal_id == 2  # the NaN trajectory has no finite log-prob: +inf NLL
    dump = res.to_json()
    json.dumps(dump, allow_nan=False)
    assert dump["nodes"][1]["logprobs"] == [None, None]


def test_generator_contract_is_checked():
    class Short:
        stats = GenerationStats()

        def sample(self, requests):
            return [[c((5,))] for _ in requests]  # 1 completion where n = 2 were asked

    with pytest.raises(RuntimeError, match="returned 1 completions for request 0 with n=2"):
        run_search([problem()], Short(), SearchConfig(expansion_width=2), step=StepSpec(1), decode=toy_decode)


def test_verifier_errors_name_the_problem():
    def broken(text: str, truncated: bool = False) -> Verdict:
        raise ValueError("boom")

    script = {(0,): [c((3, EOS), finish="eos")]}
    with pytest.raises(RuntimeError, match="problem 'bad'"):
        run_search(
            [SearchProblem((0,), broken, id="bad")], ScriptedGenerator(script),
            SearchConfig(expansion_width=1), step=StepSpec(2), decode=toy_decode,
        )


# ------------------------------------------------------------------------------- outputs
def test_overlong_penalty_on_trajectories():
    script = {(0,): [c((5,) * 6 + (3, EOS), finish="eos")]}
    cfg = SearchConfig(expansion_width=1, trajectories_per_tree=1, overlong_max_tokens=10, overlong_buffer_tokens=4)
    (res,) = run_search([problem()], ScriptedGenerator(script), cfg, step=StepSpec(8), decode=toy_decode)
    t = res.trajectories[0]
    # L = 8, L_max - L_buf = 6: -(8 - 6) / 4 = -0.5
    assert t.overlong_penalty == pytest.approx(-0.5) and t.final_score == pytest.approx(-1.5)


def test_json_dump_format():
    gen = ScriptedGenerator(SMALL_SCRIPT)
    cfg = SearchConfig(expansion_width=2, trajectories_per_tree=2, max_depth=3)
    (res,) = run_search([problem()], gen, cfg, step=StepSpec(2), decode=toy_decode)
    dump = json.loads(json.dumps(res.to_json(toy_decode), allow_nan=False))
    assert dump["format"] == "flywheel.search.tree/v1" and dump["status"] == "complete"
    assert dump["config"]["expansion_width"] == 2 and dump["prompt_ids"] == [0]
    assert len(dump["nodes"]) == 7
    root, a, c_node = dump["nodes"][0], dump["nodes"][1], dump["nodes"][3]
    assert root["parent"] is None and root["children"] == [1, 2] and root["visits"] == 2
    assert a["text"] == "xx" and a["q"] == pytest.approx(0.5) and a["Q"] == pytest.approx(0.25)
    assert a["q_soft"] == pytest.approx(math.tanh(0.5))
    assert c_node["verdict"] == {"correct": True, "reward": 1.0, "answer": "C", "reason": "correct"}
    assert c_node["kind"] == "correct" and c_node["backup_index"] == 0 and c_node["terminal"]
    assert dump["trajectories"][1]["node_ids"] == [2, 6]
    assert "logprobs" not in res.to_json(logprobs=False)["nodes"][1]


# ------------------------------------------------------------------------------- flat baseline
def test_flat_rollouts_sample_whole_responses_cut_into_steps():
    script = {  # whole responses, steps of 2 tokens, d_T = 2
        (0, 1): [c((5, 5, 2, EOS), -0.4, "eos"), c((3, EOS), -0.2, "eos")],  # "xx" "C": correct; "W": wrong
        (0, 2): [c((2, EOS), finish="eos"), c((5, 5, 5, 5))],  # "C"; "xx" "xx" at max_depth without an answer
    }
    gen = ScriptedGenerator(script)
    problems = [problem((0, 1), "a"), problem((0, 2), "b")]
    cfg = SearchConfig(max_depth=2, overlong_penalty=False)
    res = flat_rollouts(problems, gen, n=2, step=StepSpec(2), decode=toy_decode, config=cfg)
    assert [[(r.prompt_ids, r.n, r.params.max_new_tokens, r.params.stop_strings) for r in call] for call in gen.calls] == [
        [((0, 1), 2, 4, ()), ((0, 2), 2, 4, ())]]  # one call, one request per problem: room for 2 steps of 2
    a, b = res
    assert a.mode == "flat" and a.status == "complete"
    assert [(t.kind, t.reward, len(t.steps)) for t in a.trajectories] == [("correct", 1.0, 2), ("incorrect", -1.0, 1)]
    assert [s.q_soft for s in a.trajectories[0].steps] == [0.0, 1.0]  # graded, never backed up: the outcome
    assert [s.q for s in a.trajectories[0].steps] == [0.0, 0.0]       # credits a flat group (DAPO)
    assert [(t.kind, t.reward, len(t.steps)) for t in b.trajectories] == [("correct", 1.0, 1), ("incomplete", -1.0, 2)]
    assert a.trajectories[0].response_text == "xxC"
    assert a.stats.expansions == 1 and b.stats.expansions == 1 and b.stats.generated_tokens == 6


def test_a_flat_group_is_credited_by_its_outcomes_whatever_the_chosen_rule():
    """DAPO: problem a's two responses (above), "xx" "C" correct (+1) and "W" wrong (-1), mean 0:
    every token of the first gets +1, of the second -1, under the default rule ("node") as under
    "outcome" (the flat kind's own rule), though no step of a flat response is backed up."""
    from flywheel.objectives.credit import Credit, Group, credit_groups

    script = {(0, 1): [c((5, 5, 2, EOS), -0.4, "eos"), c((3, EOS), -0.2, "eos")]}
    cfg = SearchConfig(max_depth=2, overlong_penalty=False)
    (a,) = flat_rollouts([problem((0, 1), "a")], ScriptedGenerator(script), n=2, step=StepSpec(2),
                         decode=toy_decode, config=cfg)
    for advantage in ("node", "outcome"):
        rows = credit_groups([Group.of(a)], Credit(advantage=advantage), "flat").rows[0]
        assert [r.advantages for r in rows] == [(1.0,) * 4, (-1.0,) * 2]


def test_flat_rollouts_continuous_batching_and_determinism():
    problems = [problem((0, 30 + i)) for i in range(5)]
    cfg = SearchConfig(max_depth=6, seed=3)
    gen = CountingGenerator(HashGenerator(0.3))
    a = flat_rollouts(problems, gen, n=4, step=StepSpec(3), decode=toy_decode, config=cfg, max_concurrent_problems=2)
    assert max(len(b) for b in gen.batches) <= 2 * 4
    assert all(len(r.trajectories) == 4 and r.complete for r in a)
    b = flat_rollouts(problems, HashGenerator(0.3), n=4, step=StepSpec(3), decode=toy_decode, config=cfg)
    assert [_dump(x) for x in a] == [_dump(y) for y in b]
