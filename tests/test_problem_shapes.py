"""Problems in the shapes their publishers use: mapped columns (dotted paths, chat lists),
typed answers, the gold-answer conventions, Hugging Face `datasets` sources, repeated and
leaked problems, and the conf/data overlays; each of five shapes trains a tiny fit."""

import json
import logging
from pathlib import Path

import pytest

from flywheel.__main__ import main
from flywheel.tasks import Problem
from flywheel.tasks.columns import Columns, MissingColumn, map_row
from flywheel.tasks.math import MathTask, gold_answer
from flywheel.tasks.overlap import find_overlap
from flywheel.tasks.sources import load_problems

ROOT = Path(__file__).resolve().parents[1]

# The five shapes, a few rows each, written as their publishers write them.
GSM8K = [{"question": "Tom has 3 apples and buys 4 more. How many apples?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
         {"question": "A box holds 5 pens. How many pens in 2 boxes?", "answer": "5 * 2 = 10\n#### 10"},
         {"question": "Sue had 9 cards and gave away 4. How many are left?", "answer": "9 - 4 = 5\n#### 5"}]
DEEPMATH = [{"question": "Compute 2 + 3.", "final_answer": "5", "difficulty": 1.0, "topic": "Arithmetic",
             "r1_solution_1": "2 + 3 = 5, so \\boxed{5}."},
            {"question": "Compute 6 * 7.", "final_answer": "42", "difficulty": 1.5, "topic": "Arithmetic",
             "r1_solution_1": "\\boxed{42}"},
            {"question": "Compute 10 - 4.", "final_answer": "6", "difficulty": 1.0, "topic": "Arithmetic",
             "r1_solution_1": "\\boxed{6}"}]
MATH = [{"problem": "What is $1 + 1$?", "solution": "We add: $1 + 1 = \\boxed{2}$.", "level": "Level 1",
         "type": "Prealgebra"},
        {"problem": "What is $3 \\cdot 3$?", "solution": "$3 \\cdot 3 = \\boxed{9}$.", "level": "Level 1",
         "type": "Prealgebra"},
        {"problem": "What is $8 - 5$?", "solution": "$8 - 5 = \\boxed{3}$.", "level": "Level 1", "type": "Prealgebra"}]
VERL = [{"data_source": "hand", "prompt": [{"role": "user", "content": "Compute 4 + 4."}], "ability": "math",
         "reward_model": {"style": "rule", "ground_truth": "8"}, "extra_info": {"index": 0, "split": "train"}},
        {"data_source": "hand", "prompt": [{"role": "user", "content": "Compute 2 * 5."}], "ability": "math",
         "reward_model": {"style": "rule", "ground_truth": "10"}, "extra_info": {"index": 1, "split": "train"}},
        {"data_source": "hand", "prompt": [{"role": "user", "content": "Compute 9 - 2."}], "ability": "math",
         "reward_model": {"style": "rule", "ground_truth": "7"}, "extra_info": {"index": 2, "split": "train"}}]
VERL_FLAGS = ["--data.problems.columns.problem=prompt", "--data.problems.columns.answer=reward_model.ground_truth",
              "--data.problems.columns.id=extra_info.index"]


def write_jsonl(path: Path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def write_parquet(path: Path, rows) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


# ----------------------------------------------------------------------------- columns
def test_columns_map_dotted_paths_and_a_chat_column():
    row = VERL[0]
    mapped = map_row(row, Columns(problem="prompt", answer="reward_model.ground_truth", id="extra_info.index"))
    assert (mapped["problem"], mapped["answer"], mapped["id"]) == ("Compute 4 + 4.", "8", 0)
    assert mapped["data_source"] == "hand"  # every other column is kept for the task
    # The identity mapping leaves a row that lacks `problem` alone (Countdown reads numbers/target).
    assert map_row({"numbers": [1, 2], "target": 3}, Columns()) == {"numbers": [1, 2], "target": 3}
    # A column literally named with a dot is found before the path is walked.
    assert map_row({"q.text": "x", "answer": "1"}, Columns(problem="q.text"))["problem"] == "x"


def test_a_chat_keeps_its_one_user_turn_and_refuses_or_drops_a_system_turn():
    system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Compute 1 + 2."}]
    with pytest.raises(ValueError, match="system turn .*columns.system_turn=drop"):
        map_row({"prompt": system, "answer": "3"}, Columns(problem="prompt"))
    assert map_row({"prompt": system, "answer": "3"}, Columns(problem="prompt", system_turn="drop"))["problem"] == \
        "Compute 1 + 2."
    with pytest.raises(ValueError, match="'assistant' turn"):
        map_row({"m": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}, Columns(problem="m"))
    with pytest.raises(ValueError, match="2 user turns"):
        map_row({"m": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}, Columns(problem="m"))
    with pytest.raises(ValueError, match="chat message 0 must be"):
        map_row({"m": ["a plain string"]}, Columns(problem="m"))


def test_a_missing_column_names_the_file_row_the_columns_it_has_and_the_flag(tmp_path):
    f = write_parquet(tmp_path / "train.parquet", [{"question": "1+1?", "final_answer": "2", "difficulty": 1.0}])
    with pytest.raises(ValueError) as err:
        load_problems(MathTask(), [f], "train")
    assert str(err.value).startswith(f"{f}:row 1: no column 'problem' (--data.problems.columns.problem); the row has: "
                                     "difficulty, final_answer, question; map one with "
                                     "--data.problems.columns.problem=COLUMN")
    # The eval and diagnose commands spell their flags without the section.
    with pytest.raises(ValueError, match=r"no column 'problem' \(--columns.problem\).*--skip_bad_rows=true"):
        load_problems(MathTask(), [f], "test", flags="--")
    # A dotted path names the nested field it stopped at.
    g = write_jsonl(tmp_path / "v.jsonl", [{"prompt": "x", "reward_model": {"style": "rule"}}])
    with pytest.raises(ValueError, match=r"v\.jsonl:1: no column 'reward_model\.ground_truth' "
                                         r"\(--data\.problems\.columns\.answer\); column 'reward_model' has: style"):
        load_problems(MathTask(), [g], "train", columns=Columns(problem="prompt", answer="reward_model.ground_truth"))
    with pytest.raises(ValueError, match="columns.problem=''"):
        Columns(problem="")
    assert isinstance(MissingColumn("problem", "p", []), ValueError)


# ----------------------------------------------------------------------------- typed answers
def test_integer_and_float_answers_are_written_canonically_and_booleans_and_nulls_refused(tmp_path):
    rows = [{"id": "i", "problem": "a", "answer": 42}, {"id": "f", "problem": "b", "answer": 42.0},
            {"id": "h", "problem": "c", "answer": 0.5}, {"id": 7, "problem": "d", "answer": -3}]
    loaded = load_problems(MathTask(), [write_jsonl(tmp_path / "t.jsonl", rows)], "train")
    assert [(p.id, p.answer) for p in loaded.problems] == [("i", "42"), ("f", "42"), ("h", "0.5"), ("7", "-3")]
    # Parquet columns of integers and of floats (DeepMath-style derived sets, verl's ground_truth).
    ints = write_parquet(tmp_path / "i.parquet", [{"id": 1, "problem": "a", "answer": 42}, {"id": 2, "problem": "b", "answer": -3}])
    floats = write_parquet(tmp_path / "f.parquet", [{"id": 3, "problem": "c", "answer": 42.0}, {"id": 4, "problem": "d", "answer": 0.25}])
    loaded = load_problems(MathTask(), [ints, floats], "train")
    assert [(p.id, p.answer) for p in loaded.problems] == [("1", "42"), ("2", "-3"), ("3", "42"), ("4", "0.25")]
    for bad, shown in ((True, "True"), (None, "None")):
        f = write_jsonl(tmp_path / "b.jsonl", [{"problem": "a", "answer": "1"}, {"problem": "b", "answer": bad}])
        with pytest.raises(ValueError, match=rf"b\.jsonl:2: the answer is {shown}, not a string or a number"):
            load_problems(MathTask(), [f], "train")
        assert load_problems(MathTask(), [f], "train", skip_bad_rows=True).skipped == 1


def test_gold_formats_read_their_convention_and_refuse_a_row_without_it(tmp_path):
    assert gold_answer("so #### 12", "hashes") == "12" and gold_answer("$\\boxed{\\frac12}$", "boxed") == "\\frac12"
    assert gold_answer(" 3/4 ", "plain") == "3/4" and gold_answer("x #### 5", "plain") == "x #### 5"
    f = write_jsonl(tmp_path / "g.jsonl", [{"question": "q", "answer": "no marker here: 7"}])
    with pytest.raises(ValueError, match=r"g\.jsonl:1: the gold answer 'no marker here: 7' has no '#### ANSWER' line "
                                         r"\(--data.task.init_args.gold_format=hashes"):
        load_problems(MathTask(gold_format="hashes"), [f], "train", columns=Columns(problem="question"))
    with pytest.raises(ValueError, match="gold_format must be one of"):
        MathTask(gold_format="gsm8k")


# ----------------------------------------------------------------------------- repeats and leaks
def test_repeats_and_leaks_are_found_by_normalised_text():
    def p(i, q):
        return Problem(id=i, question=q, answer="1")

    train = [p("a", "What is 1+1?"), p("b", "what  is 1+1?"), p("c", "Compute 2."), p("d", "Ｃompute 3.")]
    held = [p("x", "COMPUTE 2. "), p("y", "compute 3.")]  # NFKC folds the full-width Ｃ
    overlap = find_overlap(train, held, lambda q: q.question)
    assert overlap.repeats == (("b", "a"),) and overlap.leaks == ("c", "d")


def fit_args(tmp_path: Path, *extra: str, overlay: str | None = None) -> list[str]:
    """The smallest fit of conf/deepsearch_cpu.yaml (MathTask) that searches and trains one step."""
    overlays = ["--config", str(ROOT / "conf" / "data" / overlay)] if overlay else []
    return ["fit", "--config", str(ROOT / "conf" / "deepsearch_cpu.yaml"), *overlays,
            "--trainer.max_epochs=1", "--data.batching.problems_per_epoch=2", "--data.batching.mini_batch_problems=2",
            "--data.search.expansion_width=2", "--data.search.trajectories_per_tree=2", "--data.search.max_depth=2",
            "--data.search.max_expansions_per_tree=4", "--data.task.init_args.step_tokens=4",
            "--data.task.init_args.max_response_tokens=8", "--data.search.overlong_max_tokens=8",
            "--data.search.overlong_buffer_tokens=2",
            "--data.hard_set.enabled=false", "--data.replay.enabled=false", "--data.problems.max_train_problems=null",
            "--data.problems.max_eval_problems=2", "--data.eval.samples=1", "--data.eval.at_start=false",
            "--data.save_trees=0", f"--trainer.logger.init_args.save_dir={tmp_path}",
            f"--trainer.callbacks.init_args.dirpath={tmp_path / 'checkpoints'}", *extra]


def test_drop_eval_overlap_removes_held_out_problems_from_training(tmp_path, caplog):
    train = write_jsonl(tmp_path / "train.jsonl", DEEPMATH)
    held = write_jsonl(tmp_path / "test.jsonl", [{**DEEPMATH[1], "question": "  compute 6 * 7."}])
    args = fit_args(tmp_path, f"--data.problems.train_files={train}", f"--data.problems.eval_files={held}",
                    overlay="deepmath.yaml")
    with caplog.at_level(logging.INFO):
        pool = main(args[1:], run=False).datamodule.pool
        assert len(pool.train()) == 3
    assert f"1 training problems (--data.problems.train_files=['{train}']) are held-out problems" in caplog.text
    assert "--data.problems.drop_eval_overlap=true" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO):
        pool = main(args[1:] + ["--data.problems.drop_eval_overlap=true"], run=False).datamodule.pool
        assert sorted(p.question for p in pool.train().values()) == ["Compute 10 - 4.", "Compute 2 + 3."]
    assert f"dropped 1 training problems that are held-out problems (--data.problems.eval_files=['{held}']" \
           in caplog.text and f"'{train}:2'" in caplog.text
    caplog.clear()
    repeated = write_jsonl(tmp_path / "rep.jsonl", [*DEEPMATH, DEEPMATH[0]])
    with caplog.at_level(logging.WARNING):
        main(args[1:] + [f"--data.problems.train_files={repeated}"], run=False).datamodule.pool.train()
    assert f"1 training problems (--data.problems.train_files=['{repeated}']) repeat an earlier one's text " \
           f"({repeated}:4 = {repeated}:1)" in caplog.text


# ----------------------------------------------------------------------------- the five shapes fit
def fitted(tmp_path: Path, args: list[str]) -> None:
    cli = main(args)
    assert cli.trainer.global_step >= 1  # searched and took an optimizer step


@pytest.mark.slow
@pytest.mark.parametrize("shape,rows,overlay,flags,fmt", [
    ("gsm8k", GSM8K, "gsm8k.yaml", [], "jsonl"),
    ("deepmath", DEEPMATH, "deepmath.yaml", [], "parquet"),
    ("math", MATH, "math.yaml", [], "jsonl"),
    ("verl", VERL, None, VERL_FLAGS, "parquet"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_each_shape_loads_with_one_overlay_or_a_few_flags_and_fits(tmp_path, shape, rows, overlay, flags, fmt):
    write = write_parquet if fmt == "parquet" else write_jsonl
    train = write(tmp_path / f"train.{fmt}", rows[:2])
    held = write(tmp_path / f"test.{fmt}", rows[2:])
    fitted(tmp_path, fit_args(tmp_path, f"--data.problems.train_files={train}", f"--data.problems.eval_files={held}",
                              *flags, overlay=overlay))


# ----------------------------------------------------------------------------- Hugging Face datasets
def test_a_save_to_disk_folder_and_local_files_load_through_datasets(tmp_path):
    datasets = pytest.importorskip("datasets", reason="the datasets extra is not installed (pip install 'flywheel[datasets]')")
    folder = tmp_path / "gsm8k_saved"
    datasets.Dataset.from_list(GSM8K).save_to_disk(str(folder))
    task = MathTask(gold_format="hashes")
    loaded = load_problems(task, [str(folder)], "train", columns=Columns(problem="question"))
    assert [p.answer for p in loaded.problems] == ["7", "10", "5"]
    assert loaded.problems[1].id == f"{folder}:row 2"
    # A DatasetDict's folder names its splits' folders.
    datasets.DatasetDict({"train": datasets.Dataset.from_list(GSM8K[:2]), "test": datasets.Dataset.from_list(GSM8K[2:])}) \
        .save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(ValueError, match=f"{tmp_path / 'dd'} holds a DatasetDict; pass one split's folder: "
                                         f"{tmp_path / 'dd' / 'test'}, {tmp_path / 'dd' / 'train'}"):
        load_problems(task, [str(tmp_path / "dd")], "train", columns=Columns(problem="question"))
    assert len(load_problems(task, [str(tmp_path / "dd" / "test")], "t", columns=Columns(problem="question")).problems) == 1
    # Local files through load_dataset: a glob over parquet shards, and JSON lines.
    write_parquet(tmp_path / "v-0.parquet", VERL[:2])
    write_parquet(tmp_path / "v-1.parquet", VERL[2:])
    verl = Columns(problem="prompt", answer="reward_model.ground_truth", id="extra_info.index")
    loaded = load_problems(MathTask(), [f"hf://parquet:{tmp_path}/v-*.parquet"], "train", columns=verl)
    assert sorted((p.id, p.question, p.answer) for p in loaded.problems) == \
        [("0", "Compute 4 + 4.", "8"), ("1", "Compute 2 * 5.", "10"), ("2", "Compute 9 - 2.", "7")]
    write_jsonl(tmp_path / "d.jsonl", DEEPMATH)
    loaded = load_problems(MathTask(gold_format="plain"), [f"hf://json:{tmp_path}/d.jsonl"], "train",
                           columns=Columns(problem="question", answer="final_answer"))
    assert [p.answer for p in loaded.problems] == ["5", "42", "6"]


def test_a_hub_dataset_that_cannot_be_reached_fails_with_one_line(monkeypatch):
    datasets = pytest.importorskip("datasets", reason="the datasets extra is not installed (pip install 'flywheel[datasets]')")
    import huggingface_hub.constants

    # Offline mode: nothing is fetched even on a machine that reaches the hub (nothing downloads in CI).
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HOME", "/nonexistent-flywheel-hf-home")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", Path("/nonexistent-flywheel-hf-home/datasets"))
    with pytest.raises(ValueError) as err:
        load_problems(MathTask(), ["hf://openai/gsm8k:main:train"], "train", columns=Columns(problem="question"))
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("hf://openai/gsm8k:main:train: cannot load it with datasets (ConnectionError: ")
    assert "it needs the Hugging Face hub or the dataset in the local cache" in message
    assert "save it with Dataset.save_to_disk and pass that folder" in message
    with pytest.raises(ValueError, match=r"write a hub dataset as hf://OWNER/NAME:SPLIT"):
        load_problems(MathTask(), ["hf://openai/gsm8k"], "train")


@pytest.mark.slow
def test_a_save_to_disk_folder_fits(tmp_path):
    datasets = pytest.importorskip("datasets", reason="the datasets extra is not installed (pip install 'flywheel[datasets]')")
    datasets.Dataset.from_list(MATH[:2]).save_to_disk(str(tmp_path / "train"))
    datasets.Dataset.from_list(MATH[2:]).save_to_disk(str(tmp_path / "test"))
    fitted(tmp_path, fit_args(tmp_path, f"--data.problems.train_files={tmp_path / 'train'}",
                              f"--data.problems.eval_files={tmp_path / 'test'}", overlay="math.yaml"))


def test_the_hub_source_without_datasets_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ImportError, match=r"pip install 'flywheel\[datasets\]'"):
        load_problems(MathTask(), ["hf://openai/gsm8k:main:train"], "train")


def test_eval_reads_mapped_columns_and_names_its_own_flag(tmp_path):
    f = write_parquet(tmp_path / "verl.parquet", VERL)
    task = ["--task=flywheel.tasks.math.MathTask", "--task.init_args.max_response_tokens=8", "--task.init_args.prompt_suffix="]
    base = ["eval", "--policy", "tiny-countdown", *task, "--files", f, "--samples", "1", "--max_problems", "2"]
    with pytest.raises(ValueError, match=r"verl\.parquet:row 1: no column 'problem' \(--columns\.problem\); the row has: "
                                         r"ability, data_source, extra_info, prompt, reward_model; map one with "
                                         r"--columns\.problem=COLUMN"):
        main(base + ["--out", str(tmp_path / "refused")])
    report = main(base + ["--columns.problem=prompt", "--columns.answer=reward_model.ground_truth",
                          "--columns.id=extra_info.index", "--out", str(tmp_path / "eval")])
    assert report["results"]["verl"]["problems"] == 2


def test_a_missing_column_lists_the_columns_of_the_row_as_read(tmp_path):
    """With `problem` read from `question`, a row of question and solution was said to have
    "problem, question, solution": the task saw the mapped row. The message lists the file's."""
    f = write_jsonl(tmp_path / "q.jsonl", [{"question": "1+1?", "solution": "2"}])
    with pytest.raises(ValueError) as err:
        load_problems(MathTask(), [f], "train", columns=Columns(problem="question"))
    assert f"{f}:1: no column 'answer' (--data.problems.columns.answer); the row has: question, solution; " in str(err.value)
