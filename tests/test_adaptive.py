"""The adaptive-training building blocks (deepsearch.md §7): hard set, replay buffer, mixed
rollouts and the degenerate-negative filter, with hand-worked values."""

from __future__ import annotations

import doctest
import json
import random
import time
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flywheel.adaptive.filters as filters_mod
import flywheel.adaptive.hard_set as hard_set_mod
import flywheel.adaptive.mixed as mixed_mod
import flywheel.adaptive.replay as replay_mod
import flywheel.adaptive.replay_rule as replay_rule_mod
import flywheel.adaptive.rescreen as rescreen_mod
from flywheel.adaptive import (
    CachedSolution,
    DegenerateFilter,
    HardSet,
    HardSetConfig,
    ReplayBuffer,
    ReplayConfig,
    degenerate_negative,
    direct_samples_needed,
    is_degenerate,
    is_hard,
    mixed_rollout,
    pass1_at_k,
    pass1_rates,
    qualifies,
    repeated_tail,
    screening_ids,
)
from flywheel.io import atomic_write_json

SETTINGS = settings(max_examples=60, deadline=None)


@pytest.mark.parametrize("module", [hard_set_mod, replay_mod, replay_rule_mod, mixed_mod, filters_mod, rescreen_mod])
def test_doctests(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


# ---------------------------------------------------------------------- hard set
def test_pass1_at_k_is_a_rate_and_the_threshold_switch():
    # 1 of K=4 correct: rate 0.25. Paper rule rate < 0.25: not hard; released data <=: hard.
    assert pass1_at_k(1, 4) == 0.25
    assert not is_hard(pass1_at_k(1, 4), 0.25, "lt")
    assert is_hard(pass1_at_k(1, 4), 0.25, "le")
    # Not "any of K": 1 of 4 is 0.25, not 1.0; 0 of 4 is hard under both rules.
    assert is_hard(pass1_at_k(0, 4)) and is_hard(0.0, comparison="le")
    assert not is_hard(pass1_at_k(2, 4), comparison="le")  # 0.5
    with pytest.raises(ValueError, match="0 <= correct <= samples"):
        pass1_at_k(5, 4)
    with pytest.raises(ValueError, match="at least one sample"):
        pass1_at_k(0, 0)
    with pytest.raises(ValueError, match="'lt'"):
        is_hard(0.1, comparison="lte")


def test_pass1_rates_sums_the_shards_of_one_problem():
    # "a" was screened on two ranks: (1 + 2) / (4 + 4) = 0.375, not the mean of 0.25 and 0.5.
    assert pass1_rates(["a", "b", "a"], [4, 4, 4], [1, 0, 2]) == {"a": 0.375, "b": 0.0}
    with pytest.raises(ValueError, match="one entry per problem"):
        pass1_rates(["a"], [4, 4], [1])
    with pytest.raises(ValueError, match="problem 'b'"):
        pass1_rates(["a", "b"], [4, 4], [1, 5])


@pytest.mark.parametrize(
    "kwargs, flag",
    [
        ({"k": 0}, "--data.hard_set.k"),
        ({"delta": 0.0}, "--data.hard_set.delta"),
        ({"delta": 1.5}, "--data.hard_set.delta"),
        ({"comparison": "lte"}, "--data.hard_set.comparison"),
        ({"temperature": -1.0}, "--data.hard_set.temperature"),
        ({"top_p": 0.0}, "--data.hard_set.top_p"),
        ({"rescreen": "pool"}, "--data.hard_set.rescreen='pool': choose 'hard'"),
        ({"rescreen": "all", "screen_problems": 0}, "--data.hard_set.screen_problems must be an integer >= 1"),
        ({"screen_problems": 64}, r"screen_problems=64 .* set --data.hard_set.rescreen=all, or leave"),
    ],
)
def test_hard_set_config_names_the_flag(kwargs, flag):
    with pytest.raises(ValueError, match=flag):
        HardSetConfig(**kwargs)


def test_hard_set_config_defaults_are_the_papers():
    cfg = HardSetConfig()
    assert (cfg.k, cfg.delta, cfg.comparison, cfg.temperature, cfg.top_p, cfg.enabled) == (4, 0.25, "lt", 0.6, 0.95, True)
    assert (cfg.rescreen, cfg.screen_problems) == ("hard", None)  # Eq. 9, the pool screened whole


ROUND0 = {"a": 0.0, "b": 0.25, "c": 0.5, "d": 0.0, "e": 0.75}  # "f" not measured


def test_hard_set_initial_and_two_refreshes_shrink():
    # Round 0 (Eq. 8), rate < 0.25: a (0), d (0) and the unmeasured f stay; b (0.25), c, e leave.
    hard = HardSet.initial(["a", "b", "c", "d", "e", "f"], ROUND0, HardSetConfig())
    assert hard.ids == ("a", "d", "f") and hard.round == 0 and hard.history == (3,)
    # Round 1 (Eq. 9): a reached 0.25 and leaves; c scores 0 but was not in D_hard(0), so it
    # cannot come back; d stays at 0; f is still unmeasured and stays.
    hard = hard.refresh({"a": 0.25, "c": 0.0, "d": 0.0})
    assert hard.ids == ("d", "f") and hard.round == 1 and hard.history == (3, 2)
    # Round 2: d improves to 0.5 and leaves; f measured at 0 stays.
    hard = hard.refresh({"d": 0.5, "f": 0.0})
    assert hard.ids == ("f",) and hard.round == 2 and hard.history == (3, 2, 1)
    assert "f" in hard and "d" not in hard and len(hard) == 1


def test_hard_set_le_keeps_the_25_percent_problems():
    hard = HardSet.initial(["a", "b", "c", "d", "e", "f"], ROUND0, HardSetConfig(comparison="le"))
    assert hard.ids == ("a", "b", "d", "f")  # b's 0.25 stays with <=


def test_hard_set_keeps_the_given_order_and_dedups():
    hard = HardSet.initial(["z", "a", "z", "m"], {}, HardSetConfig())
    assert hard.ids == ("z", "a", "m") and hard.history == (3,)


def test_disabled_hard_set_keeps_everything():
    hard = HardSet.initial(["a", "b"], {"a": 1.0, "b": 0.0}, HardSetConfig(enabled=False))
    assert hard.ids == ("a", "b")
    assert hard.refresh({"a": 1.0}).ids == ("a", "b")


@pytest.mark.parametrize("bad", [1.5, -0.1, float("nan"), "0.5"])
def test_hard_set_rejects_bad_rates_naming_the_problem(bad):
    with pytest.raises(ValueError, match="problem 'b'"):
        HardSet.initial(["a", "b"], {"a": 0.0, "b": bad})


def test_hard_set_round_trip_and_config_override():
    hard = HardSet.initial(["a", "b", "c", "d", "e", "f"], ROUND0, HardSetConfig(k=8)).refresh({"a": 0.5})
    data = json.loads(json.dumps(hard.to_dict()))
    assert data["format"] == "flywheel.adaptive.hard_set/v1"
    assert HardSet.from_dict(data) == hard
    resumed = HardSet.from_dict(data, config=HardSetConfig(delta=0.5))
    assert resumed.ids == hard.ids and resumed.config.delta == 0.5
    assert resumed.refresh({"d": 0.25}).ids == ("d", "f")  # 0.25 < new delta 0.5


def _state():
    return HardSet.initial(["a", "b", "c"], {"b": 1.0}).refresh({}).to_dict()  # ids a, c; history 2, 2


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.update(format="other/v9"), "format 'other/v9'"),
        (lambda d: d.pop("ids"), "missing 'ids'"),
        (lambda d: d.update(round=-1), "'round' must be an integer"),
        (lambda d: d.update(round=True), "'round' must be an integer"),
        (lambda d: d.update(history="2,2"), "'history' must be a list"),
        (lambda d: d.update(ids=["a", 3]), r"ids\[1\] must be a string"),
        (lambda d: d.update(ids=["a", "a"]), "repeated: \\['a'\\]"),
        (lambda d: d.update(ids=["a"]), "ends with 2 but the set holds 1"),
        (lambda d: d.update(history=[2]), "round \\+ 1 = 2 sizes"),
        (lambda d: d.update(history=[1, 2]), "non-increasing"),
        (lambda d: d.update(config={"k": 0}), "--data.hard_set.k"),
        (lambda d: d.update(config={"kk": 4}), "bad 'config'"),
    ],
)
def test_hard_set_from_dict_says_what_is_wrong(edit, message):
    data = _state()
    edit(data)
    with pytest.raises(ValueError, match=message):
        HardSet.from_dict(data)


