"""The LightningCLI of `fit|validate|test`: flywheel's always-on callbacks and their wiring
(`add_round_protocol`), the preflight before anything runs, checkpoints beside the run, one-line
errors for the trainer's settings. Imported by flywheel.__main__ only once the command line has
passed the checks that need no Lightning (a missing config file is refused in a second, not
after Lightning's imports)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from lightning.pytorch.cli import LightningCLI


def seed_the_data(config) -> None:
    """`--data.seed` unset takes the run's `seed_everything` (Lightning has already drawn it when
    it was `true`): otherwise `--seed_everything=1` would reseed torch alone and leave the problem
    order and every search sample as with seed 0, a "second seed" identical to the first."""
    data = config.get("data")
    if data is None or "seed" not in data or data.seed is not None:
        return
    seed = config.get("seed_everything")
    data.seed = seed if isinstance(seed, int) and not isinstance(seed, bool) else 0


SUBCOMMAND_HELP = {
    "fit": "train the policy: search, credit and optimize, round after round (--config conf/quickstart.yaml "
           "is the quickstart)",
    "validate": "held-out pass@1 and pass@k of the policy (--data.eval.*, --data.problems.eval_split), logged as "
                "eval/pass@k",
    "test": "the held-out evaluation of `validate`, logged as test/pass@k",
}
"""What each of LightningCLI's subcommands does in flywheel, for --help (Lightning's own lines,
the first lines of the Trainer's docstrings, stop mid-sentence and speak of validation sets)."""
SUBCOMMANDS = tuple(SUBCOMMAND_HELP)
"""LightningCLI's subcommands that flywheel runs (the others: flywheel.__main__.COMMANDS)."""


