"""`python -m flywheel sft` (flywheel.sft): the loss on response tokens only (a hand-computed
mask), digests of a few steps pinned before the loop moved out of tools/ (the shipped tiny
policies' recipe reproduces through it), packing equal to padded rows, a stopped run resumed
to the same weights, a bad row refused with its file:line, and the command writing a policy
folder that `fit` loads and that the command itself evaluates. SmolLM2: tests/test_real_model.py."""

from __future__ import annotations

import hashlib
import json
import os
import signal
from pathlib import Path

import pytest
import torch

from flywheel.io import file_sha256
from flywheel.policies.tiny import build_char_tokenizer, build_tiny_llama
from flywheel.run.errors import PreflightError
from flywheel.sft.command import run_sft
from flywheel.sft.loop import SftSettings, collate, packed_loss, sft_batches
from flywheel.sft.train import CHECKPOINT, SftStopped, train
from flywheel.sft.traces import Trace, file_traces, solver_episodes, episode_traces, solver_traces
from flywheel.tasks.chain import ChainTask
from flywheel.tasks.countdown import CountdownTask
from flywheel.tasks.mastermind import MastermindTask

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = build_char_tokenizer()
FEW = SftSettings(steps=4, batch_size=8, warmup_steps=1, precision="float32")


def digest(model) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def tiny_model():
    return build_tiny_llama(TOKENIZER, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0)


def traces_of(name: str):
    task = {"countdown": CountdownTask, "chain": ChainTask, "mastermind": MastermindTask}[name]()
    train_split = task.problems("train")[:12]
    if name == "mastermind":
        return episode_traces(task, TOKENIZER, train_split, solver_episodes(task, train_split, 2, 0.3, "lowest", 0))
    return solver_traces(task, TOKENIZER, train_split, 2)


def test_labels_are_the_response_tokens_only_by_hand():
    """Row 0: BOS a b | c d EOS (prompt 3); row 1: BOS a | b c (prompt 2), c's loss masked off
    (an observation). Padding, prompts and masked tokens are -100."""
    rows = [Trace((1, 10, 11, 12, 13, 2), 3), Trace((1, 10, 11, 12), 2, (True, False))]
    ids, mask, labels = collate(rows, pad_id=0)
    assert ids.tolist() == [[1, 10, 11, 12, 13, 2], [1, 10, 11, 12, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]]
    assert labels.tolist() == [[-100, -100, -100, 12, 13, 2], [-100, -100, 11, -100, -100, -100]]
    assert [r.trained_tokens for r in rows] == [3, 1]


@pytest.mark.parametrize("name, pinned", [
    ("countdown", ("10c1d9bd400e484c", [4.622118, 4.496115, 4.359122, 4.261971])),
    ("chain", ("adfca7ba0cc3bafb", [4.624918, 4.501439, 4.361605, 4.248501])),
    ("mastermind", ("8e66e8b8857968a6", [4.488124, 4.396614, 4.239498, 4.099958])),  # the shared-prompt loss
])
def test_a_few_steps_match_the_digests_pinned_before_the_loop_moved(name, pinned):
    """Pinned from tools/tiny_policy_sft.py as it was before flywheel.sft existed: the shipped
    tiny policies' recipe gives the very same floats through the new loop."""
    torch.set_num_threads(2)
    model = tiny_model()
    state = train(model, traces_of(name), FEW, TOKENIZER.pad_token_id)
    assert (digest(model), [round(loss, 6) for loss in state.losses]) == pinned


def test_packed_rows_give_the_padded_loss():
    model = tiny_model()
    ids, mask, labels = next(sft_batches(traces_of("countdown"), FEW, TOKENIZER.pad_token_id))
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    from flywheel.training.tree_attention import enable_tree_attention

    assert enable_tree_attention(model)
    with torch.no_grad():
        assert float(packed_loss(model, ids, mask, labels)) == pytest.approx(float(padded), rel=1e-5)


def test_a_stopped_run_resumes_to_the_weights_of_an_uninterrupted_one(tmp_path):
    settings = SftSettings(steps=6, batch_size=4, warmup_steps=1, precision="float32")
    traces = traces_of("chain")
    whole = tiny_model()
    train(whole, traces, settings, TOKENIZER.pad_token_id)

    def ctrl_c_at_step_3(state):
        if state.step == 3:
            os.kill(os.getpid(), signal.SIGINT)

    checkpoint = tmp_path / CHECKPOINT
    stopped = tiny_model()
    with pytest.raises(SftStopped) as stop:
        train(stopped, traces, settings, TOKENIZER.pad_token_id, checkpoint=checkpoint, on_step=ctrl_c_at_step_3)
    assert stop.value.code == 130 and checkpoint.exists()
    resumed = tiny_model()  # a fresh process: the weights come from the checkpoint
    state = train(resumed, traces, settings, TOKENIZER.pad_token_id, checkpoint=checkpoint, resume=True)
    assert state.step == 6 and len(state.losses) == 6
    assert digest(resumed) == digest(whole)
    with pytest.raises(ValueError, match="other settings \\(lr 0.003 there, 0.001 here\\)"):
        train(tiny_model(), traces, SftSettings(steps=6, batch_size=4, warmup_steps=1, precision="float32", lr=1e-3),
              TOKENIZER.pad_token_id, checkpoint=checkpoint, resume=True)


def chain_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


