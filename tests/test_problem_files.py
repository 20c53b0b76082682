"""Problem files (jsonl and parquet): bad rows fail with file and line, or are skipped and counted
on request; parquet without pyarrow names the extra to install."""

import json

import pytest

from flywheel.tasks.sources import load_problems
from flywheel.tasks.countdown import CountdownTask


def write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_good_rows_load_in_both_formats(tmp_path):
    f = write(tmp_path / "p.jsonl", [
        json.dumps({"id": "a", "numbers": [5, 9, 8], "target": 67}),
        json.dumps({"id": "b", "problem": "3 4", "answer": "12"}),
    ])
    loaded = load_problems(CountdownTask(), [f], "train")
    assert [p.id for p in loaded.problems] == ["a", "b"] and loaded.skipped == 0


@pytest.mark.parametrize(
    "bad",
    ['{"id": "x", "numbers": [1, 2]', '{"id": "x", "numbers": [1, 2], "target": "3"}',
     '{"id": "x", "problem": "", "answer": "3"}', '{"id": "x", "numbers": [1, 2]}', '[1, 2, 3]'],
    ids=["bad-json", "wrong-type", "empty-problem", "missing-answer", "not-an-object"],
)
def test_a_bad_row_names_file_and_line_or_is_skipped_and_counted(tmp_path, bad):
    good = json.dumps({"id": "a", "numbers": [5, 9, 8], "target": 67})
    f = write(tmp_path / "p.jsonl", [good, bad, json.dumps({"id": "c", "numbers": [2, 3], "target": 6})])
    with pytest.raises(ValueError, match=r"p\.jsonl:2.*skip_bad_rows"):
        load_problems(CountdownTask(), [f], "train")
    loaded = load_problems(CountdownTask(), [f], "train", skip_bad_rows=True)
    assert [p.id for p in loaded.problems] == ["a", "c"] and loaded.skipped == 1


def test_duplicate_ids_and_missing_files_are_errors(tmp_path):
    row = json.dumps({"id": "a", "numbers": [5, 9, 8], "target": 67})
    with pytest.raises(ValueError, match="duplicate problem id 'a'"):
        load_problems(CountdownTask(), [write(tmp_path / "d.jsonl", [row, row])], "train")
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_problems(CountdownTask(), [str(tmp_path / "nope.jsonl")], "train")


def write_parquet(path, rows):
    import pyarrow as pa  # in the `test` extra (and `parquet`): the parquet path always runs here
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def test_parquet_files_load_like_jsonl(tmp_path):
    from flywheel.tasks.math import MathTask

    f = write_parquet(tmp_path / "m.parquet", [
        {"id": "a", "problem": "What is 2 + 3?", "answer": "5", "source": "hand"},
        {"id": "b", "problem": "Half of 9?", "answer": "\\frac{9}{2}", "source": "hand"},
    ])
    loaded = load_problems(MathTask(), [f], "train")
    assert [(p.id, p.answer) for p in loaded.problems] == [("a", "5"), ("b", "\\frac{9}{2}")]
    assert loaded.problems[0].question == "What is 2 + 3?"
    # Countdown rows in parquet, the same columns as in jsonl.
    g = write_parquet(tmp_path / "c.parquet", [{"id": "x", "numbers": [5, 9, 8], "target": 67}])
    [problem] = load_problems(CountdownTask(), [g], "train").problems
    assert (problem.id, problem.numbers, problem.target) == ("x", (5, 9, 8), 67)


def test_a_bad_parquet_row_names_file_and_row(tmp_path):
    from flywheel.tasks.math import MathTask

    f = write_parquet(tmp_path / "m.parquet", [{"id": "a", "problem": "1+1?", "answer": "2"},
                                               {"id": "b", "problem": "", "answer": "3"}])
    with pytest.raises(ValueError, match=r"m\.parquet:row 2.*skip_bad_rows"):
        load_problems(MathTask(), [f], "train")
    assert load_problems(MathTask(), [f], "train", skip_bad_rows=True).skipped == 1


def test_parquet_without_pyarrow_names_the_extra(tmp_path, monkeypatch):
    import sys

    path = tmp_path / "m.parquet"
    path.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow now raises ImportError
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ImportError, match=r"needs pyarrow: pip install 'flywheel\[parquet\]'"):
        load_problems(CountdownTask(), [str(path)], "train")
