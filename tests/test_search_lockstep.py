"""The lock-step loop shared by the tree search and the flat rollouts: fixed-seed outputs and
the order of every generator call are pinned.

Each digest is a blake2b hash of (a) every request of every generator call, in call order
(prompt ids, n, sampling parameters, seed, affinity) and (b) every TreeResult's JSON dump
(wall time removed) and the DriverStats counters. The digests were recorded on the two
separate loops the search and the flat rollouts had before they shared
`flywheel.search.lockstep`; a change of batching order, seeds, admission or results
changes them. The HashGenerator's outputs depend only on the request, so the digests are
the same on every machine. A new field of SamplingParams or SearchConfig changes them too
(its default is in the hashed repr and the JSON's config): they were recorded again when
`distinct_first_token`, `entropy_forks_per_chain`, `fork_width` and `distinct_children` came,
after checking that the old digests held with exactly those default-valued fields left out;
again when switches moved into groups of SearchConfig (`ablations`, `rollout`, `agents`: the JSON's
config nests them), after checking that every old digest held with the groups merged back into it.
The flat digests were recorded again when flat samples became whole responses (one request a
problem) and when a flat group's nodes stopped carrying its outcome (its q and N in the JSON).
"""

from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace

import pytest

from flywheel.search.config import SearchAblations, AgentSettings
from flywheel.search import SearchConfig, SearchDriver, SearchProblem, flat_rollouts
from flywheel.search.driver import DriverStats
from scripted import HashGenerator, toy_decode, toy_score
from flywheel.tasks.base import StepSpec