GOOD = {"problem": "37 +48 -19", "answer": "66", "solution": "37+48=85\n85-19=66\n<answer>66</answer>"}


def test_a_row_without_a_worked_solution_is_refused_with_its_file_and_line(tmp_path):
    task = ChainTask()
    file = chain_rows(tmp_path / "rows.jsonl", [GOOD, {"problem": "5 +1", "answer": "6"}])
    with pytest.raises(ValueError, match=r"rows.jsonl:2: no column 'solution' \(the row has: answer, problem\); "
                                         r"name the column .* --response_column .*--skip_bad_rows=true"):
        file_traces(task, TOKENIZER, str(file), "solution")
    traces, skipped = file_traces(task, TOKENIZER, str(file), "solution", skip_bad_rows=True)
    assert (len(traces), skipped) == (1, 1)
    assert [len(g) for g in file_traces(task, TOKENIZER, str(file), "solution", limit=1)[0]] == [1]  # line 2 unread
    (trace,) = traces[0]
    text = TOKENIZER.decode(trace.input_ids[trace.prompt_len:], skip_special_tokens=True)
    assert text == GOOD["solution"] and trace.input_ids[-1] == TOKENIZER.eos_token_id
    assert TOKENIZER.decode(trace.input_ids[:trace.prompt_len], skip_special_tokens=True) == task.prompt(
        task.problem_from_row(GOOD, "x"))


def test_the_command_writes_a_policy_folder_that_fit_loads(tmp_path):
    """Worked solutions from a file (the same column mapping as RL problem files), the held-out
    loss and pass@k measured from the folder written, sft.json, and `fit --model.policy` on it."""
    rows = [{"question": f"{a} +{b}", "answer": str(a + b), "worked": f"{a}+{b}={a + b}\n<answer>{a + b}</answer>"}
            for a in range(10, 20) for b in range(1, 4)]
    file = chain_rows(tmp_path / "train.jsonl", rows)
    out = tmp_path / "policy"
    from flywheel.__main__ import main

    record = main(["sft", "--policy", "tiny-chain", "--out", str(out), "--task", "flywheel.tasks.chain.ChainTask",
                   "--files", str(file), "--response_column", "worked", "--columns.problem", "question",
                   "--train.steps", "3", "--train.batch_size", "4", "--train.warmup_steps", "1",
                   "--eval_samples", "2", "--eval_max_problems", "4"])
    assert record["steps"] == 3 and record["problems"] == 30 and record["eval"]["val"]["problems"] == 4
    assert {"pass@1", "pass@2"} <= set(record["eval"]["val"]) and record["heldout_loss"] > 0
    assert json.loads((out / "sft.json").read_text())["trained_tokens"] == record["trained_tokens"] > 0
    assert (out / "config.json").exists() and not (out / CHECKPOINT).exists()
    assert record["weights_sha256"] == {"model.safetensors": file_sha256(out / "model.safetensors")}
    with pytest.raises(PreflightError, match="holds a policy already"):
        run_sft(policy="tiny-chain", out=str(out), task=ChainTask(), files=[str(file)], response_column="worked")

    cli = main(["--config", str(ROOT / "conf" / "quickstart.yaml"), f"--model.policy={out}",
                "--data.task=flywheel.tasks.chain.ChainTask"], run=False)
    assert sum(p.numel() for p in cli.model.policy.parameters()) > 0


def test_an_unfinished_run_is_resumed_only_when_asked(tmp_path):
    (tmp_path / CHECKPOINT).write_bytes(b"x")
    with pytest.raises(PreflightError, match="unfinished SFT run .* --resume=true"):
        run_sft(policy="tiny-chain", out=str(tmp_path), task=ChainTask())
    with pytest.raises(PreflightError, match="holds no unfinished SFT run"):
        run_sft(policy="tiny-chain", out=str(tmp_path / "empty"), task=ChainTask(), resume=True)


def test_ctrl_c_then_resume_on_the_command_line_gives_the_uninterrupted_weights(tmp_path):
    """`flywheel sft` as a user runs it: Ctrl-C mid-run exits 130 with its checkpoint written and
    no policy folder yet; the same command with --resume=true finishes it, with the weights an
    uninterrupted run writes (sft.json's SHA-256)."""
    import subprocess
    import sys
    import time

    def command(out: Path, *extra: str) -> list[str]:
        return [sys.executable, "-m", "flywheel", "sft", "--policy", "tiny-chain", "--task",
                "flywheel.tasks.chain.ChainTask", "--max_rows", "32", "--train.steps", "20", "--train.batch_size", "8",
                "--train.warmup_steps", "2", "--train.lr", "1e-4", "--save_every", "2", "--threads", "1",
                "--eval_split", "null", "--out", str(out), *extra]

    whole = tmp_path / "whole"
    subprocess.run(command(whole), cwd=ROOT, check=True, capture_output=True, timeout=300)
    stopped = tmp_path / "stopped"
    proc = subprocess.Popen(command(stopped), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (stopped / CHECKPOINT).exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "stopped at step" in err and (stopped / CHECKPOINT).exists() and not (stopped / "config.json").exists()
    again = subprocess.run(command(stopped, "--resume=true"), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resuming" in again.stderr
    records = [json.loads((folder / "sft.json").read_text()) for folder in (whole, stopped)]
    assert records[0]["weights_sha256"] == records[1]["weights_sha256"] and records[1]["steps"] == 20