@SETTINGS
@given(
    ids=st.lists(st.text(min_size=1, max_size=3), max_size=20, unique=True),
    rounds=st.lists(st.dictionaries(st.text(min_size=1, max_size=3), st.sampled_from([0.0, 0.25, 0.5, 1.0])), max_size=4),
    comparison=st.sampled_from(["lt", "le"]),
)
def test_refresh_never_adds_and_keeps_order(ids, rounds, comparison):
    hard = HardSet.initial(ids, rounds[0] if rounds else {}, HardSetConfig(comparison=comparison))
    for rates in rounds[1:]:
        nxt = hard.refresh(rates)
        assert set(nxt.ids) <= set(hard.ids)
        assert list(nxt.ids) == [pid for pid in hard.ids if pid in set(nxt.ids)]  # order kept
        assert all(not is_hard(rates[pid], 0.25, comparison) for pid in set(hard.ids) - set(nxt.ids))
        hard = nxt
    assert list(hard.history) == sorted(hard.history, reverse=True) and hard.history[-1] == len(hard)
    assert HardSet.from_dict(hard.to_dict()) == hard


# ---------------------------------------------------------------------- re-screening (rescreen="all")
ALL = HardSetConfig(rescreen="all")


def test_rescreen_all_lets_a_forgotten_problem_come_back():
    # D_hard(0) over the screened p1..p4, rate < 0.25: p1 (0.0) and p4 (0.0); p2 (0.25), p3 leave.
    hard = HardSet.initial(["p1", "p2", "p3", "p4"], {"p1": 0.0, "p2": 0.25, "p3": 0.5, "p4": 0.0}, ALL)
    assert hard.ids == ("p1", "p4")
    # Round 1 screens p2, p3, p5, p6 (p1, p4 not in the sample): p2 fell to 0.0 and comes back
    # (Eq. 9 would keep it out for good), p6 joins at 0.0, p3 (0.75) and p5 (0.25) are not hard;
    # p1 and p4 were not measured, so they leave: the next set is the round's evidence.
    hard = hard.rescreen(["p2", "p3", "p5", "p6"], {"p2": 0.0, "p3": 0.75, "p5": 0.25, "p6": 0.0})
    assert hard.ids == ("p2", "p6") and hard.round == 1 and hard.history == (2, 2)
    # Round 2 screens the whole pool, all at 0.0: the set grows to 6, in the screened order.
    pool = ["p1", "p2", "p3", "p4", "p5", "p6"]
    hard = hard.rescreen(pool, dict.fromkeys(pool, 0.0))
    assert hard.ids == tuple(pool) and hard.history == (2, 2, 6)
    assert HardSet.from_dict(json.loads(json.dumps(hard.to_dict()))) == hard  # a grown history is valid under "all"
    # With "le" (the released data) p5's 0.25 is hard too.
    le = HardSet.initial(["p5"], {}, HardSetConfig(rescreen="all", comparison="le")).rescreen(["p5"], {"p5": 0.25})
    assert le.ids == ("p5",)