class Recording:
    """A generator that records every call's requests in a running hash."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.stats = inner.stats
        self.hash = hashlib.blake2b(digest_size=16)
        self.calls = 0

    def sample(self, requests):
        self.calls += 1
        for r in requests:
            self.hash.update(repr((self.calls, r.prompt_ids, r.n, r.params, r.seed, r.affinity)).encode())
        return self.inner.sample(requests)


def digest(gen: Recording, results, stats: DriverStats) -> str:
    h = gen.hash.copy()
    for res in results:
        d = res.to_json(toy_decode)
        d["stats"].pop("wall_seconds")
        h.update(json.dumps(d, sort_keys=True, allow_nan=False).encode())
    counters = {k: v for k, v in stats.as_dict().items() if k not in ("generator_seconds", "bookkeeping_seconds", "overhead_pct")}
    h.update(json.dumps(counters, sort_keys=True).encode())
    return h.hexdigest()


def problems(count: int) -> list[SearchProblem]:
    return [SearchProblem(prompt_ids=(0, 40 + i), score=toy_score, id=f"p{i}") for i in range(count)]


def value_fn(prefixes):
    # A deterministic value model: a value in [0, 1) from the prefix's length and last token.
    return [((len(p) * 7 + p[-1] * 3) % 10) / 10 for p in prefixes]


SEARCHES = {
    "frontier": ({}, None, "743f28468704c74b8636fbeff9121cdd"),
    "vanilla_uct": ({"selection": "vanilla_uct", "ablations": SearchAblations(uct_sampling="softmax")}, None,
                    "6556c9e2b6daaeaa6c35c3892a6eb7ee"),
    "puct_prm": ({"selection": "puct", "prm_weight": 0.5, "terminal_choice": "random"}, value_fn, "015d698330020ae86173a4e80f698c28"),
    "rollout": ({"expansion": "rollout", "fork_rule": "uct", "stop_when_solved": 2}, None, "5336ddd4a52663f7525959cfcd04f381"),
    "agents": ({"selection": "puct_agents", "agents": AgentSettings(count=3, iterations=4)}, value_fn, "a1908e78958372e985fa7148b3ed9c61"),
}


@pytest.mark.parametrize("name", sorted(SEARCHES))
def test_search_outputs_and_call_order_are_pinned(name):
    overrides, values, expected = SEARCHES[name]
    cfg = SearchConfig(expansion_width=3, trajectories_per_tree=4, max_depth=6, max_expansions_per_tree=40, seed=11,
                       **overrides)
    gen = Recording(HashGenerator(0.2, salt=5))
    seen = []
    driver = SearchDriver(gen, cfg, step=StepSpec(4, delimiter="\n"), decode=toy_decode, max_concurrent_trees=3,
                          progress=seen.append, value_fn=values)
    results = driver.run(problems(7))
    assert driver.stats.rounds == gen.calls == len(seen)
    assert [p.trees_done for p in seen][-1] == 7 and seen[-1].trees_live == 0
    assert digest(gen, results, driver.stats) == expected


@pytest.mark.parametrize(("n", "depth", "concurrent", "expected"), [
    (4, 5, 2, "d66dec933a77574571b1513377e758f0"),
    (1, 1, 64, "ba08f4bc5ac4aeaae6ca7f88ca2db0d5"),
    (3, 4, 3, "dac8f8c94a7bf400d5d7ed01966b6f30"),
])
def test_flat_outputs_and_call_order_are_pinned(n, depth, concurrent, expected):
    cfg = SearchConfig(max_depth=depth, seed=4)
    gen = Recording(HashGenerator(0.25, salt=2))
    stats = DriverStats()
    done = []
    results = flat_rollouts(problems(7), gen, n=n, step=StepSpec(3), decode=toy_decode, config=cfg,
                            max_concurrent_problems=concurrent, stats=stats, progress=done.append)
    assert stats.rounds == gen.calls == len(done) and done[-1] == 7
    assert digest(gen, results, stats) == expected


class Countdown:
    """A member that asks for `width` one-sample requests per round for `rounds` rounds."""

    def __init__(self, index: int, rounds: int, width: int = 1) -> None:
        self.index, self.left, self.width, self.absorbed = index, rounds, width, []

    def requests(self):
        from flywheel.generation.base import GenerationRequest, SamplingParams

        return [GenerationRequest((self.index,), 1, SamplingParams(max_new_tokens=2), seed=i) for i in range(self.width)]

    def absorb(self, outputs):
        assert len(outputs) == self.width
        self.absorbed.append(outputs)
        self.left -= 1

    @property
    def done(self):
        return self.left == 0

    def result(self):
        return SimpleNamespace(index=self.index, trajectories=(None,) * (self.index + 1))


def test_lockstep_admits_as_members_leave_and_counts_every_round():
    from flywheel.search.lockstep import Lockstep, sample

    gen = Recording(HashGenerator(0.0))
    sizes = []
    gen_sample = gen.sample
    gen.sample = lambda requests: sizes.append([r.prompt_ids[0] for r in requests]) or gen_sample(requests)
    members = [Countdown(0, 3), Countdown(1, 1, width=2), Countdown(2, 2), Countdown(3, 1)]
    settled, rounds = [], []
    stats = DriverStats()

    def one_round(live):
        for member, outputs in zip(live, sample(gen, [m.requests() for m in live], stats)):
            member.absorb(outputs)
        settled.append([m.index for m in live])

    loop = Lockstep(members, max_live=2, round=one_round, stats=stats,
                    on_round=lambda live, ended: rounds.append(([m.index for m in live], [m.index for m in ended])))
    out = list(loop)
    # Round 1: members 0 and 1 (two requests); 1 ends and 2 joins. Round 2: 0, 2. Round 3: 0
    # and 2 end, 3 joins. Round 4: 3 alone.
    assert sizes == [[0, 1, 1], [0, 2], [0, 2], [3]]
    assert settled == [[0, 1], [0, 2], [0, 2], [3]]
    assert rounds == [([0, 2], [1]), ([0, 2], []), ([3], [0, 2]), ([], [3])]
    assert [r.index for r in out] == [1, 0, 2, 3]
    assert (stats.rounds, stats.requests, stats.expansions, stats.trees_done, stats.trajectories) == (4, 8, 8, 4, 10)
    # HashGenerator without stop strings: every sample is max_new_tokens = 2 filler tokens.
    assert stats.generated_tokens == 2 * 8
