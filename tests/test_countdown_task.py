"""Countdown generator, solver, trace format, shipped splits and the CountdownTask seam."""

from __future__ import annotations

import doctest
import importlib.util
import json
import random
from collections import Counter
from pathlib import Path

import pytest

import flywheel.tasks.countdown_data as countdown_data
from flywheel.assets import asset_path
from flywheel.rewards.countdown import verify
from flywheel.tasks import Problem, StepSpec
from flywheel.tasks.countdown import CountdownProblem, CountdownTask
from flywheel.tasks.countdown_data import (
    GenerationConfig,
    format_completion,
    generate_problems,
    iter_solutions,
    least_frequent,
    reduction_distribution,
    sample_reductions,
    solution_expression,
    solve,
)

ROOT = Path(__file__).resolve().parents[1]


def load_tool():
    path = ROOT / "tools" / "make_countdown_splits.py"
    spec = importlib.util.spec_from_file_location("make_countdown_splits", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_doctests_pass():
    assert doctest.testmod(countdown_data).failed == 0


# ---- generator ---------------------------------------------------------------------------


def test_reduction_distribution_hand_worked():
    # (1, 1): only 1+1 is legal (1-1 needs a > b; a factor 1 bars * and /), in both orders
    assert reduction_distribution([1, 1]) == {2: 1.0}
    # (2, 2): 2+2, 2*2 and 2/2, each in both orders: 4 twice as likely as 1
    assert reduction_distribution([2, 2]) == pytest.approx({1: 1 / 3, 4: 2 / 3})
    assert sum(reduction_distribution([3, 7, 12, 5]).values()) == pytest.approx(1.0)


def reference_reduction(numbers: list[int], rng: random.Random) -> int:
    """at2005/llm-mcts create_countdown_target: shuffle, pop two, random op, retry if illegal."""
    numbers = list(numbers)
    while len(numbers) > 1:
        rng.shuffle(numbers)
        a, b = numbers.pop(), numbers.pop()
        op = rng.choice("+-*/")
        legal = {
            "+": True,
            "-": a > b,
            "*": a > 1 and b > 1,
            "/": b > 1 and a % b == 0,
        }[op]
        if not legal:
            numbers += [a, b]
            continue
        numbers.append({"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op])
    return numbers[0]


def test_exact_distribution_matches_simulated_reference_reductions():
    rng = random.Random(0)
    counts = Counter(reference_reduction([3, 5, 7], rng) for _ in range(20_000))
    exact = reduction_distribution([3, 5, 7])
    assert set(counts) <= set(exact)
    for value, p in exact.items():
        assert counts[value] / 20_000 == pytest.approx(p, abs=0.012), value


def test_generation_is_deterministic():
    hard = GenerationConfig(count=4, mode="hard", target_max=None, reductions=2000)
    assert generate_problems(30, seed=7) == generate_problems(30, seed=7)
    assert generate_problems(10, seed=7, config=hard) == generate_problems(10, seed=7, config=hard)
    assert generate_problems(30, seed=7) != generate_problems(30, seed=8)


def test_generated_problems_respect_the_config():
    config = GenerationConfig(count=4, low=2, high=6, target_min=10, target_max=40)
    problems = generate_problems(50, seed=1, config=config, keep=lambda m: 2 in m)
    assert len({(tuple(sorted(n)), t) for n, t in problems}) == 50
    for numbers, target in problems:
        assert len(numbers) == 4 and all(2 <= n <= 6 for n in numbers) and 2 in numbers
        assert 10 <= target <= 40
        assert solve(numbers, target) is not None


def test_generation_fails_loudly_when_too_narrow():
    with pytest.raises(RuntimeError, match="distinct problems"):
        generate_problems(10, seed=0, config=GenerationConfig(count=2, low=1, high=1))


def test_hard_mode_picks_a_least_frequent_target():
    config = GenerationConfig(count=4, mode="hard", target_max=None)
    [(numbers, target)] = generate_problems(1, seed=3, config=config)
    # replay the generator's draws: the numbers, then the 10,000 reductions, then the tie-break
    rng = random.Random(3)
    assert numbers == tuple(rng.randint(1, 13) for _ in range(4))
    counts = sample_reductions(reduction_distribution(numbers), 10_000, rng)
    assert counts[target] == min(counts.values())
    assert target == least_frequent(counts, rng)


def test_least_frequent_breaks_ties_among_the_rarest_only():
    counts = {5: 3, 9: 1, 11: 1, 24: 50}
    picks = {least_frequent(counts, random.Random(seed)) for seed in range(20)}
    assert picks == {9, 11}


# ---- solver and trace format ----------------------------------------------------------------


def test_solver_and_trace_format_hand_worked():
    steps = solve([5, 9, 8], 67)
    assert steps == [(9, "*", 8, 72), (72, "-", 5, 67)]
    assert format_completion([5, 9, 8], steps) == "9*8=72\n72-5=67\n<answer>(9*8)-5</answer>"
    assert solve([1, 1, 1], 50) is None
    assert solve([2, 3], 7) is None  # only 5, 1, 6 reachable (2/3 and 2-3 are not integers)


def test_expression_with_an_intermediate_equal_to_a_given_number():
    # 4-2 = 2 equals a given 2; either 2 may feed the next step, the value is the same
    numbers, steps = [4, 2, 2, 7], [(4, "-", 2, 2), (7, "+", 2, 9), (9, "*", 2, 18)]
    expression = solution_expression(numbers, steps)
    assert verify(numbers, 18, f"<answer>{expression}</answer>").correct


def test_expression_rejects_inconsistent_steps():
    with pytest.raises(ValueError, match="not valid"):
        solution_expression([5, 9], [(9, "*", 5, 44)])
    with pytest.raises(ValueError, match="not available"):
        solution_expression([5, 9], [(9, "*", 4, 36)])
    with pytest.raises(ValueError, match="leave 2 values"):
        solution_expression([5, 9, 8], [(9, "*", 8, 72)])


def test_every_solution_verifies():
    solutions = list(iter_solutions([4, 6, 2, 3], 24))
    assert len(solutions) > 5
    for steps in solutions:
        assert verify([4, 6, 2, 3], 24, format_completion([4, 6, 2, 3], steps)).correct


# ---- shipped splits -----------------------------------------------------------------------


def read_rows(split: str) -> list[dict]:
    return [json.loads(line) for line in asset_path("countdown", f"{split}.jsonl").read_text().splitlines()]


def test_shipped_splits_are_disjoint_by_multiset():
    multisets = {
        split: {tuple(sorted(row["numbers"])) for row in read_rows(split)} for split in ("train", "test", "test_hard")
    }
    assert not multisets["train"] & multisets["test"]
    assert not multisets["train"] & multisets["test_hard"]
    assert not multisets["test"] & multisets["test_hard"]


def test_shipped_splits_have_the_promised_shape():
    train, test, test_hard = read_rows("train"), read_rows("test"), read_rows("test_hard")
    assert Counter((len(r["numbers"]), r["mode"]) for r in train) == {(3, "random"): 4000, (4, "hard"): 4000}
    assert {(len(r["numbers"]), r["mode"]) for r in test} == {(3, "random")} and len(test) >= 600
    assert {(len(r["numbers"]), r["mode"]) for r in test_hard} == {(4, "hard")} and len(test_hard) >= 500
    for split, rows in (("train", train), ("test", test), ("test_hard", test_hard)):
        assert [r["id"] for r in rows] == [f"countdown-{split}-{i:05d}" for i in range(len(rows))]
        assert len({(tuple(sorted(r["numbers"])), r["target"]) for r in rows}) == len(rows)
        assert all(set(r) == {"id", "numbers", "target", "mode"} for r in rows)
    assert all(1 <= r["target"] <= 99 for r in test)


def test_shipped_problems_are_solvable_and_their_traces_verify():
    for split in ("train", "test", "test_hard"):
        for row in read_rows(split):
            steps = solve(row["numbers"], row["target"])
            assert steps is not None, row
            assert verify(row["numbers"], row["target"], format_completion(row["numbers"], steps)).correct, row


def test_hard_targets_are_rare_outcomes():
    # each test_hard target is among the rarest quarter of the values a random reduction reaches
    for row in read_rows("test_hard")[::5]:
        distribution = reduction_distribution(row["numbers"])
        rarer = sum(p < distribution[row["target"]] for p in distribution.values())
        assert rarer < 0.25 * len(distribution), row


def test_tool_regenerates_the_shipped_test_splits():
    tool = load_tool()
    sizes = {"train_3": 0, "train_4": 0, "test": 600, "test_hard": 500}
    splits = tool.build_splits(tool.SEED, sizes)
    assert splits["test"] == read_rows("test")
    assert splits["test_hard"] == read_rows("test_hard")


# ---- the task -----------------------------------------------------------------------------


def test_task_prompt_and_score_round_trip():
    task = CountdownTask()
    problem = CountdownProblem.create("p", [5, 9, 8], 67)
    assert task.prompt(problem) == "5 9 8|67\n"
    completion = format_completion(problem.numbers, solve(problem.numbers, problem.target))
    assert task.score(problem, completion).correct
    assert task.score(problem, "9*8=72\n<answer>9*8</answer>").reason == "bad_numbers"
    # the prompt is never graded: an answer inside it does not count
    assert task.score(problem, "").reason == "no_answer"


def test_task_options():
    problem = CountdownProblem.create("p", [5, 9, 8], 67)
    assert CountdownTask(each_number="at_most_once").score(problem, "<answer>9*8</answer>").reason == "wrong_value"
    dense = CountdownTask(reward="dense").score(problem, "<answer>9*8+5</answer>")
    assert dense.reward == pytest.approx(1 - 2 * 10 / 67)  # value 77, 10 off a target of 67
    task = CountdownTask(prompt_template="Numbers: {numbers}\nTarget: {target}\n")
    assert task.prompt(problem) == "Numbers: 5 9 8\nTarget: 67\n"


def test_task_defaults():
    task = CountdownTask()
    assert task.step == StepSpec(max_tokens=40, delimiter="\n")
    assert task.max_response_tokens == 128


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"each_number": "twice"}, "each_number"),
        ({"reward": "shaped"}, "reward"),
        ({"prompt_template": "{numbers}\n"}, "prompt_template"),
        ({"prompt_template": "{numbers}|{target}|{id}\n"}, "prompt_template"),
        ({"prompt_template": "{numbers|{target}\n"}, "prompt_template"),
        ({"max_step_tokens": 0}, "max_tokens"),
    ],
)
def test_task_validates_its_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CountdownTask(**kwargs)


