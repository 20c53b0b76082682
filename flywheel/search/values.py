"""Values read out of a finished tree for training: soft-clipped q and the overlong penalty.

deepsearch.md §6 (soft clip, paper Eq. 13-15) and §2 (DAPO overlong penalty, code).
"""

from __future__ import annotations

import math


def soft_clip(q: float, eps_q: float = 1.0, q_max: float = 1.0) -> float:
    """q~(s) = tanh(q(s) / eps_q) * q_max for an intermediate node (§6); terminals keep their reward.

    >>> round(soft_clip(0.5), 6), round(soft_clip(-2.0, eps_q=2.0, q_max=0.5), 6)
    (0.462117, -0.380797)
    """
    return math.tanh(q / eps_q) * q_max


def overlong_penalty(length: int, max_tokens: int = 16384, buffer_tokens: int = 4096) -> float:
    """DAPO overlong penalty (§2): min(-(L - (L_max - L_buf)) / L_buf, 0).

    0 up to L_max - L_buf tokens, then linear down to -1 at L_max (and below past it).

    >>> overlong_penalty(12288), overlong_penalty(14336), overlong_penalty(16384)
    (0.0, -0.5, -1.0)
    """
    penalty = -(length - (max_tokens - buffer_tokens)) / buffer_tokens
    return penalty if penalty < 0 else 0.0
