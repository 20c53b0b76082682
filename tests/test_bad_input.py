"""Bad input, second sweep (issue 37, items 2 and 5-10): each case here used to be accepted and
run on, or fail with a traceback or a 200-line usage dump. Now each is one line naming the flag
or file and the fix, before any work starts (or, where a run is still useful, a warning)."""

import json
import logging
import math
import shutil
import tracemalloc
from pathlib import Path

import pytest
import torch

from flywheel.__main__ import main
from flywheel.assets import asset_path
from flywheel.reporting.evaluation import EvalConfig
from flywheel.generation.base import SamplingParams
from flywheel.objectives import ObjectiveConfig
from flywheel.run.preflight import PreflightError, check_policy, preflight
from flywheel.search.config import SearchConfig
from flywheel.tasks.countdown import CountdownTask
from flywheel.tasks.sources import MAX_ROW_BYTES, load_problems
from flywheel.reporting.viewer import load_tree

ROOT = Path(__file__).resolve().parents[1]
QUICK = str(ROOT / "conf" / "quickstart.yaml")
TINY_POLICY = asset_path("policies", "tiny-countdown")
TRAIN = ROOT / "flywheel" / "assets" / "countdown" / "train.jsonl"
TINY = ["--data.batching.problems_per_epoch=4", "--data.batching.mini_batch_problems=4", "--data.problems.max_eval_problems=2",
        "--data.eval.samples=1", "--data.problems.max_train_problems=8", "--data.eval.at_start=false",
        "--data.search.max_expansions_per_tree=4", "--data.search.trajectories_per_tree=2"]


def refused(args: list[str], *needles: str) -> str:
    """`args` fail before any work with one line holding every needle."""
    with pytest.raises(PreflightError) as err:
        main(args, run=args[:1] != ["--config"])  # ["--config", ...]: build the parts only (no subcommand)
    message = str(err.value)
    for needle in needles:
        assert needle in message, message
    assert "\n" not in message
    return message


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# ---------------------------------------------------------------------- 2. non-finite numbers
def test_non_finite_settings_are_refused_where_they_are_built():
    # Before: `x < 0` range checks let NaN through; .inf temperature sampled uniform noise.
    for bad in ({"temperature": math.nan}, {"uct_lambda": math.nan}, {"temperature": math.inf}):
        with pytest.raises(ValueError, match=rf"--data.search.{next(iter(bad))}=(nan|inf): not a finite number"):
            SearchConfig(**bad)
    with pytest.raises(ValueError, match="--data.eval.temperature=inf"):
        EvalConfig(temperature=math.inf)
    with pytest.raises(ValueError, match="temperature must be finite"):
        SamplingParams(max_new_tokens=4, temperature=math.nan)
    assert ObjectiveConfig(dual_clip=math.inf).dual_clip == math.inf  # documented: inf turns the dual clip off
    with pytest.raises(ValueError, match="--model.objective.dual_clip=nan"):
        ObjectiveConfig(dual_clip=math.nan)


def test_non_finite_values_from_yaml_are_refused_by_the_command_line(tmp_path):
    # Every float, the trainer's and the task's too, not only flywheel's own settings dataclasses.
    for setting, flag in (("model:\n  optimizer:\n    lr: .nan", "--model.optimizer.lr=nan"),
                          ("trainer:\n  gradient_clip_val: .inf", "--trainer.gradient_clip_val=inf"),
                          ("data:\n  hard_set:\n    delta: -.inf", "--data.hard_set.delta=-inf")):
        overlay = write(tmp_path / "o.yaml", setting + "\n")
        refused(["--config", QUICK, "--config", str(overlay)], flag, "not a finite number")


# ---------------------------------------------------------------------- 5. one problem file
def test_one_problem_file_is_taken_for_a_list_of_one(tmp_path):
    # Before: jsonargparse's "Does not validate against any of the Union subtypes".
    cli = main(["--config", QUICK, f"--data.problems.train_files={TRAIN}", f"--data.problems.eval_files={TRAIN}"], run=False)
    assert cli.datamodule.pool.config.train_files == [str(TRAIN)] == cli.datamodule.pool.config.eval_files
    held = write(tmp_path / "held.jsonl", TRAIN.read_text().split("\n", 1)[0] + "\n")
    report = main(["eval", "--policy", "tiny-countdown", "--files", str(held), "--samples", "1", "--out", str(tmp_path / "e")])
    assert report["results"]["held"]["problems"] == 1