class FlywheelCLI(LightningCLI):
    """LightningCLI with flywheel's always-on callbacks that have settings as top-level
    sections (`--budget.*`, `--prm_update.*`); the held-out evaluation's settings are the data
    module's (`--data.eval.*`), the hard-set refresh's too (`--data.hard_set.*`)."""

    def __init__(self, *args, argv: list[str] | None = None, help_section: str | None = None, **kwargs) -> None:
        self.argv = argv
        """The command line (for the resume hint of a run stopped by SIGTERM)."""
        self.help_section = help_section
        """`fit --help data.search`: print that section's options only (flywheel.run.section_help)."""
        super().__init__(*args, **kwargs)

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """Lightning's subcommands but `predict`, which has nothing to predict here."""
        return {name: keys for name, keys in LightningCLI.subcommands().items() if name in SUBCOMMANDS}

    def _add_subcommands(self, parser, **kwargs) -> None:
        for name, description in SUBCOMMAND_HELP.items():
            kwargs[name] = {**kwargs.get(name, {}), "description": description}
        super()._add_subcommands(parser, **kwargs)
        for choice in parser._subcommands_action._choices_actions:  # the list under "subcommands:"
            choice.help = SUBCOMMAND_HELP.get(choice.dest, choice.help)

    def parse_arguments(self, parser, args) -> None:
        from argparse import ArgumentError

        from flywheel.run.flags import option_strings

        if self.help_section is not None:
            self.print_section(parser, args)
        try:
            super().parse_arguments(parser, args)
        except ArgumentError as err:  # the flags it knows, for the closest to an unknown one
            err.known_flags = option_strings(parser)
            raise

    def print_section(self, parser, args) -> None:
        """`fit --help SECTION`: that section's options, then exit 0; an unknown section is a
        one-line error listing the sections."""
        from flywheel.run.errors import PreflightError
        from flywheel.run.section_help import section_help

        command = next((a for a in args or () if a in SUBCOMMANDS), None)
        if command is None:
            raise PreflightError(f"--help {self.help_section}: name a command first, e.g. "
                                 f"`python -m flywheel fit --help {self.help_section}`")
        try:
            print(section_help(parser._subcommands_action._name_parser_map[command], self.help_section, command))
        except ValueError as err:
            raise PreflightError(str(err)) from None
        raise SystemExit(0)

    def add_arguments_to_parser(self, parser) -> None:
        from callbacks.budget import GenerationBudget
        from callbacks.prm import PRMUpdate

        # Their epoch-end order is not theirs to decide: callbacks.rounds.RoundProtocol
        # (added in instantiate_trainer) runs them.
        parser.add_lightning_class_args(GenerationBudget, "budget")
        parser.add_lightning_class_args(PRMUpdate, "prm_update")
        from flywheel.run.checkpoint import CHECKPOINT_WRITES

        parser.add_argument(
            "--checkpoint_writes", type=str, default=CHECKPOINT_WRITES[0], choices=CHECKPOINT_WRITES,
            help="background: a checkpoint's tensors are copied to CPU memory and the file is written by a thread "
                 "of its own while the run goes on (one file at a time, in order; an older checkpoint is deleted "
                 "only after the newer one is complete); blocking: the trainer waits for every write",
        )
        parser.add_argument(
            "--last_missing_ok", type=bool, default=False,
            help="with --ckpt_path last: start a fresh run when the run has no last.ckpt yet (a scheduler's "
                 "first attempt) instead of failing with the folder searched",
        )
        from flywheel.run.section_help import describe_rule_tables

        describe_rule_tables(parser)

    @property
    def command_config(self):
        """The parsed settings of the subcommand being run (the whole config when there is none)."""
        return self.config[self.subcommand] if self.subcommand else self.config

    def before_instantiate_classes(self) -> None:
        from flywheel.finite import non_finite_message, non_finite_settings
        from flywheel.run.preflight import PreflightError

        config = self.command_config
        for key, value in non_finite_settings(config):  # from YAML (.nan, .inf): before anything is built
            raise PreflightError(non_finite_message(key, value))
        seed_the_data(config)

    def instantiate_classes(self) -> None:
        from lightning.fabric.utilities.exceptions import MisconfigurationException

        from flywheel.run.preflight import PreflightError

        try:
            super().instantiate_classes()
        except MisconfigurationException as err:  # the trainer's own settings (accelerator, devices, strategy)
            raise PreflightError(trainer_error_line(err, self.command_config.get("trainer"))) from err
        except ValueError as err:  # a setting out of range, found by a constructor: the message names the flag
            raise PreflightError(str(err)) from err

    def instantiate_trainer(self, **kwargs):
        from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

        from flywheel.reporting.wall_split import CHECKPOINT_WRITE
        from flywheel.run.checkpoint import CHECKPOINT_WRITES, AtomicCheckpointIO, BackgroundCheckpointIO

        trainer = super().instantiate_trainer(**kwargs)
        strategy = trainer.strategy
        deepspeed = any(c.__name__ == "DeepSpeedStrategy" for c in type(strategy).__mro__)
        if deepspeed and isinstance(getattr(strategy, "config", None), dict):
            from flywheel.run.deepspeed_config import check_deepspeed_config

            check_deepspeed_config(strategy.config, where="--trainer.strategy's DeepSpeed config")
            # Without it Lightning builds the training data during setup just to read a batch
            # size (a whole epoch's search, before the model is wrapped) and then fails on
            # the data module's pre-batched loader. DeepSpeed uses it for throughput logs only.
            strategy.config.setdefault("train_micro_batch_size_per_gpu", 1)
        checkpoints_beside_the_run(trainer)
        lines_off_a_terminal(trainer)
        wall = add_round_protocol(trainer, self.datamodule, self.model)
        from flywheel.run.preemption import Preemption

        trainer.callbacks.append(Preemption(self.argv))
        # Lightning's default writer; a user's own CheckpointIO plugin (or DeepSpeed's) is kept.
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            background = self.command_config.get("checkpoint_writes", CHECKPOINT_WRITES[0]) == "background"
            trainer.strategy.checkpoint_io = (
                BackgroundCheckpointIO(on_written=lambda seconds: wall.add_overlapped(CHECKPOINT_WRITE, seconds))
                if background else AtomicCheckpointIO())
        return trainer

    def _run_subcommand(self, subcommand: str) -> None:
        from flywheel.generation.vllm.client import SidecarError
        from flywheel.run.errors import GeneratorFailure

        try:
            super()._run_subcommand(subcommand)
        except SidecarError as err:  # past the sidecar's retries and restarts: say what resumes the run
            raise GeneratorFailure(generator_failure_message(err, self.trainer, self.argv or [])) from err
        finally:  # however the fit ends; a killed process's locks go with it
            for handle in self.held_folders:
                handle.close()
            self.held_folders = []

    held_folders: list = []
    """The open lock files of the checkpoint folders this fit holds (flywheel.run.folder_lock)."""

    def hold_checkpoint_folders(self) -> None:
        """A fit holds its checkpoint folders for its whole life: a second fit into one of them
        is refused while this one runs (rank 0 holds them for every rank)."""
        from lightning.pytorch.utilities import rank_zero_only

        from flywheel.run.folder_lock import hold_folder
        from flywheel.run.preflight import checkpoint_folders

        # Both: a rank Lightning's launcher started reads its rank from the environment
        # (rank_zero_only.rank) before the strategy has set the trainer's.
        if self.trainer.global_rank != 0 or rank_zero_only.rank != 0:
            return
        for folder in checkpoint_folders(self.trainer):
            try:
                self.held_folders = [*self.held_folders, hold_folder(folder)]
            except OSError:  # an unwritable folder: the preflight names it with its fix
                continue

    def preflight(self) -> None:
        """flywheel.run.preflight's checks, before anything is searched, trained or evaluated."""
        from flywheel.run.preflight import preflight

        if self.subcommand == "fit":
            self.hold_checkpoint_folders()
        config = self.config[self.subcommand]
        from flywheel.run.settings import RunSettings

        saver = next((c for c in self.trainer.callbacks if isinstance(c, RunSettings)), None)
        resolved = preflight(self.trainer, self.model, self.datamodule, self.subcommand, config.ckpt_path,
                             missing_ok=config.get("last_missing_ok", False),
                             settings=saver.settings() if saver is not None else None)
        if saver is not None:
            saver.resuming = resolved is not None
        from flywheel.run.zero_checkpoint import use_universal

        if use_universal(self.trainer.strategy, resolved):  # tools/zero_to_universal.py's folder, on any world size
            logging.getLogger("flywheel").info("resuming %s as a DeepSpeed universal checkpoint", resolved)
        # "last" with nothing there (--last_missing_ok): a fresh run; no --ckpt_path but the same
        # command as the run in the checkpoint folder: resumed (flywheel.run.preflight.rerun_to_resume)
        if (resolved is None) != (config.ckpt_path is None):
            self.config_init[self.subcommand]["ckpt_path"] = resolved
            config.ckpt_path = resolved

    def before_validate(self) -> None:
        self.preflight()

    def before_test(self) -> None:
        self.preflight()

    def before_fit(self) -> None:
        from flywheel.run.checkpoint import continue_logging

        self.preflight()
        config = self.config[self.subcommand]
        logger = config.trainer.logger
        chosen = logger.init_args.get("version") if hasattr(logger, "init_args") else None
        folder = continue_logging(self.trainer, config.ckpt_path, chosen)
        if folder:
            logging.getLogger("flywheel").info("resuming: logging on in %s", folder)

    def _parse_ckpt_path(self) -> None:
        # LightningCLI would overwrite the model's arguments with the checkpoint's saved
        # hyperparameters, even ones given explicitly on the command line
        # (lightning-cpu.md §2). In flywheel the YAML and the command line decide the
        # configuration; a checkpoint restores state (weights, optimizer, loops, search
        # state), not settings.
        return


