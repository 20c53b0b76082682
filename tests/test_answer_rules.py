"""Issue 36 at the seams: a response cut by the length limit reaches the verifier as
`truncated` (tree search, flat rollouts, held-out evaluation) and is graded by the strict
rules; the rule that read each answer is counted as `reward/answer_rule/<rule>`."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from data_modules.epoch_metrics import epoch_metrics
from flywheel.reporting.evaluation import EvalConfig, evaluate
from flywheel.generation.base import Completion
from flywheel.rewards import Verdict
from flywheel.search import DriverStats, SearchConfig, SearchProblem, flat_rollouts, run_search
from scripted import EOS, ScriptedGenerator, toy_decode, toy_score
from flywheel.tasks import MathTask, Problem
from flywheel.tasks.base import StepSpec
from flywheel.policies.tiny import build_char_tokenizer


def recording_score(seen: list):
    def score(text: str, truncated: bool = False) -> Verdict:
        seen.append((text, truncated))
        return toy_score(text)
    return score


def test_search_grades_a_terminal_cut_at_max_depth_as_truncated():
    # d_T = 1: "W" + EOS ends by EOS; "xx" stops at its token cap, cut by the depth limit.
    script = {(0,): [Completion((3, EOS), (-1.0, -1.0), "eos"), Completion((5, 5), (-1.0, -1.0), "length")]}
    seen: list = []
    cfg = SearchConfig(expansion_width=2, trajectories_per_tree=2, max_depth=1)
    run_search([SearchProblem((0,), recording_score(seen), id="p")], ScriptedGenerator(script), cfg,
               step=StepSpec(2), decode=toy_decode)
    assert sorted(seen) == [("W", False), ("xx", True)]


def test_flat_rollouts_grade_a_length_cut_response_as_truncated():
    script = {(0,): [Completion((3, EOS), (-1.0, -1.0), "eos"), Completion((5, 5), (-1.0, -1.0), "length")]}
    seen: list = []
    flat_rollouts([SearchProblem((0,), recording_score(seen), id="p")], ScriptedGenerator(script), n=2,
                  step=StepSpec(2), decode=toy_decode, config=SearchConfig(max_depth=1))
    assert sorted(seen) == [("W", False), ("xx", True)]


def test_math_task_grades_a_truncated_response_by_boxes_only():
    task, problem = MathTask(), Problem("p", "3 + 4?", "7")
    assert task.score(problem, "3 + 4 = 7. The answer is 7.").reason == "correct:phrase"
    assert task.score(problem, "3 + 4 = 7. The answer is 7.", truncated=True).reason == "no_answer"
    assert task.score(problem, "3 + 4 = 7, so \\boxed{7}. Let me also check", truncated=True).reason == "correct:box"


class _TwoEndings:
    """Every request gets the same text twice: once ended by EOS, once cut by the length limit."""

    def __init__(self, ids):
        self.ids = tuple(ids)

    def sample(self, requests):
        return [[Completion(self.ids, (-1.0,) * len(self.ids), "eos"),
                 Completion(self.ids, (-1.0,) * len(self.ids), "length")] for _ in requests]


def test_evaluation_grades_a_length_cut_response_strictly():
    tok = build_char_tokenizer(" .=+34ATaehinrsw7")
    text = "3 + 4 = 7. The answer is 7."
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids, skip_special_tokens=True) == text
    result = evaluate(_TwoEndings(ids), tok, MathTask(chat_template=False), [Problem("p", "3 + 4?", "7")],
                      EvalConfig(samples=2))
    # The EOS-ended copy is read by its answer phrase; the length-cut copy has no box: no answer.
    assert result.correct == (1,)
    assert dict(result.reasons) == {"correct:phrase": 1, "no_answer": 1}


def _result(*reasons: str):
    trajectories = [SimpleNamespace(steps=(SimpleNamespace(depth=1),), reward=0.0, verdict=Verdict(r.startswith("correct"), 0.0, None, r))
                    for r in reasons]
    stats = SimpleNamespace(expansions=1, nodes=2, max_depth=1)
    tree = SimpleNamespace(turns={}, observation=[()])  # not an environment's
    return SimpleNamespace(searched=True, complete=True, stats=stats, trajectories=trajectories, tree=tree)


def test_epoch_metrics_give_the_share_of_each_answer_rule():
    results = [_result("correct:box", "wrong_value:phrase"), _result("no_answer", "correct:box")]
    metrics = epoch_metrics(results, DriverStats(), 1.0, 0, None, answer_rules=MathTask.answer_rules)
    # 4 trajectories: 2 read by a box, 1 by a phrase, 1 with no answer; the other rules read none.
    assert {k: v for k, v in metrics.items() if k.startswith("reward/")} == {
        "reward/answer_rule/box": 0.5, "reward/answer_rule/phrase": 0.25, "reward/answer_rule/hashes": 0.0,
        "reward/answer_rule/last_line": 0.0, "reward/answer_rule/conclusion": 0.0, "reward/answer_rule/none": 0.25}
    assert not any(k.startswith("reward/") for k in epoch_metrics(results, DriverStats(), 1.0, 0, None))


def test_verdict_names_its_answer_rule():
    assert Verdict(True, 1.0, "7", "correct:last_line").answer_rule == "last_line"
    assert Verdict(False, -1.0, None, "no_answer").answer_rule is None


@pytest.mark.parametrize("rule", MathTask.answer_rules)
def test_every_rule_reads_an_answer(rule):
    examples = {"box": "so \\boxed{7}", "phrase": "The answer is 7.", "hashes": "3 + 4\n#### 7",
                "last_line": "We add them.\n7", "conclusion": "Adding, the total is $7$."}
    assert MathTask().score(Problem("p", "3 + 4?", "7"), examples[rule]).reason == f"correct:{rule}"
