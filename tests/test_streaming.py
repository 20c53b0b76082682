"""The litdata problem stream (data_modules/streaming.py): optimized once, shuffled per pass,
sharded across ranks without duplicates, resumable to the exact next problem.

Marker `stream` (needs litdata, the `stream` extra); `.ci/run` runs this group after the
default suite."""

import json
import time
from pathlib import Path

import pytest

from flywheel.tasks.countdown import CountdownTask

pytestmark = pytest.mark.stream
pytest.importorskip("litdata")

from data_modules.streaming import StreamingProblems, dataset_key, optimize_files  # noqa: E402


def write_rows(path: Path, count: int, start: int = 0) -> Path:
    with path.open("w") as fh:
        for i in range(start, start + count):
            fh.write(json.dumps({"id": f"p{i}", "numbers": [i % 7 + 1, i % 11 + 1, 3], "target": i % 50 + 1}) + "\n")
    return path


def ids(problems) -> list[str]:
    return [p.id for p in problems]


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """200,000 rows, optimized once for the module's tests."""
    root = tmp_path_factory.mktemp("big")
    files = [str(write_rows(root / "big.jsonl", 200_000))]
    start = time.perf_counter()
    directory = optimize_files(CountdownTask(), files, root / "cache")
    return files, root / "cache", directory, time.perf_counter() - start


def test_a_large_file_is_optimized_once_and_sharded_without_duplicates(big):
    files, cache, directory, _ = big
    again = time.perf_counter()
    assert optimize_files(CountdownTask(), files, cache) == directory  # cached: found, not rebuilt
    assert time.perf_counter() - again < 5.0  # a hang guard, not a speed claim: hashing 12 MB
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # no staging folder left
    shards = [StreamingProblems(CountdownTask(), directory, seed=0, rank=r, world=2) for r in (0, 1)]
    assert [len(s) for s in shards] == [100_000, 100_000]
    drawn = [ids(s.take(100_000)) for s in shards]
    assert all(len(set(d)) == 100_000 for d in drawn)  # a pass has no repeats on a rank
    assert not set(drawn[0]) & set(drawn[1])  # and no problem on both ranks
    assert set(drawn[0]) | set(drawn[1]) == {f"p{i}" for i in range(200_000)}


def test_draws_are_shuffled_across_the_whole_file(big):
    _, _, directory, _ = big
    first = [int(i[1:]) for i in ids(StreamingProblems(CountdownTask(), directory, seed=0).take(64))]
    # 64 draws from a file of 200,000 rows in order: a stream reading it in file order (or in
    # windows of it) would keep them within a few thousand rows of each other.
    assert max(first) - min(first) > 100_000
    other_seed = ids(StreamingProblems(CountdownTask(), directory, seed=1).take(64))
    assert other_seed != [f"p{i}" for i in first]


def test_resume_draws_exactly_what_the_uninterrupted_stream_draws(tmp_path):
    files = [str(write_rows(tmp_path / "small.jsonl", 10))]
    directory = optimize_files(CountdownTask(), files, tmp_path / "cache")
    whole = StreamingProblems(CountdownTask(), directory, seed=3)
    reference = ids(whole.take(27))  # 2.7 passes of 10
    assert sorted(reference[:10]) == sorted(reference[10:20]) == sorted(f"p{i}" for i in range(10))
    assert reference[:10] != reference[10:20]  # each pass reshuffled
    for cut in (0, 4, 10, 13, 26):
        stream = StreamingProblems(CountdownTask(), directory, seed=3)
        head = ids(stream.take(cut))
        state = json.loads(json.dumps(stream.state_dict()))  # what a checkpoint keeps
        resumed = StreamingProblems(CountdownTask(), directory, seed=3)
        resumed.load_state_dict(state)
        assert head + ids(resumed.take(27 - cut)) == reference, cut


def test_bad_rows_name_their_line_or_are_skipped_and_counted(tmp_path):
    path = write_rows(tmp_path / "rows.jsonl", 5)
    with path.open("a") as fh:
        fh.write('{"id": "bad", "numbers": [1, 2], "target": "x"}\n')
    with pytest.raises(ValueError, match=r"rows\.jsonl:6.*--data\.problems\.skip_bad_rows=true"):
        optimize_files(CountdownTask(), [str(path)], tmp_path / "cache")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
    directory = optimize_files(CountdownTask(), [str(path)], tmp_path / "cache", skip_bad_rows=True)
    assert sorted(ids(StreamingProblems(CountdownTask(), directory, seed=0).take(5))) == [f"p{i}" for i in range(5)]


def test_duplicate_ids_are_refused(tmp_path):
    a = write_rows(tmp_path / "a.jsonl", 3)
    b = write_rows(tmp_path / "b.jsonl", 3, start=2)
    with pytest.raises(ValueError, match=r"duplicate problem id 'p2' at .*b\.jsonl:1"):
        optimize_files(CountdownTask(), [str(a), str(b)], tmp_path / "cache")


def test_a_changed_file_is_optimized_again(tmp_path):
    path = write_rows(tmp_path / "rows.jsonl", 4)
    first = optimize_files(CountdownTask(), [str(path)], tmp_path / "cache")
    write_rows(path, 6)
    second = optimize_files(CountdownTask(), [str(path)], tmp_path / "cache")
    assert first != second and dataset_key(CountdownTask(), [str(path)], False) == second.name
    assert len(StreamingProblems(CountdownTask(), second, seed=0)) == 6