def generator_failure_message(err: Exception, trainer, argv: list[str]) -> str:
    """One line for a generator that failed mid-fit: nothing of the epoch under way is kept (its
    search, or its steps before the weight push, are redone), and the run's newest checkpoint
    resumes it with the same command and `--ckpt_path last`."""
    from flywheel.run.preemption import last_checkpoint_path, resume_command

    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    if getattr(trainer, "state", None) is None or trainer.state.fn != "fit":
        return f"the generator failed: {first}"
    epoch = trainer.current_epoch
    last = last_checkpoint_path(trainer)
    if not last.is_file():
        return (f"the generator failed in epoch {epoch}: {first}. No checkpoint was written yet; after fixing the "
                "cause, run the same command again")
    return (f"the generator failed in epoch {epoch}: {first}. Nothing of epoch {epoch} was kept; {last} (the "
            f"newest checkpoint) resumes the run at its start, after fixing the cause: {resume_command(argv)}")


def trainer_error_line(err: Exception, trainer_config) -> str:
    """Lightning's refusal of the trainer's settings as one line, naming the flag: the usual
    one is an accelerator this machine does not have (`--trainer.accelerator=gpu` on a CPU)."""
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    accelerator = str(trainer_config.get("accelerator", "auto")) if trainer_config is not None else "auto"
    if accelerator not in ("auto", "cpu"):
        return (f"--trainer.accelerator={accelerator}: {first} (this machine has no such device); use "
                "--trainer.accelerator=cpu, or auto to take what there is")
    return f"--trainer settings: {first}; fix the --trainer.* flag it names"


