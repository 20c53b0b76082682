"""Chain arithmetic: the verifier (hand-worked and fuzzed), the task's rows and splits, and
the line-by-line reading of a response (flywheel.tasks.chain, flywheel.rewards.chain,
flywheel.tasks.chain_data, tools/make_chain_splits.py)."""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flywheel.rewards.chain import MAX_COMPLETION_CHARS, verify
from flywheel.tasks.chain import ChainProblem, ChainTask, as_chain
from flywheel.tasks.chain_data import chain_values, failure_profile, format_completion, line_errors, make_chain
from flywheel.tasks.sources import load_problems

ROOT = Path(__file__).resolve().parents[1]

TRACE = "37+48=85\n85-19=66\n66*3=198\n<answer>198</answer>"


# -- the verifier ----------------------------------------------------------------------------


@pytest.mark.parametrize("completion, correct, reason, answer", [
    (TRACE, True, "correct", "198"),
    ("<answer>198</answer>", True, "correct", "198"),  # only the answer is graded
    ("37+48=85\n85-19=67\n67*3=201\n<answer>201</answer>", False, "wrong_value", "201"),
    ("<answer>201</answer> no: <answer> 198 </answer>", True, "correct", "198"),  # the last block
    ("<answer>198</answer> then <answer>7</answer>", False, "wrong_value", "7"),
    ("<answer>198</answer>\n<answer>19", True, "correct", "198"),  # an unclosed tail hides nothing
    ("37+48=85\n85-19=66", False, "no_answer", None),
    ("<answer></answer>", False, "parse_error", ""),
    ("<answer>198.0</answer>", False, "parse_error", "198.0"),
    ("<answer>+198</answer>", False, "parse_error", "+198"),
    ("<answer>1 98</answer>", False, "parse_error", "1 98"),
    ("<answer>\u0661\u0669\u0668</answer>", False, "parse_error", "\u0661\u0669\u0668"),  # Arabic-Indic digits
    ("<answer>198-0</answer>", False, "parse_error", "198-0"),
    ("<answer>0198</answer>", True, "correct", "0198"),  # an integer's value, leading zeros and all
])
def test_verify_hand_worked(completion, correct, reason, answer):
    verdict = verify(198, completion)
    assert (verdict.correct, verdict.reason, verdict.answer) == (correct, reason, answer)
    assert verdict.reward == (1.0 if correct else -1.0)


def test_verify_negative_values_and_bad_gold():
    assert verify(-4, "<answer>-4</answer>").correct
    assert verify(4, "<answer>-4</answer>").reason == "wrong_value"
    with pytest.raises(TypeError):
        verify(True, "<answer>1</answer>")
    with pytest.raises(TypeError):
        verify("198", TRACE)


def test_verify_bounds_length_and_digits():
    assert verify(1, "x" * (MAX_COMPLETION_CHARS + 1)).reason == "too_long"
    huge = "9" * 10_000
    verdict = verify(1, f"<answer>{huge}</answer>")
    assert verdict.reason == "parse_error" and len(verdict.answer) <= 25  # never int() of 10,000 digits


@pytest.mark.parametrize("shape", [
    "<answer>" * 100_000, "</answer>" * 100_000, " " * 200_000, "\n" * 200_000, "1" * 200_000,
    "<answer>" + "1" * 200_000 + "</answer>", "<answer>3" + " " * 200_000 + "</answer>",
    "37+48=85\n" * 20_000, ("<answer>1</answer>" * 10_000),
])
def test_verify_is_fast_on_long_adversarial_shapes(shape):
    start = time.perf_counter()
    verify(198, shape)
    assert time.perf_counter() - start < 0.5


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("<>/answer0123456789-+* =\n\t.e")), max_size=2000))
def test_verify_never_raises_and_is_fast_on_any_text(text):
    start = time.perf_counter()
    verdict = verify(198, text)
    assert time.perf_counter() - start < 0.2
    assert verdict.correct == (verdict.reason == "correct")


