"""`python -m flywheel eval`: pass@k / mean@n from a checkpoint or a folder, per problem file,
to JSON and TensorBoard; sharded across processes without double counting."""

import json
import logging
import os
import socket
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from flywheel.__main__ import main
from procs import run_group
from flywheel.reporting.evaluation import merge_shards, shard
from flywheel.reporting.evaluation import EvalResult
from flywheel.tasks import Problem
from flywheel.run.errors import PreflightError
from flywheel.tasks.countdown import CountdownTask

ROOT = Path(__file__).resolve().parents[1]


def write_jsonl(path: Path, problems) -> Path:
    path.write_text("".join(json.dumps({"id": p.id, "problem": p.question, "answer": p.answer}) + "\n" for p in problems))
    return path


def test_shards_cover_every_problem_once_and_merge_in_order():
    problems = [Problem(id=f"p{i}", question="q", answer="a") for i in range(7)]
    parts = [shard(problems, rank, 3) for rank in range(3)]
    assert sorted(p.id for part in parts for p in part) == sorted(p.id for p in problems)
    results = [EvalResult(tuple(p.id for p in part), (4,) * len(part), tuple(int(p.id[1:]) % 5 for p in part), 10)
               for part in parts]
    merged = merge_shards(problems, results)
    assert merged.problem_ids == tuple(p.id for p in problems)
    assert merged.correct == tuple(i % 5 for i in range(7)) and merged.generated_tokens == 30
    with pytest.raises(ValueError, match="two ranks"):
        merge_shards(problems, results + results[:1])
    with pytest.raises(ValueError, match="not evaluated"):
        merge_shards(problems, results[:2])


@pytest.mark.slow
def test_eval_of_a_checkpoint_reproduces_the_in_run_evaluation(tmp_path):
    fit = main(["fit", "--config", str(ROOT / "conf" / "quickstart.yaml"), "--trainer.max_epochs=1",
                "--data.batching.problems_per_epoch=8", "--data.problems.max_eval_problems=16", "--data.eval.samples=2",
                "--data.epochs_per_round=1", f"--trainer.logger.init_args.save_dir={tmp_path}",
                f"--trainer.callbacks.init_args.dirpath={tmp_path / 'checkpoints'}"])
    summary = json.loads((Path(fit.trainer.log_dir) / "summary.json").read_text())
    report = main(["eval", "--checkpoint", str(tmp_path / "checkpoints" / "last.ckpt"), "--split", "test",
                   "--samples", "2", "--max_problems", "16", "--out", str(tmp_path / "eval")])
    result = report["results"]["test"]
    assert result["problems"] == 16 and report["global_step"] == fit.trainer.global_step
    assert result["pass@1"] == pytest.approx(summary["rounds"][-1]["eval_pass1"])
    assert result["pass@2"] == pytest.approx(summary["rounds"][-1]["eval_passk"])
    assert result["mean@2"] == result["pass@1"]
    assert json.loads((tmp_path / "eval" / "eval.json").read_text())["results"]["test"]["pass@1"] == result["pass@1"]
    ea = EventAccumulator(str(tmp_path / "eval"))
    ea.Reload()
    assert {"eval/test/pass@1", "eval/test/pass@2"} <= set(ea.Tags()["scalars"])

    # tools/export_hf.py: the checkpoint's policy as a model folder, evaluated the same.
    sys.path.insert(0, str(ROOT / "tools"))
    from export_hf import main as export_main

    folder = export_main([str(tmp_path / "checkpoints" / "last.ckpt"), str(tmp_path / "hf")])
    exported = main(["eval", "--policy", str(folder), "--split", "test", "--samples", "2", "--max_problems", "16",
                     "--out", str(tmp_path / "eval_hf")])
    assert exported["results"]["test"]["per_problem"] == result["per_problem"]
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    # --dtype bfloat16: the weights rounded to bf16 (half the file), still a policy eval loads
    half = export_main([str(tmp_path / "checkpoints" / "last.ckpt"), str(tmp_path / "hf_bf16"), "--dtype", "bfloat16"])
    with safe_open(str(half / "model.safetensors"), "pt") as weights:
        assert {weights.get_tensor(k).dtype for k in weights.keys()} == {torch.bfloat16}
    assert (half / "model.safetensors").stat().st_size < 0.6 * (folder / "model.safetensors").stat().st_size
    rounded = main(["eval", "--policy", str(half), "--split", "test", "--samples", "2", "--max_problems", "16",
                    "--out", str(tmp_path / "eval_bf16")])
    assert rounded["results"]["test"]["problems"] == 16


@pytest.mark.slow
@pytest.mark.ddp
def test_eval_reports_each_file_and_matches_under_two_processes(tmp_path):
    test = CountdownTask().problems("test")
    a = write_jsonl(tmp_path / "a.jsonl", test[:9])
    b = write_jsonl(tmp_path / "b.jsonl", test[100:105])
    args = ["--policy", "tiny-countdown", "--files", f"[{a},{b}]", "--samples", "3", "--k", "[1,2]"]
    single = main(["eval", *args, "--out", str(tmp_path / "one")])
    assert set(single["results"]) == {"a", "b"}
    assert [r["problems"] for r in single["results"].values()] == [9, 5]
    assert {"pass@1", "pass@2", "mean@3"} <= set(single["results"]["a"])

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = run_group(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}",
         "--master_addr=127.0.0.1", "-m", "flywheel", "eval", *args, "--out", str(tmp_path / "two")],
        timeout=300, cwd=ROOT, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    double = json.loads((tmp_path / "two" / "eval.json").read_text())
    assert double["world_size"] == 2
    for name in ("a", "b"):
        assert double["results"][name]["per_problem"] == single["results"][name]["per_problem"]
        assert double["results"][name]["pass@1"] == single["results"][name]["pass@1"]


