"""Bad input and faults fail early and clearly (issue 22): each case here used to run on
silently, fail epochs later, or fail with a message that named the wrong flag or no file.
Every error must come before the first search, name the flag (`--section.field`) or the
`file:line`, and say the fix."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flywheel.tasks.sources import MAX_ROW_BYTES, load_problems
from data_modules.search import SearchDataModule
from data_modules.settings import ProblemsConfig
from flywheel.__main__ import main
from flywheel.run.checkpoint import AtomicCheckpointIO, CheckpointReadError, unreadable_checkpoint_message
from flywheel.module import PolicyModule
from flywheel.run.preflight import PreflightError, check_folder, load_inputs
from flywheel.tasks.countdown import CountdownTask
from flywheel.tasks.math import MathTask

ROOT = Path(__file__).resolve().parents[1]
QUICK = str(ROOT / "conf" / "quickstart.yaml")
TINY = ["--data.batching.problems_per_epoch=4", "--data.batching.mini_batch_problems=4", "--data.problems.max_eval_problems=4",
        "--data.eval.samples=1", "--data.epochs_per_round=1", "--data.problems.max_train_problems=8", "--data.save_trees=1"]


def fit_args(run_dir: Path, *extra: str) -> list[str]:
    return ["fit", "--config", QUICK, *TINY, "--trainer.max_epochs=1", f"--trainer.logger.init_args.save_dir={run_dir}",
            f"--trainer.callbacks.init_args.dirpath={run_dir / 'checkpoints'}", *extra]


def refused(args: list[str], *needles: str) -> str:
    """The run fails before anything is searched, with a message holding every needle."""
    with pytest.raises(PreflightError) as err:
        main(args)
    message = str(err.value)
    for needle in needles:
        assert needle in message, message
    assert "\n" not in message  # one line
    return message


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """One finished 1-epoch quickstart run of the tiny policy: its folder (checkpoints/, quickstart/version_0/)."""
    folder = tmp_path_factory.mktemp("run")
    main(fit_args(folder))
    assert (folder / "checkpoints" / "last.ckpt").is_file()
    return folder


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


# ---------------------------------------------------------------------- 1. the checkpoint's policy
def test_fit_and_eval_refuse_a_checkpoint_of_another_policy(run, tmp_path):
    # Before: tiny-countdown weights loaded into tiny-countdown-h3 without a word (pass@1 0.0, not 0.31).
    last = run / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=False)["hyper_parameters"]["policy"] == "tiny-countdown"
    refused(fit_args(run, "--trainer.max_epochs=2", "--ckpt_path", "last", "--model.policy=tiny-countdown-h3"),
            f"checkpoint {last}", "'tiny-countdown'", "--model.policy=tiny-countdown")
    refused(["eval", "--checkpoint", str(last), "--policy", "tiny-countdown-h3", "--out", str(tmp_path)],
            "'tiny-countdown'", "--policy=tiny-countdown", "leave --policy out")


# ---------------------------------------------------------------------- 2. gold answers
def test_math_gold_answers_written_as_solutions_are_reduced_at_load(tmp_path):
    # Before: a gold `\boxed{5}` or a GSM8K rationale made every completion score -1.
    task = MathTask()
    rows = [{"id": "box", "problem": "2+3?", "answer": "\\boxed{5}"},
            {"id": "gsm", "problem": "8*9?", "answer": "She has 8 bags of 9.\n8 * 9 = 72\n#### 72"},
            {"id": "plain", "problem": "1/2?", "answer": "\\frac{1}{2}"}]
    problems = load_problems(task, [str(write_jsonl(tmp_path / "m.jsonl", rows))], "x").problems
    assert [p.answer for p in problems] == ["5", "72", "\\frac{1}{2}"]
    assert task.score(problems[0], "so the answer is \\boxed{5}").correct
    assert task.score(problems[1], "8 * 9 = 72, so \\boxed{72}").correct

    empty = write_jsonl(tmp_path / "e.jsonl", [rows[2], {"problem": "?", "answer": "\\boxed{}"}])
    with pytest.raises(ValueError, match=rf"{empty}:2: the gold answer .* holds no answer.*--data.problems.skip_bad_rows"):
        load_problems(task, [str(empty)], "x")


# ---------------------------------------------------------------------- 4. rows the policy cannot take
def test_a_prompt_longer_than_the_policy_context_fails_at_load_with_file_line(tmp_path):
    # Before: found only when an epoch first drew the row ("request N"), and skip_bad_rows did not cover it.
    ok = {"numbers": [3, 5, 7], "target": 22}
    long = {"numbers": list(range(10, 250)), "target": 22}  # ~720 characters: over 512 - 128 tokens
    train = write_jsonl(tmp_path / "train.jsonl", [ok, long, {**ok, "id": "b"}])
    module = PolicyModule()
    strict = SearchDataModule(problems=ProblemsConfig(train_files=[str(train)]))
    with pytest.raises(PreflightError, match=rf"{train}:2: problem .*exceeds the policy's context of 512 tokens.*"
                                             r"--data.problems.skip_bad_rows=true"):
        load_inputs(strict, module, train=True)
    lenient = SearchDataModule(problems=ProblemsConfig(train_files=[str(train)], skip_bad_rows=True))
    load_inputs(lenient, module, train=True)
    assert len(lenient.train_pool()) == 2 and lenient.pool.skipped_rows == 1


def test_a_row_over_the_byte_cap_is_refused_as_it_is_read(tmp_path):
    # Before: a 50 MB row was tokenized and searched (20 GB of memory, or an abort).
    big = {"problem": "x" * (MAX_ROW_BYTES + 10), "answer": "1"}
    path = write_jsonl(tmp_path / "big.jsonl", [{"problem": "1+1", "answer": "2"}, big, {"problem": "2+2", "answer": "4"}])
    with pytest.raises(ValueError, match=rf"{path}:2: row longer than {MAX_ROW_BYTES} bytes"):
        load_problems(MathTask(), [str(path)], "x")
    loaded = load_problems(MathTask(), [str(path)], "x", skip_bad_rows=True)
    assert [p.answer for p in loaded.problems] == ["2", "4"] and loaded.skipped == 1


# ---------------------------------------------------------------------- 5. late validation
def test_bad_settings_and_inputs_fail_before_the_first_search(tmp_path):
    # Before: each was found after an epoch's search (or at the first save), as a long traceback.
    missing = tmp_path / "nope.jsonl"
    refused(fit_args(tmp_path, f"--data.problems.eval_files=[{missing}]"), str(missing), "--data.problems.eval_files")
    garbled = write_jsonl(tmp_path / "held.jsonl", ['{"problem": "3 5 7", "answer": "22"}', '{"problem": "3 5'])
    refused(fit_args(tmp_path, f"--data.problems.eval_files=[{garbled}]"), f"{garbled}:2", "--data.problems.skip_bad_rows")
    refused(fit_args(tmp_path, "--data.eval.temperature=-0.5"), "--data.eval.temperature=-0.5", ">= 0")
    refused(fit_args(tmp_path, "--data.batching.max_concurrent_trees=0"), "--data.batching.max_concurrent_trees", ">= 1")
    blocker = tmp_path / "a_file"
    blocker.write_text("in the way")
    refused(fit_args(tmp_path, f"--trainer.callbacks.init_args.dirpath={blocker / 'ckpts'}"),
            f"cannot write to {blocker / 'ckpts'}", "--trainer.callbacks.init_args.dirpath=FOLDER")
    assert not list(tmp_path.rglob("epoch_*.jsonl")) and not list(tmp_path.rglob("*.ckpt"))  # nothing searched


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 64 KiB file system (tmpfs); needs root."""
    folder = tmp_path / "tiny_disk"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    yield folder
    subprocess.run(["umount", str(folder)], check=True)


