"""tools/compare.py's parts for issue 32 item 3: runs that start from a plateau checkpoint
(`--init`: the policy exported, the optimizer moments by callbacks/optimizer_from.py), seeds as
separate processes (`--seed-list`, one process per run folder), and the report's columns
(optimizer steps, fit seconds, the gain per token, step and second), worked by hand. The
compare.py run end to end: tests/test_tools.py, and the slow test at the end."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from argparse import Namespace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from callbacks.optimizer_from import OptimizerStateFrom, optimizer_mismatch

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("compare", ROOT / "tools" / "compare.py")
compare = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare)


def summary(base: float, rows: list[tuple]) -> dict:
    """rows: (eval_pass1 or None, tokens, optimizer steps or None, wall_s, eval_s)."""
    return {"base_eval_pass1": base, "base_eval_passk": 0.5, "rounds": [
        {"round": i + 1, "eval_pass1": p1, "eval_passk": None if p1 is None else 0.6, "generated_tokens": tokens,
         **({"optimizer_steps": steps} if steps is not None else {}), "wall_seconds": 0.0,
         "wall_split": {"wall_s": wall, "eval_s": ev}}
        for i, (p1, tokens, steps, wall, ev) in enumerate(rows)]}


def test_fit_seconds_and_the_gain_rates_by_hand(capsys):
    # Round 1 is not evaluated (100 s, no evaluation); round 2 is: 150 s of which 50 s evaluating.
    # Fit seconds: 100, then 100 + 150 - 50 = 200. Gain 0.30 - 0.20 = 0.10 at 1M tokens, 40 steps,
    # 200 s: 0.10 per 1M tokens, 0.10 / 0.4 = 0.25 per 100 steps, 0.10 / 0.2 = 0.5 per 1000 s.
    one = summary(0.2, [(None, 500_000, 20, 100.0, 0.0), (0.3, 1_000_000, 40, 150.0, 50.0)])
    assert compare.fit_seconds(one["rounds"]) == [100.0, 200.0]
    ends = [(one, compare.last_round(one))]
    assert compare.rates(ends) == pytest.approx({"per_mtok": 0.1, "per_100_steps": 0.25, "per_1000_s": 0.5})
    # A second seed: 0.2 -> 0.1 at 2M tokens, 100 steps, 400 s: -0.05, -0.1, -0.25; means 0.025, 0.075, 0.125.
    two = summary(0.2, [(0.1, 2_000_000, 100, 400.0, 0.0)])
    ends.append((two, compare.last_round(two)))
    assert compare.rates(ends) == pytest.approx({"per_mtok": 0.025, "per_100_steps": 0.075, "per_1000_s": 0.125})
    # A run from before rounds recorded their optimizer steps: that rate is not reported, the others are.
    old = summary(0.2, [(0.3, 1_000_000, None, 150.0, 50.0)])
    assert compare.rates([(old, compare.last_round(old))]) == pytest.approx(
        {"per_mtok": 0.1, "per_100_steps": None, "per_1000_s": 1.0})

    compare.report({"dapo": [(0, one)], "old": [(0, old)]}, Namespace(eval_split="test_hard", tokens=1_000_000, seeds=[0]))
    out = capsys.readouterr().out
    assert "dapo                  0       2    1000000     40     200  0.3000  0.6000" in out  # round 1: not evaluated
    assert "old                   0       1    1000000      -     100  0.3000" in out
    assert "gain per 1M tokens +0.1000   per 100 steps +0.2500   per 1000 s +0.5000" in out
    assert "per 100 steps -   per 1000 s +1.0000" in out
    assert "newly solved train problems: not reported" in out
    assert out.strip().splitlines()[-1].endswith("tokens=1000000 seeds=1")


def test_newly_solved_counts_the_problems_p_failed_by_round(tmp_path, capsys):
    from tools.compare_report import failed_under_init, newly_by_round

    screen = tmp_path / "init_screen_seed0.json"
    screen.write_text(json.dumps({"records": [{"id": i, "screen_correct": c} for i, c in
                                              [("a", 0), ("b", 3), ("c", 0), ("d", 0)]]}))
    assert failed_under_init(screen) == {"a", "c", "d"} and failed_under_init(tmp_path / "none.json") is None
    run = tmp_path / "dapo_seed0"
    (run / "version_0").mkdir(parents=True)
    (run / "version_1").mkdir()
    # the newest part's file is whole: b (P solved it) does not count; a in round 1, c and d in round 3
    (run / "version_0" / "solved_problems.json").write_text(json.dumps({"problems": {"a": {"round": 1, "tokens": 5}}}))
    (run / "version_1" / "solved_problems.json").write_text(json.dumps({"problems": {
        "a": {"round": 1, "tokens": 5}, "b": {"round": 1, "tokens": 5}, "c": {"round": 3, "tokens": 9},
        "d": {"round": 3, "tokens": 9}}}))
    one = summary(0.2, [(None, 500_000, 20, 100.0, 0.0), (0.25, 1_000_000, 40, 150.0, 50.0), (0.3, 2_000_000, 80, 200.0, 0.0)])
    counts = newly_by_round(run, one["rounds"], failed_under_init(screen))
    assert counts == {1: 1, 2: 1, 3: 3} and newly_by_round(tmp_path / "none", one["rounds"], frozenset()) is None
    # 3 newly solved at the last evaluation: 2M tokens, 80 steps, 100 + 100 + 200 = 400 fit seconds
    assert compare.rates([(one, compare.last_round(one))], [counts[3]]) == pytest.approx(
        {"per_mtok": 1.5, "per_100_steps": 3.75, "per_1000_s": 7.5})
    compare.report({"dapo": [(0, one)]}, Namespace(eval_split="test_hard", tokens=2_000_000, seeds=[0]),
                   {("dapo", 0): counts})
    out = capsys.readouterr().out
    assert "dapo                  0       3    2000000     80     400  0.3000  0.6000       0     3" in out
    assert "newly solved per 1M tokens 1.5   per 100 steps 3.75   per 1000 s 7.50" in out
    assert "dapo_newly_per_mtok=1.50 " in out.strip().splitlines()[-1]


def test_a_run_folder_is_run_by_one_process_at_a_time(tmp_path):
    folder = tmp_path / "dapo_seed1"
    with compare.claimed(folder):
        assert (folder / "running.pid").read_text() == str(os.getpid())
        with pytest.raises(RuntimeError, match=f"dapo_seed1 is being run by process {os.getpid()}; not started twice"):
            with compare.claimed(folder):
                pass
    assert not (folder / "running.pid").exists()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (folder / "running.pid").write_text(str(gone.pid))  # left by a process that ended without cleaning up
    with compare.claimed(folder):
        assert (folder / "running.pid").read_text() == str(os.getpid())


def test_init_names_one_checkpoint_per_seed_and_a_folder_keeps_its_own(tmp_path):
    for seed in (0, 1):
        (tmp_path / f"p{seed}.ckpt").write_bytes(b"")
    args = Namespace(init=str(tmp_path / "p{seed}.ckpt"))
    assert compare.init_checkpoint(args, 1) == tmp_path / "p1.ckpt"
    with pytest.raises(RuntimeError, match="p2.ckpt is not a checkpoint file"):
        compare.init_checkpoint(args, 2)
    assert compare.init_checkpoint(Namespace(init=None), 0) is None

    folder = tmp_path / "dapo_seed0"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "last.ckpt").write_bytes(b"")
    with pytest.raises(RuntimeError, match="dapo_seed0 ran without --init"):
        compare.init_overrides(folder, tmp_path / "p0.ckpt")
    (folder / "init.json").write_text(json.dumps({"checkpoint": str(tmp_path / "p0.ckpt")}))
    with pytest.raises(RuntimeError, match="dapo_seed0 started from .*p0.ckpt, not .*p1.ckpt; use another --out"):
        compare.init_overrides(folder, tmp_path / "p1.ckpt")
    # The same checkpoint again (a resume): nothing is exported again.
    assert compare.init_overrides(folder, tmp_path / "p0.ckpt") == [
        f"--model.policy={folder / 'init_policy'}", "--trainer.callbacks+=callbacks.optimizer_from.OptimizerStateFrom",
        f"--trainer.callbacks.checkpoint={tmp_path / 'p0.ckpt'}"]


@pytest.mark.parametrize("flags, message", [
    (["--seeds", "2", "--seed-list", "1"], "Can't provide both `--seeds` and `--seed-list`. Choose one."),
    (["--init", "p.ckpt", "--model.policy=x"], "Can't provide both `--init` and `--model.policy`"),
])
def test_conflicting_flags_are_refused(flags, message, tmp_path):
    proc = subprocess.run([sys.executable, "tools/compare.py", "--out", str(tmp_path), *flags], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr


def adamw(*shapes, lr: float = 1e-3) -> torch.optim.AdamW:
    params = [torch.nn.Parameter(torch.ones(shape)) for shape in shapes]
    return torch.optim.AdamW(params, lr=lr)


def stepped(optimizer: torch.optim.Optimizer) -> dict:
    """One step with gradient 1 everywhere: Adam's moments exp_avg = 0.1, exp_avg_sq = 0.001, step 1."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad = torch.ones_like(p)
    optimizer.step()
    return optimizer.state_dict()