# ---------------------------------------------------------------------- 6. -c
def test_dash_c_is_config_for_the_checks_too(tmp_path):
    # Before: "fit needs a --config", and the file's YAML was not checked.
    bad = write(tmp_path / "bad.yaml", "trainer:\n  max_epochs: 2\n  logger: [1\n")
    refused(["fit", "-c", str(bad)], f"--config {bad}:", "not valid YAML")
    refused(["fit", f"-c={bad}"], f"--config {bad}:")


# ---------------------------------------------------------------------- 7. one line, not a traceback
def test_unreadable_configs_and_settings_are_one_line(tmp_path, monkeypatch):
    binary = tmp_path / "b.yaml"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00\xd0\xff" * 30)
    refused(["fit", "--config", str(binary)], f"--config {binary}: not a YAML text file")
    refused(["--config", QUICK, "--model.dtype=foo"], "--model.dtype=foo", "float32")
    refused(["eval", "--policy", "tiny-countdown", "--dtype", "foo", "--out", str(tmp_path)], "--dtype=foo", "bfloat16")
    refused(["eval", "--checkpoint", str(tmp_path / "nope.ckpt")], f"--checkpoint {tmp_path / 'nope.ckpt'}: no such file")
    refused(["--config", QUICK, "--data.search.expansion_widht=3"], "unrecognized arguments", "--help` lists every option")
    if not torch.cuda.is_available():
        refused(["--config", QUICK, "--trainer.accelerator=gpu"], "--trainer.accelerator=gpu", "--trainer.accelerator=cpu")
    monkeypatch.setenv("FLYWHEEL_LOG_LEVEL", "bogus")
    refused(["--config", QUICK], "FLYWHEEL_LOG_LEVEL=bogus: not a logging level")


@pytest.mark.parametrize("damage, needle", [("tokenizer.json", "holds no tokenizer"), ("model.safetensors", "holds no weights"),
                                            ("config.json", "config.json is not valid JSON")])
def test_a_damaged_policy_folder_is_named_with_its_missing_file(tmp_path, damage, needle):
    folder = tmp_path / "policy"
    shutil.copytree(TINY_POLICY, folder)
    if damage == "config.json":
        (folder / damage).write_text("{not json")
    else:
        (folder / damage).unlink()
        (folder / "tokenizer_config.json").unlink(missing_ok=damage != "tokenizer.json")
    refused(["eval", "--policy", str(folder), "--out", str(tmp_path / "e")], f"--policy={folder}: {folder} cannot be loaded", needle)
    refused(["--config", QUICK, f"--model.policy={folder}"], f"--model.policy={folder}", needle)


def test_every_bad_input_to_tree_is_one_line(tmp_path):
    refused(["tree", str(tmp_path / "nope")], "no such run folder or tree file")
    refused(["tree", str(tmp_path)], f"no saved trees in {tmp_path}")
    root = tmp_path / "runs" / "quickstart"
    for version, epochs in ((0, (0, 1)), (2, (0,)), (10, (0, 3))):  # version_10 is the newest, not version_2
        (root / f"version_{version}" / "trees").mkdir(parents=True)
        for epoch in epochs:
            write(root / f"version_{version}" / "trees" / f"epoch_{epoch:04d}.jsonl",
                  json.dumps({"nodes": [], "problem_id": f"v{version}e{epoch}"}) + "\n")
    (root / "version_11").mkdir()  # a fresh run that saved nothing yet
    assert load_tree(root)["problem_id"] == "v10e3"
    refused(["tree", str(root), "--epoch", "5"], "--epoch 5: no trees saved for that epoch", "saved epochs: 0, 3")
    refused(["tree", str(root), "--epoch", "-1"], "--epoch -1")
    refused(["tree", str(root), "--index", "4"], "--index 4:", "holds 1 trees; choose 0 to 0")


