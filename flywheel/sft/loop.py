"""The SFT loop: seeded batches of traces, the loss on the response tokens only, AdamW with a
warmup + cosine schedule, and a resumable state.

Every step is a pure function of (the traces, the settings, the step number and the state
before it): the batches come from one torch.Generator seeded by `seed` (a resumed run draws
and skips the batches it already trained on), the learning rate is written into the
optimizer each step (`lr_at`), and nothing else draws randomness. So a run stopped and
resumed ends with the very weights an uninterrupted run ends with (tests/test_sft.py).

The loss of a batch is the mean token cross-entropy over its trained tokens, computed one of
three ways, equal up to float rounding:
* padded rows, the model's own loss (`model(..., labels=labels).loss`): the tiny policies'
  recipe (tools/make_tiny_policy.py);
* rows that all start with one prompt (Mastermind's rules): the prompt runs once and its keys
  and values are broadcast to every row (`shared_prompt_loss`);
* `packing`: the rows packed into one token trie (flywheel.training.packing, block-sparse tree
  attention), so padding costs nothing and shared prefixes are computed once.
"""

from __future__ import annotations

import inspect
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Literal, Sequence

import torch
import torch.nn.functional as F

from flywheel.finite import check_finite_fields
from flywheel.sft.traces import Trace

log = logging.getLogger("flywheel.sft")


@dataclass(frozen=True)
class SftSettings:
    """How the SFT steps run. The defaults are the tiny policies' recipe.

    Args:
        seed: seeds the data order (which traces each step trains on).
        steps: optimizer steps; the only cap on training (a wall-clock cap would make the
            weights depend on machine load).
        batch_size: traces per step.
        lr: peak AdamW learning rate.
        warmup_steps: linear warmup, then cosine decay to `min_lr_ratio * lr`.
        min_lr_ratio: floor of the cosine schedule as a fraction of `lr`.
        weight_decay: AdamW weight decay.
        grad_clip: max gradient norm.
        packing: pack each batch's rows into one token trie (no padding, shared prefixes once;
            needs a Llama / Qwen2 policy with sdpa attention); off: padded rows.
        precision: "bfloat16" computes the forward and backward under bfloat16 autocast (the
            weights and the optimizer stay float32), "float32" does not; "auto" is bfloat16 for a
            policy of at least 20M parameters on a CPU with native bf16 matmuls (AVX512-BF16 /
            AMX), else float32 (`autocast_bf16`; the choice is logged).
    """

    seed: int = 0
    steps: int = 500
    batch_size: int = 128
    lr: float = 3e-3
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    packing: bool = False
    precision: Literal["auto", "float32", "bfloat16"] = "auto"

    def __post_init__(self) -> None:
        check_finite_fields(self, "")
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError(f"--steps and --batch_size must be >= 1, got {self.steps}, {self.batch_size}")
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(f"--warmup_steps must be in [0, --steps), got {self.warmup_steps} with --steps {self.steps}")
        if self.lr <= 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"--lr must be > 0 and --min_lr_ratio in [0, 1], got {self.lr}, {self.min_lr_ratio}")
        if self.grad_clip <= 0 or self.weight_decay < 0:
            raise ValueError(f"--grad_clip must be > 0 and --weight_decay >= 0, got {self.grad_clip}, {self.weight_decay}")
        if self.precision not in ("auto", "float32", "bfloat16"):
            raise ValueError(f"--precision must be auto, float32 or bfloat16, got {self.precision!r}")


