"""Per-round curves: scalars whose x axis is the flywheel round, beside the per-step ones."""

from __future__ import annotations

import lightning as L


def log_round_scalars(trainer: L.Trainer, metrics: dict[str, float], round_index: int) -> None:
    """Write `metrics` at step `round_index` to every logger that can (TensorBoard), on rank 0."""
    if not trainer.is_global_zero:
        return
    for logger in trainer.loggers:
        experiment = getattr(logger, "experiment", None)
        if hasattr(experiment, "add_scalar"):
            for key, value in metrics.items():
                experiment.add_scalar(key, value, round_index)
