"""Training rows into mini-batches (data_modules/examples.py): behaviour log-probs filled
with the trainer's where the generator gave none, the layout and staleness built in; the
search decoder; and rollouts credited by the chosen rule, replay-buffer problems included. The rows' credit by hand:
tests/test_credit.py (the same hand-built tree T1-T3 and mixed rollout C1, D1)."""

from dataclasses import fields, replace

import torch

from data_modules.examples import collate, mini_batches
from flywheel.objectives.credit import Credit, Group, TrainingRow, credit_groups
from flywheel.training.batch import TrainingBatch
from flywheel.search.config import SearchConfig
from tests.test_credit import C1, D1, PROMPT, T1, result


def test_behaviour_logprobs_are_filled_with_the_trainers_only_where_unknown():
    groups = [Group.of(result(T1)), Group("p7", PROMPT, result(D1), (C1,), n=2)]
    rows = [row for group in credit_groups(groups, Credit(advantage="outcome")).rows for row in group]
    old = -torch.arange(1, 22, dtype=torch.float32).reshape(3, 7)  # distinct stand-ins for pi_old
    batch = collate(rows, pad_id=0, pack=lambda ids, mask, groups: None, score=lambda ids, mask, packed: old)
    # Row 0: prompt of 3 tokens, so response token i is predicted at position 2 + i.
    # Row 1 (C1) and row 2 (D1) likewise; L = 3 + 5 = 8, so per-token fields are [3, 7].
    assert batch.loss_mask.tolist() == [
        [False, False, True, True, True, True, True],
        [False, False, True, True, False, False, False],
        [False, False, True, True, False, False, False],
    ]
    b = batch.behaviour_logprobs
    # T1: token 10 has the generator's -0.5; token 11 had NaN and takes the trainer's old[0, 3] = -4.
    assert b[0, 2].item() == -0.5 and b[0, 3].item() == -4.0
    assert torch.allclose(b[0, 4:], torch.tensor([-0.1, -0.2, -0.3]))
    assert b[1, 2:4].tolist() == [-10.0, -11.0]  # the cached solution: all the trainer's
    assert torch.allclose(b[2, 2:4], torch.tensor([-0.3, -0.4]))  # the direct sample: its own
    assert torch.equal(batch.old_logprobs, old)
    assert batch.rewards.tolist() == [1.0, 1.0, -1.0]
    assert batch.weight_version is None and batch.staleness is None and batch.packed is None


def test_each_mini_batch_is_built_whole_its_layout_decided_once_and_scored_in_it():
    def rows_of(problem: str, prompt: tuple[int, ...], responses: list[tuple[int, ...]]) -> list[TrainingRow]:
        return [TrainingRow(problem, 7, prompt, r, (1.0,) * len(r), (-0.5,) * len(r), (0,) * len(r), 1.0,
                            weight_version=3) for r in responses]

    # Two problems, one per mini-batch; a stand-in module packs the first and leaves the second flat.
    per_problem = [rows_of("a", (1, 2), [(3, 4), (3, 5, 6)]), rows_of("b", (1, 9), [(8,)])]
    layouts, scored = iter(["tries of a", None]), []

    def pack(ids, mask, groups):
        assert groups.tolist() == [0] * len(ids)  # a problem's rows: group 0 of their mini-batch
        return next(layouts)

    def score(ids, mask, packed):
        scored.append(packed)
        return torch.zeros(ids.shape[0], ids.shape[1] - 1)

    first, second = mini_batches(per_problem, problems_per_rank=2, problems_per_batch=1, world=1, pad_id=0,
                                 pack=pack, score=score, staleness=1)
    assert scored == ["tries of a", None]  # pi_old in the layout each batch keeps
    assert (first.packed, second.packed) == ("tries of a", None)
    assert first.input_ids.tolist() == [[1, 2, 3, 4, 0], [1, 2, 3, 5, 6]]
    assert first.weight_version.tolist() == [3, 3] and first.staleness.tolist() == [1, 1]
    assert second.staleness.tolist() == [1] and second.group_ids.tolist() == [0]
    # A rank with nothing in a slot trains an all-masked batch (DDP), unstamped and flat.
    _, empty = mini_batches(per_problem[:1], problems_per_rank=2, problems_per_batch=1, world=2, pad_id=0,
                            pack=lambda *a: None, score=score, staleness=1)
    assert not empty.loss_mask.any() and empty.staleness is None and empty.packed is None


def test_lightning_moves_a_batch_field_by_field_its_packed_layout_by_its_own_to():
    from lightning.fabric.utilities.apply_func import move_data_to_device

    from flywheel.training.packing import pack_rows

    row = TrainingRow("p", 0, (1, 2), (3, 4), (1.0, 1.0), (-0.5, -0.5), (0, 0), 1.0, weight_version=2)
    batch = collate([row, replace(row, response_ids=(3, 5))], pad_id=0, pack=pack_rows,
                    score=lambda ids, mask, packed: torch.zeros(ids.shape[0], ids.shape[1] - 1))
    moved = move_data_to_device(batch, torch.device("meta"))
    assert type(moved) is TrainingBatch and moved is not batch
    for field in fields(TrainingBatch):
        value = getattr(moved, field.name)
        if field.name == "packed":
            assert value.input_ids.is_meta and value.index.is_meta and batch.packed.input_ids.device.type == "cpu"
        elif value is not None:
            assert value.is_meta, field.name
    assert moved.staleness is None and batch.input_ids.device.type == "cpu"


def test_the_search_decoder_gives_the_tokenizers_own_decode(tok):
    # The fast path (the Rust backend, no Python wrapper) must return exactly what
    # tokenizer.decode(ids, skip_special_tokens=True) returns, special tokens included.
    from flywheel.reporting.problem_view import decoder

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


def test_a_replay_buffer_problem_is_credited_by_the_chosen_rule(one_thread):
    # A problem with a cached solution gets a mixed rollout: the cached one and 7 direct samples.
    # Until issue 34 it was credited DAPO-style whatever `--data.credit.advantage` said, so
    # best-of-N trained its wrong direct samples with r - mean < 0; now it trains the correct ones, +1.
    from data_modules.rollout import rollout
    from flywheel.adaptive import CachedSolution
    from flywheel.generation.hf import HFGenerator
    from flywheel.policies.load import load_policy
    from flywheel.tasks.countdown import CountdownTask

    model, tokenizer = load_policy("tiny-countdown")
    task = CountdownTask()
    problem = task.problems("train")[0]
    solution = CachedSolution(problem.id, tuple(tokenizer.encode("cached", add_special_tokens=False)), "cached", round=0)
    search = SearchConfig(trajectories_per_tree=8, max_depth=8, overlong_max_tokens=task.max_response_tokens,
                          overlong_buffer_tokens=16)

    def run(advantage):
        return rollout([problem], generator=HFGenerator(model, tokenizer), task=task, tokenizer=tokenizer,
                       kind="search", search=search, flat_samples=8, max_concurrent_trees=8,
                       credit=Credit(advantage=advantage), cached=lambda pid: (solution,) if pid == problem.id else ())

    dapo, best = run("node"), run("best_of_n")
    direct = best.results[0].trajectories
    assert len(direct) == 7 and any(not t.verdict.correct for t in direct)  # wrong samples to train or not
    assert min(a for row in dapo.rows[0] for a in row.advantages) < 0  # node credit: r - mean, negatives too
    assert best.rows[0][0].response_ids == solution.response_ids
    assert [row.response_ids for row in best.rows[0][1:]] == [t.response_ids for t in direct if t.verdict.correct]
    assert all(set(row.advantages) == {1.0} and row.correct for row in best.rows[0])
