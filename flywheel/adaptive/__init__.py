"""Adaptive training inside the loop (deepsearch.md §7): the Pass1@K hard set and which
problems a screening re-measures, the replay buffer of cached correct solutions with mixed
rollouts, and the garbled / repetition filter for negative samples.
Pure Python over plain data; the DataModule and callbacks call it."""

from flywheel.adaptive.filters import DegenerateFilter, degenerate_negative, is_degenerate, repeated_tail
from flywheel.adaptive.hard_set import HardSet, HardSetConfig, is_hard, pass1_at_k, pass1_rates
from flywheel.adaptive.mixed import direct_samples_needed, mixed_rollout
from flywheel.adaptive.replay import CachedSolution, ReplayBuffer
from flywheel.adaptive.replay_rule import ReplayConfig, qualifies
from flywheel.adaptive.rescreen import screening_ids

__all__ = [
    "CachedSolution",
    "DegenerateFilter",
    "HardSet",
    "HardSetConfig",
    "ReplayBuffer",
    "ReplayConfig",
    "degenerate_negative",
    "direct_samples_needed",
    "is_degenerate",
    "is_hard",
    "mixed_rollout",
    "pass1_at_k",
    "pass1_rates",
    "qualifies",
    "repeated_tail",
    "screening_ids",
]