def autocast_bf16(settings: SftSettings, model: Any) -> bool:
    """Whether the steps run under bfloat16 autocast (`settings.precision`; "auto" decided as
    the in-process generator decides its sampling dtype, flywheel.generation.precision, and logged)."""
    if settings.precision != "auto":
        return settings.precision == "bfloat16"
    from flywheel.generation.precision import BF16_MIN_PARAMETERS, cpu_has_bf16

    size = sum(p.numel() for p in model.parameters())
    chosen = size >= BF16_MIN_PARAMETERS and cpu_has_bf16() and next(model.parameters()).device.type == "cpu"
    log.info("SFT computes in %s: %.1fM parameters, %s (--precision=float32|bfloat16 to choose)",
             "bfloat16 autocast" if chosen else "float32", size / 1e6,
             "a CPU with native bf16 matmuls" if cpu_has_bf16() else "no native bf16 matmuls on this CPU")
    return chosen


def lr_at(step: int, settings: SftSettings) -> float:
    """Linear warmup over `warmup_steps`, then cosine from `lr` down to `min_lr_ratio * lr`.

    >>> s = SftSettings(steps=10, lr=1.0, warmup_steps=2, min_lr_ratio=0.0)
    >>> lr_at(0, s), lr_at(1, s), lr_at(2, s), round(lr_at(6, s), 3)
    (0.5, 1.0, 1.0, 0.5)
    """
    if step < settings.warmup_steps:
        return settings.lr * (step + 1) / settings.warmup_steps
    progress = (step - settings.warmup_steps) / max(1, settings.steps - settings.warmup_steps)
    floor = settings.min_lr_ratio
    return settings.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


# -- batches ---------------------------------------------------------------------------------


def batch_picks(traces: Sequence[Sequence[Trace]], settings: SftSettings) -> Iterator[list[Trace]]:
    """The traces of each of the `settings.steps` batches: problems are visited in seeded random
    epochs, and each visit picks one of the problem's traces at random."""
    rng = torch.Generator().manual_seed(settings.seed)
    order: list[int] = []
    for _ in range(settings.steps):
        while len(order) < settings.batch_size:
            order += torch.randperm(len(traces), generator=rng).tolist()
        picked, order = order[: settings.batch_size], order[settings.batch_size :]
        choice = torch.randint(0, 1 << 30, (len(picked),), generator=rng).tolist()
        yield [traces[p][c % len(traces[p])] for p, c in zip(picked, choice)]