def test_rescreen_keeps_an_unmeasured_member_and_never_adds_one():
    hard = HardSet.initial(["a", "b"], {"a": 0.0, "b": 0.0}, ALL)
    # b and c were to be screened but have no rate (e.g. a shard lost): b stays (dropped only
    # on evidence), c is not added without it.
    assert hard.rescreen(["a", "b", "c"], {"a": 0.5}).ids == ("b",)
    assert HardSet.initial(["a"], {"a": 1.0}, HardSetConfig(rescreen="all", enabled=False)).rescreen([], {}).ids == ("a",)


def test_a_grown_history_resumed_under_rescreen_hard_names_the_flag():
    grown = HardSet.initial(["a"], {"a": 0.0}, ALL).rescreen(["a", "b"], {"a": 0.0, "b": 0.0}).to_dict()
    with pytest.raises(ValueError, match="resumes with --data.hard_set.rescreen=all"):
        HardSet.from_dict(grown, config=HardSetConfig())
    assert HardSet.from_dict(grown, config=ALL).history == (1, 2)


@SETTINGS
@given(
    pool=st.lists(st.text(min_size=1, max_size=3), max_size=20, unique=True),
    rounds=st.lists(st.dictionaries(st.text(min_size=1, max_size=3), st.sampled_from([0.0, 0.25, 0.5, 1.0])), max_size=4),
    comparison=st.sampled_from(["lt", "le"]),
)
def test_rescreen_is_the_screened_problems_below_delta(pool, rounds, comparison):
    config = HardSetConfig(rescreen="all", comparison=comparison)
    hard = HardSet.initial(pool, rounds[0] if rounds else {}, config)
    for i, rates in enumerate(rounds[1:]):
        screened = pool[i % 2 :: 2]  # every other problem: some members go unmeasured
        nxt = hard.rescreen(screened, rates)
        expected = [p for p in screened if (is_hard(rates[p], 0.25, comparison) if p in rates else p in hard)]
        assert list(nxt.ids) == expected and nxt.history == hard.history + (len(expected),)
        hard = nxt
    assert HardSet.from_dict(hard.to_dict()) == hard


def test_screening_ids_are_the_pending_and_a_seeded_sample_in_pool_order():
    pool = [f"q{i}" for i in range(10)]
    # No sample size: the whole pool (a pending id outside the pool is ignored).
    assert screening_ids(pool, sample=None, seed=0, always=["q3", "gone"]) == tuple(pool)
    assert screening_ids(pool, sample=20, seed=0) == tuple(pool)  # asks for more than there are
    # 3 sampled from the 8 ids that are not pending, plus the 2 pending ones: 5, in pool order.
    picked = screening_ids(pool, sample=3, seed=7, always=["q9", "q0"])
    assert len(picked) == 5 and {"q0", "q9"} <= set(picked) and list(picked) == [p for p in pool if p in picked]
    assert screening_ids(pool, sample=3, seed=7, always=["q9", "q0"]) == picked  # the same on every rank
    assert screening_ids(pool, sample=0, seed=7, always=["q4"]) == ("q4",)
    # A new seed each round: over 10 rounds the samples differ and cover most of the pool.
    samples = {screening_ids(pool, sample=3, seed=round_) for round_ in range(10)}
    assert len(samples) > 1 and len(set().union(*samples)) >= 8
    with pytest.raises(ValueError, match="sample >= 0"):
        screening_ids(pool, sample=-1, seed=0)