def test_optimizer_moments_load_only_into_a_matching_optimizer():
    saved = stepped(adamw((2, 3), (2,)))
    assert optimizer_mismatch(saved, adamw((2, 3), (2,))) is None
    assert optimizer_mismatch(None, adamw((2,))) == "the checkpoint holds no optimizer state"
    assert optimizer_mismatch(saved, adamw((2, 3), (2,), (4,))) == "parameter groups of [2] parameters saved, [3] here"
    assert optimizer_mismatch(saved, adamw((3, 3), (2,))) == "parameter 0 has shape (3, 3) here, (2, 3) saved"
    sgd = torch.optim.SGD([torch.nn.Parameter(torch.ones(2, 3)), torch.nn.Parameter(torch.ones(2))], lr=0.1)
    assert optimizer_mismatch(saved, sgd) == "this run's optimizer is SGD, not Adam or AdamW"
    momentum = torch.optim.SGD([torch.nn.Parameter(torch.ones(2, 3)), torch.nn.Parameter(torch.ones(2))], lr=0.1,
                               momentum=0.9)
    assert "not an Adam state" in optimizer_mismatch(stepped(momentum), adamw((2, 3), (2,)))


def test_a_fresh_run_takes_the_moments_and_keeps_its_learning_rate(tmp_path):
    path = tmp_path / "p.ckpt"
    torch.save({"optimizer_states": [stepped(adamw((2, 3), (2,), lr=1e-3))]}, path)
    here = adamw((2, 3), (2,), lr=5e-4)
    callback = OptimizerStateFrom(str(path))
    callback.on_fit_start(SimpleNamespace(ckpt_path=None, optimizers=[here]), None)
    state = here.state[here.param_groups[0]["params"][0]]
    assert callback.carried is True and float(state["step"]) == 1.0
    assert torch.allclose(state["exp_avg"], torch.full((2, 3), 0.1)) and torch.allclose(state["exp_avg_sq"], torch.full((2, 3), 0.001))
    assert here.param_groups[0]["lr"] == 5e-4  # this run's
    # A resumed run restores its own state: left alone.
    resumed = adamw((2, 3), (2,))
    callback = OptimizerStateFrom(str(path))
    callback.on_fit_start(SimpleNamespace(ckpt_path="last.ckpt", optimizers=[resumed]), None)
    assert callback.carried is None and not resumed.state
    # Other parameters (a value head): weights only, said in the log.
    other = adamw((2, 3), (2,), (8,))
    callback = OptimizerStateFrom(str(path))
    callback.on_fit_start(SimpleNamespace(ckpt_path=None, optimizers=[other]), None)
    assert callback.carried is False and not other.state


