"""PRMUpdate: the self-rewarding value model of ReST-MCTS* inside the loop (spec §A).

Every epoch the finished search trees become value samples (flywheel.prm.targets); at every
round's end a value model (by default a fresh copy of the current policy with a scalar
head) is fitted to everything accumulated and the round protocol (callbacks.rounds) hands
it to the data module, so the NEXT round's search is scored by this round's model
(`--data.search.prm_weight` sets how much its V(s) counts in selection). A tenth of the trees (by problem id) is held out to measure
how well V predicts whether a node can still reach a correct answer: round/prm_auc and
round/prm_calibration_error in TensorBoard, and prm_auc, prm_calibration_error,
prm_heldout_mse, prm_loss and prm_samples in each round of summary.json. Samples,
value-model weights and optimizer state are part of every checkpoint.
"""

from __future__ import annotations

import logging
import zlib
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from callbacks.round_scalars import log_round_scalars
from callbacks.run_summary import RunSummary
from flywheel.ports import WallClock
from flywheel.reporting.wall_split import UNTIMED, VALUE_MODEL
from flywheel.run.distributed import all_gather
from flywheel.prm import ValueFn
from flywheel.prm.model import PRMTrainConfig, ValueModel, auc, calibration_error, fit_value_model
from flywheel.prm.targets import tree_samples

log = logging.getLogger(__name__)

STATE_FORMAT = "flywheel.prm_update/v1"


class PRMUpdate(Callback):
    """Train the value model at each round's end and use it in the next round's search.

    Args:
        enabled: off by default (DeepSearch alone); on in conf/rest_mcts.yaml.
        train: learning rate, epochs and batch size of the value-model fit.
        max_samples: most (prefix, target) samples kept; the oldest go first.
        heldout_every: every this-many-th problem (by id hash) is held out for AUC and
            calibration, never trained on.
        init: "policy" = each round starts from a copy of the current policy (the paper's
            previous-round model); "continue" = keep fitting the same value model.
    """

    def __init__(
        self,
        enabled: bool = False,
        train: PRMTrainConfig = PRMTrainConfig(),
        max_samples: int = 50_000,
        heldout_every: int = 10,
        init: str = "policy",
    ) -> None:
        if init not in ("policy", "continue"):
            raise ValueError(f"--prm_update.init={init!r}: choose 'policy' or 'continue'")
        if max_samples < 1 or heldout_every < 2:
            raise ValueError("--prm_update.max_samples must be >= 1 and --prm_update.heldout_every >= 2")
        self.enabled = enabled
        self.train_config = train
        self.max_samples = max_samples
        self.heldout_every = heldout_every
        self.init = init
        self.samples: list[tuple[tuple[int, ...], float, bool]] = []
        self.heldout: list[tuple[tuple[int, ...], float, bool]] = []
        self.model: ValueModel | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self._restored: dict[str, Any] | None = None
        self.summary: RunSummary | None = None
        """Where a round's value-model numbers go (the run's one summary, set by the CLI wiring)."""
        self.wall: WallClock = UNTIMED
        """The run's wall clock (callbacks.wall_time.WallTime, set by the CLI wiring)."""

    # ------------------------------------------------------------------ round steps
    def collect(self, results) -> None:
        """Every epoch: the finished search trees of every rank become value samples (collective)."""
        if self.enabled:
            self._collect(results)

    def end_round(self, trainer: L.Trainer, pl_module: L.LightningModule, round_index: int) -> bool:
        """A round's end: fit the value model to everything collected; True when a new model
        is ready for the next round's search (`value_fn`)."""
        if not self.enabled:
            return False
        if not self.samples:
            log.info("PRM: no tree with a correct answer yet; the value model waits")
            return False
        if self.model is None or self.init == "policy":
            self.model = ValueModel.from_policy(pl_module.policy)
            self.optimizer = None
        with self.wall.section(VALUE_MODEL):
            loss, self.optimizer = fit_value_model(
                self.model, [(s, t) for s, t, _ in self.samples], self.train_config, pad_id=pl_module.tokenizer.pad_token_id or 0,
                seed=trainer.current_epoch, optimizer=self.optimizer,
            )
            metrics = {"round/prm_loss": loss, "round/prm_samples": float(len(self.samples))}
            metrics.update(self.quality(pl_module))
        log_round_scalars(trainer, metrics, round_index)
        if self.summary is not None:  # the round's value-model numbers beside its held-out pass@k
            self.summary.record(trainer, round_index, {k.replace("round/", ""): float(v) for k, v in metrics.items()})
        pl_module.log_dict({k.replace("round/prm_", "prm/"): v for k, v in metrics.items()})
        log.info("PRM round %d: %s", round_index, ", ".join(f"{k.split('/')[1]} {v:.4f}" for k, v in metrics.items()))
        return True

    def value_fn(self, pl_module: L.LightningModule) -> ValueFn | None:
        """V(s) of the current value model for the search (None while there is none); a model
        restored from a checkpoint is rebuilt on the policy's architecture first."""
        if not self.enabled:
            return None
        restored, self._restored = self._restored, None
        if restored is not None and restored.get("model") is not None:
            self.model = ValueModel.from_policy(pl_module.policy)
            self.model.load_state_dict(restored["model"])
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.train_config.lr,
                                               weight_decay=self.train_config.weight_decay)
            if restored.get("optimizer") is not None:
                self.optimizer.load_state_dict(restored["optimizer"])
        if self.model is None:
            return None
        pad, model = pl_module.tokenizer.pad_token_id or 0, self.model
        return lambda prefixes: model.score(prefixes, pad_id=pad)

    # ------------------------------------------------------------------ work
    def _collect(self, results) -> None:
        local = []
        for result in results or ():
            if not result.searched:
                continue
            held = zlib.crc32(result.problem_id.encode()) % self.heldout_every == 0
            local += [(held, sample) for sample in tree_samples(result.tree)]
        for part in all_gather(local):  # every rank fits the same model
            for held, sample in part:
                (self.heldout if held else self.samples).append(sample)
        del self.samples[: max(0, len(self.samples) - self.max_samples)]
        del self.heldout[: max(0, len(self.heldout) - self.max_samples // self.heldout_every)]

    def quality(self, pl_module: L.LightningModule) -> dict[str, float]:
        """AUC and calibration of V(s) as the probability that s can reach a correct answer,
        on the held-out trees' nodes."""
        if not self.heldout or self.model is None:
            return {}
        scores = self.model.score([s for s, _, _ in self.heldout], pad_id=pl_module.tokenizer.pad_token_id or 0)
        labels = [reach for _, _, reach in self.heldout]
        targets = [t for _, t, _ in self.heldout]
        mse = sum((s - t) ** 2 for s, t in zip(scores, targets)) / len(scores)
        return {"round/prm_auc": auc(scores, labels), "round/prm_calibration_error": calibration_error(scores, labels),
                "round/prm_heldout_mse": mse}

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        if not self.enabled:
            return {}
        return {
            "format": STATE_FORMAT,
            "samples": self.samples,
            "heldout": self.heldout,
            "model": self.model.state_dict() if self.model is not None else None,
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"the checkpoint's PRMUpdate state has format {state.get('format')!r}, expected "
                             f"{STATE_FORMAT!r}; resume from another checkpoint or start without --ckpt_path")
        self.samples = [(tuple(s), float(t), bool(r)) for s, t, r in state["samples"]]
        self.heldout = [(tuple(s), float(t), bool(r)) for s, t, r in state["heldout"]]
        self._restored = state
