"""PolicyModule: a causal-LM policy and the loss it trains by, as a LightningModule.

Thin glue: the losses (`--model.objective.loss_type`: Tree-GRPO / DAPO, CISPO, ReST-MCTS*
self-training), the advantages and the log-probs are the pure functions of
`flywheel.objectives`; the training data (typed mini-batches, flywheel.training.batch, with
advantages already attached) comes from `data_modules.SearchDataModule`, which regenerates it
every epoch by tree search.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import lightning as L
import torch
from lightning.pytorch.strategies import DeepSpeedStrategy

from flywheel.reporting.evaluation import evaluate_sharded
from flywheel.finite import check_finite_fields
from flywheel.objectives import (
    ObjectiveConfig,
    kl_penalty,
    policy_loss,
    self_training_loss,
    token_logprobs,
    truncated_importance_weight,
)
from flywheel.objectives.credit import check_loss
from flywheel.objectives.losses import LOSSES
from flywheel.objectives.value import value_baseline_advantages, value_loss
from flywheel.ports import PortClient
from flywheel.training.batch import TrainingBatch
from flywheel.training.packing import PACKABLE_MODEL_TYPES, Packed, pack_for, packable, packed_logprobs, packing_pays
from flywheel.training.tree_attention import enable_tree_attention, uses_tree_attention
from flywheel.policies.load import LoraSettings, add_lora, load_policy
from flywheel.policies.check import load_checked_policy
from flywheel.training.value_head import ValueHead, prefix_values

log = logging.getLogger(__name__)

OldLogprobs = Literal["recompute", "recompute_tis", "behaviour"]


@dataclass(frozen=True)
class OptimizerConfig:
    """AdamW with linear warmup, then a constant learning rate (DeepSearch code's schedule).

    Args:
        lr: peak learning rate (paper: 1e-6 for a 1.5B model; the tiny policy wants ~1e-4).
        weight_decay: AdamW weight decay (paper: 0.1).
        betas: AdamW betas.
        warmup_steps: optimizer steps of linear warmup from 0 (paper: 10).
    """

    lr: float = 1e-6
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 10

    def __post_init__(self) -> None:
        check_finite_fields(self, "model.optimizer")
        if not self.lr > 0:
            raise ValueError(f"--model.optimizer.lr must be > 0, got {self.lr}")
        if self.warmup_steps < 0:
            raise ValueError(f"--model.optimizer.warmup_steps must be >= 0, got {self.warmup_steps}")


class PolicyModule(PortClient, L.LightningModule):
    """A causal LM policy trained by the chosen loss: Tree-GRPO, DAPO, CISPO or ReST-MCTS* self-training.

    The loss is `--model.objective.loss_type` (flywheel.objectives.losses): the clipped Tree-GRPO
    objective (DeepSearch §3.3) and its DAPO and CISPO variants, or ReST-MCTS*'s log-likelihood of
    the search's paths weighted by their rewards. With `--model.objective.value_coef` > 0 a value
    head is trained beside the policy (its loss, and with `value_baseline` the advantage r - V(s)).

    The data module is its port (flywheel.ports.DataPort, connected by the CLI): the credit rule its
    loss must match, the round boundaries, and the held-out set of `validate` and `test`.

    Args:
        policy: a local Hugging Face model folder, or the name of a policy shipped with
            flywheel ("tiny-countdown"). Nothing is downloaded.
        objective: clip bounds, aggregation, advantage normalisation, KL, overlong penalty.
        optimizer: AdamW settings and warmup.
        old_logprobs: where pi_old of the PPO ratio comes from. "recompute" (default): a
            forward pass of the trainer's policy over the epoch's data before any update.
            "recompute_tis": the same, and each token's loss is weighted by the truncated
            importance weight min(pi_old / pi_generator, objective.tis_cap), correcting the
            generator/trainer mismatch, and the lag of `--data.async_search` (which needs it). "behaviour": the generator's own log-probs are
            pi_old (no extra forward pass).
        dtype: parameter dtype of the policy ("float32" or "bfloat16").
        packing: compute each tree's shared prefixes once (flywheel.training.packing): the mini-batch's
            trajectories become one token trie, attention is block-sparse over each token's
            ancestors (flywheel.training.tree_attention), log-probs are laid back out per trajectory,
            so the loss is the same. "auto" (default): pack a mini-batch when a flat pass would
            compute >= 1.2x its packed tokens (flywheel.training.packing.packing_pays); true: always;
            false: never. Llama and Qwen2 families with sdpa attention; other attention
            implementations get a dense ancestor mask, other models one row per trajectory
            (said once).
        lora: train low-rank adapters instead of every weight (`--model.lora.rank=16`; needs
            `peft`). Checkpoints hold base + adapters; `tools/export_hf.py` and `flywheel eval`
            merge them. The vLLM sidecar then syncs only the adapter.
    """

    def __init__(
        self,
        policy: str | None = "tiny-countdown",
        objective: ObjectiveConfig = ObjectiveConfig(),
        optimizer: OptimizerConfig = OptimizerConfig(),
        old_logprobs: OldLogprobs = "recompute",
        dtype: str = "float32",
        packing: bool | Literal["auto"] = "auto",
        lora: LoraSettings = LoraSettings(),
    ) -> None:
        super().__init__()
        if not policy:
            raise ValueError(
                "--model.policy is required: the folder of the Hugging Face model to train (e.g. "
                "--model.policy=/models/Nemotron-Research-Reasoning-Qwen-1.5B), or a built-in name (tiny-countdown)"
            )
        self.save_hyperparameters()
        self.objective = objective
        self.optimizer_config = optimizer
        self.old_logprobs = old_logprobs
        self.policy, self.tokenizer = load_checked_policy(policy, dtype, "--model.policy", "--model.dtype")
        self.policy = add_lora(self.policy, lora)
        if packing not in (True, False, "auto"):
            raise ValueError(f"--model.packing must be true, false or auto, got {packing!r}")
        self.packing = packing if packable(self.policy) else False
        if self.packing:
            enable_tree_attention(self.policy)
        if packing is True and not self.packing:
            log.info("packing off: %s models are not known to take a 4D attention mask (packable: %s); "
                     "training one row per trajectory", getattr(self.policy.config, "model_type", "?"),
                     ", ".join(sorted(PACKABLE_MODEL_TYPES)))
        self.reference = None
        if objective.kl_coef > 0 and objective.kl_reference == "round" and lora.rank > 0:
            raise ValueError(
                "--model.objective.kl_reference=round copies the policy's weights into the reference at each round's "
                "start, which LoRA adapters (--model.lora.rank > 0) do not support yet; set "
                "--model.objective.kl_reference=base or --model.lora.rank=0"
            )
        if objective.kl_coef > 0:
            self.reference, _ = load_policy(policy, dtype)
            self.reference.requires_grad_(False).eval()
            if self.packing:
                enable_tree_attention(self.reference)
        self.value_head = None
        if objective.value_coef > 0:
            if packing is True:
                raise ValueError("--model.objective.value_coef > 0 reads the value head from one row per trajectory; "
                                 "it does not take tree-packed batches: set --model.packing=auto or false")
            self.packing = False  # `auto`: the value head's batches stay one row per trajectory
            self.value_head = ValueHead(self.policy.config.hidden_size)

    def search_values(self, prefixes: list[tuple[int, ...]]) -> list[float]:
        """V(s) of search nodes (prompt + steps) from the value head: the driver's value function
        for search.selection=puct_agents."""
        assert self.value_head is not None
        return prefix_values(self.policy, self.value_head, prefixes, pad_id=self.tokenizer.pad_token_id or 0)

    def logprobs_and_values(self, batch: TrainingBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, L-1] next-token log-probs and [B, L-1] V of the state before each target, one forward."""
        out = self.policy(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_hidden_states=True)
        logprobs = token_logprobs(out.logits[:, :-1], batch.input_ids[:, 1:])
        return logprobs, self.value_head(out.hidden_states[-1][:, :-1])

    # ------------------------------------------------------------------ log-probs
    def sequence_logprobs(self, model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """[B, L] ids -> [B, L-1] log-prob of each next token under `model` (one row each)."""
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]  # [B, L-1, V]
        return token_logprobs(logits, input_ids[:, 1:])

    def laid_out_logprobs(self, model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                          packed: Packed | None) -> torch.Tensor:
        """[B, L] ids -> [B, L-1] next-token log-probs under `model`: one forward over the rows'
        token tries when `packed`, else one row per trajectory."""
        if packed is None:
            return self.sequence_logprobs(model, input_ids, attention_mask)
        return packed_logprobs(model, packed.to(input_ids.device), input_ids.shape)

    def batch_logprobs(self, model: torch.nn.Module, batch: TrainingBatch) -> torch.Tensor:
        """[B, L-1] next-token log-probs of a mini-batch, in the layout it was built with."""
        return self.laid_out_logprobs(model, batch.input_ids, batch.attention_mask, batch.packed)

    def pack_batch(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, group_ids: torch.Tensor) -> Packed | None:
        """The layout of a mini-batch's forward passes, decided once as the data module builds it:
        the rows' token tries when `packing` is on (with "auto", when `packing_pays`), else None
        (one row per trajectory). Laid out for the policy; the KL reference, the same
        architecture with the same attention, reads the same layout."""
        if not self.packing:
            return None
        mask = attention_mask.cpu()
        packed = pack_for(self.policy, input_ids.cpu(), mask, group_ids.cpu(), pad_id=self.tokenizer.pad_token_id or 0)
        if self.packing == "auto" and not packing_pays(packed, mask, uses_tree_attention(self.policy)):
            return None
        return packed

    @torch.no_grad()
    def score_batch(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, packed: Packed | None) -> torch.Tensor:
        """pi_old log-probs [B, L-1] of a mini-batch being built, in its layout `packed`, without
        grad (before the epoch's updates): computed on the policy's device, returned on the rows'."""
        was_training = self.policy.training
        self.policy.eval()
        try:
            logprobs = self.laid_out_logprobs(self.policy, input_ids.to(self.device), attention_mask.to(self.device), packed)
            return logprobs.to(input_ids.device)
        finally:
            self.policy.train(was_training)

    # ------------------------------------------------------------------ training
    def on_fit_start(self) -> None:
        check_loss(self.port.credit.advantage, self.objective.loss_type)

    def _can_skip_steps(self) -> bool:
        """Lightning skips the optimizer step of a training_step that returns None on one
        process only; DDP ranks must all run backward, and DeepSpeed refuses None."""
        trainer = self._trainer
        return trainer is not None and trainer.world_size == 1 and not isinstance(trainer.strategy, DeepSpeedStrategy)

    def on_train_epoch_start(self) -> None:
        # ReST-MCTS*'s KL reference "the policy before this round's training": refreshed at
        # each round's first epoch (restored from the checkpoint, as a submodule, on resume).
        if self.reference is not None and self.objective.kl_reference == "round" and self.port.round_starts(self.current_epoch):
            self.reference.load_state_dict(self.policy.state_dict())

    def training_step(self, batch: TrainingBatch, batch_idx: int) -> torch.Tensor | None:
        mask = batch.loss_mask  # [B, L-1]
        if not mask.any() and self._can_skip_steps():
            # Nothing to train on (an epoch whose groups were all left out): no optimizer
            # step, where a zero-gradient one would still move AdamW's weights (momentum, decay).
            return None
        values = None
        if self.value_head is not None:
            logprobs, values = self.logprobs_and_values(batch)
        else:
            logprobs = self.batch_logprobs(self.policy, batch)
        advantages = batch.advantages
        if self.objective.value_baseline:  # the search's one trajectory per tree: r - sg(V_old(s_t))
            advantages = value_baseline_advantages(values, batch.rewards, batch.step_ids, mask)
        n = len(batch.input_ids)
        if batch.packed is not None and self._trainer is not None:  # tokens a flat pass would compute / computed
            self.log("compute/packed_token_ratio", float(batch.attention_mask.sum()) / max(batch.packed.tokens, 1),
                     batch_size=n)
        if self.packing and self._trainer is not None:
            self.log("compute/packed", float(batch.packed is not None), batch_size=n)
        if batch.staleness is not None and self._trainer is not None:  # --data.async_search: how old the sampling weights are
            self.log("compute/staleness", batch.staleness.float().mean(), batch_size=n)
            self.log("compute/staleness_steps", (self.global_step - batch.weight_version).float().mean(), batch_size=n)
        if LOSSES[self.objective.loss_type].weights_paths:
            loss, stats = self._self_training_loss(batch, logprobs)
        else:
            loss, stats = self._policy_loss(batch, logprobs, advantages)
        if values is not None:
            v_loss = value_loss(values, batch.rewards, batch.step_ids, mask)
            loss = loss + self.objective.value_coef * v_loss
            stats["value_loss"] = v_loss.detach()
        self.log("train/loss", loss, prog_bar=True, batch_size=n)
        for key, value in stats.items():
            self.log(f"train/{key}", value, batch_size=n)
        valid = mask.bool()
        adv = advantages[valid]
        if adv.numel():
            self.log_dict(
                {
                    "train/advantage_mean": adv.mean(),
                    "train/advantage_std": adv.std(unbiased=False),
                    "train/advantage_min": adv.min(),
                    "train/advantage_max": adv.max(),
                    "train/response_tokens": valid.sum().float(),
                },
                batch_size=n,
            )
        return loss

    def _self_training_loss(self, batch: TrainingBatch, logprobs: torch.Tensor):
        """ReST-MCTS*: the rows' advantages are their path weights (`--data.credit.advantage=self_training`)."""
        ref = self.batch_logprobs(self.reference, batch).detach() if self.reference is not None else None
        return self_training_loss(
            logprobs, batch.advantages, batch.loss_mask, ref, kl_coef=self.objective.kl_coef,
            kl_estimator=self.objective.kl_estimator, aggregation=self.objective.aggregation, step_ids=batch.step_ids,
        )

    def _policy_loss(self, batch: TrainingBatch, logprobs: torch.Tensor, advantages: torch.Tensor):
        """Tree-GRPO / DAPO / CISPO: the clipped surrogate on the rows' advantages, plus the KL."""
        mask = batch.loss_mask
        weights = None
        if self.old_logprobs == "behaviour":
            old = batch.behaviour_logprobs
        else:
            old = batch.old_logprobs
            if self.old_logprobs == "recompute_tis":
                weights = truncated_importance_weight(old, batch.behaviour_logprobs, mask, self.objective.tis_cap)
        loss, stats = policy_loss(
            logprobs,
            old,
            advantages,
            mask,
            clip_low=self.objective.clip_low,
            clip_high=self.objective.clip_high,
            dual_clip=self.objective.dual_clip,
            aggregation=self.objective.aggregation,
            step_ids=batch.step_ids,
            weights=weights,
            loss_type=self.objective.loss_type,
        )
        if self.reference is not None:
            ref = self.batch_logprobs(self.reference, batch).detach()
            kl = kl_penalty(logprobs, ref, mask, kind=self.objective.kl_estimator, aggregation=self.objective.aggregation, step_ids=batch.step_ids)
            loss = loss + self.objective.kl_coef * kl
            stats["kl_ref"] = kl.detach()
        return loss, stats

    def configure_optimizers(self):
        cfg = self.optimizer_config
        params = [p for p in self.policy.parameters() if p.requires_grad]
        if self.value_head is not None:
            params += list(self.value_head.parameters())
        optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        warmup = cfg.warmup_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # ------------------------------------------------------------------ validate / test
    def _eval_step(self, positions: list[int], stage: str) -> None:
        """pass@1 and pass@k of the held-out problems at `positions` (all of them, the same
        batch on every rank) by the run's one evaluator: each rank samples its own shard,
        every rank gets the merged counts (collective)."""
        port = self.port
        pool = port.eval_problems()
        result = evaluate_sharded(port.generator, self.tokenizer, port.task, [pool[int(i)] for i in positions], port.eval,
                                  grader=port.grader)
        for k in sorted({1, port.eval.pass_k}):
            # The same number on every rank: the mean over ranks (sync_dist) leaves it as it is.
            self.log(f"{stage}/pass@{k}", result.pass_at(k), batch_size=len(result.samples), sync_dist=True)

    def validation_step(self, positions: list[int], batch_idx: int) -> None:
        self._eval_step(positions, "eval")

    def test_step(self, positions: list[int], batch_idx: int) -> None:
        self._eval_step(positions, "test")

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        from flywheel.run.checkpoint import RUN_KEY, run_record

        checkpoint[RUN_KEY] = run_record(self.trainer)
