"""Callbacks that turn the flywheel. RoundProtocol (callbacks.rounds) runs the end of every
epoch and round in one order: weight sync, then hard-set refresh -> HeldOutEval -> PRMUpdate.
They reach the data module through its port (flywheel.ports.DataPort), handed over by the CLI."""

from callbacks.evaluation import HeldOutEval
from callbacks.prm import PRMUpdate
from callbacks.rounds import RoundProtocol

__all__ = ["HeldOutEval", "PRMUpdate", "RoundProtocol"]
