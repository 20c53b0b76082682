"""Generator backends behind one seam (see `flywheel.generation.base`)."""

from flywheel.generation.base import (
    Completion,
    FinishReason,
    GenerationRequest,
    GenerationStats,
    Generator,
    SamplingParams,
)

__all__ = [
    "Completion",
    "FinishReason",
    "GenerationRequest",
    "GenerationStats",
    "Generator",
    "SamplingParams",
]
