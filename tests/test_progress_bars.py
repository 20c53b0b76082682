"""Bars that move during a long generator call (an evaluation of a real model sat at 0/16
problems for minutes: its bar moved once per call); off a terminal, a plain line every 30 s
instead of carriage-return frames (an 18-minute evaluation was one 84 KB line of 714 frames);
no ETA before it means something (the first read `[00:06<17:12:35]`); and the projected end of
a fit, from the epochs' own time (the base evaluation once counted as an epoch's)."""

from __future__ import annotations

import io
import logging
import time

import pytest

from flywheel.generation import GenerationRequest, SamplingParams
from flywheel.generation.base import GenerationStats
from flywheel.generation.hf import HFGenerator
from flywheel.policies.tiny import build_tiny_llama
from flywheel.reporting import bars
from flywheel.reporting.bars import LineBar, TerminalBar, progress_bar, progress_line
from flywheel.reporting.sample_bar import sample_bar
from flywheel.reporting.wall_split import projected_finish

pytestmark = pytest.mark.usefixtures("one_thread")  # fixtures one_thread and tok: conftest.py


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def on_a_terminal(monkeypatch):
    monkeypatch.setattr(bars, "is_terminal", lambda stream: True)


@pytest.mark.usefixtures("on_a_terminal")
def test_the_bar_counts_samples_and_tokens_while_one_generator_call_runs(tok, capsys):
    model = build_tiny_llama(tok, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=1,
                             initializer_range=0.4)
    gen = HFGenerator(model, tok)
    params = SamplingParams(max_new_tokens=16, temperature=1.0)
    requests = [GenerationRequest(tuple(tok(p)["input_ids"]), 3, params, seed=i) for i, p in enumerate(["1 2 3|6", "4 5|9"])]
    seen: list[tuple[int, int]] = []
    with sample_bar(gen, problems=2, samples=3, desc="eval test", show=True) as advance:
        listen = gen.stats.live
        gen.stats.live = lambda tokens, finished: (seen.append((tokens, finished)), listen(tokens, finished))
        out = gen.sample(requests)  # ONE call: the bar must move inside it, per decode step
        advance(2)
    generated = sum(len(c.token_ids) for cs in out for c in cs)
    assert len(seen) > 2  # per step, not once per call
    assert sum(t for t, _ in seen) == generated == gen.stats.generated_tokens
    assert sum(f for _, f in seen) == 6
    assert gen.stats.live is None  # the bar stops listening with its block
    err = capsys.readouterr().err
    assert "6/6" in err and f"{generated} tok" in err and "tok/s" in err


@pytest.mark.usefixtures("on_a_terminal")
def test_a_backend_that_does_not_report_still_moves_the_bar_per_problem(capsys):
    class Silent:  # a generator whose sample() never ticks (a backend without live progress)
        stats = GenerationStats()

    with sample_bar(Silent(), problems=4, samples=2, desc="screen test", show=True) as advance:
        advance(1)
        advance(3)
    assert "6/8" in capsys.readouterr().err


def test_off_a_terminal_the_bar_is_a_log_line_every_30_s(caplog):
    clock = FakeClock()
    caplog.set_level(logging.INFO, logger="flywheel.reporting.bars")
    bar = progress_bar(100, "eval base", "sample", show=True, terminal=False, clock=clock)
    assert isinstance(bar, LineBar)
    clock.t = 10.0
    bar.update(5)  # 10 s: under 30 s, no line
    clock.t = 31.0
    bar.set_postfix_str("900 tok, 29 tok/s", refresh=False)
    bar.update(15)  # 31 s: 20 done at 20 / 31 = 0.645 a second; 80 left / 0.645 = 124 s
    clock.t = 45.0
    bar.update(10)  # 14 s after the last line: none
    clock.t = 62.0
    bar.update(10)  # 40 done at 40 / 62 = 0.645 a second, 60 left: 93 s
    clock.t = 80.0
    bar.update(60)
    bar.close()  # 100 in 80 s: 1.25 a second
    assert [r.getMessage() for r in caplog.records] == [
        "eval base: 20/100 (20%) after 31 s, 0.645 sample/s, about 2 min 04 s left; 900 tok, 29 tok/s",
        "eval base: 40/100 (40%) after 1 min 02 s, 0.645 sample/s, about 1 min 33 s left; 900 tok, 29 tok/s",
        "eval base: 100/100 in 1 min 20 s, 1.25 sample/s; 900 tok, 29 tok/s",
    ]


