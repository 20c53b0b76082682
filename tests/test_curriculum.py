"""The Curriculum (hard set, replay buffer, round, cursor) by hand, and the data settings that
are checked when the data module is built."""

from __future__ import annotations

import logging

import pytest

from data_modules.curriculum import Curriculum
from data_modules.search import SearchDataModule
from data_modules.settings import BatchingConfig, ProblemsConfig
from data_modules.token_split import TokenSplit
from flywheel.objectives.credit import Credit
from flywheel.adaptive import HardSetConfig, ReplayConfig
from flywheel.generation.backends import HFBackend
from flywheel.tasks import Problem

POOL = {i: Problem(i, f"question {i}", "1") for i in ("a", "b", "c", "d", "e")}


def curriculum(epochs_per_round: int = 1, rule: str = "code") -> Curriculum:
    return Curriculum(HardSetConfig(), ReplayConfig(rule=rule), epochs_per_round, seed=0)


def test_a_round_ends_every_epochs_per_round_epochs():
    # 0-based epochs: with 2 epochs per round, epochs 1, 3, 5 end rounds 1, 2, 3.
    assert [curriculum(2).round_ends(e) for e in range(6)] == [False, True, False, True, False, True]
    assert all(curriculum(1).round_ends(e) for e in range(3))
    with pytest.raises(ValueError, match="--data.epochs_per_round must be >= 1"):
        curriculum(0)


def test_the_problem_stream_is_a_seeded_permutation_per_pass_and_resumes_from_the_cursor():
    c = curriculum()
    c.start(list(POOL), {})  # screening off: every problem is in the hard set
    first = [p.id for p in c.next_problems(POOL, 3)]
    rest = [p.id for p in c.next_problems(POOL, 2)]
    assert sorted(first + rest) == sorted(POOL) and c.cursor == 5  # one pass: each problem once
    # 3 more: the second pass, a fresh permutation; a copy restored at the cursor continues alike.
    restored = curriculum()
    restored.load_state_dict(c.state_dict())
    assert [p.id for p in c.next_problems(POOL, 3)] == [p.id for p in restored.next_problems(POOL, 3)]
    assert c.cursor == restored.cursor == 8


def test_a_draw_never_holds_a_problem_twice():
    # 5 problems, 8 asked for: each once (an epoch's results are keyed by id), the cursor one pass on.
    c = curriculum()
    c.start(list(POOL), {})
    assert sorted(p.id for p in c.next_problems(POOL, 8)) == sorted(POOL) and c.cursor == 5
    # Seed 0, round 0: pass 0 is a e b d c, pass 1 is d b c a e. Draws of 3 and 4: a e b, then
    # d c from pass 0 and, from pass 1, d (held: skipped), b, c (held: skipped), a. The cursor
    # moves past the skipped ones: 3 + 2 + 4 = 9. (Before, the second draw was d c d b.)
    c = curriculum()
    c.start(list(POOL), {})
    assert [p.id for p in c.next_problems(POOL, 3)] == ["a", "e", "b"]
    assert [p.id for p in c.next_problems(POOL, 4)] == ["d", "c", "b", "a"] and c.cursor == 9


def test_a_round_end_shrinks_the_hard_set_settles_the_buffer_and_restarts_the_stream():
    c = curriculum(rule="paper")
    # Round 0 (Eq. 8), Pass1@4 < 0.25 stays: a (0.0), d (0.0) and unmeasured e; b, c leave.
    c.start(list(POOL), {"a": 0.0, "b": 0.5, "c": 0.25, "d": 0.0})
    assert c.hard.ids == ("a", "d", "e")
    c.next_problems(POOL, 2)
    # A search of "a" found 1 correct of 4: pending under the paper rule until the round's rate.
    c.observe([("a", [((5, 6), "56")], 4), ("d", [], 4)])
    assert c.cached("a") == () and len(c.buffer) == 0
    # Round end: a measures 0.0 (stays hard, and its pending solution registers), d 0.5 leaves.
    change = c.end_round({"a": 0.0, "d": 0.5, "e": 0.0})
    assert (change.before, change.after, change.newly_cached) == (3, 2, 1)
    assert c.hard.ids == ("a", "e") and c.round == 1 and c.cursor == 0
    assert [s.response_ids for s in c.cached("a")] == [(5, 6)]


def test_the_state_round_trips_and_a_malformed_one_raises():
    c = curriculum()
    c.start(list(POOL), {})
    c.observe([("b", [((7,), "7")], 8)])  # code rule: 1 of 8 < delta 0.25, registered at once
    c.next_problems(POOL, 4)
    c.end_round({})
    back = curriculum()
    back.load_state_dict(c.state_dict())
    assert back.state_dict() == c.state_dict() and back.round == 1 and len(back.buffer) == 1
    broken = c.state_dict()
    del broken["replay_buffer"]
    with pytest.raises(KeyError):
        curriculum().load_state_dict(broken)