def test_task_problems_from_the_shipped_splits():
    task = CountdownTask()
    test = task.problems("test")
    assert len(test) == len(read_rows("test"))
    first = test[0]
    assert isinstance(first, CountdownProblem) and first.id == "countdown-test-00000"
    assert first.question == " ".join(map(str, first.numbers)) and first.answer == str(first.target)
    assert isinstance(first.numbers, tuple) and len({first, test[0]}) == 1  # hashable
    assert task.problems("test") == test and task.problems("test") is not test
    with pytest.raises(ValueError, match="unknown countdown split 'dev'"):
        task.problems("dev")


def test_task_split_files_override(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"id": "a", "numbers": [5, 9, 8], "target": 67}\n\n{"problem": "2, 3", "answer": "6"}\n')
    task = CountdownTask(split_files={"mine": str(path)})
    a, b = task.problems("mine")
    assert (a.id, a.numbers, a.target) == ("a", (5, 9, 8), 67)
    assert (b.id, b.numbers, b.target) == (f"{path}:3", (2, 3), 6)
    assert len(task.problems("test")) > 0  # the shipped splits are still there
    path.write_text('{"numbers": [5, 9, 8], "target": "67"}\n')
    with pytest.raises(ValueError, match=r"mine\.jsonl:1: `target` must be an integer"):
        CountdownTask(split_files={"mine": str(path)}).problems("mine")


