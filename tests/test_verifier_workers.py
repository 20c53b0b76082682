"""The verifiers hold no signals and no global state, so they give the same verdicts inside
DataLoader worker processes (fork and spawn) and threads as in the main process (README:
"runs in threads and workers"). Verdicts worked out by hand."""

import math
from concurrent.futures import ThreadPoolExecutor

import pytest
from torch.utils.data import DataLoader, Dataset

from flywheel.tasks import Problem
from flywheel.tasks.countdown import CountdownProblem, CountdownTask
from flywheel.tasks.math import MathTask

CD = CountdownProblem.create("cd", [5, 9, 8], 67)
CASES = [
    # (task, problem, completion, correct)
    ("countdown", CD, "9*8=72\n72-5=67\n<answer>(9*8)-5</answer>", True),  # 72 - 5 = 67
    ("countdown", CD, "<answer>9*8-8</answer>", False),  # 64, and 8 used twice
    ("countdown", CD, "<answer>9*8</answer>", False),  # 72, not 67
    ("countdown", CD, "<answer>" + "(" * 10_000 + "1" + ")" * 10_000 + "</answer>", False),  # too long: bounded
    ("math", Problem("m1", "Half of 1?", "\\frac{1}{2}"), "So the answer is \\boxed{0.5}.", True),  # 1/2 = 0.5
    ("math", Problem("m2", "1 + 1?", "2"), "\\boxed{3}", False),
    ("math", Problem("m3", "sqrt 8?", "2\\sqrt{2}"), "\\boxed{\\sqrt{8}}", True),  # sqrt 8 = 2 sqrt 2
    ("math", Problem("m4", "big?", "1"), "\\boxed{" + "9^" * 200 + "9}", False),  # a power tower: bounded, wrong
]
TASKS = {"countdown": CountdownTask(), "math": MathTask()}


class Grading(Dataset):
    def __len__(self):
        return len(CASES)

    def __getitem__(self, i):
        name, problem, completion, _ = CASES[i]
        verdict = TASKS[name].score(problem, completion)
        return i, verdict.correct, verdict.reward


def expected():
    return [(i, correct, 1.0 if correct else -1.0) for i, (_, _, _, correct) in enumerate(CASES)]


def test_verdicts_by_hand_in_the_main_process():
    assert [Grading()[i] for i in range(len(CASES))] == expected()


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_verdicts_are_the_same_in_dataloader_workers(context):
    loader = DataLoader(Grading(), batch_size=None, num_workers=2, multiprocessing_context=context, timeout=300)
    got = sorted((int(i), bool(c), float(r)) for i, c, r in loader)
    assert got == expected()


def test_verdicts_are_the_same_in_threads():
    data = Grading()
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(data.__getitem__, [i % len(CASES) for i in range(4 * len(CASES))]))
    assert got == expected() * 4
    assert not any(math.isnan(r) for _, _, r in got)
