"""RoundProtocol: the end of every epoch and of every flywheel round, in one visible order.

At each epoch's end:
  1. WeightSync.push          the generator gets the epoch's weights (before it samples again)
  2. PRMUpdate.collect        the epoch's search trees become value samples
If the epoch ends a round (`Curriculum.round_ends`, the one place that decides it):
  3. HardSetRefresh.end_round the trained policy re-measures the hard set; the replay buffer settles
  4. HeldOutEval.end_round    held-out pass@k, with the round's hard-set size and cache in its summary
                              (`--data.eval.every_tokens` may skip it, never in the run's last round)
  5. PRMUpdate.end_round      the value model is fitted and handed to the next round's search
If the epoch instead ends the run inside a round (its token budget `--budget.max_tokens`, or
`--trainer.max_epochs` not a multiple of `--data.epochs_per_round`):
  4'. HeldOutEval.end_round   the policy the run leaves is evaluated as a partial round (no refresh,
                              no value model: a resume with a larger budget or more epochs continues
                              the round, and its whole-round evaluation replaces this one)
Then the epoch's data scalars (search/*, compute/*, data/*) are logged.

The steps are callbacks too (for their own settings, hooks and checkpointed state), but none
decides on its own that a round ended, so their order in the CLI does not matter.
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import Callback

from callbacks.budget import GenerationBudget
from callbacks.evaluation import HeldOutEval
from callbacks.hard_set import HardSetRefresh
from callbacks.prm import PRMUpdate
from callbacks.weight_sync import WeightSync


class RoundProtocol(Callback):
    """Runs the epoch-end and round-end steps of the flywheel in the order above.

    Args:
        weight_sync: pushes the weights to the generator.
        refresh: the hard-set refresh.
        evaluation: the held-out evaluation.
        value_model: the ReST-MCTS* value model (does nothing unless enabled).
        budget: the token budget that may end the run inside a round (None: only max_epochs).
    """

    def __init__(self, weight_sync: WeightSync, refresh: HardSetRefresh, evaluation: HeldOutEval,
                 value_model: PRMUpdate, budget: GenerationBudget | None = None) -> None:
        self.weight_sync = weight_sync
        self.refresh = refresh
        self.evaluation = evaluation
        self.value_model = value_model
        self.budget = budget

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A resumed run's value model (restored from the checkpoint) scores the next search.
        trainer.datamodule.use_value_model(self.value_model.value_fn(pl_module))

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        dm = trainer.datamodule
        self.weight_sync.push(trainer, pl_module)
        self.value_model.collect(dm.epoch_results)
        spent = self.budget is not None and self.budget.reached(trainer)
        last = spent or last_epoch(trainer)
        if dm.curriculum.round_ends(trainer.current_epoch):
            self.refresh.end_round(trainer, pl_module)
            self.evaluation.end_round(trainer, pl_module, dm.curriculum.round, round_facts(dm), last=last)
            if self.value_model.end_round(trainer, pl_module, dm.curriculum.round):
                dm.use_value_model(self.value_model.value_fn(pl_module))
        elif last:  # the run ends inside a round (its budget, or max_epochs not a multiple of the round)
            self.evaluation.end_round(trainer, pl_module, dm.curriculum.round + 1, round_facts(dm), partial=True)
        if dm.epoch_metrics:
            pl_module.log_dict(dm.epoch_metrics)


def last_epoch(trainer: L.Trainer) -> bool:
    """Whether the epoch ending now is the run's last by `--trainer.max_epochs` or
    `--trainer.max_steps` (None or -1: no limit)."""
    max_epochs, max_steps = trainer.max_epochs, trainer.max_steps
    return (max_epochs is not None and 0 <= max_epochs <= trainer.current_epoch + 1) or (
        max_steps is not None and 0 <= max_steps <= trainer.global_step)


def round_facts(dm) -> dict:
    """The curriculum's numbers that go into a round's summary row (after its refresh)."""
    curriculum = dm.curriculum
    return {"hard_set_size": len(curriculum.hard) if curriculum.hard is not None else None,
            "cached": len(curriculum.buffer), "generated_tokens": dm.generated_tokens}