# -- the task ---------------------------------------------------------------------------------


def test_problem_prompt_and_score():
    task = ChainTask()
    problem = ChainProblem.create("c1", 37, [("+", 48), ("-", 19), ("*", 3)])
    assert (problem.question, problem.answer, problem.value) == ("37 +48 -19 *3", "198", 198)
    assert task.prompt(problem) == "37 +48 -19 *3\n"
    assert task.score(problem, TRACE).correct
    assert not task.score(problem, TRACE.replace("198", "199")).correct
    # a plain Problem with the same text is the same chain
    from flywheel.tasks import Problem

    plain = Problem(id="c1", question="37 +48 -19 *3", answer="198")
    assert as_chain(plain) == problem and task.score(plain, TRACE).correct
    with pytest.raises(ValueError, match="does not match"):
        as_chain(Problem(id="c2", question="37 +48", answer="86"))


def test_math_answer_format_reads_a_chat_model_s_answers():
    task = ChainTask(answer_format="math", prompt_template="Start with {start}, apply {ops}. Answer in \\boxed{{}}.")
    problem = ChainProblem.create("c", 37, [("+", 48), ("-", 19)])
    assert task.prompt(problem) == "Start with 37, apply +48 -19. Answer in \\boxed{}."
    assert task.score(problem, "37 + 48 = 85, 85 - 19 = 66, so \\boxed{66}").correct
    assert task.score(problem, "The answer is 66.").correct
    assert task.score(problem, "\\boxed{67}").reason.startswith("wrong_value")
    assert not task.score(problem, "<answer>66</answer>\nso the answer is 67").correct
    assert task.answer_rules and ChainTask().answer_rules == ()
    with pytest.raises(ValueError, match="answer_format"):
        ChainTask(answer_format="box")


def test_prompt_template_fields_are_checked():
    assert ChainTask(prompt_template="Start {start}, then {ops}.\n").prompt(
        ChainProblem.create("c", 2, [("*", 3)])) == "Start 2, then *3.\n"
    for bad in ("{start}\n", "{start} {ops} {target}", "{start"):
        with pytest.raises(ValueError, match="prompt_template"):
            ChainTask(prompt_template=bad)
    with pytest.raises(ValueError, match="lengths"):
        ChainTask(lengths=[0])


def write_rows(tmp_path: Path, rows: list) -> str:
    path = tmp_path / "chains.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return str(path)


GOOD = {"id": "c1", "start": 37, "ops": [["+", 48], ["-", 19], ["*", 3]], "answer": 198}


def test_rows_load_in_both_encodings(tmp_path):
    files = [write_rows(tmp_path, [GOOD, {"id": "c2", "problem": "5 *3 -20", "answer": "-5"}])]
    problems = load_problems(ChainTask(), files, "train").problems
    assert [(p.id, p.start, p.ops, p.answer) for p in problems] == [
        ("c1", 37, (("+", 48), ("-", 19), ("*", 3)), "198"), ("c2", 5, (("*", 3), ("-", 20)), "-5")]