def rescreening(screen_problems: int | None = None, rule: str = "paper") -> Curriculum:
    return Curriculum(HardSetConfig(rescreen="all", screen_problems=screen_problems), ReplayConfig(rule=rule), 1, seed=0)


def test_rescreen_all_regrows_the_hard_set_and_keeps_the_cache_of_a_problem_that_left():
    c = rescreening()
    # D_hard(0): the whole pool is screened; a (0.0) and b (0.0) are hard.
    assert c.to_screen(list(POOL)) == list(POOL)
    c.start(c.to_screen(list(POOL)), {"a": 0.0, "b": 0.0, "c": 0.5, "d": 1.0, "e": 0.25})
    assert c.hard.ids == ("a", "b")
    # Round 0: a's search found 1 correct of 4 (pending, paper rule); b's found none.
    c.observe([("a", [((5, 6), "56")], 4), ("b", [], 4)])
    # Round 1's screening measures the pool again: a is still hard (0.0), so its solution is
    # registered; b learnt (0.5) and leaves; c was forgotten (0.0) and comes back, which Eq. 9
    # could never do.
    change = c.end_round({"a": 0.0, "b": 0.5, "c": 0.0, "d": 1.0, "e": 0.25}, c.to_screen(list(POOL)))
    assert c.hard.ids == ("a", "c") and (change.before, change.after, change.newly_cached) == (2, 2, 1)
    assert c.cached_count == 1 and [s.response_ids for s in c.cached("a")] == [(5, 6)]
    # Round 2: a is solved now (0.75) and leaves the set, but keeps its cached solution: the
    # buffer holds it, the hard set's count of cached problems drops to 0.
    c.end_round({"a": 0.75, "b": 0.5, "c": 0.0, "d": 1.0, "e": 0.25}, c.to_screen(list(POOL)))
    assert c.hard.ids == ("c",) and "a" in c.buffer and c.cached_count == 0
    # Round 3: a is forgotten again and comes back with its solution: a mixed rollout, no tree.
    c.end_round({"a": 0.0, "b": 0.5, "c": 0.0, "d": 1.0, "e": 0.25}, c.to_screen(list(POOL)))
    assert c.hard.ids == ("a", "c") and c.cached_count == 1 and c.cached("a")
    assert c.hard.history == (2, 2, 1, 2)
    with pytest.raises(ValueError, match="rescreen=all: a round's end needs the problems it screened"):
        c.end_round({"a": 0.0})


def test_rescreen_hard_still_shrinks_and_drops_the_cache_of_a_problem_that_left():
    c = curriculum(rule="paper")
    c.start(c.to_screen(list(POOL)), {"a": 0.0, "b": 0.0, "c": 0.5, "d": 1.0, "e": 0.25})
    c.observe([("a", [((5, 6), "56")], 4)])
    assert c.to_screen(list(POOL)) == ["a", "b"]  # Eq. 9: the hard set only
    c.end_round({"a": 0.0, "b": 0.5}, c.to_screen(list(POOL)))
    assert c.hard.ids == ("a",) and c.cached("a")
    c.end_round({"a": 0.75}, c.to_screen(list(POOL)))
    assert c.hard.ids == () and "a" not in c.buffer  # retain(hard ids): the paper's Table 6


def test_a_sampled_rescreen_always_measures_the_pending_candidates():
    c = rescreening(screen_problems=2)
    first = c.to_screen(list(POOL))
    assert len(first) == 2 and first == [p for p in POOL if p in first]
    c.start(first, dict.fromkeys(first, 0.0))
    pending = first[0]
    c.observe([(pending, [((1,), "1")], 4)])
    screened = c.to_screen(list(POOL))  # round 0's end: the pending one plus 2 of the other 4
    assert len(screened) == 3 and pending in screened
    c.end_round(dict.fromkeys(screened, 0.0), screened)
    assert c.hard.ids == tuple(screened) and c.cached(pending)  # settled: its post-round rate was measured
    # Round 1's sample is drawn with round 1's seed; a copy restored from the state draws the same.
    back = rescreening(screen_problems=2)
    back.load_state_dict(c.state_dict())
    assert back.to_screen(list(POOL)) == c.to_screen(list(POOL))


def test_the_token_split_is_counted_per_round_and_round_trips():
    c = rescreening()
    c.start(list(POOL), dict.fromkeys(POOL, 0.0))
    c.count_tokens(TokenSplit(screening=100))  # D_hard(0)'s screening, in round 0
    c.count_tokens(TokenSplit(tree=300, flat=100))  # epoch 0
    c.count_tokens(TokenSplit(screening=40))  # round 0's end screening, before the round counts
    c.end_round(dict.fromkeys(POOL, 0.0), list(POOL))
    # The round that just ended, until the next one counts something: 300 + 100 + 140.
    assert c.tokens.this_round == TokenSplit(tree=300, flat=100, screening=140)
    c.count_tokens(TokenSplit(tree=0, flat=50))  # round 1's first epoch: all mixed rollouts
    assert c.tokens.this_round == TokenSplit(flat=50) and c.tokens.round == 1
    assert c.tokens.total == TokenSplit(tree=300, flat=150, screening=140)
    back = rescreening()
    back.load_state_dict(c.state_dict())
    assert back.state_dict() == c.state_dict() and back.tokens.this_round == TokenSplit(flat=50)
    old = c.state_dict()
    del old["tokens"]  # a checkpoint from before the split was counted: restored from zero
    back.load_state_dict(old)
    assert back.tokens.total == TokenSplit() and back.hard == c.hard


