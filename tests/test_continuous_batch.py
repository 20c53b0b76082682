"""The in-process generator's continuous batch (flywheel/generation/continuous.py) and the
search's continuous mode (SearchDriver(continuous=True)), on tiny Llamas.

Requests that join a running batch are left-padded to its width; a position, mask or cache
slip shows as log-probs off teacher forcing by 1e-2 or more, and as other tokens."""

from __future__ import annotations

import functools

import pytest
import torch

from flywheel.generation import GenerationRequest, SamplingParams
from flywheel.generation.hf import HFGenerator
from flywheel.search import SearchConfig, SearchDriver, SearchProblem
from flywheel.search.scripted import HashGenerator, toy_decode, toy_score
from flywheel.tasks.base import StepSpec
from flywheel.tiny import build_tiny_llama
from tests.test_hf_generator import encode, teacher_forced

pytestmark = pytest.mark.usefixtures("one_thread")  # fixtures one_thread and tok: conftest.py


@pytest.fixture(scope="module")
def model(tok):
    return build_tiny_llama(tok, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=1,
                            initializer_range=0.4)


def requests(tok):
    digits = tuple(tok.convert_tokens_to_ids(list("0123456789")))
    return [
        GenerationRequest(encode(tok, "5 9 8|67\n"), 3, SamplingParams(max_new_tokens=16, top_logprobs=5), seed=1),
        GenerationRequest(encode(tok, "1 2|3\n"), 2, SamplingParams(max_new_tokens=12, stop_token_ids=digits), seed=2),
        GenerationRequest(encode(tok, "12 7 3 9|40\n9*3=27\n"), 2,
                          SamplingParams(max_new_tokens=10, temperature=1.3, top_p=0.9, stop_strings=("=",)), seed=3),
        GenerationRequest(encode(tok, "7|7\n"), 4, SamplingParams(max_new_tokens=20, stop_strings=("\n",)), seed=4),
    ]


def drain(batch, waves):
    """Submit the first wave, then each next wave after a step: requests join a running batch."""
    tickets, got = [], {}
    tickets += batch.submit(waves[0])
    for wave in waves[1:]:
        got.update(batch.step())
        tickets += batch.submit(wave)
    while batch.busy:
        got.update(batch.step())
    return [got[t] for t in tickets]


@pytest.mark.parametrize(("max_batch_size", "compact_fraction"), [(64, 0.25), (5, 0.0), (3, 0.5)])
def test_continuous_batch_samples_what_sample_does(model, tok, max_batch_size, compact_fraction):
    reqs = requests(tok)
    reference = HFGenerator(model, tok).sample(reqs)
    gen = HFGenerator(model, tok, max_batch_size=max_batch_size, compact_fraction=compact_fraction)
    out = drain(gen.continuous(), [reqs[:2], reqs[2:3], reqs[3:]])
    lengths = set()
    for req, ref, completions in zip(reqs, reference, out):
        assert len(completions) == req.n
        for a, b in zip(ref, completions):
            # Each sample draws from its own request's uniforms: the same tokens and reasons.
            assert (a.token_ids, a.finish_reason) == (b.token_ids, b.finish_reason)
            lengths.add(len(b.token_ids))
            chosen, entropy = teacher_forced(model, req.prompt_ids, b)
            torch.testing.assert_close(torch.tensor(b.logprobs), chosen, atol=1e-5, rtol=1e-5)
            if req.params.top_logprobs:
                torch.testing.assert_close(torch.tensor(b.entropies), entropy, atol=1e-5, rtol=1e-5)
            else:
                assert b.entropies is None
    assert len(lengths) > 2, "rows should finish at different steps"
    assert gen.stats.requests == len(reqs) and gen.stats.generated_tokens == sum(lengths_of(out))


def lengths_of(out):
    return [len(c.token_ids) for cs in out for c in cs]