# ---------------------------------------------------------------------- replay rules
@dataclass(frozen=True)
class Resp:
    """Stands in for a correct search Trajectory (same attribute names)."""

    response_ids: tuple[int, ...]
    response_text: str
    reward: float = 1.0


A, B, C, D = Resp((1, 2), "a"), Resp((3,), "b"), Resp((4, 5, 6), "c"), Resp((7,), "d")


def test_code_rule_worked_examples():
    code = ReplayConfig(rule="code")
    # The search found c correct of 8 trajectories: register when 0 < c / 8 <= 0.25.
    assert qualifies(code, correct=1, trajectories=8)  # 0.125
    assert qualifies(code, correct=2, trajectories=8)  # 0.25, the bound itself is in
    assert not qualifies(code, correct=3, trajectories=8)  # 0.375
    assert not qualifies(code, correct=0, trajectories=8)  # nothing to cache
    with pytest.raises(ValueError, match="trajectories="):
        qualifies(code, correct=1)
    with pytest.raises(ValueError, match="correct <= trajectories"):
        qualifies(code, correct=9, trajectories=8)


def test_paper_rule_worked_examples():
    paper = ReplayConfig()
    assert qualifies(paper, correct=1, post_rate=0.0)  # found, still failing 4 of 4 after training
    assert not qualifies(paper, correct=1, post_rate=0.25)  # 1 of 4 after training: not < 0.25
    assert not qualifies(paper, correct=0, post_rate=0.0)  # search found nothing to cache
    with pytest.raises(ValueError, match="--data.replay.rule=paper needs"):
        qualifies(paper, correct=1)
    with pytest.raises(ValueError, match="post_rate"):
        qualifies(paper, correct=1, post_rate=1.5)


def test_register_code_rule_stores_all_correct_and_first_found_is_kept():
    buf = ReplayBuffer(ReplayConfig(rule="code"))
    assert buf.register("p", [A], round=0, search_trajectories=8)  # 1 of 8
    assert not buf.register("q", [A, B, C], round=0, search_trajectories=8)  # 3 of 8
    assert not buf.register("r", [], round=0, search_trajectories=8)  # 0 of 8
    assert buf.solutions("p") == (CachedSolution("p", (1, 2), "a", 0, 1.0),)
    # Registering p again (a later round, another solution) changes nothing: first found kept.
    assert not buf.register("p", [B], round=1, search_trajectories=8)
    assert buf.solutions("p")[0].response_ids == (1, 2)
    assert "p" in buf and "q" not in buf and len(buf) == 1 and buf.solutions("q") == ()


def test_register_dedups_and_caps_per_problem():
    buf = ReplayBuffer(ReplayConfig(rule="code", max_solutions_per_problem=2, delta=1.0))
    # A twice counts once; cap 2 keeps A and B, C is dropped.
    assert buf.register("p", [A, Resp((1, 2), "a again"), B, C], round=3, search_trajectories=8)
    assert [s.response_ids for s in buf.solutions("p")] == [(1, 2), (3,)]
    assert buf.solutions("p")[0].response_text == "a" and buf.solutions("p")[0].round == 3
    assert buf.num_solutions == 2


def test_register_accepts_real_search_trajectories():
    from flywheel.rewards import Verdict
    from flywheel.search.outputs import StepRecord, Trajectory

    steps = (
        StepRecord(1, 1, (10, 11), (-0.1, -0.2), 0.5, 0.4, 1, "stop"),
        StepRecord(2, 2, (12,), (-0.3,), 1.0, 1.0, 1, "stop"),
    )
    traj = Trajectory(2, 0, steps, "correct", 1.0, 0.0, Verdict(True, 1.0, "5", "correct"), "x<answer>5</answer>")
    buf = ReplayBuffer(ReplayConfig(rule="code"))
    assert buf.register("p", [traj], round=0, search_trajectories=4)
    assert buf.solutions("p") == (CachedSolution("p", (10, 11, 12), "x<answer>5</answer>", 0, 1.0),)


def test_eviction_oldest_and_refuse():
    cfg = ReplayConfig(rule="code", max_problems=2)
    buf = ReplayBuffer(cfg)
    for pid in ("p1", "p2", "p3"):
        assert buf.register(pid, [A], round=0, search_trajectories=8)
    # p1 was registered earliest and left to make room for p3.
    assert buf.problem_ids == ("p2", "p3") and buf.evicted == 1
    buf.register("p4", [A], round=1, search_trajectories=8)
    assert list(buf) == ["p3", "p4"] and buf.evicted == 2

    refuse = ReplayBuffer(ReplayConfig(rule="code", max_problems=2, eviction="refuse"))
    assert refuse.register("p1", [A], round=0, search_trajectories=8)
    assert refuse.register("p2", [A], round=0, search_trajectories=8)
    assert not refuse.register("p3", [A], round=0, search_trajectories=8)
    assert refuse.problem_ids == ("p1", "p2") and refuse.evicted == 0
    refuse.remove("p1")
    assert refuse.register("p3", [A], round=1, search_trajectories=8)


