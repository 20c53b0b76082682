"""The grading guard (flywheel.tasks.grading): a verifier that sleeps, raises, ends its
process or runs out of memory costs one wrong verdict ("timeout" / "error"), counted and
logged with the problem and the response's length, never a stalled or crashed run: on its own,
in the held-out evaluation, in the Pass1@K screening, in the search, and through a whole fit
(search/grading_timeouts in TensorBoard, the run's totals in summary.json). The misbehaving
verifier is tests/trap_task.py's."""

from __future__ import annotations

import json
import logging
import pickle
import time
from pathlib import Path

import pytest
import torch

from flywheel.tasks.base import Problem
from flywheel.tasks.countdown import CountdownProblem
from flywheel.tasks.grading import Grader, GradingConfig
from trap_task import TrapTask, set_traps, traps_left

PROBLEM = CountdownProblem.create("p1", [5, 9, 8], 67)
RIGHT = "9*8=72\n72-5=67\n<answer>(9*8)-5</answer>"  # 72 - 5 = 67
FAST = GradingConfig(timeout_s=1.0)


def grader_with(tmp_path: Path, config: GradingConfig = FAST, **traps: int) -> Grader:
    set_traps(tmp_path, **traps)
    return Grader(TrapTask(trap_dir=str(tmp_path)), config)


# ---------------------------------------------------------------------- the guard itself
def test_a_sleeping_verifier_is_cut_at_the_limit_and_the_next_response_is_graded(tmp_path, caplog):
    grader = grader_with(tmp_path, sleep=1)
    try:
        with caplog.at_level(logging.WARNING, logger="flywheel.tasks.grading"):
            start = time.perf_counter()
            verdict = grader.score(PROBLEM, RIGHT)
            seconds = time.perf_counter() - start
        assert (verdict.correct, verdict.reward, verdict.answer, verdict.reason) == (False, -1.0, None, "timeout")
        assert seconds < 1.0 + 5.0  # the limit, a worker's start and slack; the trap sleeps 600 s
        assert "problem 'p1'" in caplog.text and f"{len(RIGHT)} characters" in caplog.text
        again = grader.score(PROBLEM, RIGHT)  # a new worker
        assert (again.correct, again.reason) == (True, "correct")
        assert grader.counts() == {"timeouts": 1, "errors": 0}
    finally:
        grader.close()


@pytest.mark.parametrize("trap", ["raise", "exit", "memory"])
def test_a_verifier_that_raises_dies_or_overflows_its_memory_is_graded_error(tmp_path, trap, caplog):
    config = GradingConfig(timeout_s=30.0, memory_mb=256)  # 8 GiB asked for, 256 MB allowed
    grader = grader_with(tmp_path, config, **{trap: 1})
    try:
        with caplog.at_level(logging.WARNING, logger="flywheel.tasks.grading"):
            verdict = grader.score(PROBLEM, RIGHT)
        assert (verdict.correct, verdict.reason) == (False, "error")
        assert {"raise": "ArithmeticError('a verifier bug')", "exit": "exit code 3",
                "memory": "more than grading.memory_mb=256 MB"}[trap] in caplog.text
        assert grader.score(PROBLEM, RIGHT).correct
        assert grader.counts() == {"timeouts": 0, "errors": 1}
    finally:
        grader.close()


def test_in_process_grading_catches_exceptions_and_grades_late_verdicts_as_timeouts(tmp_path):
    grader = grader_with(tmp_path, GradingConfig(timeout_s=0.05, isolate=False), **{"raise": 1})
    assert grader.score(PROBLEM, RIGHT).reason == "error"
    slow = TrapTask()
    slow.score = lambda problem, completion, truncated=False: (time.sleep(0.2), TrapTask.score(slow, problem, completion))[1]
    late = Grader(slow, GradingConfig(timeout_s=0.05, isolate=False)).score(PROBLEM, RIGHT)
    assert (late.correct, late.reason) == (False, "timeout")  # a right answer, but past the limit
    assert grader.counts() == {"timeouts": 0, "errors": 1}


def test_only_the_first_events_are_logged_and_every_one_is_counted(tmp_path, caplog):
    grader = grader_with(tmp_path, GradingConfig(timeout_s=30.0), **{"raise": 8})
    try:
        with caplog.at_level(logging.WARNING, logger="flywheel.tasks.grading"):
            verdicts = [grader.score(PROBLEM, RIGHT) for _ in range(9)]
        assert [v.reason for v in verdicts] == ["error"] * 8 + ["correct"]
        assert caplog.text.count("grading error") == 5 and "later ones are only counted" in caplog.text
        assert grader.counts() == {"timeouts": 0, "errors": 8}
    finally:
        grader.close()


def test_a_task_that_cannot_be_copied_into_the_worker_names_the_way_out():
    task = TrapTask()
    task.hook = lambda: None  # a lambda does not pickle
    with pytest.raises(TypeError, match="--data.grading.isolate=false"):
        Grader(task).score(PROBLEM, RIGHT)