@pytest.mark.parametrize("row, message", [
    ({**GOOD, "ops": [["/", 2]], "answer": 18}, "unknown operation '/'"),
    ({**GOOD, "ops": [["^", 2]], "answer": 1369}, "unknown operation"),
    ({**GOOD, "start": 37.0}, "`start` must be an integer"),
    ({**GOOD, "start": "37"}, "`start` must be an integer"),
    ({**GOOD, "start": True}, "`start` must be an integer"),
    ({**GOOD, "ops": [["+", 48.5], ["-", 19], ["*", 3]]}, "`ops` must be an integer"),
    ({**GOOD, "answer": 199}, "does not match the ops, which give 198"),
    ({**GOOD, "answer": "198"}, "`answer` must be an integer"),
    ({k: v for k, v in GOOD.items() if k != "answer"}, "missing answer"),
    ({k: v for k, v in GOOD.items() if k != "ops"}, "missing ops"),
    ({"id": "x", "numbers": [1, 2]}, "a chain row needs `start`"),
    ({**GOOD, "ops": []}, "`ops` must be a list of 1 to 64"),
    ({**GOOD, "ops": "+48"}, "`ops` must be a list"),
    ({**GOOD, "ops": [["+", 48, 1]]}, "an \\[op, operand\\] pair"),
    ({**GOOD, "ops": [["*", 10**5]] * 3, "answer": 37 * 10**15}, "beyond the limit"),
    ({"id": "x", "problem": "37 + 48", "answer": "85"}, "`problem` must be a chain as text"),
    ({"id": "x", "problem": "37 +48", "answer": "eighty-five"}, "`answer` must be the chain's value as text"),
    ({**GOOD, "id": ["c1"]}, "`id` must be a string"),
])
def test_bad_rows_are_refused_with_file_and_line(tmp_path, row, message):
    files = [write_rows(tmp_path, [GOOD | {"id": "ok"}, row])]
    with pytest.raises(ValueError, match=message) as err:
        load_problems(ChainTask(), files, "train")
    assert "chains.jsonl:2:" in str(err.value)


def test_a_bad_row_in_a_split_file_names_its_line(tmp_path):
    path = write_rows(tmp_path, [GOOD, "not json"])
    with pytest.raises(ValueError, match="chains.jsonl:2: not valid JSON"):
        ChainTask(split_files={"mine": path}).problems("mine")


# -- the shipped splits -----------------------------------------------------------------------


def test_shipped_splits_are_disjoint_sized_and_consistent():
    task = ChainTask()
    sizes = {"train": 8000, "val": 500, "test": 500, "test_hard": 500, "short": 500}
    lengths = {"train": set(range(2, 9)), "val": set(range(2, 9)), "test": set(range(2, 9)),
               "test_hard": set(range(9, 13)), "short": {1, 2}}
    seen: dict[tuple, str] = {}
    for split, size in sizes.items():
        problems = task.problems(split)
        assert len(problems) == size
        assert {len(p.ops) for p in problems} == lengths[split]
        for p in problems:
            key = (p.start, p.ops)
            assert key not in seen, f"{p.id} of {split} is also in {seen[key]}"
            seen[key] = split
            values = chain_values(p.start, p.ops)
            assert all(0 <= v <= 99 for v in values)
            assert all(o <= 9 for op, o in p.ops if op == "*")
            assert task.score(p, format_completion(p.start, p.ops)).correct
    assert len(ChainTask(lengths=[3]).problems("train")) == 8000 // 7 + (1 if 8000 % 7 > 1 else 0)


def test_the_splits_tool_reproduces_the_shipped_files():
    sys.path.insert(0, str(ROOT / "tools"))
    from make_chain_splits import SEED, build_splits

    from flywheel.assets import asset_path

    for split, rows in build_splits(SEED).items():
        shipped = asset_path("chain", f"{split}.jsonl").read_text(encoding="utf-8")
        assert shipped == "".join(json.dumps(row) + "\n" for row in rows), split


def test_make_chain_stays_in_range():
    rng = random.Random(0)
    for _ in range(500):
        start, ops = make_chain(rng, rng.randint(1, 12))
        assert all(0 <= v <= 99 for v in chain_values(start, ops))
    with pytest.raises(ValueError):
        make_chain(rng, 0)


# -- reading a response line by line ----------------------------------------------------------

OPS = [("+", 48), ("-", 19), ("*", 3)]