def test_paper_rule_observe_then_settle():
    buf = ReplayBuffer(ReplayConfig())  # paper rule
    assert not buf.observe("p1", [A], round=0, search_trajectories=8)  # held, not yet registered
    assert not buf.observe("p2", [], round=0, search_trajectories=8)  # nothing found: not held
    assert not buf.observe("p3", [A, B], round=0, search_trajectories=8)
    assert not buf.observe("p4", [C], round=0, search_trajectories=8)
    assert not buf.observe("p1", [B, A], round=0, search_trajectories=8)  # p1 searched again: merged
    assert buf.pending == ("p1", "p3", "p4") and len(buf) == 0
    # Round end, Pass1@K after training: p1 still 0 -> registered; p3 at 0.5 was learned ->
    # not; p4 was not measured -> dropped with the other pending problems.
    assert buf.settle({"p1": 0.0, "p3": 0.5}) == ("p1",)
    assert buf.pending == () and buf.problem_ids == ("p1",)
    assert [s.response_ids for s in buf.solutions("p1")] == [(1, 2), (3,)]  # A first, B appended
    # Already buffered: a later search of p1 is not held again.
    buf.observe("p1", [C], round=1, search_trajectories=8)
    assert buf.pending == ()


def test_code_rule_observe_registers_now():
    buf = ReplayBuffer(ReplayConfig(rule="code"))
    assert buf.observe("p", [A], round=2, search_trajectories=8)
    assert not buf.observe("q", [A, B, C], round=2, search_trajectories=8)
    assert buf.pending == () and buf.settle({"p": 0.0, "q": 0.0}) == ()
    assert buf.solutions("p")[0].round == 2


def test_retain_follows_the_hard_set_and_remove():
    buf = ReplayBuffer(ReplayConfig(rule="code"))
    for pid in ("p1", "p2", "p3"):
        buf.register(pid, [A], round=0, search_trajectories=8)
    assert buf.retain(("p3", "p1", "other")) == ("p2",)
    assert buf.problem_ids == ("p1", "p3")
    assert buf.remove("p1") and not buf.remove("p1")
    assert buf.problem_ids == ("p3",)
    paper = ReplayBuffer()
    paper.observe("p1", [A], round=0, search_trajectories=8)
    paper.observe("p2", [A], round=0, search_trajectories=8)
    assert paper.retain(["p2"]) == () and paper.pending == ("p2",)  # pending follows too


def test_disabled_buffer_registers_nothing():
    buf = ReplayBuffer(ReplayConfig(enabled=False, rule="code"))
    assert not buf.register("p", [A], round=0, search_trajectories=8)
    assert not buf.observe("p", [A], round=0, search_trajectories=8)
    assert len(buf) == 0 and buf.pending == ()


@pytest.mark.parametrize(
    "kwargs, flag",
    [
        ({"rule": "verl"}, "--data.replay.rule"),
        ({"max_problems": 0}, "--data.replay.max_problems"),
        ({"max_solutions_per_problem": 0}, "--data.replay.max_solutions_per_problem"),
        ({"eviction": "lru"}, "--data.replay.eviction"),
        ({"delta": 0.0}, "--data.replay.delta"),
    ],
)
def test_replay_config_names_the_flag(kwargs, flag):
    with pytest.raises(ValueError, match=flag):
        ReplayConfig(**kwargs)


def test_cached_solution_validates():
    with pytest.raises(ValueError, match="problem 'p': reward must be a finite"):
        CachedSolution("p", (1,), "a", 0, float("nan"))
    with pytest.raises(ValueError, match="problem 'p': response_ids must be integers"):
        CachedSolution("p", (1, "2"), "a", 0)
    with pytest.raises(ValueError, match="problem 'p': round"):
        CachedSolution("p", (1,), "a", -1)


# ---------------------------------------------------------------------- replay checkpoint
def _buffer() -> ReplayBuffer:
    buf = ReplayBuffer(ReplayConfig(max_problems=3))
    buf.observe("p1", [A, B], round=0, search_trajectories=8)
    buf.observe("p2", [C], round=0, search_trajectories=8)
    buf.settle({"p1": 0.0, "p2": 0.0})
    buf.observe("p3", [D], round=1, search_trajectories=8)  # still pending at save time
    return buf


def test_replay_round_trip_through_an_atomic_json_file(tmp_path):
    buf = _buffer()
    atomic_write_json(tmp_path / "replay.json", buf.to_dict())
    data = json.loads((tmp_path / "replay.json").read_text())
    assert data["format"] == "flywheel.adaptive.replay/v1"
    back = ReplayBuffer.from_dict(data)
    assert back.config == buf.config and back.problem_ids == ("p1", "p2") and back.pending == ("p3",)
    assert all(back.solutions(p) == buf.solutions(p) for p in ("p1", "p2"))
    assert back.to_dict() == buf.to_dict()
    assert back.settle({"p3": 0.0}) == ("p3",) and back.solutions("p3")[0].round == 1


