"""GenerationBudget: stop training once the run has generated a given number of tokens.

Comparisons between rollout kinds (tree search, flat DAPO, best-of-N) are only fair at equal
generation cost; this callback makes the token count, not the epoch count, the budget.
"""

from __future__ import annotations

import logging

import lightning as L
from lightning.pytorch.callbacks import Callback

from flywheel.ports import PortClient

log = logging.getLogger(__name__)


class GenerationBudget(PortClient, Callback):
    """Ends `fit` once the training rollouts have generated `max_tokens` tokens.

    It stops after the first epoch at which the training rollouts' generated tokens
    (evaluation and hard-set screening excluded) reach `max_tokens`. The epoch in progress
    always completes; when it does not end a round, the round protocol still evaluates the
    policy it leaves (a partial round in summary.json, replaced by the whole round if the run
    is resumed with a larger budget). The count is the data module's (its port, connected by
    the CLI).

    Args:
        max_tokens: the training generation budget in tokens; None = no budget.
    """

    def __init__(self, max_tokens: int | None = None) -> None:
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"--budget.max_tokens must be >= 1 or null, got {max_tokens}")
        self.max_tokens = max_tokens

    def reached(self) -> bool:
        """Whether the training rollouts have generated the whole budget."""
        return self.max_tokens is not None and self.port.generated_tokens >= self.max_tokens

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.reached():
            log.info("generation budget reached: %d >= %d tokens; stopping", self.port.generated_tokens, self.max_tokens)
            trainer.should_stop = True
