r"""Training rows from a finished search (data_modules/examples.py) on a hand-built tree:
node / outcome / best-of-N advantages per token, dropped trajectories kept in the group
baseline, mixed rollouts with cached solutions scored +1, and behaviour log-probs filled
with the trainer's where the generator gave none.

The tree (token ids in brackets, q~ = the soft-clipped value after the search):

    root -- A [10 11]  q~ 0.6 -- A1 [12 13 14]  correct,   reward +1
         |                    \- A2 [15]        incorrect, reward -1
         \- B [20]     q~ -0.4 -- B1 [21 22]    incorrect, reward -1, overlong penalty -0.5

Trajectories T1 = A.A1 (final 1.0), T2 = A.A2 (final -1.0), T3 = B.B1 (final -1.5).
Tree mean mu = (1.0 - 1.0 - 1.5) / 3 = -0.5.
"""

import math

import pytest
import torch

from data_modules.examples import collate, fill_behaviour, mixed_rows, rows_from_result
from flywheel.adaptive import CachedSolution
from flywheel.rewards import Verdict
from flywheel.search.config import SearchConfig
from flywheel.search.outputs import StepRecord, Trajectory, TreeResult

NAN = float("nan")
PROMPT = (1, 5, 6)


def step(node, depth, tokens, q_soft, logprobs=None):
    logprobs = logprobs if logprobs is not None else tuple(-0.1 * (i + 1) for i in range(len(tokens)))
    return StepRecord(node, depth, tuple(tokens), tuple(logprobs), q=0.0, q_soft=q_soft, visits=1, finish_reason="stop")


A = step(1, 1, [10, 11], 0.6, (-0.5, NAN))  # the generator gave no log-prob for token 11
B = step(2, 1, [20], -0.4)


def trajectory(terminal, steps, correct, overlong=0.0, index=0):
    reward = 1.0 if correct else -1.0
    verdict = Verdict(correct, reward, "x", "correct" if correct else "wrong_value")
    return Trajectory(terminal, index, tuple(steps), "correct" if correct else "incorrect", reward, overlong, verdict, "text")


T1 = trajectory(3, [A, step(3, 2, [12, 13, 14], 1.0)], True, index=0)
T2 = trajectory(4, [A, step(4, 2, [15], -1.0)], False, index=1)
T3 = trajectory(5, [B, step(5, 2, [21, 22], -1.0)], False, overlong=-0.5, index=2)


def result(*trajectories):
    return TreeResult(0, "p7", PROMPT, tuple(trajectories), "complete", None, SearchConfig(), tree=None)


def close(a, b):
    return len(a) == len(b) and all(x == pytest.approx(y, abs=1e-9) for x, y in zip(a, b))


def test_node_advantages_are_step_value_plus_overlong_minus_the_tree_mean_per_token():
    rows = rows_from_result(result(T1, T2, T3), group=4, weighting="node")
    assert [r.response_ids for r in rows] == [(10, 11, 12, 13, 14), (10, 11, 15), (20, 21, 22)]
    # T1: A 0.6 - (-0.5) = 1.1 on its 2 tokens; A1 1.0 + 0.5 = 1.5 on 3 tokens.
    assert close(rows[0].advantages, [1.1, 1.1, 1.5, 1.5, 1.5])
    # T2: A 1.1 again; A2 -1.0 + 0.5 = -0.5.
    assert close(rows[1].advantages, [1.1, 1.1, -0.5])
    # T3: every step also carries the overlong penalty: B -0.4 - 0.5 + 0.5 = -0.4; B1 -1.5 + 0.5 = -1.0.
    assert close(rows[2].advantages, [-0.4, -1.0, -1.0])
    assert rows[0].step_ids == (0, 0, 1, 1, 1) and rows[2].step_ids == (0, 1, 1)
    assert [r.reward for r in rows] == [1.0, -1.0, -1.0]  # the terminal reward, without the penalty
    assert all(r.group == 4 and r.problem_id == "p7" and r.prompt_ids == PROMPT for r in rows)
    # The generator's log-probs, step after step, NaN kept where it gave none.
    assert rows[0].behaviour_logprobs[0] == -0.5 and math.isnan(rows[0].behaviour_logprobs[1])
    assert close(rows[0].behaviour_logprobs[2:], [-0.1, -0.2, -0.3])