def test_replay_from_dict_trims_to_tighter_flags():
    data = _buffer().to_dict()
    back = ReplayBuffer.from_dict(data, config=ReplayConfig(max_problems=1, max_solutions_per_problem=1))
    assert back.problem_ids == ("p2",) and back.evicted == 1  # oldest (p1) left
    refuse = ReplayBuffer.from_dict(data, config=ReplayConfig(max_problems=1, eviction="refuse"))
    assert refuse.problem_ids == ("p1",)  # "refuse" keeps the earliest
    assert len(ReplayBuffer.from_dict(data, config=ReplayConfig(max_solutions_per_problem=1)).solutions("p1")) == 1


def _bad(path: str, value):
    data = _buffer().to_dict()
    target = data
    *head, last = path.split(".")
    for key in head:
        target = target[int(key)] if isinstance(target, list) else target[key]
    if value is KeyError:
        del target[last]
    else:
        target[int(last) if isinstance(target, list) else last] = value
    return data


@pytest.mark.parametrize(
    "data, message",
    [
        ([], "must be a dict"),
        (_bad("format", "flywheel.adaptive.replay/v0"), "expected 'flywheel.adaptive.replay/v1'"),
        (_bad("problems", None), "'problems' must be a list"),
        (_bad("evicted", -1), "'evicted'"),
        (_bad("problems.0.problem_id", 7), r"problems\[0\]: 'problem_id' must be a string"),
        (_bad("problems.1.solutions", []), r"problems\[1\] \(problem 'p2'\): 'solutions' must be a non-empty list"),
        (_bad("problems.0.solutions.1.response_ids", "3"), r"problem 'p1'\): solutions\[1\].response_ids must be a list"),
        (_bad("problems.0.solutions.0.response_ids", [1, "x"]), r"problem 'p1'\): solutions\[0\]: .*must be integers"),
        (_bad("problems.0.solutions.0.round", KeyError), r"problem 'p1'\): solutions\[0\] is missing \['round'\]"),
        (_bad("problems.1.problem_id", "p1"), r"problems\[1\] \(problem 'p1'\): problem listed twice"),
        (_bad("pending.0.solutions.0.reward", "high"), r"pending\[0\] \(problem 'p3'\).*reward"),
        (_bad("config.rule", "verl"), "--data.replay.rule"),
    ],
)
def test_replay_from_dict_names_the_problem(data, message):
    with pytest.raises(ValueError, match=message):
        ReplayBuffer.from_dict(data)


@SETTINGS
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["reg", "obs", "settle", "retain", "remove"]), st.integers(0, 9), st.integers(0, 8)),
        max_size=40,
    ),
    max_problems=st.integers(1, 4),
    rule=st.sampled_from(["paper", "code"]),
    eviction=st.sampled_from(["oldest", "refuse"]),
)
def test_buffer_never_exceeds_its_bounds(ops, max_problems, rule, eviction):
    buf = ReplayBuffer(ReplayConfig(rule=rule, max_problems=max_problems, max_solutions_per_problem=2, eviction=eviction))
    pool = [A, B, C, D, Resp((1, 2), "dup of A"), A, B, C]
    for op, pid, correct in ops:
        responses = pool[:correct]
        key = f"p{pid}"
        if op == "reg":
            buf.register(key, responses, round=0, search_trajectories=8, post_rate=pid / 10)
        elif op == "obs":
            buf.observe(key, responses, round=0, search_trajectories=8)
        elif op == "settle":
            buf.settle({f"p{i}": i / 10 for i in range(0, 10, 2)})
        elif op == "retain":
            buf.retain(f"p{i}" for i in range(pid))
        else:
            buf.remove(key)
        assert len(buf) <= max_problems
        assert all(1 <= len(buf.solutions(p)) <= 2 for p in buf)
        assert all(len({s.response_ids for s in buf.solutions(p)}) == len(buf.solutions(p)) for p in buf)
    back = ReplayBuffer.from_dict(json.loads(json.dumps(buf.to_dict())))
    assert back.to_dict() == buf.to_dict()


# ---------------------------------------------------------------------- mixed rollout
DIRECT = [f"d{i}" for i in range(8)]


def test_mixed_rollout_with_0_3_10_cached():
    assert mixed_rollout([], DIRECT) == DIRECT  # nothing cached: all 8 direct
    # 3 cached replace the first 3 direct samples.
    assert mixed_rollout(["c0", "c1", "c2"], DIRECT) == ["c0", "c1", "c2", "d3", "d4", "d5", "d6", "d7"]
    # 10 cached: min(10, 8) = 8 replace every direct sample; c8, c9 are not used.
    cached = [f"c{i}" for i in range(10)]
    assert mixed_rollout(cached, DIRECT) == cached[:8]