@pytest.mark.slow
def test_compare_continues_from_a_plateau_checkpoint(tmp_path):
    """A first compare run's last.ckpt is P; --init P starts dapo and flat_first from it: P's policy
    weights, P's optimizer moments, and new counters (one optimizer step after one epoch)."""
    from tests.test_tools import run_tool

    common = ["--tokens", "1", "--numbers", "3", "--eval-split", "test", "--epochs-per-round", "1",
              "--data.batching.problems_per_epoch=4", "--data.problems.max_eval_problems=4", "--data.eval.samples=8",
              "--data.problems.max_train_problems=8", "--data.hard_set.enabled=false", "--data.batching.flat_samples=2",
              "--data.search.expansion_width=2", "--data.search.trajectories_per_tree=12"]
    run_tool("tools/compare.py", "--arms", "dapo", "--out", str(tmp_path / "plateau"), *common)
    plateau = torch.load(tmp_path / "plateau" / "dapo_seed0" / "checkpoints" / "last.ckpt", weights_only=False)
    fields, _ = run_tool("tools/compare.py", "--arms", "dapo", "flat_first", "--seed-list", "0", "--out",
                         str(tmp_path / "continue"), "--init", str(tmp_path / "plateau" / "dapo_seed{seed}" / "checkpoints" /
                                                                   "last.ckpt"), *common)
    assert fields["dapo_seeds"] == fields["flat_first_seeds"] == "1" and fields["seeds"] == "1"
    # P screened once over the runs' training pool (8 problems), and the newly solved rates reported
    screen = json.loads((tmp_path / "continue" / "init_screen_seed0.json").read_text())
    assert screen["problems"] == 8 and screen["policy"] == str(tmp_path / "plateau" / "dapo_seed0" / "checkpoints" / "last.ckpt")
    assert float(fields["dapo_newly_per_mtok"]) >= 0 and float(fields["flat_first_newly_per_mtok"]) >= 0
    from safetensors.torch import load_file

    for arm in ("dapo", "flat_first"):
        folder = tmp_path / "continue" / f"{arm}_seed0"
        weights = load_file(folder / "init_policy" / "model.safetensors")
        policy = {k.removeprefix("policy."): v for k, v in plateau["state_dict"].items() if k.startswith("policy.")}
        assert weights.keys() <= policy.keys() and all(torch.equal(weights[k], policy[k]) for k in weights)
        assert "optimizer moments of" in (folder / "fit-0.log").read_text()
        (row,) = json.loads(next(folder.glob("version_*/summary.json")).read_text())["rounds"]
        assert row["round"] == 1 and row["optimizer_steps"] >= 1
        assert json.loads((folder / "done.json").read_text())["command"].count(f"--model.policy={folder / 'init_policy'}") == 1
        assert not (folder / "running.pid").exists()

    # tools/ship_policies.py: each run's policy, summary and commands; fp32 reproduces the runs' numbers exactly
    proc = subprocess.run([sys.executable, "tools/ship_policies.py", str(tmp_path / "continue"), str(tmp_path / "ship"),
                           "--dtype", "float32", "--checkpoints", "--verify"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "RESULT runs=2 max_abs_diff_pass1=0.0000 max_abs_diff_passk=0.0000"
    for arm in ("dapo", "flat_first"):
        shipped = tmp_path / "ship" / f"{arm}_seed0"
        record = json.loads((shipped / "run.json").read_text())
        assert (shipped / "policy" / "model.safetensors").is_file() and (shipped / "last.ckpt").is_file()
        assert record["eval"]["max_problems"] == 4 and record["eval"]["samples"] == 8 and record["eval"]["split"] == "test"
        assert record["shipped_eval"] == {"pass1": record["last_eval"]["pass1"], "passk": record["last_eval"]["passk"]}
        assert f"--arms {arm} --seed-list 0 --tokens 1" in record["compare_command"] and "--init" in record["compare_command"]
        assert "--max_problems 4" in record["eval_command"]
    # the shipped folder reads back as the comparison: the same tables and RESULT line
    shipped_fields, _ = run_tool("tools/compare.py", "--report", "--arms", "dapo", "flat_first", "--seed-list", "0", "--out",
                                 str(tmp_path / "ship"), *common)
    assert shipped_fields == fields


def test_the_chain_task_runs_its_arms_on_conf_chain_without_countdown_settings(tmp_path, monkeypatch):
    """`--task chain`: every arm's fit starts from conf/chain.yaml, evaluates the chain's test split
    and gets no Countdown number count; `--task countdown` (the default) keeps both as before."""
    seen = []

    def fake_run(cmd, **kwargs):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(compare.subprocess, "run", fake_run)
    monkeypatch.setattr(compare, "latest_summary", lambda folder: {})
    for task, base, split, numbers in (("chain", "conf/chain.yaml", "test", False),
                                        ("countdown", "conf/step_tree.yaml", "test_hard", True)):
        args = Namespace(task=task, out=tmp_path / task, tokens=1000, epochs_per_round=5, eval_every_tokens=500,
                         numbers=4, extra=["--model.optimizer.lr=3e-5"], init=None)
        args.base, default_split, _ = compare.TASKS[task]
        args.eval_split = default_split
        compare.fit("dapo", 0, tmp_path / task / "dapo_seed0", args)
        cmd = seen[-1]
        assert cmd[cmd.index("--config") + 1] == base and "conf/dapo.yaml" in cmd
        assert f"--data.problems.eval_split={split}" in cmd and cmd[-1] == "--model.optimizer.lr=3e-5"
        assert any(a.startswith("--data.task.init_args.numbers_count") for a in cmd) == numbers
    assert "step_node" in compare.ARMS and "rollout_entropy_mb16" in compare.ARMS