def test_outcome_advantages_give_every_token_its_final_score_minus_the_mean():
    rows = rows_from_result(result(T1, T2, T3), group=0, weighting="outcome")
    # finals 1.0, -1.0, -1.5 minus mu = -0.5: 1.5, -0.5, -1.0.
    assert close(rows[0].advantages, [1.5] * 5)
    assert close(rows[1].advantages, [-0.5] * 3)
    assert close(rows[2].advantages, [-1.0] * 3)


def test_outcome_advantages_divided_by_the_population_std_when_asked():
    rows = rows_from_result(result(T1, T2, T3), group=0, weighting="outcome", normalize_std=True)
    # deviations 1.5, -0.5, -1.0: variance (2.25 + 0.25 + 1.0) / 3 = 7/6, std 1.0801...
    std = math.sqrt(7 / 6) + 1e-6
    assert close(rows[0].advantages, [1.5 / std] * 5) and close(rows[2].advantages, [-1.0 / std] * 3)


def test_best_of_n_trains_on_the_correct_trajectories_only_with_advantage_one():
    rows = rows_from_result(result(T1, T2, T3), group=0, weighting="best_of_n")
    assert [r.response_ids for r in rows] == [(10, 11, 12, 13, 14)]
    assert rows[0].advantages == (1.0,) * 5
    assert rows_from_result(result(T2, T3), group=0, weighting="best_of_n") == []  # nothing correct


def test_dropped_trajectories_still_count_in_the_group_baseline():
    rows = rows_from_result(result(T1, T2, T3), group=0, weighting="node", drop=lambda t: t.terminal_id == 5)
    assert [r.response_ids for r in rows] == [(10, 11, 12, 13, 14), (10, 11, 15)]
    # mu is still -0.5 with T3 left out of training (without it mu would be 0 and T1's A 0.6).
    assert close(rows[0].advantages, [1.1, 1.1, 1.5, 1.5, 1.5])
    assert close(rows[1].advantages, [1.1, 1.1, -0.5])
    outcome = rows_from_result(result(T1, T2, T3), group=0, weighting="outcome", drop=lambda t: t.terminal_id == 5)
    assert close(outcome[0].advantages, [1.5] * 5)


# A buffered problem: 2 cached correct solutions, n = 4, so 2 direct samples are kept.
C1 = CachedSolution("p7", (30, 31), "c1", round=0)
C2 = CachedSolution("p7", (32,), "c2", round=1)
D0 = trajectory(6, [step(6, 1, [40], 1.0)], True)
D1 = trajectory(7, [step(7, 1, [41, 42], -1.0, (-0.3, -0.4))], False)
D2 = trajectory(8, [step(8, 1, [43], -1.0, (-0.6,))], False, overlong=-0.5)


@pytest.mark.parametrize("direct", [[D1, D2], [D0, D1, D2]], ids=["only-the-needed", "n-direct"])
def test_mixed_rows_score_cached_solutions_plus_one_against_the_direct_samples(direct):
    rows = mixed_rows("p7", PROMPT, [C1, C2], direct, group=2, n=4)
    # cached[:2] + the last 2 of direct[:4]: C1, C2, D1, D2 either way.
    assert [r.response_ids for r in rows] == [(30, 31), (32,), (41, 42), (43,)]
    # scores 1, 1, -1, -1.5: mean -0.5 / 4 = -0.125; advantages 1.125, 1.125, -0.875, -1.375.
    assert [r.reward for r in rows] == [1.0, 1.0, -1.0, -1.5]
    for row, adv in zip(rows, [1.125, 1.125, -0.875, -1.375]):
        assert close(row.advantages, [adv] * len(row.response_ids))
        assert row.step_ids == (0,) * len(row.response_ids) and row.group == 2
    # A cached solution has no behaviour log-probs (NaN, filled later); a direct sample keeps its own.
    assert all(math.isnan(x) for x in rows[0].behaviour_logprobs + rows[1].behaviour_logprobs)
    assert rows[2].behaviour_logprobs == (-0.3, -0.4) and rows[3].behaviour_logprobs == (-0.6,)


def test_mixed_rows_drop_a_direct_sample_but_keep_it_in_the_baseline():
    rows = mixed_rows("p7", PROMPT, [C1, C2], [D1, D2], group=0, n=4, drop=lambda t: t.terminal_id == 8)
    assert [r.response_ids for r in rows] == [(30, 31), (32,), (41, 42)]
    # The mean still holds D2's -1.5: -0.125 (without it: 1/3 and C1 would get 2/3).
    assert close(rows[0].advantages, [1.125, 1.125]) and close(rows[2].advantages, [-0.875, -0.875])


