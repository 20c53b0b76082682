"""HeldOutEval: pass@1 / pass@k on the held-out problems before training and after every
flywheel round, logged to TensorBoard; each result and its round's facts go to the run's
summary (callbacks.run_summary.RunSummary, handed in by the CLI wiring), which writes
summary.json, solved_problems.json and the report."""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

from flywheel.reporting.evaluation import evaluate_sharded, shard
from flywheel.ports import PortClient, WallClock
from flywheel.reporting.wall_split import EVAL, UNTIMED
from flywheel.reporting.sample_bar import sample_bar

from callbacks.round_scalars import log_round_scalars
from callbacks.run_summary import CURRICULUM_FACTS, RunSummary

log = logging.getLogger(__name__)


class HeldOutEval(PortClient, Callback):
    """Evaluates the policy on the data module's held-out problems before the first update
    (`--data.eval.at_start`) and at the end of every flywheel round (called by the round
    protocol, callbacks.rounds). Its settings are the data module's, all under `--data.eval.*`
    (how) and `--data.problems.*` (which problems), read through the port the CLI connects.
    It samples with the fit's own generator, so it runs where the trainer put the policy
    (`--trainer.accelerator`; auto takes CUDA when present, the rule of `eval --device auto`,
    flywheel.policies.device) in the generator's dtype (`--data.generator.init_args.dtype`; its
    auto is the policy's own dtype off the CPU: `--model.dtype=bfloat16` on a bf16 GPU)."""

    def __init__(self, summary: RunSummary | None = None) -> None:
        self.summary = summary
        """Where the results go: the run's one summary, handed in by the CLI wiring
        (flywheel.run.cli.add_round_protocol) before the fit starts."""
        self.wall: WallClock = UNTIMED
        """The run's wall clock (callbacks.wall_time.WallTime, set by the CLI wiring)."""

    # ------------------------------------------------------------------ hooks
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.port.eval.at_start and self.summary.base is None:
            with self.wall.once():
                base = self.run_eval(trainer, pl_module, "base")
            self._log(pl_module, base)
            self._log_round(trainer, 0, base)
            self.summary.set_base(trainer, base)

    def end_round(self, trainer: L.Trainer, pl_module: L.LightningModule, round_index: int,
                  curriculum: dict[str, Any], partial: bool = False, last: bool = False) -> dict[str, float] | None:
        """Evaluate at the end of round `round_index` (called by the round protocol,
        callbacks.rounds) and hand the summary the round's row; `curriculum`: hard_set_size,
        cached and generated_tokens, and any further facts of the round (the token split:
        tree_tokens, flat_tokens, tree_token_fraction, screening_tokens; solved_problems,
        first_solved), copied into the row as given. `partial`: the run ended before the round's
        last epoch (its token budget, or `--trainer.max_epochs` not a multiple of
        `--data.epochs_per_round`; the row says so; a resumed run's whole-round row replaces it).
        `last`: the run ends with this round. With `--data.eval.every_tokens` a round that is
        neither gets its row without pass@k (None returned) until that many tokens passed since
        the last evaluation."""
        # A partial row of this round is about to be replaced: spacing counts from the evaluation before it.
        self.summary.drop_round(round_index)
        every = self.port.eval.every_tokens
        since = (curriculum["generated_tokens"] or 0) - self.summary.last_evaluated_tokens()
        result = self.run_eval(trainer, pl_module, f"round {round_index}") if partial or last or since >= every else None
        if result is not None:
            self._log(pl_module, result)
            self._log_round(trainer, round_index, result)
        else:
            log.info("round %d: held-out evaluation skipped (--data.eval.every_tokens=%d; %d tokens since the last)",
                     round_index, every, since)
        self.summary.end_round(trainer, self.round_row(trainer, round_index, result, curriculum, partial))
        return result

    def round_row(self, trainer: L.Trainer, round_index: int, result: dict[str, float] | None,
                  curriculum: dict[str, Any], partial: bool) -> dict[str, Any]:
        """Round `round_index`'s row of summary.json."""
        return {
            "round": round_index,
            "epoch": trainer.current_epoch,
            "eval_pass1": result["pass1"] if result else None,
            "eval_passk": result["passk"] if result else None,
            "k": int(self.port.eval.pass_k),
            "hard_set_size": curriculum["hard_set_size"],
            "cached": curriculum["cached"],
            "generated_tokens": curriculum["generated_tokens"],
            **{key: value for key, value in curriculum.items() if key not in CURRICULUM_FACTS},
            "optimizer_steps": trainer.global_step,
            "wall_seconds": round(self.summary.wall_seconds(), 1),
            "config": config_file(trainer),  # the settings this round ran under (each resume has its own file)
            **({"partial": True} if partial else {}),
        }

    # ------------------------------------------------------------------ work
    def run_eval(self, trainer: L.Trainer, pl_module: L.LightningModule, label: str) -> dict[str, float]:
        port = self.port
        problems = port.eval_problems()
        mine = shard(problems, trainer.global_rank, trainer.world_size)  # uneven shards, no padding
        with self.wall.section(EVAL), sample_bar(port.generator, len(mine), port.eval.samples, f"eval {label}",
                                                     show=trainer.is_global_zero) as advance:
            result = evaluate_sharded(port.generator, pl_module.tokenizer, port.task, problems, port.eval,
                                      progress=advance, grader=port.grader)
        out = {"k": float(port.eval.pass_k), "problems": float(len(problems)),
               "pass1": result.pass_at(1), "passk": result.pass_at(port.eval.pass_k)}
        log.info("eval %s: pass@1 %.4f, pass@%d %.4f on %d problems", label, out["pass1"], port.eval.pass_k, out["passk"], len(problems))
        return out

    def _log(self, pl_module: L.LightningModule, result: dict[str, float]) -> None:
        k = int(result["k"])
        pl_module.log_dict({"eval/pass@1": result["pass1"], f"eval/pass@{k}": result["passk"]})

    def _log_round(self, trainer: L.Trainer, round_index: int, result: dict[str, float]) -> None:
        k = int(result["k"])
        log_round_scalars(trainer, {"round/eval_pass@1": result["pass1"], f"round/eval_pass@{k}": result["passk"]}, round_index)

    # ------------------------------------------------------------------ resume
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A checkpoint from before RunSummary kept the results under this callback's name."""
        if "rounds" in state:
            self.summary.load_state_dict(state)


def config_file(trainer: L.Trainer) -> str | None:
    """The name of this part of the run's config file in the log folder (flywheel.run.settings)."""
    from lightning.pytorch.cli import SaveConfigCallback

    return next((c.config_filename for c in trainer.callbacks if isinstance(c, SaveConfigCallback)), None)
