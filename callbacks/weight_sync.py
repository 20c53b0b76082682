"""WeightSync: after an epoch's optimizer steps, push the new weights to the generator, before
anything samples again (the round's screening and evaluation, the next epoch's search)."""

from __future__ import annotations

import logging

import lightning as L
from lightning.pytorch.callbacks import Callback

from callbacks.wall_time import WEIGHT_SYNC, wall_section

log = logging.getLogger(__name__)


class WeightSync(Callback):
    """Keeps the data module's generator in step with the policy: an out-of-process backend
    (the vLLM sidecar) gets the weights of the latest optimizer step, stamped with it as the
    weight version; the in-process backend shares the parameters, so its push is a no-op.

    The round protocol (callbacks.rounds) calls `push` first at every epoch's end; the hook
    below makes the same call, so whichever runs first pushes and the other finds nothing to do.
    """

    def push(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Collective: every rank pushes together."""
        with wall_section(trainer, WEIGHT_SYNC):
            pushed = trainer.datamodule.push_weights(pl_module.policy, version=trainer.global_step)
        if pushed:
            log.debug("weights of step %d pushed to the generator", trainer.global_step)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.push(trainer, pl_module)
