"""The run report (flywheel.reporting.report, `python -m flywheel report`): what its table's time
columns mean, a panel with nothing to draw, a run with no round yet, and the run's clock that
its round times come from (callbacks.run_summary)."""

from __future__ import annotations

import json

import pytest

from callbacks import run_summary
from callbacks.run_summary import RunSummary
from flywheel.__main__ import main
from flywheel.reporting.report import report_figure, report_markdown
from flywheel.run.preflight import PreflightError


def rows(cached: list[int], hard: list[int | None]) -> list[dict]:
    return [{"round": i + 1, "epoch": 5 * i + 4, "eval_pass1": 0.3, "eval_passk": 0.5, "k": 4, "hard_set_size": h,
             "cached": c, "generated_tokens": 1000 * (i + 1)} for i, (c, h) in enumerate(zip(cached, hard))]


def test_the_table_gives_a_round_s_own_time_and_the_run_s_time_under_their_names():
    """A resumed run's report gave round 3 "242 s" where its wall split said 766: the column was
    the run's time at the round's end, on a clock that missed each part's first search. Both now
    are there, named."""
    row = {**rows([0], [None])[0], "round": 3, "wall_seconds": 1544.2, "wall_split": {"wall_s": 766.4}}
    text = report_markdown({"k": 4, "base_eval_pass1": 0.2, "base_eval_passk": 0.4, "rounds": [row]})
    assert "| generated tokens | round wall (s) | run wall (s) |" in text
    assert "| 1,000 | 766 | 1544 |" in text
    assert "Round wall: the round's own seconds" in text and "run wall: the run's wall time at the round's end" in text
    assert "| base | - | 0.2000 | 0.4000 | - | - | 0 | - | - |" in text
    older = report_markdown({"k": 4, "rounds": [{**row, "wall_split": None}]})  # a summary from before the split
    assert "| 1,000 | - | 1544 |" in older


def test_a_run_with_no_hard_set_and_nothing_cached_says_so_instead_of_an_empty_panel():
    """The quickstart (hard set off, no solution cached) drew an empty panel on a -0.04..0.04 axis."""
    quickstart = report_figure({"k": 4, "base_eval_pass1": 0.2, "rounds": rows([0, 0], [None, None])})
    right = quickstart.axes[1]
    assert not right.axison and not right.patches
    assert [t.get_text() for t in right.texts] == ["the hard set is off and nothing was cached\n"
                                                   "(--data.hard_set.*, --data.replay.*)"]
    cached = report_figure({"k": 4, "rounds": rows([0, 3], [None, None])}).axes[1]
    assert cached.axison and [p.get_height() for p in cached.patches] == [0, 3]
    assert cached.get_title() == "replay buffer per round (the hard set is off)"
    emptied = report_figure({"k": 4, "rounds": rows([0, 0], [5, 0])}).axes[1]  # a hard set, emptied: drawn
    assert emptied.axison and [p.get_height() for p in emptied.patches] == [5, 0, 0, 0]


def test_report_of_a_run_before_its_first_round_says_so(tmp_path):
    """A run stopped before its first round was told to "give a run's log folder", which it was."""
    run = tmp_path / "quickstart" / "version_0"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("seed_everything: 0\n")
    for given in (run, run.parent):
        with pytest.raises(PreflightError, match=r"no round has finished yet \(a run writes summary.json"):
            main(["report", str(given)])
    (run / "summary.json").write_text(json.dumps({"base_eval_pass1": 0.25, "k": 4, "rounds": []}))  # the base only
    with pytest.raises(PreflightError, match=r"summary.json: no round has finished yet \(held-out pass@1 before "
                                             r"training: 0.2500\)"):
        main(["report", str(run)])
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(PreflightError, match="no summary.json in it or below it; give a run's log folder"):
        main(["report", str(tmp_path / "elsewhere")])


def test_the_run_s_clock_starts_with_the_fit_as_the_wall_split_s_does(monkeypatch):
    """Lightning builds the first epoch's data loader (its whole search) between `setup` and
    `on_train_start`; the wall split (callbacks.wall_time) starts at `setup`, and so does the
    run's clock now, so a round's `wall_seconds` holds that search too, in every part of a run."""
    now = [100.0]
    monkeypatch.setattr(run_summary.time, "perf_counter", lambda: now[0])
    summary = RunSummary()
    now[0] = 130.0  # the CLI's preflight, the policy's loading: before the fit
    summary.setup(None, None, "fit")
    now[0] = 190.0  # the first epoch's search
    summary.on_train_start(None, None)
    now[0] = 200.0
    assert summary.wall_seconds() == 70.0  # 130 -> 200; from on_train_start it was 10
    summary.load_state_dict({"base": None, "rounds": [], "wall_seconds": 500.0})  # a resumed part
    assert summary.wall_seconds() == 570.0


def test_the_report_of_a_finished_fit_has_its_last_round_s_own_time(tmp_path):
    """The wall split closes the last round in its on_fit_end, after the summary's: the report is
    drawn at teardown, so the last row's round wall is there (it was "-")."""
    from types import SimpleNamespace

    trainer = SimpleNamespace(log_dir=str(tmp_path / "version_0"), is_global_zero=True)
    (tmp_path / "version_0").mkdir()
    summary = RunSummary()
    summary.connect(SimpleNamespace(eval=SimpleNamespace(pass_k=4, samples=2, temperature=1.0),
                                    eval_problems=lambda: [1, 2], solved_problems=lambda: {}))
    summary.end_round(trainer, {**rows([0], [None])[0], "wall_seconds": 61.0})
    summary.on_fit_end(trainer, None)
    summary.record(trainer, 1, {"wall_split": {"wall_s": 60.4}})  # callbacks.wall_time's on_fit_end
    summary.teardown(trainer, None, "fit")
    assert "| 1,000 | 60 | 61 |" in (tmp_path / "version_0" / "report.md").read_text()
