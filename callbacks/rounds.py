"""RoundProtocol: the end of every epoch and of every flywheel round, in one visible order.

At each epoch's end:
  0. search ahead             with `--data.async_search`, the next epoch's search that ran beside
                              this epoch's training ends first (waited for; stopped when the run
                              ends here): a push mid-search would mix weight versions in a tree
  1. weight sync              the generator gets the epoch's weights (before it samples again):
                              ONE push per epoch (an out-of-process backend reloads them; the
                              in-process one shares the parameters and has nothing to do)
  2. PRMUpdate.collect        the epoch's search trees become value samples
If the epoch ends a round (`round_ends`, which the curriculum alone decides):
  3. hard-set refresh         the trained policy re-measures the hard set; the replay buffer settles
  4. HeldOutEval.end_round    held-out pass@k, with the round's hard-set size and cache in its summary
                              (`--data.eval.every_tokens` may skip it, never in the run's last round)
  5. PRMUpdate.end_round      the value model is fitted and handed to the next round's search
                              (steps 3-5 sample from the weights pushed in step 1)
If the epoch instead ends the run inside a round (its token budget `--budget.max_tokens`, or
`--trainer.max_epochs` not a multiple of `--data.epochs_per_round`):
  4'. HeldOutEval.end_round   the policy the run leaves is evaluated as a partial round (no refresh,
                              no value model: a resume with a larger budget or more epochs continues
                              the round, and its whole-round evaluation replaces this one)
  6. search ahead             with `--data.async_search`, the search of the epoch after next
                              starts on the weights pushed in step 1 (unless the run ends here), so
                              the generator searches while the checkpoint is written and the next
                              epoch's loader is built (data_modules.search_ahead)
Then the epoch's data scalars (search/*, compute/*, data/*) are logged.

The data module is reached through its port (flywheel.ports.DataPort), handed over by the
CLI. The evaluation and the value model are callbacks too (for their own settings, hooks and
checkpointed state), but none decides on its own that a round ended, so their order in the
CLI does not matter.
"""

from __future__ import annotations

import logging

import lightning as L
from lightning.pytorch.callbacks import Callback

from callbacks.budget import GenerationBudget
from callbacks.evaluation import HeldOutEval
from callbacks.prm import PRMUpdate
from callbacks.round_scalars import log_round_scalars
from callbacks.run_summary import RunSummary
from flywheel.ports import DataPort, WallClock
from flywheel.reporting.wall_split import UNTIMED, WEIGHT_SYNC
from flywheel.run.preemption import stop_requested

log = logging.getLogger(__name__)


class RoundProtocol(Callback):
    """Runs the epoch-end and round-end steps of the flywheel in the order above.

    Args:
        port: the data module.
        evaluation: the held-out evaluation.
        value_model: the ReST-MCTS* value model (does nothing unless enabled).
        summary: the run's summary (summary.json), where a round's staleness goes.
        budget: the token budget that may end the run inside a round (None: only max_epochs).
    """

    def __init__(self, port: DataPort, evaluation: HeldOutEval, value_model: PRMUpdate, summary: RunSummary,
                 budget: GenerationBudget | None = None, wall: WallClock = UNTIMED) -> None:
        self.port = port
        self.evaluation = evaluation
        self.value_model = value_model
        self.summary = summary
        self.budget = budget
        self.wall = wall

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A resumed run's value model (restored from the checkpoint) scores the next search.
        self.port.use_value_model(self.value_model.value_fn(pl_module))

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        port = self.port
        spent = self.budget is not None and self.budget.reached()
        last = spent or last_epoch(trainer)
        port.finish_search_ahead(abandon=last or stop_requested(trainer))
        self.sync_weights(trainer, pl_module)
        self.value_model.collect(port.epoch_results)
        if port.round_ends(trainer.current_epoch):
            self.refresh_hard_set(trainer, pl_module)
            self.evaluation.end_round(trainer, pl_module, port.rounds_completed, port.round_facts(), last=last)
            self.record_staleness(trainer, port.rounds_completed)
            if self.value_model.end_round(trainer, pl_module, port.rounds_completed):
                port.use_value_model(self.value_model.value_fn(pl_module))
        elif last:  # the run ends inside a round (its budget, or max_epochs not a multiple of the round)
            self.evaluation.end_round(trainer, pl_module, port.rounds_completed + 1, port.round_facts(), partial=True)
            self.record_staleness(trainer, port.rounds_completed + 1)
        if not (last or stop_requested(trainer)):
            port.search_after_push()  # before the checkpoint's write: the generator searches through it
        if port.epoch_metrics:
            pl_module.log_dict(port.epoch_metrics)

    def record_staleness(self, trainer: L.Trainer, round_index: int) -> None:
        """With `--data.async_search`: the staleness of the round's last epoch (weight syncs and
        optimizer steps between the weights that searched it and those that trained on it) in
        the round's row of summary.json."""
        metrics = self.port.epoch_metrics
        if "search/staleness" in metrics:
            self.summary.record(trainer, round_index, {"staleness": int(metrics["search/staleness"]),
                                                       "staleness_steps": int(metrics["search/staleness_steps"])})

    def sync_weights(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Step 1: the generator samples from the weights of the latest optimizer step, stamped
        with it as the weight version (collective: every rank pushes together)."""
        with self.wall.section(WEIGHT_SYNC):
            pushed = self.port.push_weights(pl_module.policy, version=trainer.global_step)
        if pushed:
            log.debug("weights of step %d pushed to the generator", trainer.global_step)

    def refresh_hard_set(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, float]:
        """Step 3 (deepsearch.md §7, the paper's Table 6): round/hard_set_size and round/cached
        (x axis = round) and data/* per step. The hard set and the replay buffer are the data
        module's curriculum: in every checkpoint, and written to <run>/flywheel_state/ atomically."""
        metrics = self.port.end_round(pl_module.tokenizer)
        pl_module.log_dict({k.replace("round/", "data/"): v for k, v in metrics.items()})
        log_round_scalars(trainer, metrics, self.port.rounds_completed)
        return metrics


def last_epoch(trainer: L.Trainer) -> bool:
    """Whether the epoch ending now is the run's last by `--trainer.max_epochs` or
    `--trainer.max_steps` (None or -1: no limit)."""
    max_epochs, max_steps = trainer.max_epochs, trainer.max_steps
    return (max_epochs is not None and 0 <= max_epochs <= trainer.current_epoch + 1) or (
        max_steps is not None and 0 <= max_steps <= trainer.global_step)