def test_mixed_rollout_with_only_the_needed_direct_samples():
    assert direct_samples_needed(3) == 5 and direct_samples_needed(10) == 0 and direct_samples_needed(2, n=4) == 2
    needed = ["e0", "e1", "e2", "e3", "e4"]
    assert mixed_rollout(["c0", "c1", "c2"], needed) == ["c0", "c1", "c2", *needed]
    assert mixed_rollout(["c0"], DIRECT, n=4) == ["c0", "d1", "d2", "d3"]  # n direct -> replace the first m
    with pytest.raises(ValueError, match="needs 5 direct samples, got 4"):
        mixed_rollout(["c0", "c1", "c2"], DIRECT[:4])
    with pytest.raises(ValueError, match="n >= 1"):
        mixed_rollout([], DIRECT, n=0)


@SETTINGS
@given(cached=st.integers(0, 12), extra=st.integers(0, 4), n=st.integers(1, 10))
def test_mixed_rollout_shape(cached, extra, n):
    c = [("c", i) for i in range(cached)]
    d = [("d", i) for i in range(direct_samples_needed(cached, n) + extra)]
    out = mixed_rollout(c, d, n=n)
    m = min(cached, n)
    assert len(out) == n and out[:m] == c[:m] and all(kind == "d" for kind, _ in out[m:])


# ---------------------------------------------------------------------- degenerate filter
NORMAL = [
    "9*8=72\n72-5=67\n<answer>(9*8)-5</answer>",
    "25+3=28\n28*2=56\n56-4=52\n52/4=13\n<answer>((25+3)*2-4)/4</answer>",
    "",
    "<answer>4</answer>",
    # Math prose with LaTeX and a boxed answer.
    r"Factoring, $(x-2)(x-3)=0$, so $x=2$ or $x=3$. Check: $2^2-5\cdot2+6=0$. "
    r"Then $$\int_0^1 x^2\,dx=\left[\frac{x^3}{3}\right]_0^1=\frac{1}{3}.$$ The product of the roots is $\boxed{6}$.",
    # Symbol-dense LaTeX (word characters about half).
    r"$$\frac{(x+1)^2}{(x-1)^2}=\left(\frac{x+1}{x-1}\right)^2$$ so $f'(x)=2(x+1)/(x-1)^2-2(x+1)^2/(x-1)^3$ "
    r"and \boxed{-\frac{4(x+1)}{(x-1)^3}}",
    # Short legitimate repeats: below min_repeat_chars or not the tail.
    "1/3 = 0.3333333333333333, so the answer is \\boxed{1/3}.",
    "Let me think......\n\nWait. 3+3=6, 3+3=6, 3+3=6",
    "| a | b |\n|---|---|\n| 1 | 2 |\nSo \\boxed{3}.",
    "Non-ASCII is fine: x ≥ 0, π ≈ 3.14159, 解 = 5, so \\boxed{5}.",
]


@pytest.mark.parametrize("text", NORMAL)
def test_filter_keeps_normal_outputs(text):
    assert is_degenerate(text) is None
    assert is_degenerate(text, token_ids=[ord(ch) for ch in text]) is None  # char tokenizer


def test_filter_keeps_long_varied_outputs():
    lines = "".join(f"line {i}: {i * i}\n" for i in range(700))  # 11.3k chars, compresses 2.9x
    assert is_degenerate(lines) is None


def test_filter_keeps_a_long_varied_solution():
    # 60 distinct templated steps (3.4k chars) compress about 3.4x, under the 10x bound.
    pairs = [(i * 7 % 97 + 2, i * 13 % 89 + 3) for i in range(60)]
    steps = [f"Step {i}: ${a} \\times {b} = {a * b}$, minus ${b}$ gives ${a * b - b}$." for i, (a, b) in enumerate(pairs)]
    text = "\n".join(steps) + "\nHence \\boxed{42}."
    assert is_degenerate(text, token_ids=[ord(ch) for ch in text]) is None


def test_repeated_tail_worked_examples():
    # Unit "I am stuck. " (12 chars) x 10 = 120; the ':' before it breaks the period.
    assert repeated_tail("Let me think:" + "I am stuck. " * 10) == (120, 12)
    # Cut mid-unit: the partial unit counts; "ab" x 20 + "a" = 41 chars of period 2.
    assert repeated_tail("xyz" + "ab" * 20 + "a") == (41, 2)
    # Period 3 but only 3 repeats (9 chars) is below both min_length and 4 units.
    assert repeated_tail("hello abcabcabc") == (0, 0)


