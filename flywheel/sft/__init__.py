"""Supervised fine-tuning (`python -m flywheel sft`): a policy learns worked solutions, response
tokens only, before RL. Lightning-free: a plain loop (loop.py, train.py) over traces
(traces.py); command.py is the command, top to bottom."""

from flywheel.sft.loop import SftSettings, SftState, lr_at, sft_batches
from flywheel.sft.traces import Trace

__all__ = ["SftSettings", "SftState", "Trace", "lr_at", "sft_batches"]
