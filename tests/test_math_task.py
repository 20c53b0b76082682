"""MathTask: DeepSearch's prompt (plain or as the chat template's user turn), fixed-chunk
steps, the math verifier, the built-in arithmetic splits; and conf/deepsearch_cpu.yaml runs
the math path end to end."""

import json
from pathlib import Path

import pytest

from flywheel.__main__ import main
from flywheel.reporting.problem_view import encode_prompt
from flywheel.rewards.math import answers_equal, parse
from flywheel.tasks import MathTask, Problem
from flywheel.policies.tiny import build_char_tokenizer

ROOT = Path(__file__).resolve().parents[1]


def test_prompt_steps_and_grading():
    task = MathTask()
    problem = Problem(id="p", question="What is $1/2 + 1/4$?", answer="\\frac{3}{4}")
    assert task.prompt(problem).endswith("output the final answer within \\boxed{}.")
    assert task.step.max_tokens == 256 and task.step.delimiter is None  # the paper's chunks
    assert task.max_response_tokens == 16384
    assert task.score(problem, "... so \\boxed{0.75}").correct
    assert not task.score(problem, "... so \\boxed{3/5}").correct
    assert not task.score(problem, "\\boxed{3/4 or 1/2}").correct  # hedged answers are wrong
    assert task.score(problem, "... so the answer is $0.75$.").correct  # default: unboxed answers count
    strict = MathTask(require_box=True)
    assert not strict.score(problem, "... so the answer is $0.75$.").correct
    assert strict.score(problem, "... so \\boxed{0.75}").correct


def test_builtin_arithmetic_is_seeded_and_its_answers_are_right():
    task = MathTask()
    a, b = task.problems("arith_test"), MathTask().problems("arith_test")
    assert a == b and len(a) == 500 and len({p.question for p in a}) == 500
    for problem in a[:200]:
        expression = problem.question.removeprefix("Compute ").removesuffix(".").replace("*", "\\times")
        assert answers_equal(parse(problem.answer), parse(expression)), problem
    train = task.problems("arith_train")
    assert len(train) == 2000 and not {p.question for p in train} & {p.question for p in a}  # held out
    with pytest.raises(ValueError, match="train_files"):
        task.problems("train")


def test_chat_template_wraps_the_prompt_when_the_tokenizer_has_one():
    tok = build_char_tokenizer()
    task = MathTask()
    problem = Problem(id="p", question="Compute 1 + 1.", answer="2")
    plain = encode_prompt(tok, task, problem)
    assert tok.decode(plain, skip_special_tokens=True) == task.prompt(problem)
    tok.chat_template = "{% for m in messages %}U:{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}A:{% endif %}"
    wrapped = encode_prompt(tok, task, problem)
    assert tok.decode(wrapped, skip_special_tokens=True) == f"U:{task.prompt(problem)}\nA:"
    assert encode_prompt(tok, MathTask(chat_template=False), problem) == plain


@pytest.mark.slow
def test_deepsearch_cpu_config_runs_the_math_path(tmp_path):
    cli = main(["fit", "--config", str(ROOT / "conf" / "deepsearch_cpu.yaml"), "--trainer.max_epochs=1",
                "--data.batching.problems_per_epoch=8", "--data.problems.max_train_problems=16", "--data.problems.max_eval_problems=8",
                f"--trainer.logger.init_args.save_dir={tmp_path}",
                f"--trainer.callbacks.init_args.dirpath={tmp_path / 'checkpoints'}"])
    assert cli.trainer.global_step > 0
    summary = json.loads((Path(cli.trainer.log_dir) / "summary.json").read_text())
    assert [r["round"] for r in summary["rounds"]] == [1]
    trees = (Path(cli.trainer.log_dir) / "trees" / "epoch_0000.jsonl").read_text().splitlines()
    tree = json.loads(trees[0])
    steps = [n for n in tree["nodes"][1:] if not n["terminal"]]
    assert steps and all(len(n["token_ids"]) == 16 for n in steps)  # fixed 16-token chunks
    assert "\\boxed{}" in tree["prompt_text"]


def test_deepsearch_recipe_config_reads_and_names_its_required_settings(tmp_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "flywheel", "fit", "--config", str(ROOT / "conf" / "deepsearch.yaml"),
                          "--print_config"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    for line in ("lr: 1.0e-06", "weight_decay: 0.1", "warmup_steps: 10", "clip_high: 0.28", "dual_clip: 10.0",
                 "expansion_width: 8", "trajectories_per_tree: 8", "max_depth: 64", "step_tokens: 256",
                 "max_response_tokens: 16384", "problems_per_epoch: 256", "mini_batch_problems: 32",
                 "class_path: flywheel.generation.vllm.VLLMSidecar", "config: conf/deepspeed/zero2.json"):
        assert line in out.stdout, line
    # On CPU, without DeepSpeed or vLLM: the missing policy is named before anything starts.
    cpu = ["--trainer.accelerator=cpu", "--trainer.strategy=auto", "--trainer.precision=32-true",
           "--data.generator=flywheel.generation.backends.HFBackend", "--model.dtype=float32",
           f"--trainer.logger.init_args.save_dir={tmp_path}", f"--trainer.callbacks.init_args.dirpath={tmp_path}"]
    with pytest.raises(ValueError, match="--model.policy is required"):
        main(["fit", "--config", str(ROOT / "conf" / "deepsearch.yaml"), *cpu])
    with pytest.raises(ValueError, match="--data.problems.train_files"):
        main(["fit", "--config", str(ROOT / "conf" / "deepsearch.yaml"), *cpu, "--model.policy=tiny-countdown",
              "--trainer.max_epochs=1"])