def test_continuous_search_finds_the_lock_step_trees(tok):
    from flywheel.evaluation import encode_prompt
    from flywheel.policy import load_policy
    from flywheel.tasks.countdown import CountdownTask

    policy, ptok = load_policy("tiny-countdown")
    task = CountdownTask(numbers_count=3)
    problems = [SearchProblem(encode_prompt(ptok, task, p), functools.partial(task.score, p), p.id)
                for p in task.problems("test")[:6]]
    config = SearchConfig(max_depth=8, expansion_width=4, trajectories_per_tree=4, max_expansions_per_tree=16,
                          merge_duplicate_steps=True, terminal_choice="random")
    decode = functools.partial(ptok.decode, skip_special_tokens=True)
    runs = {}
    for continuous in (False, True):
        gen = HFGenerator(policy, ptok, seed=0, prefix_cache_mb=16, max_batch_size=12)
        driver = SearchDriver(gen, config, step=task.step, decode=decode, max_concurrent_trees=4,
                              eos_token_ids=[ptok.eos_token_id], continuous=continuous)
        runs[continuous] = (driver.run(problems), driver.stats, gen.stats)
    (lock, lock_stats, _), (cont, cont_stats, cont_gen) = runs[False], runs[True]
    for a, b in zip(lock, cont):
        assert [t.response_ids for t in a.trajectories] == [t.response_ids for t in b.trajectories]
        assert [t.reward for t in a.trajectories] == [t.reward for t in b.trajectories]
        assert a.stats.expansions == b.stats.expansions
    assert cont_stats.generated_tokens == lock_stats.generated_tokens == sum(r.stats.generated_tokens for r in cont)
    assert cont_stats.expansions == lock_stats.expansions and cont_stats.trees_done == 6
    assert cont_stats.rounds > lock_stats.rounds  # trees move on one group at a time
    assert cont_gen.extra["prefix_cache_hit_tokens"] > 0


def test_continuous_mode_settles_only_the_trees_that_moved():
    class Continuous(HashGenerator):
        """HashGenerator behind the continuous-batch interface: one request completes per step."""

        def continuous(self):
            gen = self

            class Batch:
                def __init__(self):
                    self.queue, self.next = [], 0

                @property
                def busy(self):
                    return bool(self.queue)

                def submit(self, reqs):
                    tickets = list(range(self.next, self.next + len(reqs)))
                    self.next += len(reqs)
                    self.queue += zip(tickets, reqs)
                    return tickets

                def step(self):
                    ticket, req = self.queue.pop(0)
                    return [(ticket, gen.sample([req])[0])]

            return Batch()

    seen = []
    problems = [SearchProblem((0, 60 + i), toy_score, str(i)) for i in range(3)]
    cfg = SearchConfig(expansion_width=2, trajectories_per_tree=2, max_depth=4, prm_weight=0.5, selection="puct")

    def values(prefixes):
        seen.append(len(prefixes))
        return [0.5] * len(prefixes)

    driver = SearchDriver(Continuous(0.3), cfg, step=StepSpec(2), decode=toy_decode, max_concurrent_trees=2,
                          value_fn=values, continuous=True)
    results = driver.run(problems)
    assert [r.index for r in results] == [0, 1, 2] and all(r.complete for r in results)
    # One request completes per step, so each value call scores one tree's new children (<= n = 2).
    assert seen and max(seen) <= 2 and driver.stats.rounds == driver.stats.requests
    lock = SearchDriver(HashGenerator(0.3), cfg, step=StepSpec(2), decode=toy_decode, max_concurrent_trees=2,
                        value_fn=values).run(problems)
    assert [[t.response_ids for t in r.trajectories] for r in lock] == [[t.response_ids for t in r.trajectories] for r in results]


def test_continuous_mode_needs_a_continuous_generator():
    with pytest.raises(ValueError, match="continuous=False"):
        SearchDriver(HashGenerator(), SearchConfig(), step=StepSpec(2), decode=toy_decode, continuous=True).run(
            [SearchProblem((0, 1), toy_score)]
        )
