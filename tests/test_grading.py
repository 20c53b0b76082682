"""The grading guard (flywheel.tasks.grading): a verifier that sleeps, raises, ends its
process or runs out of memory costs one wrong verdict ("timeout" / "error"), counted and
logged with the problem and the response's length, never a stalled or crashed run: on its own,
in the held-out evaluation, in the Pass1@K screening, in the search, and through a whole fit
(search/grading_timeouts in TensorBoard, the run's totals in summary.json). The misbehaving
verifier is tests/trap_task.py's. A verdict's limit is the verifier's own CPU time, so a loaded
machine (tests/busy.py's busy loops beside the grader) never turns a correct response wrong."""

from __future__ import annotations

import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from flywheel.tasks.base import Problem
from flywheel.tasks.countdown import CountdownProblem
from busy import busy_cpus
from flywheel.tasks.grading import Grader, GradingConfig, Usage, overrun
from trap_task import STARVE_CPU_S, TrapTask, set_traps, traps_left

PROBLEM = CountdownProblem.create("p1", [5, 9, 8], 67)
RIGHT = "9*8=72\n72-5=67\n<answer>(9*8)-5</answer>"  # 72 - 5 = 67
FAST = GradingConfig(timeout_s=1.0, backstop_s=2.0)


def grader_with(tmp_path: Path, config: GradingConfig = FAST, **traps: int) -> Grader:
    set_traps(tmp_path, **traps)
    return Grader(TrapTask(trap_dir=str(tmp_path)), config)


# ---------------------------------------------------------------------- the guard itself
def test_a_sleeping_verifier_is_cut_at_the_backstop_and_the_next_response_is_graded(tmp_path, caplog):
    grader = grader_with(tmp_path, sleep=1)
    try:
        with caplog.at_level(logging.WARNING, logger="flywheel.tasks.grading"):
            start = time.perf_counter()
            verdict = grader.score(PROBLEM, RIGHT)
            seconds = time.perf_counter() - start
        assert (verdict.correct, verdict.reward, verdict.answer, verdict.reason) == (False, -1.0, None, "timeout")
        assert seconds < 2.0 + 5.0  # the backstop, a worker's start and slack; the trap sleeps 600 s
        assert "problem 'p1'" in caplog.text and f"{len(RIGHT)} characters" in caplog.text
        assert "the verifier waiting, not computing" in caplog.text
        again = grader.score(PROBLEM, RIGHT)  # a new worker
        assert (again.correct, again.reason) == (True, "correct")
        assert grader.counts() == {"timeouts": 1, "errors": 0}
    finally:
        grader.close()


def test_a_computing_verifier_is_cut_by_its_cpu_time_long_before_the_backstop(tmp_path, caplog):
    grader = grader_with(tmp_path, GradingConfig(timeout_s=0.5, backstop_s=120.0), spin=1)
    try:
        with caplog.at_level(logging.WARNING, logger="flywheel.tasks.grading"):
            start = time.perf_counter()
            verdict = grader.score(PROBLEM, RIGHT)
            seconds = time.perf_counter() - start
        assert verdict.reason == "timeout" and seconds < 60.0  # the trap computes for 600 s
        assert "s of CPU, over the limit of 0.5 s (grading.timeout_s)" in caplog.text
        assert grader.score(PROBLEM, RIGHT).correct and grader.counts() == {"timeouts": 1, "errors": 0}
    finally:
        grader.close()


@pytest.mark.parametrize("usage, expected", [
    (Usage(wall_s=0.2, cpu_s=0.1, waiting_s=0.0), None),
    (Usage(wall_s=1.2, cpu_s=1.1, waiting_s=0.0), "cpu"),  # over the 1 s of CPU, under the backstop
    (Usage(wall_s=3.0, cpu_s=1.1, waiting_s=1.5), "cpu"),  # the CPU limit first
    (Usage(wall_s=3.0, cpu_s=0.7, waiting_s=0.0), None),  # slow, but not past the 4 s backstop
    (Usage(wall_s=4.5, cpu_s=0.0, waiting_s=0.1), "stalled"),  # asleep: 0.1 < 0.25 * 4.5 waiting for a CPU
    (Usage(wall_s=4.5, cpu_s=0.9, waiting_s=3.6), "starved"),  # 3.6 >= 0.25 * 4.5 waiting for a CPU
    (Usage(wall_s=4.5, cpu_s=0.0, waiting_s=None), "stalled"),  # no run-queue figures: not starved
    (Usage(wall_s=1.5, cpu_s=None, waiting_s=None), "cpu"),  # no CPU figures: the wall clock stands in
])
def test_which_limit_a_verdict_is_past(usage, expected):
    assert overrun(usage, GradingConfig(timeout_s=1.0, backstop_s=4.0)) == expected


# ---------------------------------------------------------------------- under load
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs: one to starve the worker on")
@pytest.mark.parametrize("starved, expected", [(1, (True, "correct", 0)), (2, (False, "timeout", 1))])
def test_a_verdict_starved_by_a_saturated_machine_is_graded_again_once(tmp_path, caplog, starved, expected):
    """The trap moves its worker to the first CPU at the lowest priority, beside two busy loops
    there: 0.3 s of CPU takes far longer than the 2 s backstop, nearly all of it waiting."""
    grader = grader_with(tmp_path, GradingConfig(timeout_s=1.0, backstop_s=2.0))
    try:
        grader.score(PROBLEM, RIGHT)  # the worker is up before the loops start
        set_traps(tmp_path, starve=starved)
        with caplog.at_level(logging.WARNING, logger="flywheel.tasks.grading"), \
                busy_cpus(2, cpu=min(os.sched_getaffinity(0))):
            verdict = grader.score(PROBLEM, RIGHT)
        assert (verdict.correct, verdict.reason, grader.counts()["timeouts"]) == expected
        assert grader.retries == 1 and "the machine is saturated); graded again" in caplog.text
        assert traps_left(tmp_path) == []
        if starved == 2:
            assert "the machine saturated" in caplog.text and "graded twice" in caplog.text
    finally:
        grader.close()
    assert STARVE_CPU_S > 0