def test_rescreen_all_with_a_problem_stream_is_refused_with_the_flags_named(tmp_path):
    with pytest.raises(ValueError, match=r"--data.hard_set.rescreen=all .* --data.problems.stream=true"):
        SearchDataModule(problems=ProblemsConfig(train_files=[str(tmp_path / "p.jsonl")], stream=True),
                         replay=ReplayConfig(enabled=False), hard_set=HardSetConfig(rescreen="all"))


@pytest.mark.parametrize("flag", ["max_concurrent_trees", "problems_per_epoch", "mini_batch_problems", "flat_samples"])
def test_counts_below_one_fail_at_construction_with_the_flag_named(flag):
    with pytest.raises(ValueError, match=rf"--data\.batching\.{flag}=0: must be >= 1; set it to 1 or more"):
        BatchingConfig(**{flag: 0})


@pytest.mark.parametrize("flag", ["max_train_problems", "max_eval_problems"])
def test_problem_limits_below_one_fail_at_construction_with_the_flag_named(flag):
    with pytest.raises(ValueError, match=rf"--data\.problems\.{flag}=0: must be >= 1, or null"):
        ProblemsConfig(**{flag: 0})


def test_an_unknown_advantage_rule_fails_with_the_flag_and_the_choices():
    with pytest.raises(ValueError, match=r"--data\.credit\.advantage must be one of \('node', .*\), got 'tree'"):
        Credit(advantage="tree")


def test_an_advantage_rule_a_flat_rollout_ignores_is_reported(caplog):
    with caplog.at_level(logging.WARNING, logger="data_modules.search"):
        SearchDataModule(rollout="flat", credit=Credit(advantage="subtree"))
    assert "--data.credit.advantage=subtree is not used with --data.rollout=flat" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="data_modules.search"):
        SearchDataModule(rollout="search", credit=Credit(advantage="outcome"))
        SearchDataModule(rollout="flat")
    assert caplog.text == ""


@pytest.mark.parametrize("advantage, rollout", [("subtree", "search"), ("best_of_n", "search"), ("node", "best_of_n")])
def test_normalize_std_where_the_credit_ignores_it_is_refused_at_construction(advantage, rollout):
    # Subtree and best-of-N credit never divide by a std; it used to be ignored without a word.
    with pytest.raises(ValueError, match=r"^--data\.credit\.normalize_std=true but .* which ignores it"):
        SearchDataModule(rollout=rollout, credit=Credit(advantage=advantage, normalize_std=True))


def test_normalize_std_where_the_credit_ignores_it_is_one_line_on_the_command_line(tmp_path):
    from pathlib import Path

    from flywheel.__main__ import main
    from flywheel.run.preflight import PreflightError

    quickstart = Path(__file__).resolve().parents[1] / "conf" / "quickstart.yaml"
    with pytest.raises(PreflightError, match=r"^--data\.credit\.normalize_std=true but --data\.credit\.advantage=subtree"):
        main(["--config", str(quickstart), "--data.credit.advantage=subtree", "--data.credit.normalize_std=true",
              f"--trainer.default_root_dir={tmp_path}"], run=False)


def test_generator_settings_fail_at_construction_with_the_flag_named():
    with pytest.raises(ValueError, match=r"--data\.generator\.init_args\.prefix_cache_mb must be >= 0"):
        HFBackend(prefix_cache_mb=-1)
    with pytest.raises(ValueError, match=r"--data\.generator\.init_args\.max_batch_size must be >= 1"):
        HFBackend(max_batch_size=0)


def test_the_live_generator_is_built_once_and_pushes_only_new_weight_versions():
    from flywheel.generation.backends import LiveGenerator
    from flywheel.policies.load import load_policy

    policy, tok = load_policy("tiny-countdown")
    live = LiveGenerator(HFBackend())
    with pytest.raises(RuntimeError, match="not started"):
        live.generator  # noqa: B018 (the getter builds nothing)
    assert not live.push(policy, 3)  # nothing to push to yet
    live.start(policy, tok, None, None, version=2)
    first = live.generator
    live.start(policy, tok, None, None, version=5)
    assert live.generator is first and live.version == 2  # built once
    assert not live.push(policy, 2)  # already at step 2
    assert live.push(policy, 4) and live.version == 4 and not live.push(policy, 4)
    live.close()
    assert not live.started