def test_a_full_disk_is_reported_as_no_space_left_on_the_folder(tiny_disk):
    # Before: a full checkpoint folder surfaced at the first save as a bare zip-writer error.
    module = PolicyModule()
    with pytest.raises(PreflightError, match=f"no space left on {tiny_disk}: a checkpoint needs about"):
        from flywheel.run.preflight import checkpoint_bytes

        check_folder(tiny_disk, "--trainer.callbacks.init_args.dirpath", checkpoint_bytes(module.policy))
    (tiny_disk / "last.ckpt").write_bytes(b"the previous checkpoint")
    with pytest.raises(OSError, match=f"no space left on {tiny_disk} while writing checkpoint last.ckpt"):
        AtomicCheckpointIO().save_checkpoint({"state_dict": module.policy.state_dict()}, tiny_disk / "last.ckpt")
    assert (tiny_disk / "last.ckpt").read_bytes() == b"the previous checkpoint"
    assert [p.name for p in tiny_disk.iterdir()] == ["last.ckpt"]  # the temporary file is gone


# ---------------------------------------------------------------------- 6. --ckpt_path last with nothing there
def test_ckpt_path_last_without_a_last_checkpoint_names_the_folder_and_what_is_there(run, tmp_path):
    # Before: a mistyped or fresh folder, or a lost last.ckpt, silently trained from scratch.
    refused(fit_args(tmp_path, "--ckpt_path", "last"), f"no last.ckpt in {tmp_path / 'checkpoints'}",
            "--last_missing_ok=true")
    others = tmp_path / "others"
    (others / "checkpoints").mkdir(parents=True)
    epoch_file = next(p for p in (run / "checkpoints").glob("epoch=*.ckpt"))
    shutil.copy(epoch_file, others / "checkpoints" / epoch_file.name)
    refused(fit_args(others, "--ckpt_path", "last"), f"checkpoints there: {others / 'checkpoints' / epoch_file.name}")

    from flywheel.run.preflight import resolve_ckpt_path

    cli = main(fit_args(tmp_path)[1:], run=False)  # run=False: no subcommand
    assert resolve_ckpt_path(cli.trainer, "last", missing_ok=True) is None  # a scheduler's first attempt starts fresh


