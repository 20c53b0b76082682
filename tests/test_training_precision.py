"""bf16 mixed-precision training on CPU: the warning where the CPU has no native bf16, and
tools/bench_precision.py's side-by-side parity of fp32 and bf16-mixed steps."""

import logging

import lightning.pytorch as pl
import pytest

from flywheel.generation import precision
from flywheel.run.preflight import check_precision


@pytest.mark.parametrize("native, setting, warned", [(False, "bf16-mixed", True), (True, "bf16-mixed", False),
                                                     (False, "32-true", False)])
def test_bf16_training_on_a_cpu_without_native_bf16_is_warned(monkeypatch, caplog, native, setting, warned):
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: native)
    trainer = pl.Trainer(accelerator="cpu", precision=setting, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    with caplog.at_level(logging.WARNING, logger="flywheel.run.preflight"):
        check_precision(trainer)
    said = [r.getMessage() for r in caplog.records if "native bf16" in r.getMessage()]
    assert bool(said) == warned
    if warned:
        assert "--trainer.precision=32-true" in said[0] and "bf16-mixed" in said[0]