def test_a_pass_shorter_than_a_line_logs_nothing_and_an_early_eta_is_not_shown(caplog):
    clock = FakeClock()
    caplog.set_level(logging.INFO, logger="flywheel.reporting.bars")
    with progress_bar(50, "screen base", "sample", show=True, terminal=False, clock=clock) as bar:
        clock.t = 29.0
        bar.update(50)
    assert caplog.records == []  # the log's other lines say what a short pass did
    # 1 of 400 done after 40 s (under 5%): the rate so far says nothing of the time left.
    assert progress_line("epoch 0 search", 1, 400, 40.0, "problem") == "epoch 0 search: 1/400 (0%) after 40 s, 0.025 problem/s"
    assert progress_line("train", 0, None, 30.0, "batch") == "train: 0 after 30 s"


def test_on_a_terminal_the_bar_shows_no_eta_before_it_means_something():
    out = io.StringIO()
    bar = TerminalBar(total=100, desc="eval", unit="sample", file=out, mininterval=0)
    bar.start_t = bar._time() - 6  # 6 s in with 3 done: the old bar read `[00:06<03:14, ...]`
    bar.update(3)
    assert "[00:06, " in out.getvalue() and "<" not in out.getvalue()
    bar.start_t = bar._time() - 40  # 40 s in with 20 done: 80 left at 0.5 a second
    bar.update(17)
    assert "[00:40<02:40, " in out.getvalue()
    bar.close()


def test_the_projected_finish_is_the_mean_epoch_pace_times_the_epochs_left():
    now = time.mktime((2026, 1, 1, 12, 0, 0, 0, 0, -1))
    # 2 of 5 epochs at (40 + 50) / 2 = 45 s each: 3 x 45 = 135 s left, 12:02:15.
    assert projected_finish([40.0, 50.0], 0.0, 5, now) == (
        "2 of 5 epochs done (1 min 30 s; 45 s an epoch); at that pace the fit ends in about 2 min 15 s, around 12:02:15")
    assert projected_finish([7200.0], 0.0, 3, now).endswith("in about 4 h 00 min, around 16:00:00")
    assert projected_finish([], 0.0, 5, now) is None and projected_finish([1.0], 0.0, None, now) is None
    assert projected_finish([1.0, 1.0], 0.0, 2, now) is None  # nothing left: the fit is ending


def test_the_projected_finish_leaves_the_one_time_work_out_of_the_pace():
    now = time.mktime((2026, 1, 1, 12, 0, 0, 0, 0, -1))
    # The first epoch of 15 took 1042 s (17 min 22 s), 790 of them the base evaluation, the
    # screening and the generator's launch: 252 s an epoch, 14 x 252 = 3528 s left (58 min 48 s).
    # Counted in, the pace was 1042 s and the fit "ended in about 4 h 03 min" (it took 72 min).
    assert projected_finish([1042.0], 790.0, 15, now) == (
        "1 of 15 epochs done (17 min 22 s, 13 min 10 s of it one-time work; 4 min 12 s an epoch); "
        "at that pace the fit ends in about 58 min 48 s, around 12:58:48")
    # Later epochs: (1042 - 790 + 248 + 256) / 3 = 252 s, 12 left: 3024 s.
    assert projected_finish([1042.0, 248.0, 256.0], 790.0, 15, now).endswith("in about 50 min 24 s, around 12:50:24")