def test_a_stream_maps_columns_reads_a_saved_dataset_and_leaves_held_out_problems_out(tmp_path):
    from data_modules.pool import ProblemPool
    from data_modules.settings import ProblemsConfig
    from flywheel.tasks.columns import Columns
    from flywheel.tasks.math import MathTask

    datasets = pytest.importorskip("datasets", reason="the datasets extra is not installed (pip install 'flywheel[datasets]')")
    rows = [{"question": f"Compute {i} + 1.", "final_answer": i + 1, "uid": f"u{i}"} for i in range(6)]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "train"))
    held = tmp_path / "held.jsonl"
    held.write_text(json.dumps({"question": "compute 2 + 1.", "final_answer": "3", "uid": "h0"}) + "\n")
    columns = Columns(problem="question", answer="final_answer", id="uid")
    config = ProblemsConfig(train_files=[str(tmp_path / "train")], eval_files=[str(held)], columns=columns, stream=True,
                            stream_cache=str(tmp_path / "cache"), drop_eval_overlap=True)
    pool = ProblemPool(MathTask(gold_format="plain"), config, seed=0)
    drawn = pool.draw(5, 0, 1)
    assert sorted((p.id, p.question, p.answer) for p in drawn) == \
        [(f"u{i}", f"Compute {i} + 1.", str(i + 1)) for i in (0, 1, 3, 4, 5)]  # u2 is held out
    # Another column mapping is another optimized dataset; the same one is found again.
    kept = ProblemsConfig(train_files=[str(tmp_path / "train")], eval_files=[str(held)], columns=columns, stream=True,
                          stream_cache=str(tmp_path / "cache"))
    assert len(ProblemPool(MathTask(gold_format="plain"), kept, seed=0).draw(6, 0, 1)) == 6
    assert len(list((tmp_path / "cache").iterdir())) == 2


# ---------------------------------------------------------------------- from the command line
def test_settings_of_a_stream_are_checked_with_their_flags(tmp_path):
    from data_modules.search import SearchDataModule
    from data_modules.settings import ProblemsConfig

    with pytest.raises(ValueError, match=r"--data\.problems\.stream=true streams --data\.problems\.train_files"):
        ProblemsConfig(stream=True)
    with pytest.raises(ValueError, match=r"--data\.problems\.max_train_problems .* leave it out"):
        ProblemsConfig(stream=True, train_files=["a.jsonl"], max_train_problems=8)
    with pytest.raises(ValueError, match=r"--data\.problems\.stream=true needs --data\.replay\.enabled=false"):
        SearchDataModule(problems=ProblemsConfig(stream=True, train_files=["a.jsonl"]))
    assert ProblemsConfig(stream=True, train_files=[str(tmp_path / "a.jsonl")]).cache_folder == str(tmp_path / ".flywheel_stream")


def test_fit_streams_its_problems_screens_each_draw_and_resumes_the_stream(tmp_path, monkeypatch):
    """`--data.problems.stream=true`: each epoch draws its problems from the litdata stream,
    the hard set screens that draw (not the 60-problem file), and a resumed run draws on
    where the stream stopped."""
    import data_modules.screening as screening_module
    from data_modules.pool import ProblemPool
    from data_modules.settings import ProblemsConfig
    from flywheel.__main__ import main

    files = [str(write_rows(tmp_path / "train.jsonl", 60))]
    screened: list[list[str]] = []
    real_screen = screening_module.screen

    def spy(shard, **kwargs):  # the real screening, its problems recorded
        screened.append(ids(shard))
        return real_screen(shard, **kwargs)

    monkeypatch.setattr(screening_module, "screen", spy)
    root = Path(__file__).resolve().parents[1]
    args = ["fit", "--config", str(root / "conf" / "quickstart.yaml"), f"--data.problems.train_files=[{files[0]}]",
            "--data.problems.stream=true", "--data.replay.enabled=false", "--data.hard_set.enabled=true",
            "--data.hard_set.k=2", "--data.batching.problems_per_epoch=4", "--data.batching.mini_batch_problems=4",
            "--data.problems.max_eval_problems=2", "--data.eval.samples=1", "--data.eval.at_start=false",
            "--data.epochs_per_round=1", "--data.search.expansion_width=2", "--data.search.trajectories_per_tree=2",
            f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
            f"--trainer.callbacks.init_args.dirpath={tmp_path / 'checkpoints'}"]
    cli = main(args + ["--trainer.max_epochs=2"])
    dm = cli.datamodule
    draws = [s for s in screened]  # epoch draws, then the round ends' (empty) hard-set refreshes
    drawn = [s for s in draws if s]
    assert len(drawn) == 2 and all(len(d) == 4 for d in drawn)  # 4 problems screened per epoch, not 60
    assert set(drawn[0]) | set(drawn[1]) == set(dm.train_pool()) and not set(drawn[0]) & set(drawn[1])
    assert dm.state_dict()["stream"] == {"epoch": 0, "drawn": 8}
    state = dm.state_dict()
    expected = ProblemPool(dm.task, ProblemsConfig(train_files=files, stream=True), seed=0)
    expected.load_stream_position(state["stream"])
    screened.clear()
    resumed = main(args + ["--trainer.max_epochs=3", "--ckpt_path", "last"])
    assert [s for s in screened if s] == [ids(expected.draw(4, 0, 1))]
    assert resumed.datamodule.state_dict()["stream"] == {"epoch": 0, "drawn": 12}