def checkpoints_beside_the_run(trainer) -> None:
    """A ModelCheckpoint without a dirpath writes to <logger save_dir>/<run name>/checkpoints:
    fixed across versions, so `--ckpt_path last` finds it, and derived from the run name, so an
    overlay that renames the run (conf/dapo.yaml on top of the quickstart) cannot overwrite
    another recipe's last.ckpt. Names are never versioned (`last-v1.ckpt`): a resumed run
    overwrites its own last.ckpt."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    logger = trainer.logger
    save_dir, name = getattr(logger, "save_dir", None), getattr(logger, "name", None)
    for callback in trainer.checkpoint_callbacks:
        if not isinstance(callback, ModelCheckpoint):
            continue
        # One folder holds one run (preflight refuses a new run where another left checkpoints),
        # so a name that exists is this run's own, older state: overwrite it. Lightning's counter
        # would write `last-v1.ckpt` beside a resumed run's `last.ckpt`, which then stays the
        # stopped run's file (issue 37).
        callback._enable_version_counter = False
        if callback.dirpath is None and save_dir and name:
            callback.dirpath = str((Path(save_dir) / name / "checkpoints").expanduser().resolve())


def lines_off_a_terminal(trainer, terminal: bool | None = None) -> None:
    """Lightning's own progress bar (tqdm's or rich's, the default or configured) writes
    carriage-return frames to stdout, which a file or a CI log keeps as one growing line: when
    stdout is not a terminal (`terminal` None: ask it), a LineProgressBar takes its place."""
    from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar

    from callbacks.line_progress import LineProgressBar
    from flywheel.reporting.bars import is_terminal

    if terminal is None:
        terminal = is_terminal(sys.stdout)
    if terminal:
        return
    for i, callback in enumerate(trainer.callbacks):
        if type(callback) in (TQDMProgressBar, RichProgressBar):
            trainer.callbacks[i] = LineProgressBar()


def add_round_protocol(trainer, port, module) -> "WallTime":
    """The RoundProtocol that drives the end of every epoch and round (weight sync, hard-set
    refresh, evaluation, value model), and the wiring, the one place that connects the parts:
    the data module `port` (flywheel.ports.DataPort) is handed to the run summary, the held-out
    evaluation, the budget and the LightningModule `module`; the run's one RunSummary
    (summary.json, solved problems, the report) to the evaluation, the value model, the round
    protocol and WallTime (the run's wall split, callbacks.wall_time), which follows the round
    protocol; that WallTime, the run's wall clock, to the data module and the round's callbacks.
    Returns the WallTime (the checkpoint writer reports its background writes to it)."""
    from callbacks.budget import GenerationBudget
    from callbacks.evaluation import HeldOutEval
    from callbacks.prm import PRMUpdate
    from callbacks.rounds import RoundProtocol
    from callbacks.run_summary import RunSummary
    from callbacks.wall_time import WallTime

    from lightning.pytorch.callbacks import Checkpoint

    callbacks = trainer.callbacks
    before = next((i for i, c in enumerate(callbacks) if isinstance(c, Checkpoint)), len(callbacks))  # saves stay last

    def one(kind):
        found = [c for c in callbacks if isinstance(c, kind)]
        if found:
            return found[0]
        callbacks.insert(before, kind())
        return callbacks[before]

    evaluation, value_model = one(HeldOutEval), one(PRMUpdate)
    summary = one(RunSummary)  # inserted before both: its clock starts before the base evaluation
    evaluation.summary = value_model.summary = summary
    budget = next((c for c in callbacks if isinstance(c, GenerationBudget)), None)
    for part in (summary, evaluation, budget, module):
        if part is not None:
            part.connect(port)
    wall = WallTime(summary, budgeted=budget is not None and budget.max_tokens is not None)  # the run's wall clock, handed to every part that times its work
    port.wall = evaluation.wall = value_model.wall = wall
    at = next((i for i, c in enumerate(callbacks) if isinstance(c, Checkpoint)), len(callbacks))
    callbacks[at:at] = [RoundProtocol(port, evaluation, value_model, summary, budget=budget, wall=wall), wall]
    return wall