def test_a_grader_copies_without_its_worker_and_keeps_its_counts(tmp_path):
    grader = grader_with(tmp_path, **{"raise": 1})
    try:
        grader.score(PROBLEM, RIGHT)
        copy = pickle.loads(pickle.dumps(grader))
        assert copy.counts() == {"timeouts": 0, "errors": 1} and copy.score(PROBLEM, RIGHT).correct
        copy.close()
    finally:
        grader.close()


@pytest.mark.parametrize("settings", [{"timeout_s": 0.0}, {"timeout_s": float("inf")}, {"memory_mb": -1}])
def test_bad_grading_settings_are_refused_naming_the_flag(settings):
    with pytest.raises(ValueError, match="--data.grading"):
        GradingConfig(**settings)


# ---------------------------------------------------------------------- in the loop
@pytest.fixture(scope="module")
def tiny():
    from flywheel.generation.hf import HFGenerator
    from flywheel.policies.load import load_policy

    torch.manual_seed(0)
    model, tokenizer = load_policy("tiny-countdown")
    return HFGenerator(model.eval(), tokenizer), tokenizer


def countdown_problems(count: int) -> list[Problem]:
    return list(TrapTask(numbers_count=3).problems("test")[:count])


def test_the_evaluation_grades_a_stuck_and_a_failing_verifier_wrong_and_finishes(tiny, tmp_path):
    from flywheel.reporting.evaluation import EvalConfig, evaluate

    generator, tokenizer = tiny
    grader = grader_with(tmp_path, sleep=1, **{"raise": 1})
    try:
        result = evaluate(generator, tokenizer, grader.task, countdown_problems(3), EvalConfig(samples=2),
                          grade=grader.score)
    finally:
        grader.close()
    reasons = dict(result.reasons)
    assert (reasons["timeout"], reasons["error"]) == (1, 1) and sum(reasons.values()) == 6
    assert traps_left(tmp_path) == [] and grader.counts() == {"timeouts": 1, "errors": 1}


def test_the_screening_grades_a_stuck_and_a_failing_verifier_wrong_and_finishes(tiny, tmp_path):
    from data_modules.screening import screen
    from flywheel.adaptive import HardSetConfig

    generator, tokenizer = tiny
    grader = grader_with(tmp_path, sleep=1, **{"raise": 1})
    problems = countdown_problems(2)
    try:
        rates, tokens = screen(problems, generator=generator, tokenizer=tokenizer, task=grader.task,
                               config=HardSetConfig(k=2), seed=0, grade=grader.score)
    finally:
        grader.close()
    assert set(rates) == {p.id for p in problems} and tokens > 0
    assert traps_left(tmp_path) == [] and grader.counts() == {"timeouts": 1, "errors": 1}


def test_the_search_grades_a_stuck_and_a_failing_verifier_wrong_and_finishes(tiny, tmp_path):
    from data_modules.rollout import rollout
    from flywheel.objectives.credit import Credit
    from flywheel.search.config import SearchConfig

    generator, tokenizer = tiny
    grader = grader_with(tmp_path, sleep=1, **{"raise": 1})
    search = SearchConfig(max_depth=8, expansion_width=2, trajectories_per_tree=4, max_expansions_per_tree=8)
    try:
        out = rollout(countdown_problems(2), generator=generator, task=grader.task, tokenizer=tokenizer, kind="search",
                      search=search, flat_samples=2, max_concurrent_trees=2, credit=Credit(), grade=grader.score)
    finally:
        grader.close()
    reasons = [t.verdict.reason for r in out.results for t in r.trajectories]
    assert len(out.results) == 2 and traps_left(tmp_path) == []
    assert grader.counts() == {"timeouts": 1, "errors": 1}
    assert {"timeout", "error"} <= set(reasons)  # wrong trajectories (seeded: the same every run)


def test_a_fit_counts_the_guards_verdicts_in_tensorboard_and_summary_json(tmp_path):
    from test_faults import fit_args

    from flywheel.__main__ import main

    traps = tmp_path / "traps"
    set_traps(traps, sleep=1, **{"raise": 1})
    run = tmp_path / "run"
    main(fit_args(run, "--data.task=trap_task.TrapTask", f"--data.task.init_args.trap_dir={traps}",
                  "--data.task.init_args.numbers_count=3", "--data.grading.timeout_s=1.0"))
    assert traps_left(traps) == []  # sprung by the first evaluation's responses
    summary = json.loads(next(run.rglob("summary.json")).read_text())
    assert (summary["rounds"][-1]["grading_timeouts"], summary["rounds"][-1]["grading_errors"]) == (1, 1)
    assert summary["rounds"][-1]["hard_set_size"] is None  # the quickstart's hard set is off: no size to draw
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(next(run.rglob("events.out.tfevents.*")).parent))
    events.Reload()
    assert [e.value for e in events.Scalars("search/grading_timeouts")] == [1.0]
    assert [e.value for e in events.Scalars("search/grading_errors")] == [1.0]
