"""flywheel: Monte Carlo tree search inside RL with verifiable rewards, on PyTorch Lightning."""

__version__ = "0.1.0"

from flywheel.moved import install as _install_moved

_install_moved()
