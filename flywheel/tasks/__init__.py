"""Tasks: prompt format, step definition, verifier and problem source, behind one seam."""

from flywheel.tasks.base import Problem, StepSpec, Task
from flywheel.tasks.countdown import CountdownProblem, CountdownTask
from flywheel.tasks.math import MathTask

__all__ = ["CountdownProblem", "CountdownTask", "MathTask", "Problem", "StepSpec", "Task"]
