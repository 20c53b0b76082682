"""Tasks: prompt format, step definition, verifier and problem source, behind one seam."""

from flywheel.tasks.base import Problem, StepSpec, Task

__all__ = ["Problem", "StepSpec", "Task"]