def collate(batch: Sequence[Trace], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, labels), each [B, T], right-padded. Labels are -100 on the
    prompt, on the tokens a trace's `loss_mask` marks False (observations) and on the padding:
    the loss is on the response and EOS, or on an episode's actions."""
    width = max(len(t.input_ids) for t in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for row, t in enumerate(batch):
        n = len(t.input_ids)
        ids[row, :n] = torch.tensor(t.input_ids)
        mask[row, :n] = 1
        labels[row, t.prompt_len : n] = ids[row, t.prompt_len : n]
        if t.loss_mask:
            labels[row, t.prompt_len : n][~torch.tensor(t.loss_mask)] = -100
    return ids, mask, labels


def sft_batches(traces: Sequence[Sequence[Trace]], settings: SftSettings, pad_id: int, start: int = 0):
    """Yield the (input_ids, attention_mask, labels) batches of steps `start`, `start` + 1, ...
    (`batch_picks` collated); the earlier ones are drawn and skipped, so the stream is the
    same whatever step a run resumes from."""
    for step, batch in enumerate(batch_picks(traces, settings)):
        if step >= start:
            yield collate(batch, pad_id)


# -- loss ------------------------------------------------------------------------------------


def shared_prompt(traces: Sequence[Sequence[Trace]]) -> int:
    """The length of the prompt every trace starts with (Mastermind's rules: the prompt shows
    no secret), or 0 when the prompts differ (Countdown, chains)."""
    prompts = {t.input_ids[: t.prompt_len] for group in traces for t in group}
    return len(next(iter(prompts))) if len(prompts) == 1 else 0


def shared_prompt_loss(model: Any, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor,
                       prompt_len: int) -> torch.Tensor:
    """The SFT loss of a batch whose rows all start with the same `prompt_len` tokens: the prompt
    runs once (row 0) and its keys and values are broadcast to every row, so a Mastermind batch
    costs its ~60 episode tokens a row instead of ~190 (the rules are 131). The same mean token
    cross-entropy as `model(..., labels=labels).loss`, up to float rounding; the gradient
    through the broadcast sums over the rows as the full batch's would.

    ids, mask, labels: [B, T]; labels are -100 on the whole prompt."""
    from transformers import DynamicCache

    batch = ids.shape[0]
    kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"  # 5.24 renamed it
    head = model(input_ids=ids[:1, :prompt_len], use_cache=True)
    filled = getattr(head, kwarg)
    broadcast = DynamicCache(ddp_cache_data=[(layer.keys.expand(batch, -1, -1, -1), layer.values.expand(batch, -1, -1, -1))
                                             for layer in filled.layers])
    tail = model(input_ids=ids[:, prompt_len:], attention_mask=mask, use_cache=True, **{kwarg: broadcast})
    # Position t's logits predict token t + 1: the prompt's last predicts the first episode token.
    logits = torch.cat([head.logits[:, -1:].expand(batch, -1, -1), tail.logits[:, :-1]], dim=1)  # [B, T - P, V]
    return F.cross_entropy(logits.flatten(0, 1).float(), labels[:, prompt_len:].flatten(), ignore_index=-100)


def packed_loss(model: Any, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean token cross-entropy of the batch's trained tokens from one forward pass over its
    rows packed into a token trie (flywheel.training.packing): no padding is computed, and a
    prefix several rows share (a prompt) is computed once."""
    from flywheel.training.packing import pack_for, packed_logprobs

    packed = pack_for(model, ids, mask, torch.zeros(ids.shape[0], dtype=torch.long))
    logprobs = packed_logprobs(model, packed, ids.shape)  # [B, T - 1]: position t predicts token t + 1
    trained = labels[:, 1:] != -100
    return -(logprobs * trained).sum() / trained.sum().clamp(min=1)


def loss_function(model: Any, traces: Sequence[Sequence[Trace]], settings: SftSettings
                  ) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """The batch loss this run computes (module docstring): packed when `packing` (the model is
    switched to tree attention; ValueError for a model that cannot pack), else the shared-prompt
    form when every trace starts with one prompt, else the model's own loss on padded rows."""
    if settings.packing:
        from flywheel.training.packing import packable
        from flywheel.training.tree_attention import enable_tree_attention

        if not packable(model) or not enable_tree_attention(model):
            raise ValueError("--packing=true needs a Llama or Qwen2 policy with sdpa attention (tree attention packs "
                             f"its rows); this one is {getattr(model.config, 'model_type', '?')} with "
                             f"{getattr(model.config, '_attn_implementation', '?')}: set --packing=false")
        return lambda ids, mask, labels: packed_loss(model, ids, mask, labels)
    prompt_len = shared_prompt(traces)
    if prompt_len:
        return lambda ids, mask, labels: shared_prompt_loss(model, ids, mask, labels, prompt_len)
    return lambda ids, mask, labels: model(input_ids=ids, attention_mask=mask, labels=labels).loss


# -- the loop --------------------------------------------------------------------------------


@dataclass
class SftState:
    """Where a run is: the next step, every finished step's loss and seconds, and its trained
    tokens (the weights are the model's, the moments the optimizer's). Written at a checkpoint
    beside them, restored on resume."""

    step: int = 0
    losses: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    tokens: int = 0


def make_optimizer(model: Any, settings: SftSettings) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)


def sft_step(model: Any, optimizer: torch.optim.Optimizer, loss_of: Callable[..., torch.Tensor],
             batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor], lr: float, settings: SftSettings,
             bf16: bool = False) -> float:
    """One optimizer step on `batch` at learning rate `lr` (under bfloat16 autocast with `bf16`);
    returns the loss."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = loss_of(*batch)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
    optimizer.step()
    return loss.item()