# ---------------------------------------------------------------------- 8. a built-in policy by its path
def test_a_built_in_policy_given_by_its_folder_is_the_same_policy(tmp_path, monkeypatch):
    # Before: "checkpoint ... was trained from policy 'tiny-countdown', but --model.policy=<its folder>".
    check_policy("tiny-countdown", str(TINY_POLICY), "last.ckpt", "--model.policy", "")
    check_policy(str(TINY_POLICY), "tiny-countdown", "last.ckpt", "--model.policy", "")
    monkeypatch.chdir(TINY_POLICY.parent)
    check_policy("tiny-countdown", "./tiny-countdown/", "last.ckpt", "--policy", "")
    with pytest.raises(PreflightError, match="'tiny-countdown', but --model.policy=tiny-countdown-h3"):
        check_policy("tiny-countdown", "tiny-countdown-h3", "last.ckpt", "--model.policy", "")


# ---------------------------------------------------------------------- 9. problem files
def test_a_folder_given_as_a_problem_file_is_called_a_folder(tmp_path):
    # Before: "problem file ... does not exist".
    write(tmp_path / "a.jsonl", TRAIN.read_text().split("\n", 1)[0] + "\n")
    with pytest.raises(ValueError, match=rf"problem file {tmp_path} is a folder, not a file; pass the files in it .*a\.jsonl"):
        load_problems(CountdownTask(), [str(tmp_path)], "train")


def test_a_countdown_row_stating_two_problems_is_a_bad_row(tmp_path):
    # Before: `numbers`/`target` won and `problem`/`answer` were ignored without a word.
    rows = [{"id": "same", "numbers": [3, 5, 7], "target": 22, "problem": "7 5 3", "answer": "22"},
            {"id": "differ", "numbers": [3, 5, 7], "target": 22, "problem": "3 5 8", "answer": "22"},
            {"id": "prose", "numbers": [2, 3], "target": 6, "problem": "Make 6 from 2 and 3", "answer": "six"}]
    path = write(tmp_path / "p.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=rf"{path}:2: `numbers`/`target` \(\[3, 5, 7\] -> 22\) and `problem`/`answer` "
                                         r"\('3 5 8' -> '22'\) state different problems"):
        load_problems(CountdownTask(), [str(path)], "train")
    loaded = load_problems(CountdownTask(), [str(path)], "train", skip_bad_rows=True)
    assert [p.id for p in loaded.problems] == ["same", "prose"] and loaded.skipped == 1