@pytest.mark.parametrize("completion, wrong, complete", [
    (TRACE, (), True),
    ("37+48=85\n85-19=67\n67*3=201\n<answer>201</answer>", (2,), True),  # one slip, carried on consistently
    ("37+48=85\n85-19=67\n66*3=198\n<answer>198</answer>", (2, 3), True),  # line 3 ignores line 2's result
    ("37+48=84\n84-19=64\n64*3=192\n<answer>192</answer>", (1, 2), True),
    ("37+48=85\n85+19=104\n104*3=312\n<answer>312</answer>", (2,), True),  # the wrong operation
    ("37+48=85\n85-91=-6\n-6*3=-18\n<answer>-18</answer>", (2,), True),  # the wrong operand
    ("37 + 48 = 85\n85 - 19 = 66\n66 * 3 = 198\n<answer> 198 </answer>", (), True),  # spaces are fine
    ("37+48=85\n85-19=66\n<answer>66</answer>", (), False),  # a line missing
    ("37+48=85\n85-19=66\n66*3=198\n198+1=199\n<answer>199</answer>", (4,), False),  # a line added
    ("37+48=85\nhello\n66*3=198\n<answer>198</answer>", (2, 3), True),  # line 3 has no stated result to start from
    ("37+48=85\n85-19=66\n66*3=198\n<answer>197</answer>", (), False),  # the answer is not the last result
    ("37+48=85\n85-19=66\n66*3=198", (), False),  # no answer line
])
def test_line_errors_hand_worked(completion, wrong, complete):
    reading = line_errors(37, OPS, completion)
    assert (reading.wrong_lines, reading.complete) == (wrong, complete)
    assert reading.first_wrong == (wrong[0] if wrong else None)
    assert reading.one_local_mistake == (complete and len(wrong) == 1)


def test_failure_profile_hand_worked():
    failures = [(37, OPS, c) for c in (
        "37+48=85\n85-19=67\n67*3=201\n<answer>201</answer>",  # one wrong line, line 2 (second fifth of 3)
        "37+48=84\n84-19=64\n64*3=192\n<answer>192</answer>",  # several, first at line 1
        "37+48=85\n85-19=66\n<answer>66</answer>",  # incomplete, no wrong line
        "37+48=85\n85-19=66\n66*3=199\n<answer>199</answer>",  # one wrong line, line 3 (last fifth)
    )]
    profile = failure_profile(failures)
    assert (profile.failed, profile.one_wrong_line, profile.several_wrong_lines, profile.not_a_complete_chain) == (4, 2, 1, 1)
    assert profile.first_wrong_line == {1: 1, 2: 1, 3: 1}
    assert profile.first_wrong_fifth == (1, 1, 0, 1, 0)  # lines 1, 2, 3 of 3 -> fifths 0, 1 (5*1//3), 3 (5*2//3)


def test_line_errors_is_bounded_on_long_lines():
    start = time.perf_counter()
    reading = line_errors(37, OPS, "3" * 200_000 + "\n" + "=" * 200_000)
    assert time.perf_counter() - start < 0.5 and reading.wrong_lines == (1, 2)


def test_docstring_examples():
    import doctest

    import flywheel.rewards.chain as verifier
    import flywheel.tasks.chain_data as data

    assert doctest.testmod(verifier).failed == 0 and doctest.testmod(data).failed == 0


# -- the tools that read chain runs (tools/mistake_credit.py, tools/chain_failures.py) ---------


def _tree_of_one_mistake(tmp_path: Path) -> Path:
    """A saved tree on train-07504 (95 -32 -47 = 16): one shared correct first step, then a
    correct and a wrong second step, each ending the response."""
    node = lambda i, parent, text, q, reward=None: {"id": i, "parent": parent, "q": q, "q_soft": q, "text": text,
                                                   "reward": reward}
    nodes = [node(0, None, "", 0.0), node(1, 0, "95-32=63\n", 0.0),
             node(2, 1, "63-47=16\n<answer>16</answer>", 1.0, 1.0), node(3, 1, "63-47=15\n<answer>15</answer>", -1.0, -1.0)]
    trajectory = lambda ids, reward: {"node_ids": ids, "reward": reward, "final_score": reward, "overlong_penalty": 0.0,
                                      "response_text": "".join(nodes[i]["text"] for i in ids)}
    tree = {"problem_id": "train-07504", "nodes": nodes, "trajectories": [trajectory([1, 2], 1.0), trajectory([1, 3], -1.0)]}
    run = tmp_path / "run"
    (run / "version_0" / "trees").mkdir(parents=True)
    (run / "version_0" / "trees" / "epoch_0000.jsonl").write_text(json.dumps(tree) + "\n")
    return run


