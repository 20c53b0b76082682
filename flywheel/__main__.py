"""`python -m flywheel fit|validate|test --config conf/X.yaml`: the LightningCLI entry point."""

from __future__ import annotations

import logging
import os
import sys

from lightning.pytorch.cli import LightningCLI


class FlywheelCLI(LightningCLI):
    """LightningCLI with flywheel's always-on callbacks as top-level sections (`--eval.*`,
    `--hard_set_refresh.*`, `--budget.*`)."""

    def add_arguments_to_parser(self, parser) -> None:
        from callbacks.budget import GenerationBudget
        from callbacks.evaluation import HeldOutEval
        from callbacks.hard_set import HardSetRefresh
        from callbacks.prm import PRMUpdate

        # Their epoch-end order is not theirs to decide: callbacks.rounds.RoundProtocol
        # (added in instantiate_trainer) runs them.
        parser.add_lightning_class_args(HardSetRefresh, "hard_set_refresh")
        parser.add_lightning_class_args(HeldOutEval, "eval")
        parser.add_lightning_class_args(GenerationBudget, "budget")
        parser.add_lightning_class_args(PRMUpdate, "prm_update")

    def instantiate_trainer(self, **kwargs):
        from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

        from flywheel.checkpoint import AtomicCheckpointIO

        trainer = super().instantiate_trainer(**kwargs)
        strategy = trainer.strategy
        deepspeed = any(c.__name__ == "DeepSpeedStrategy" for c in type(strategy).__mro__)
        if deepspeed and isinstance(getattr(strategy, "config", None), dict):
            from flywheel.deepspeed_config import check_deepspeed_config

            check_deepspeed_config(strategy.config, where="--trainer.strategy's DeepSpeed config")
            # Without it Lightning builds the training data during setup just to read a batch
            # size (a whole epoch's search, before the model is wrapped) and then fails on
            # the data module's pre-batched loader. DeepSpeed uses it for throughput logs only.
            strategy.config.setdefault("train_micro_batch_size_per_gpu", 1)
        checkpoints_beside_the_run(trainer)
        add_round_protocol(trainer)
        # Lightning's default writer; a user's own CheckpointIO plugin (or DeepSpeed's) is kept.
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        return trainer

    def before_fit(self) -> None:
        from flywheel.checkpoint import continue_logging

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


def checkpoints_beside_the_run(trainer) -> None:
    """A ModelCheckpoint without a dirpath writes to <logger save_dir>/<run name>/checkpoints:
    fixed across versions, so `--ckpt_path last` finds it, and derived from the run name, so an
    overlay that renames the run (conf/dapo.yaml on top of the quickstart) cannot overwrite
    another recipe's last.ckpt."""
    from pathlib import Path

    from lightning.pytorch.callbacks import ModelCheckpoint

    logger = trainer.logger
    save_dir, name = getattr(logger, "save_dir", None), getattr(logger, "name", None)
    if not save_dir or not name:
        return
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.dirpath is None:
            callback.dirpath = str((Path(save_dir) / name / "checkpoints").expanduser().resolve())


def add_round_protocol(trainer) -> None:
    """WeightSync and the RoundProtocol that drives the end of every epoch and round, over the
    refresh, evaluation and value-model callbacks the parser built (`--hard_set_refresh.*`,
    `--eval.*`, `--prm_update.*`)."""
    from callbacks.evaluation import HeldOutEval
    from callbacks.hard_set import HardSetRefresh
    from callbacks.prm import PRMUpdate
    from callbacks.rounds import RoundProtocol
    from callbacks.weight_sync import WeightSync

    from lightning.pytorch.callbacks import Checkpoint

    callbacks = trainer.callbacks
    before = next((i for i, c in enumerate(callbacks) if isinstance(c, Checkpoint)), len(callbacks))  # saves stay last

    def one(kind):
        found = [c for c in callbacks if isinstance(c, kind)]
        if found:
            return found[0]
        callbacks.insert(before, kind())
        return callbacks[before]

    sync = WeightSync()
    steps = (one(HardSetRefresh), one(HeldOutEval), one(PRMUpdate))
    at = next((i for i, c in enumerate(callbacks) if isinstance(c, Checkpoint)), len(callbacks))
    callbacks[at:at] = [sync, RoundProtocol(sync, *steps)]


def main(args: list[str] | None = None, run: bool = True):
    """`fit|validate|test` go to LightningCLI; `eval` to flywheel.eval_command; `tree` to
    flywheel.viewer."""
    logging.basicConfig(level=os.environ.get("FLYWHEEL_LOG_LEVEL", "INFO"), format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    argv = sys.argv[1:] if args is None else list(args)
    if argv[:1] == ["eval"]:
        from flywheel.eval_command import main as eval_main

        return eval_main(argv[1:])
    if argv[:1] == ["tree"]:
        from flywheel.viewer import main as tree_main

        return tree_main(argv[1:])
    if argv[:1] in (["--help"], ["-h"]):
        print("flywheel subcommands: fit, validate, test (below); eval: pass@k of a checkpoint or model folder "
              "(`python -m flywheel eval --help`); tree: one search tree as an HTML page "
              "(`python -m flywheel tree --help`)\n")
    from data_modules.search import SearchDataModule
    from flywheel.module import TreeGRPOModule

    return FlywheelCLI(
        TreeGRPOModule,
        SearchDataModule,
        trainer_defaults={"reload_dataloaders_every_n_epochs": 1, "use_distributed_sampler": False, "num_sanity_val_steps": 0},
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"description": "flywheel: Monte Carlo tree search inside RL with verifiable rewards."},
        args=args,
        run=run,
    )


if __name__ == "__main__":
    main(None if sys.argv[1:] else ["--help"])
