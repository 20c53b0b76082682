"""Tasks: prompt format, step definition, verifier and problem source, behind one seam.

Every task class is imported here: jsonargparse lists the subclasses of Task imported when a
command's parser is built as `--task`'s and `--data.task`'s known classes."""

from flywheel.tasks.base import Problem, StepSpec, Task
from flywheel.tasks.chain import ChainProblem, ChainTask
from flywheel.tasks.countdown import CountdownProblem, CountdownTask
from flywheel.tasks.mastermind import MastermindProblem, MastermindTask
from flywheel.tasks.math import MathTask
from flywheel.tasks.textarena_env import TextArenaTask

__all__ = ["ChainProblem", "ChainTask", "CountdownProblem", "CountdownTask", "MastermindProblem", "MastermindTask",
           "MathTask", "Problem", "StepSpec", "Task", "TextArenaTask"]
