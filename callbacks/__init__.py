"""Callbacks that turn the flywheel: evaluation, hard-set refresh, replay buffer, weight sync."""

from callbacks.evaluation import HeldOutEval

__all__ = ["HeldOutEval"]