def test_at_load_8_a_correct_response_after_a_sleeping_verifier_grades_correct(tmp_path):
    """A new worker's start (a fresh interpreter, seconds at load 8) is not a verdict's time."""
    grader = grader_with(tmp_path, sleep=2, **{"raise": 1})
    try:
        with busy_cpus(8):
            reasons = [grader.score(PROBLEM, RIGHT).reason for _ in range(12)]
        assert reasons == ["error", "timeout", "timeout"] + ["correct"] * 9  # the traps spring in name order
        assert grader.counts() == {"timeouts": 2, "errors": 1} and grader.retries == 0
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
    late = Grader(slow, GradingConfig(timeout_s=0.05, backstop_s=0.1, isolate=False)).score(PROBLEM, RIGHT)
    assert (late.correct, late.reason) == (False, "timeout")  # a right answer, but asleep past the backstop
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


class UnloadableTask(TrapTask):
    """Copies into the grading worker but cannot be loaded there (its loader refuses any other process)."""

    def __reduce__(self):
        return _load_in, (os.getpid(),)


def _load_in(pid: int) -> TrapTask:
    if os.getpid() != pid:
        raise ImportError("a module this process does not have")
    return TrapTask()


def test_a_task_the_worker_cannot_load_stops_the_run_with_its_error():
    with pytest.raises(RuntimeError, match="could not load the task: ImportError"):
        Grader(UnloadableTask()).score(PROBLEM, RIGHT)


SCRIPT = """
import os, signal, sys, threading, time
# A run started at a terminal: Python's own Ctrl-C handler, SIGINT not blocked. A child inherits an
# ignored or blocked SIGINT from the process that starts it, and the test runner's process may
# hold one (the README's suite at load 8 once ran this script to its end with no KeyboardInterrupt).
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {{signal.SIGINT}})
sys.path[:0] = {path!r}
from flywheel.tasks.countdown import CountdownProblem
from flywheel.tasks.grading import Grader, GradingConfig
from trap_task import TrapTask, set_traps
PROBLEM, RIGHT = CountdownProblem.create("p1", [5, 9, 8], 67), {right!r}
from pathlib import Path
grader = Grader(TrapTask(trap_dir={traps!r}), GradingConfig(timeout_s=1.0, backstop_s=300.0))
assert grader.score(PROBLEM, RIGHT).correct
print(grader._worker.process.pid, flush=True)
if {action!r} == "interrupt":  # what a Ctrl-C at the terminal does: SIGINT to the whole process group
    try:
        os.killpg(os.getpgid(0), signal.SIGINT)
        time.sleep(5)
    except KeyboardInterrupt:
        print("stopped", flush=True)
else:  # end this process while its worker is stuck in a sleeping verifier
    set_traps(Path({traps!r}), sleep=1)
    threading.Thread(target=grader.score, args=(PROBLEM, RIGHT), daemon=True).start()
    time.sleep(1.0)
    os._exit(0)
"""


def run_script(tmp_path: Path, action: str) -> tuple[int, subprocess.CompletedProcess]:
    here = str(Path(__file__).parent)
    script = SCRIPT.format(path=[here, str(Path(here).parent)], traps=str(tmp_path / "traps"), action=action,
                           right=RIGHT)
    (tmp_path / "traps").mkdir()
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          timeout=600, start_new_session=True)  # minutes where the machine is loaded
    return int(done.stdout.split()[0]), done


def gone(pid: int, within_s: float) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_a_ctrl_c_reaches_the_run_and_not_its_grading_worker(tmp_path):
    worker, done = run_script(tmp_path, "interrupt")
    assert "stopped" in done.stdout and done.returncode == 0
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr, done.stderr
    assert gone(worker, 30.0)


def test_a_worker_stuck_in_a_verifier_ends_when_its_run_is_gone(tmp_path):
    worker, done = run_script(tmp_path, "exit")
    assert done.returncode == 0 and gone(worker, 30.0)  # the verifier would sleep 600 s


@pytest.mark.parametrize("settings", [{"timeout_s": 0.0}, {"timeout_s": float("inf")}, {"memory_mb": -1},
                                      {"backstop_s": 0.0}, {"timeout_s": 30.0, "backstop_s": 20.0}])
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
                          grader=grader)
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
                               config=HardSetConfig(k=2), seed=0, grader=grader)
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
                      search=search, flat_samples=2, max_concurrent_trees=2, credit=Credit(), grader=grader)
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
                  "--data.task.init_args.numbers_count=3", "--data.grading.timeout_s=1.0",
                  "--data.grading.backstop_s=2.0"))
    assert traps_left(traps) == []  # sprung by the first evaluation's responses
    summary = json.loads(next(run.rglob("summary.json")).read_text())
    assert (summary["rounds"][-1]["grading_timeouts"], summary["rounds"][-1]["grading_errors"]) == (1, 1)
    assert summary["rounds"][-1]["hard_set_size"] is None  # the quickstart's hard set is off: no size to draw
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(next(run.rglob("events.out.tfevents.*")).parent))
    events.Reload()
    assert [e.value for e in events.Scalars("search/grading_timeouts")] == [1.0]
    assert [e.value for e in events.Scalars("search/grading_errors")] == [1.0]
