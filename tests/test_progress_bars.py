"""Bars that move during a long generator call (an evaluation of a real model sat at 0/16
problems for minutes: its bar moved once per call), and the projected end of a fit."""

from __future__ import annotations

import time

import pytest

from flywheel.generation import GenerationRequest, SamplingParams
from flywheel.generation.base import GenerationStats
from flywheel.generation.hf import HFGenerator
from flywheel.policies.tiny import build_tiny_llama
from flywheel.reporting.sample_bar import sample_bar
from flywheel.reporting.wall_split import projected_finish

pytestmark = pytest.mark.usefixtures("one_thread")  # fixtures one_thread and tok: conftest.py


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


def test_a_backend_that_does_not_report_still_moves_the_bar_per_problem(capsys):
    class Silent:  # a generator whose sample() never ticks (a backend without live progress)
        stats = GenerationStats()

    with sample_bar(Silent(), problems=4, samples=2, desc="screen test", show=True) as advance:
        advance(1)
        advance(3)
    assert "6/8" in capsys.readouterr().err


def test_the_projected_finish_is_the_mean_epoch_pace_times_the_epochs_left():
    now = time.mktime((2026, 1, 1, 12, 0, 0, 0, 0, -1))
    # 2 of 5 epochs at (40 + 50) / 2 = 45 s each: 3 x 45 = 135 s left, 12:02:15.
    assert projected_finish([40.0, 50.0], 5, now) == (
        "2 of 5 epochs done (1 min 30 s, 45 s an epoch); at that pace the fit ends in about 2 min 15 s, around 12:02:15")
    assert projected_finish([7200.0], 3, now).endswith("in about 4 h 00 min, around 16:00:00")
    assert projected_finish([], 5, now) is None and projected_finish([1.0], None, now) is None
    assert projected_finish([1.0, 1.0], 2, now) is None  # nothing left: the fit is ending
