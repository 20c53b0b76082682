"""OptimizerStateFrom: a fresh run starts its optimizer from another run's checkpoint.

A continuation from a plateau checkpoint P (issue 32 item 3) is a fresh run: its weights are
P's policy (exported once: `tools/export_hf.py P folder`, then `--model.policy=folder`), its
epoch and step counters, its data state (hard set, replay buffer, cursor) and its learning-rate
schedule start anew. This callback adds P's optimizer moments, so AdamW goes on from where the
plateau left it instead of re-estimating them from zero:

    --trainer.callbacks+=callbacks.optimizer_from.OptimizerStateFrom --trainer.callbacks.checkpoint=P

Only when the optimizers match: the same parameters in the same groups with the same shapes and
an Adam-family state (a value head, LoRA adapters or another optimizer give other parameters or
states). Otherwise it says why and the optimizer starts fresh (weights only). The hyperparameters
(learning rate, betas, weight decay) stay this run's own. A resumed run restores its own state
and is left alone.
"""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from flywheel.run.checkpoint import read_checkpoint

log = logging.getLogger(__name__)

ADAM_STATE = frozenset({"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"})
"""The per-parameter state of torch's Adam and AdamW (max_exp_avg_sq with amsgrad)."""


def optimizer_mismatch(saved: dict[str, Any] | None, optimizer: torch.optim.Optimizer) -> str | None:
    """Why `saved` (an optimizer's state_dict, as Lightning checkpoints it) cannot be loaded into
    `optimizer` as its moments, or None when it can: the same groups of parameters of the same
    shapes, an Adam-family state, and `optimizer` an Adam-family optimizer."""
    if saved is None:
        return "the checkpoint holds no optimizer state"
    if not isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
        return f"this run's optimizer is {type(optimizer).__name__}, not Adam or AdamW"
    groups = [list(g["params"]) for g in optimizer.param_groups]
    saved_groups = [list(g["params"]) for g in saved.get("param_groups", [])]
    if [len(g) for g in saved_groups] != [len(g) for g in groups]:
        return (f"parameter groups of {[len(g) for g in saved_groups]} parameters saved, "
                f"{[len(g) for g in groups]} here")
    params = [p for g in groups for p in g]
    index = [i for g in saved_groups for i in g]
    for i, param in zip(index, params):
        state = saved.get("state", {}).get(i)
        if state is None:
            continue
        if not set(state) <= ADAM_STATE:
            return f"parameter {i}'s saved state has {sorted(set(state) - ADAM_STATE)}, not an Adam state"
        for name in ("exp_avg", "exp_avg_sq"):
            if name in state and tuple(state[name].shape) != tuple(param.shape):
                return f"parameter {i} has shape {tuple(param.shape)} here, {tuple(state[name].shape)} saved"
    return None


class OptimizerStateFrom(Callback):
    """Load the optimizer moments of `checkpoint` into a fresh run's optimizer (module docstring).

    Args:
        checkpoint: a `flywheel fit` checkpoint file (e.g. runs/plateau/dapo_seed0/checkpoints/last.ckpt).
    """

    def __init__(self, checkpoint: str) -> None:
        self.checkpoint = checkpoint
        self.carried: bool | None = None
        """Whether the moments were loaded (None: not tried: a resumed run)."""

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.ckpt_path is not None:  # a resumed run: Lightning restores its own optimizer after this hook
            return
        flag = "--trainer.callbacks.checkpoint"
        states = read_checkpoint(self.checkpoint, flag).get("optimizer_states") or [None]
        optimizers = trainer.optimizers
        reason = (optimizer_mismatch(states[0], optimizers[0]) if len(states) == 1 == len(optimizers)
                  else f"{len(states)} optimizer(s) saved, {len(optimizers)} here")
        self.carried = reason is None
        if reason is not None:
            log.warning("%s %s: the optimizer state is not carried (%s); the optimizer starts fresh (weights only)",
                        flag, self.checkpoint, reason)
            return
        optimizer = optimizers[0]
        # The saved moments, this run's hyperparameters (learning rate, betas, weight decay, schedule).
        optimizer.load_state_dict({"state": states[0]["state"], "param_groups": optimizer.state_dict()["param_groups"]})
        log.info("optimizer moments of %s loaded (%d parameters)", self.checkpoint, len(states[0]["state"]))