def test_mistake_credit_finds_the_wrong_step_and_reads_each_rules_advantage_of_it(tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "tools"))
    from mistake_credit import chain_first_wrong, main, measure

    run = _tree_of_one_mistake(tmp_path)
    chains = chain_first_wrong("train")
    m = measure(run, ["outcome", "subtree"], chains)
    # One failed trajectory, its mistake at step 2 (node 3). Outcome credit: every step of the
    # failure gets the response's advantage, negative, the shared first step included.
    assert m["outcome"]["mistakes"] == 1 and m["outcome"]["mistake_positive"] == 0.0
    assert m["outcome"]["mistake_mean"] < 0 and m["outcome"]["before_mean"] == m["outcome"]["mistake_mean"]
    # Subtree credit: the wrong step's subtree (-1) against its parent's (mean 0) is negative;
    # the shared first step's (0) against the root's (0) is zero.
    assert m["subtree"]["mistake_mean"] < 0 and m["subtree"]["before_mean"] == pytest.approx(0.0, abs=1e-6)
    assert main([str(run), "--rules", "outcome"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "RESULT run_outcome_mistake_positive=0.000"
    with pytest.raises(SystemExit, match="no saved trees"):
        measure(tmp_path, ["outcome"], chains)


def test_chain_failures_reads_the_tiny_chain_policy(capsys):
    sys.path.insert(0, str(ROOT / "tools"))
    from chain_failures import main

    assert main(["tiny-chain", "--lengths", "6", "--max-problems", "2", "--samples", "2"]) == 0
    result = dict(kv.split("=") for kv in capsys.readouterr().out.splitlines()[-1].split()[1:])
    assert set(result) == {"tiny-chain_pass1", "tiny-chain_one_wrong", "tiny-chain_incomplete", "tiny-chain_tokens"}
    assert 0.0 <= float(result["tiny-chain_pass1"]) <= 1.0 and float(result["tiny-chain_tokens"]) > 10


def test_the_shipped_chain_policies_and_the_chain_task_agree_on_plain_prompts():
    """`flywheel eval` of a shipped chain policy with the command its run.json records warned that
    ChainTask "asks for the tokenizer's chat template", which no chain policy of the project has:
    the task now asks for it only when told (`chat_template=true`, for a pretrained chat model)."""
    import shlex

    from transformers import AutoTokenizer

    from flywheel.policies.check import chat_template_warning
    from flywheel.tasks.math import MathTask

    shipped = ROOT / "results" / "chain_long" / "deepsearch_seed0"
    command = shlex.split(json.loads((shipped / "run.json").read_text())["eval_command"])
    assert "--task" in command and not any("chat_template" in a for a in command)
    folder = str(ROOT / command[command.index("--policy") + 1])
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert not tokenizer.chat_template
    assert ChainTask().chat_template is False
    assert chat_template_warning(ChainTask(lengths=[6, 7, 8]), tokenizer, folder, "--task.init_args.chat_template") is None
    # A task that does ask for it is still warned about (issue 49).
    assert "asks for the tokenizer's chat template" in chat_template_warning(ChainTask(chat_template=True), tokenizer,
                                                                             folder, "--task.init_args.chat_template")
    assert chat_template_warning(MathTask(), tokenizer, folder, "--task.init_args.chat_template") is not None