def test_behaviour_logprobs_are_filled_with_the_trainers_only_where_unknown():
    rows = rows_from_result(result(T1), group=0, weighting="outcome") + mixed_rows("p7", PROMPT, [C1], [D1], 1, n=2)
    batch = collate(rows, pad_id=0)
    # Row 0: prompt of 3 tokens, so response token i is predicted at position 2 + i.
    # Row 1 (C1) and row 2 (D1) likewise; L = 3 + 5 = 8, so per-token fields are [3, 7].
    assert batch["loss_mask"].tolist() == [
        [False, False, True, True, True, True, True],
        [False, False, True, True, False, False, False],
        [False, False, True, True, False, False, False],
    ]
    old = -torch.arange(1, 22, dtype=torch.float32).reshape(3, 7)  # distinct stand-ins for pi_old
    fill_behaviour(batch, old)
    b = batch["behaviour_logprobs"]
    # T1: token 10 has the generator's -0.5; token 11 had NaN and takes the trainer's old[0, 3] = -4.
    assert b[0, 2].item() == -0.5 and b[0, 3].item() == -4.0
    assert torch.allclose(b[0, 4:], torch.tensor([-0.1, -0.2, -0.3]))
    assert b[1, 2:4].tolist() == [-10.0, -11.0]  # the cached solution: all the trainer's
    assert torch.allclose(b[2, 2:4], torch.tensor([-0.3, -0.4]))  # the direct sample: its own
    assert torch.equal(batch["old_logprobs"], old)
    assert batch["rewards"].tolist() == [1.0, 1.0, -1.0]


def test_the_search_decoder_gives_the_tokenizers_own_decode(tok):
    # The fast path (the Rust backend, no Python wrapper) must return exactly what
    # tokenizer.decode(ids, skip_special_tokens=True) returns, special tokens included.
    from data_modules.rollout import decoder

    decode = decoder(tok)
    assert decode.func == tok.backend_tokenizer.decode  # the fast path is the one taken
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        ids = torch.randint(0, len(tok), (int(torch.randint(0, 40, (1,), generator=gen)),), generator=gen).tolist()
        assert decode(ids) == tok.decode(ids, skip_special_tokens=True)
        assert decode(tuple(ids)) == tok.decode(ids, skip_special_tokens=True)
    tok.clean_up_tokenization_spaces = True  # a clean-up is transformers' own: the wrapper is kept
    try:
        assert decoder(tok).func == tok.decode
    finally:
        tok.clean_up_tokenization_spaces = False


def test_a_search_credited_best_of_n_trains_on_its_correct_trajectories_only(one_thread):
    # Rejection sampling over trees (`--data.credit.advantage=best_of_n`): the same searches as
    # subtree credit, of whose trajectories only the correct ones become rows, each token +1.
    from data_modules.rollout import rollout
    from data_modules.settings import Credit
    from flywheel.generation.hf import HFGenerator
    from flywheel.policies.load import load_policy
    from flywheel.tasks.countdown import CountdownTask

    model, tokenizer = load_policy("tiny-countdown")
    task = CountdownTask()
    problems = task.problems("train")[:6]
    search = SearchConfig(expansion="rollout", expansion_width=4, trajectories_per_tree=8, max_depth=8,
                          overlong_max_tokens=task.max_response_tokens, overlong_buffer_tokens=16)

    def run(advantage):
        return rollout(problems, generator=HFGenerator(model, tokenizer), task=task, tokenizer=tokenizer,
                       kind="search", search=search, flat_samples=8, max_concurrent_trees=8,
                       credit=Credit(advantage=advantage))

    every, best = run("subtree"), run("best_of_n")
    assert [r.trajectories for r in best.results] == [r.trajectories for r in every.results]  # the same trees
    correct = [[t.response_ids for t in r.trajectories if t.verdict.correct] for r in best.results]
    assert [[row.response_ids for row in rows] for rows in best.rows] == correct
    assert sum(map(len, correct)) > 0 and sum(map(len, every.rows)) > sum(map(len, correct))
    assert all(set(row.advantages) == {1.0} and row.correct for rows in best.rows for row in rows)
