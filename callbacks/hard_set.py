"""HardSetRefresh: at every flywheel round's end, re-measure the hard set with the trained
policy and shrink it; settle the replay buffer (deepsearch.md §7, the paper's Table 6)."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import Callback

from callbacks.round_scalars import log_round_scalars


class HardSetRefresh(Callback):
    """Ends each round (every `--data.epochs_per_round` epochs; called by the round protocol,
    callbacks.rounds) with the hard-set refresh.

    Logs round/hard_set_size and round/cached (x axis = round) and data/* per step. The hard
    set and the replay buffer themselves are the data module's curriculum: saved in every
    checkpoint and written to <run>/flywheel_state/ atomically.
    """

    def end_round(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, float]:
        dm = trainer.datamodule
        metrics = dm.end_round(pl_module.tokenizer)
        pl_module.log_dict({k.replace("round/", "data/"): v for k, v in metrics.items()})
        log_round_scalars(trainer, metrics, dm.curriculum.round)
        return metrics
