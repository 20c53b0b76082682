"""Callbacks that turn the flywheel. RoundProtocol (callbacks.rounds) runs the end of every
epoch and round in one order: WeightSync, then HardSetRefresh -> HeldOutEval -> PRMUpdate."""

from callbacks.evaluation import HeldOutEval
from callbacks.hard_set import HardSetRefresh
from callbacks.prm import PRMUpdate
from callbacks.rounds import RoundProtocol
from callbacks.weight_sync import WeightSync

__all__ = ["HardSetRefresh", "HeldOutEval", "PRMUpdate", "RoundProtocol", "WeightSync"]