@pytest.mark.parametrize(
    "text, reason",
    [
        ("9*8=72\n" + "72-5=67\n" * 20, "repetition"),  # the whole tail loops
        ("Let me try. " + "the " * 40, "repetition"),
        ("A long careful start. " + "Wait, wait, " * 200, "repetition"),
        # 11.3k chars of varied lines (kept on their own), then a 2,080-char loop: 16% of the
        # text, under max_repeat_fraction, but over max_repeat_chars = 2000.
        ("".join(f"line {i}: {i * i}\n" for i in range(700)) + "I will recheck. " * 130, "repetition"),
        ("abc\x00\x01\x02\x03def", "non_printable"),
        ("answer \ufffd\ufffd is \ufffd 5", "garbled"),
        ("#$%^&*(!@#)+{}[]<>?/|\\~`" * 4, "garbled"),
    ],
)
def test_filter_flags_degenerate_outputs(text, reason):
    assert is_degenerate(text) == reason


def test_filter_flags_near_repetition_by_compression():
    # A loop whose unit varies at random among three phrasings, so it has no exact period;
    # its ~6.3k chars compress about 23x (prose: 2-4x).
    rng = random.Random(0)
    units = ["Wait, 72-5=67. ", "Wait, 72 - 5 = 67. ", "Hmm, 72-5=67. "]
    text = "Start. " + "".join(rng.choice(units) for _ in range(400))
    assert repeated_tail(text) == (0, 0)
    assert is_degenerate(text) == "low_diversity"


def test_filter_flags_low_token_diversity():
    text = "Looks fine as text."
    # 1024 final tokens with 3 distinct ids < 1024 / 64 = 16.
    assert is_degenerate(text, token_ids=[5, 6, 7] * 400) == "low_diversity"
    assert is_degenerate(text, token_ids=list(range(20)) * 60) is None  # 20 distinct >= 16
    assert is_degenerate(text, token_ids=[5] * 1023) is None  # shorter than the window


def test_filter_applies_to_negatives_only_and_can_be_off():
    loop = "9*8=72\n" + "72-5=67\n" * 20
    assert degenerate_negative(False, loop) == "repetition"
    assert degenerate_negative(True, loop) is None  # verified correct: never dropped
    assert DegenerateFilter(enabled=False)(loop) is None
    assert degenerate_negative(False, loop, flt=DegenerateFilter(max_repeat_fraction=1.0, max_repeat_chars=10_000)) is None


def test_filter_config_names_the_flag():
    with pytest.raises(ValueError, match="--data.credit.degenerate_filter.max_repeat_fraction"):
        DegenerateFilter(max_repeat_fraction=2.0)
    with pytest.raises(ValueError, match="--data.credit.degenerate_filter.max_period"):
        DegenerateFilter(max_period=0)


_RNG = random.Random(1)
_VARIED = "".join(_RNG.choice("abcdefghij klmnop\n+-=*()0123456789") for _ in range(100_000))


@pytest.mark.parametrize(
    "text, reason, reason_with_ids",
    [
        (_VARIED, None, None),  # nothing to flag: every check runs to the end
        ("q" * 100_000, "repetition", "repetition"),
        ("lorem ipsum " * 8_000 + "dolor", "low_diversity", "low_diversity"),  # period 12 broken at the end
        (_VARIED[:98_000] + "a" * 1_999, None, "low_diversity"),  # ~250 periods pass the probe
        (_VARIED[:99_000] + "ab" * 500, None, None),  # the 1024-token window reaches 24 varied chars
    ],
)
def test_filter_does_bounded_work_on_100k_chars(text, reason, reason_with_ids, monkeypatch):
    """Work, not wall time, is bounded: the only super-linear risk is the period search, so
    its character comparisons are counted (every other check is one regex or zlib pass).
    Per period p <= 256 a probe of max(32, 4p) characters; for a period that passes, a
    gallop (at most 2n characters in all) and a bisection (at most log2(n) checks of <= n).
    A quadratic scan would exceed the bound by orders of magnitude; the counter stops it
    at the bound, so a regression fails at once instead of hanging."""
    import math

    from flywheel.adaptive import filters

    flt = DegenerateFilter()
    n = len(text)
    probes = sum(max(flt.min_repeat_chars, flt.min_repeats * p) for p in range(1, flt.max_period + 1))
    bound_chars = probes + flt.max_period * (2 + math.ceil(math.log2(n))) * n
    bound_calls = flt.max_period * (2 + 2 * math.ceil(math.log2(n)))
    work = {"calls": 0, "chars": 0}
    has_period = filters._has_period

    def counted(t, start, period):
        work["calls"] += 1
        work["chars"] += max(len(t) - start - period, 0)
        assert work["calls"] <= bound_calls and work["chars"] <= bound_chars, work
        return has_period(t, start, period)

    monkeypatch.setattr(filters, "_has_period", counted)
    start = time.monotonic()
    assert flt(text) == reason
    # With char-level token ids, the final 1024 tokens of the "a" tail hold 1 distinct id
    # (< 1024 / 64 = 16): the token check flags it (one set of 1024 ids: constant work).
    assert flt(text, [ord(ch) for ch in text]) == reason_with_ids
    assert time.monotonic() - start < 60  # a hang guard only, far above the milliseconds it takes