def test_a_huge_single_line_is_refused_in_bounded_memory(tmp_path):
    # Before: the whole line was read (and decoded) before its length was checked: a 400 MB
    # line cost 1.24 GB. Here a 24 MiB line: the peak must stay a few times the row cap.
    path = tmp_path / "huge.jsonl"
    with path.open("wb") as fh:
        fh.write(b'{"problem": "1+1", "answer": "2"}\n{"problem": "')
        for _ in range(24):
            fh.write(b"x" * (1 << 20))
        fh.write(b'", "answer": "1"}\n{"problem": "2+2", "answer": "4"}\n')
    from flywheel.tasks.math import MathTask

    tracemalloc.start()
    try:
        loaded = load_problems(MathTask(), [str(path)], "x", skip_bad_rows=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [p.answer for p in loaded.problems] == ["2", "4"] and loaded.skipped == 1
    assert peak < 4 * MAX_ROW_BYTES, f"peak {peak / 2**20:.1f} MiB"


# ---------------------------------------------------------------------- 10. settings that waste a run
def test_settings_that_waste_a_run_are_refused_before_it(tmp_path):
    refused(["--config", QUICK, "--data.search.expansion_width=10000"], "--data.search.expansion_width=10000",
            "at most 1024")
    # Before: searched an epoch, then stopped without training.
    refused(["fit", "--config", QUICK, *TINY, "--trainer.max_epochs=0", f"--trainer.logger.init_args.save_dir={tmp_path}"],
            "--trainer.max_epochs=0", "set it to 1 or more")
    assert not list(tmp_path.rglob("epoch_*.jsonl"))
    # Before: the tree recipe ran, silently replacing the overlay given first.
    refused(["fit", "--config", str(ROOT / "conf" / "dapo.yaml"), "--config", QUICK],
            f"--config {QUICK} is a whole recipe", "data.rollout", f"--config {QUICK} --config {ROOT / 'conf' / 'dapo.yaml'}")
    # Before: "Unexpected config:" after a 200-line usage dump.
    empty = write(tmp_path / "empty.yaml", "# nothing here yet\n")
    refused(["fit", "--config", QUICK, "--config", str(empty)], f"--config {empty}: the file holds no settings")
    # Before: `<unicode string>` in place of the nested file's name, after the usage dump.
    nested = write(tmp_path / "search.yaml", "expansion_width: [3\n")
    refused(["fit", "--config", QUICK, f"--data.search={nested}"], f"--data.search: nested config {nested}:2: not valid YAML")
    outer = write(tmp_path / "outer.yaml", f"data:\n  search: {nested.name}\n")
    refused(["fit", "--config", QUICK, "--config", str(outer)], f"{outer}: nested config {nested}:2")


def test_an_overlay_alone_is_refused_naming_the_recipes_it_can_follow(tmp_path):
    # Before: "No seed found", "max_epochs was not set. Setting it to 1000 epochs", and the
    # defaults' screening of 32,000 problems.
    conf = ROOT / "conf"
    dapo = conf / "dapo.yaml"
    # (--trainer.max_epochs=0: were the overlay let through, the preflight would stop the run, not 1000 epochs)
    message = refused(["fit", "--config", str(dapo), "--trainer.max_epochs=0"], f"--config {dapo}: an overlay (no seed_everything",
                      f"give the recipe first: --config {conf / 'quickstart.yaml'} --config {dapo} ")
    recipes = sorted(str(p) for p in conf.glob("*.yaml") if "\nseed_everything:" in "\n" + p.read_text())
    assert {"quickstart.yaml", "chain.yaml", "mastermind.yaml"} <= {Path(p).name for p in recipes}
    assert "dapo.yaml" not in {Path(p).name for p in recipes}
    assert message.endswith(f"(it can follow {', '.join(recipes)})")
    # conf/data/*.yaml set a MathTask: only the MathTask recipes, from the folder above
    gsm8k = conf / "data" / "gsm8k.yaml"
    message = refused(["fit", "-c", str(gsm8k)], f"--config {conf / 'deepsearch.yaml'} --config {gsm8k} ")
    assert message.endswith(f"(it can follow {conf / 'deepsearch.yaml'}, {conf / 'deepsearch_cpu.yaml'}, "
                            f"{conf / 'smollm2_cpu.yaml'})")
    refused(["validate", "--config", str(dapo), "--config", str(conf / "cispo.yaml")], "overlays (no seed_everything")
    mine = write(tmp_path / "mine.yaml", "model:\n  objective:\n    kl_coef: 0.0\n")  # no recipe beside it
    refused(["fit", "--config", str(mine)], "a recipe is a file that sets seed_everything, e.g. conf/quickstart.yaml")
    # with the recipe first it is what it was; --print_config of the overlay alone prints it
    assert main(["--config", QUICK, "--config", str(dapo)], run=False).datamodule.rollout == "flat"
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(dapo), "--print_config"])


def test_training_on_the_held_out_split_is_said(tmp_path, caplog):
    # Before: `--data.problems.train_split=test` trained on the held-out problems without a word.
    cli = main(["--config", QUICK, *TINY, "--data.problems.train_split=test", "--data.problems.max_train_problems=null",
                f"--trainer.logger.init_args.save_dir={tmp_path}"], run=False)
    with caplog.at_level(logging.WARNING):
        preflight(cli.trainer, cli.model, cli.datamodule, "fit", None)
    assert "2 training problems (--data.problems.train_split=test) are held-out problems " \
           "(--data.problems.eval_split=test): held-out pass@k will measure memory" in caplog.text
    assert "drop them with --data.problems.drop_eval_overlap=true" in caplog.text


def test_an_eval_k_above_the_samples_reports_pass_at_samples_and_says_so(caplog):
    # The quickstart reports pass@4 of 16 samples; a run that lowers the samples to 2 reports
    # pass@2 (labelled so) with a warning, where it used to be refused before it started.
    assert EvalConfig(samples=16, k=4).pass_k == 4
    assert EvalConfig(samples=3).pass_k == 3
    with caplog.at_level("WARNING", logger="flywheel.reporting.evaluation"):
        assert EvalConfig(samples=2, k=4).pass_k == 2
    assert "--data.eval.k=4 is above --data.eval.samples=2: pass@2 is reported" in caplog.text
    with pytest.raises(ValueError, match="--data.eval.k=0 must be >= 1"):
        EvalConfig(k=0)