# ---------------------------------------------------------------------- 7. resuming with changed settings
def test_a_resume_with_changed_settings_says_so_and_keeps_each_parts_config(run, caplog):
    # Before: config.yaml was overwritten to claim the new settings for every round, silently.
    resumed = main(fit_args(run, "--trainer.max_epochs=2", "--data.eval.samples=2", "--ckpt_path", "last"))
    assert "--data.eval.samples: 1 -> 2" in caplog.text and "--trainer.max_epochs: 1 -> 2" in caplog.text
    log_dir = Path(resumed.trainer.log_dir)
    assert "samples: 1\n" in (log_dir / "config.yaml").read_text()
    assert "samples: 2\n" in (log_dir / "config.resume-1.yaml").read_text()
    rounds = json.loads((log_dir / "summary.json").read_text())["rounds"]
    assert [(r["round"], r["config"]) for r in rounds] == [(1, "config.yaml"), (2, "config.resume-1.yaml")]


# ---------------------------------------------------------------------- 8. ranges
@pytest.mark.parametrize("value", ["0", "-1"])
def test_problem_limits_below_one_are_refused(tmp_path, value):
    # Before: 0 evaluated every problem, -1 all but the last (599), both silently.
    refused(fit_args(tmp_path, f"--data.problems.max_eval_problems={value}"), f"--data.problems.max_eval_problems={value}", "null")
    refused(["eval", "--policy", "tiny-countdown", "--max_problems", value, "--out", str(tmp_path)],
            f"--max_problems={value}", ">= 1")


def test_countdown_takes_a_negative_target_as_text_as_well_as_a_number():
    task = CountdownTask()
    as_text = task.problem_from_row({"id": "a", "problem": "5 9 8", "answer": "-4"}, "f:1")
    as_number = task.problem_from_row({"id": "a", "numbers": [5, 9, 8], "target": -4}, "f:1")
    assert as_text == as_number and as_text.target == -4
    assert task.score(as_text, "5 - 9 = -4\n-4 * 8 = -32\n<answer>5 - 9</answer>").reward < 1  # graded, not refused