def test_problem_from_row_encodings_round_trip():
    task = CountdownTask()
    problem = task.problem_from_row({"id": "x", "numbers": [5, 9, 8], "target": 67, "mode": "random"}, "f:1")
    assert problem == CountdownProblem.create("x", (5, 9, 8), 67)
    text_row = {"id": "x", "problem": problem.question, "answer": problem.answer}
    assert task.problem_from_row(text_row, "f:2") == problem
    # a plain Problem with the same text encoding is graded the same way
    plain = Problem(id="x", question="5 9 8", answer="67")
    assert task.prompt(plain) == "5 9 8|67\n"
    assert task.score(plain, "<answer>9*8-5</answer>").correct


@pytest.mark.parametrize(
    "row",
    [
        {"numbers": [5, 9, 8]},
        {"numbers": [5, 9, 8], "target": 67.0},
        {"numbers": [5, 9, 8], "target": True},
        {"numbers": "5 9 8", "target": 67},
        {"numbers": [5], "target": 5},
        {"numbers": [5, -9, 8], "target": 67},
        {"numbers": [5, 9.0, 8], "target": 67},
        {"problem": "5 9 8"},
        {"problem": "5 nine 8", "answer": "67"},
        {"problem": "5 9 8", "answer": "sixty-seven"},
        {"problem": "5 9 8", "answer": 67},
        {"question": "5 9 8", "target_value": 67},
    ],
)
def test_bad_rows_name_their_location(row):
    with pytest.raises(ValueError, match=r"^data\.jsonl:7: "):
        CountdownTask().problem_from_row(row, "data.jsonl:7")
