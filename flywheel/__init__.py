"""flywheel: Monte Carlo tree search inside RL with verifiable rewards, on PyTorch Lightning."""

__version__ = "0.1.0"
