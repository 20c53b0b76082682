"""The one typed port between the data module and everything that drives rounds.

`DataPort` is what the round protocol (callbacks.rounds), the held-out evaluation
(callbacks.evaluation), the token budget (callbacks.budget) and the LightningModule read of
the data module, and all they read: `data_modules.search.SearchDataModule` implements it.
The CLI hands the data module to each of them when it builds them
(`flywheel.run.cli.add_round_protocol`); none reaches it through `trainer.datamodule`
(tests/test_port.py scans for that). `PolicyPort` is the LightningModule as the data module
sees it. `WallClock` is the run's wall split as the parts that
time their work see it, handed to them by the same wiring.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Callable, Protocol

from flywheel.prm import ValueFn

if TYPE_CHECKING:
    from flywheel.reporting.evaluation import EvalConfig
    from flywheel.generation.base import Generator
    from flywheel.objectives.credit import Credit
    from flywheel.search.outputs import TreeResult
    from flywheel.tasks import Problem, Task
    from flywheel.tasks.grading import Grader
    from flywheel.training.packing import Packed


class PolicyPort(Protocol):
    """The LightningModule as the data module sees it, and all it reads of it: the policy the
    generator samples from, its tokenizer, the packing decision and pi_old scoring of a
    mini-batch, and the policy's own value head for the search (flywheel.module.PolicyModule
    implements it; the data module reaches it only through `SearchDataModule.policy_port`)."""

    policy: Any
    """The torch model being trained (the generator is put in step with it)."""
    tokenizer: Any
    value_head: Any
    """The value head trained beside the policy, or None."""

    def pack_batch(self, input_ids: Any, attention_mask: Any, group_ids: Any) -> Packed | None:
        """How a mini-batch's forward passes are laid out, decided once as it is built: its rows'
        token tries, or None for one row per trajectory."""

    def score_batch(self, input_ids: Any, attention_mask: Any, packed: Packed | None) -> Any:
        """pi_old log-probs [B, L-1] of a mini-batch laid out by `pack_batch`, without grad."""

    def search_values(self, prefixes: list[tuple[int, ...]]) -> list[float]:
        """The value head's values of token-id prefixes (the search's node values)."""


class WallClock(Protocol):
    """The run's wall split as the parts that time their work see it (callbacks.wall_time.WallTime;
    flywheel.reporting.wall_split.UNTIMED where a run keeps none). The CLI wiring hands it to
    the data module and the round's callbacks; none finds it by scanning the trainer's callbacks."""

    def section(self, name: str, part: tuple[str, Callable[[], float]] | None = None) -> AbstractContextManager:
        """Count the block's time as section `name` (flywheel.reporting.wall_split names them)."""

    def rebuild(self) -> AbstractContextManager:
        """An epoch's data loader being built: the split's epoch boundary, then section `rebuild`."""

    def once(self) -> AbstractContextManager:
        """Work the fit does once (the base evaluation and screening, the generator's launch):
        timed in its sections as usual, and left out of the epochs' pace that projects the fit's end."""

    def add_overlapped(self, name: str, seconds: float) -> None:
        """Seconds of work that ran beside the training thread (the search ahead)."""


class DataPort(Protocol):
    """The data module as the parts that drive rounds see it."""

    task: Task
    """Prompt format and verifier (the held-out evaluation's)."""
    grader: Grader
    """The task's verifier under the grading guard (`--data.grading.*`): every response of
    the held-out evaluation is graded by `grader.score`."""
    eval: EvalConfig
    """How the held-out set is evaluated (`--data.eval.*`)."""
    credit: Credit
    """The credit settings (`--data.credit.*`); the module checks its loss against the rule."""
    generated_tokens: int
    """Tokens generated for training over the run, all ranks (the budget's count)."""
    epoch_metrics: dict[str, float]
    """This epoch's search and compute scalars, logged at the epoch's end."""
    epoch_results: list[TreeResult]
    """This epoch's finished trees on this rank (the value model learns from them)."""
    wall: WallClock
    """The run's wall clock, set by the CLI wiring: the epoch's sections are timed on it."""

    @property
    def generator(self) -> Generator:
        """The generator, in step with the policy after `push_weights`."""

    @property
    def rounds_completed(self) -> int:
        """Flywheel rounds completed (the index of the round `end_round` just ended)."""

    def eval_problems(self) -> tuple[Problem, ...]:
        """The held-out problems."""

    def finish_search_ahead(self, abandon: bool) -> None:
        """End the next epoch's search running beside this epoch's training
        (`--data.async_search`) before the weights are pushed: wait for it, or with `abandon`
        (the run stops) stop it and leave its problems to the resumed run. Nothing when none runs."""

    def search_after_push(self) -> None:
        """With `--data.async_search`, once the epoch's weights are pushed and its round's end
        has sampled from them: start the search of the epoch after next (nothing when it cannot
        start yet, or past the last epoch)."""

    def push_weights(self, policy: Any, version: int) -> bool:
        """Make the generator sample from `policy` as of optimizer step `version` (collective);
        False when it already does."""

    def use_value_model(self, value_fn: ValueFn | None) -> None:
        """Score the next searches' new nodes with `value_fn` (None = no value model)."""

    def round_starts(self, epoch: int) -> bool:
        """Whether `epoch` (0-based) is the first of a round."""

    def round_ends(self, epoch: int) -> bool:
        """Whether `epoch` (0-based) is the last of a round: the one place that decides it."""

    def end_round(self, tokenizer: Any) -> dict[str, float]:
        """A round's end: re-measure and shrink the hard set, settle the replay buffer
        (collective); the round's scalars."""

    def round_facts(self) -> dict[str, float | None]:
        """hard_set_size, cached and generated_tokens for a round's summary row, the round's
        token split (tree_tokens, flat_tokens, tree_token_fraction, screening_tokens) and the
        training problems it solved (solved_problems, first_solved: solved for the first time)."""

    def solved_problems(self) -> dict[str, Any]:
        """Every training problem the run solved so far, with the round and the training tokens
        of its first solve: the content of solved_problems.json (data_modules.solved)."""


class PortClient:
    """A part that is built before the data module (from its own `--section`, or as the
    LightningModule) and handed the port afterwards by the CLI (`connect`)."""

    _port: DataPort | None = None

    def connect(self, port: DataPort) -> None:
        self._port = port

    @property
    def port(self) -> DataPort:
        if self._port is None:
            raise RuntimeError(f"{type(self).__name__} has no data module: the CLI connects it "
                               "(flywheel.run.cli.add_round_protocol); call connect(datamodule) when building it by hand")
        return self._port