# ---------------------------------------------------------------------- fit overlays, the recorded task, --device
GSM8K = ROOT / "conf" / "data" / "gsm8k.yaml"
GSM_ROWS = [{"question": f"What is {a} plus {b}?", "answer": f"{a} + {b} = {a + b}\n#### {a + b}"} for a, b in ((2, 3), (7, 8))]
SHORT = ["--samples", "1", "--max_problems", "2"]


@pytest.fixture
def gsm_file(tmp_path) -> Path:
    path = tmp_path / "gsm.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in GSM_ROWS))
    return path


@pytest.fixture(scope="module")
def math_checkpoint(tmp_path_factory) -> Path:
    """A checkpoint as `fit --config conf/deepsearch_cpu.yaml --config conf/data/gsm8k.yaml` records
    its task (flywheel.run.settings), around the tiny policy's weights: no fit needed."""
    from flywheel.policies.load import load_policy
    from flywheel.run.settings import SETTINGS_KEY

    model, _ = load_policy("tiny-countdown")
    task = "--data.task.init_args."
    settings = {"--data.task.class_path": "flywheel.tasks.math.MathTask", f"{task}step_tokens": 16,
                f"{task}max_response_tokens": 64, f"{task}gold_format": "hashes", f"{task}system_prompt": None,
                f"{task}prompt_suffix": " Let's think step by step and output the final answer within \\boxed{}.",
                "--data.problems.columns.problem": "question", "--seed_everything": 0}
    path = tmp_path_factory.mktemp("ckpt") / "math.ckpt"
    torch.save({"state_dict": {f"policy.{k}": v for k, v in model.state_dict().items()}, "global_step": 3,
                "hyper_parameters": {"policy": "tiny-countdown"}, SETTINGS_KEY: settings}, path)
    return path


def test_a_fit_overlay_reaches_eval_s_task_and_columns(gsm_file, tmp_path):
    # Before: "Option 'data.task.init_args.gold_format' is not accepted".
    from flywheel.reporting.eval_command import run_eval
    from flywheel.run.overlays import fit_config_flags

    args = fit_config_flags(["--config", str(GSM8K), "--task.init_args.max_response_tokens=64"], run_eval, "eval")
    assert args[:2] == ['--task={"class_path": "flywheel.tasks.math.MathTask", "init_args": {"gold_format": "hashes", '
                        '"prompt_suffix": " Let\'s think step by step and output the final answer within \\\\boxed{}."}}',
                        '--columns={"problem": "question", "answer": "answer"}']
    report = main(["eval", "--config", str(GSM8K), "--policy", "tiny-countdown", "--files", str(gsm_file),
                   "--task.init_args.max_response_tokens=64", "--device", "cpu", *SHORT, "--out", str(tmp_path / "e")])
    assert report["results"]["gsm"]["problems"] == 2
    assert (report["task"], report["device"], report["dtype"]) == ("flywheel.tasks.math.MathTask", "cpu", "float32")


def test_eval_of_a_checkpoint_takes_its_recorded_task_and_layers_flags_on_it(math_checkpoint, gsm_file, tmp_path, caplog):
    # Before: the default Countdown task, refused with "evaluate it with --task flywheel.tasks.math.MathTask".
    base = ["eval", "--checkpoint", str(math_checkpoint), "--files", str(gsm_file), "--columns.problem=question",
            *SHORT, "--out", str(tmp_path / "e")]
    with caplog.at_level(logging.INFO, logger="flywheel.eval"):
        report = main(base)
    assert report["task"] == "flywheel.tasks.math.MathTask"
    assert (f"evaluating with the task recorded in {math_checkpoint}: MathTask(step_tokens=16, max_response_tokens=64, "
            "gold_format='hashes')") in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="flywheel.eval"):
        main(base + ["--config", str(GSM8K)])  # the run's own overlay changes nothing: no warning
    assert "evaluating with the task recorded in" in caplog.text and "differs" not in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="flywheel.eval"):
        main(base + ["--task.init_args.max_response_tokens=32"])  # the recorded task, one setting changed
    assert (f"the task given differs from the one {math_checkpoint} was trained with: max_response_tokens 64 -> 32"
            in caplog.text)
    with pytest.raises(PreflightError) as err:  # another task class: refused before the policy loads
        main(base + ["--task=flywheel.tasks.chain.ChainTask"])
    assert (f"--task flywheel.tasks.chain.ChainTask: {math_checkpoint} was trained on flywheel.tasks.math.MathTask; "
            "leave --task (and a --config that sets data.task) out") in str(err.value)


def test_eval_refuses_a_gpu_this_machine_lacks_before_loading(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(PreflightError, match="--device=cuda: this machine has no CUDA device"):
        main(["eval", "--policy", "tiny-countdown", "--device", "cuda", "--out", str(tmp_path)])