def test_a_bare_fit_says_what_is_missing_instead_of_a_1000_epoch_run(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    bare = subprocess.run([sys.executable, "-m", "flywheel", "fit"], cwd=tmp_path, capture_output=True, text=True,
                          env=env, timeout=120)
    assert bare.returncode == 2
    assert "needs a --config" in bare.stderr and "conf/quickstart.yaml" in bare.stderr
    assert "Traceback" not in bare.stderr and not (tmp_path / "lightning_logs").exists()
    helped = subprocess.run([sys.executable, "-m", "flywheel", "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert "`fit` needs a --config" in helped.stdout and "exits 143" in helped.stdout


# ---------------------------------------------------------------------- 9. messages
def test_eval_errors_name_its_own_flags(run, tmp_path):
    # Before: --data.eval.samples / --data.eval.k / --ckpt_path, flags eval does not have.
    refused(["eval", "--policy", "tiny-countdown", "--samples", "0", "--out", str(tmp_path)], "--samples=0")
    refused(["eval", "--policy", "tiny-countdown", "--samples", "2", "--k", "[1,4]", "--out", str(tmp_path)],
            "--k=[1, 4]", "--samples=2")
    broken = tmp_path / "broken.ckpt"
    broken.write_bytes((run / "checkpoints" / "last.ckpt").read_bytes()[:1000])
    with pytest.raises(CheckpointReadError) as err:
        main(["eval", "--checkpoint", str(broken), "--out", str(tmp_path / "out")])
    assert f"checkpoint {broken} cannot be read" in str(err.value) and "--ckpt_path" not in str(err.value)


def test_eval_refuses_a_checkpoint_of_another_task_before_loading_anything(run, tmp_path):
    # Before: a MathTask on a Countdown checkpoint failed on a context-length check.
    message = refused(["eval", "--checkpoint", str(run / "checkpoints" / "last.ckpt"), "--task", "flywheel.tasks.math.MathTask",
                       "--out", str(tmp_path)], "--task flywheel.tasks.math.MathTask",
                      "was trained on flywheel.tasks.countdown.CountdownTask")
    assert "--task flywheel.tasks.countdown.CountdownTask" in message


def test_the_way_out_of_a_damaged_checkpoint_lists_only_readable_ones(run, tmp_path):
    # Before: every other *.ckpt was suggested, the damaged ones included.
    good = tmp_path / "epoch=0-step=1.ckpt"
    shutil.copy(run / "checkpoints" / "last.ckpt", good)
    (tmp_path / "epoch=1-step=2.ckpt").write_bytes(b"garbage" * 100)  # newer, unreadable
    last = tmp_path / "last.ckpt"
    last.write_bytes(good.read_bytes()[:5000])
    with pytest.raises(CheckpointReadError) as err:
        AtomicCheckpointIO().load_checkpoint(last)
    message = str(err.value)
    assert f"--ckpt_path {good}" in message and "epoch=1-step=2" not in message
    assert "epoch=1-step=2" not in unreadable_checkpoint_message(last, ValueError("x"), "--checkpoint")


def test_a_folder_given_as_the_checkpoint_is_called_a_folder(run):
    # Before: "truncated or corrupt".
    folder = run / "checkpoints"
    refused(fit_args(run, "--trainer.max_epochs=2", "--ckpt_path", str(folder)), "is a folder, not a checkpoint file",
            str(folder / "last.ckpt"))
    with pytest.raises(CheckpointReadError, match="--checkpoint .* is a folder"):
        main(["eval", "--checkpoint", str(folder)])


def test_tree_names_a_truncated_or_garbled_file(run, tmp_path):
    # Before: a bare JSONDecodeError without the file.
    saved = next((run / "quickstart").rglob("epoch_0000.jsonl"))
    truncated = tmp_path / "epoch_0000.jsonl"
    truncated.write_bytes(saved.read_bytes()[: len(saved.read_bytes()) // 2])
    refused(["tree", str(truncated)], f"{truncated}:1: bad JSON", "truncated or damaged")
    garbled = tmp_path / "t.json"
    garbled.write_bytes(b"\xff\xfe garbage")
    refused(["tree", str(garbled)], f"{garbled}: not UTF-8")
    assert main(["tree", str(saved), "--out", str(tmp_path / "ok.html")]).is_file()


def test_a_yaml_syntax_error_names_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  max_epochs: 2\n  logger: [1\n")
    refused(["fit", "--config", str(bad)], f"--config {bad}:", "not valid YAML")


# ---------------------------------------------------------------------- 10. parquet
def test_a_corrupt_parquet_file_is_named(tmp_path):
    pytest.importorskip("pyarrow")
    bad = tmp_path / "held.parquet"
    bad.write_bytes(b"PAR1 this is not parquet PAR1")
    with pytest.raises(ValueError, match=f"problem file {bad} cannot be read as parquet") as err:
        load_problems(MathTask(), [str(bad)], "x")
    assert type(err.value) is ValueError  # not pyarrow's ArrowInvalid
