"""Problem files: bad rows fail with file and line, or are skipped and counted on request."""

import json

import pytest

from data_modules.problems import load_problems
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
