"""HeldOutEval: pass@1 / pass@k on the held-out problems before training and after every
flywheel round, logged to TensorBoard and kept in the run's summary.json (where other
callbacks add their own per-round numbers through `record`, e.g. the value model's AUC).
Beside it at every round's end, solved_problems.json: the training problems the run solved."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

from flywheel.reporting.evaluation import evaluate_sharded, shard
from flywheel.io import atomic_write_json
from flywheel.ports import PortClient
from flywheel.reporting.report import write_run_report
from flywheel.reporting.sample_bar import sample_bar

from callbacks.round_scalars import log_round_scalars
from callbacks.wall_time import EVAL, wall_section

log = logging.getLogger(__name__)

CURRICULUM_FACTS = ("hard_set_size", "cached", "generated_tokens")
"""The facts of `DataPort.round_facts` every summary row has; any further ones are copied as given."""


class HeldOutEval(PortClient, Callback):
    """Evaluates the policy on the data module's held-out problems before the first update
    (`--data.eval.at_start`) and at the end of every flywheel round (called by the round
    protocol, callbacks.rounds). Its settings are the data module's, all under `--data.eval.*`
    (how) and `--data.problems.*` (which problems), read through the port the CLI connects."""

    def __init__(self) -> None:
        self.base: dict[str, float] | None = None
        self.rounds: list[dict[str, Any]] = []
        self.extras: dict[int, dict[str, Any]] = {}
        """Per-round numbers of other callbacks (`record`), merged into the rounds of summary.json."""
        self.run_extras: dict[str, Any] = {}
        """Whole-run numbers of other callbacks (`record_run`), top-level keys of summary.json."""
        self._started = time.perf_counter()
        self._wall_before = 0.0
        """Wall seconds of the run before this process (restored on resume)."""

    def wall_seconds(self) -> float:
        """Wall time of the run so far, over every resumed part."""
        return self._wall_before + time.perf_counter() - self._started

    # ------------------------------------------------------------------ hooks
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._started = time.perf_counter()
        if self.port.eval.at_start and self.base is None:
            self.base = self.run_eval(trainer, pl_module, "base")
            self._log(pl_module, self.base)
            self._log_round(trainer, 0, self.base)
            self.write_summary(trainer)

    def end_round(self, trainer: L.Trainer, pl_module: L.LightningModule, round_index: int,
                  curriculum: dict[str, Any], partial: bool = False, last: bool = False) -> dict[str, float] | None:
        """Evaluate at the end of round `round_index` (called by the round protocol,
        callbacks.rounds); `curriculum`: hard_set_size, cached and generated_tokens for the
        round's summary row, and any further facts of the round (the token split: tree_tokens,
        flat_tokens, tree_token_fraction, screening_tokens; solved_problems, first_solved),
        copied into the row as given; solved_problems.json is rewritten with the row.
        `partial`: the run ended before the round's last epoch (its
        token budget, or `--trainer.max_epochs` not a multiple of `--data.epochs_per_round`;
        the row says so; a resumed run's whole-round row replaces it). `last`: the run
        ends with this round. With `--data.eval.every_tokens` a round that is neither gets
        its row without pass@k (None returned) until that many tokens passed since the last
        evaluation."""
        # A partial row of this round is about to be replaced: spacing counts from the evaluation before it.
        self.rounds = [r for r in self.rounds if r["round"] != round_index]
        every = self.port.eval.every_tokens
        since = (curriculum["generated_tokens"] or 0) - self.last_evaluated_tokens()
        result = self.run_eval(trainer, pl_module, f"round {round_index}") if partial or last or since >= every else None
        if result is not None:
            self._log(pl_module, result)
            self._log_round(trainer, round_index, result)
        else:
            log.info("round %d: held-out evaluation skipped (--data.eval.every_tokens=%d; %d tokens since the last)",
                     round_index, every, since)
        self.rounds.append(
            {
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
                "wall_seconds": round(self.wall_seconds(), 1),
                "config": config_file(trainer),  # the settings this round ran under (each resume has its own file)
                **({"partial": True} if partial else {}),
            }
        )
        self.write_summary(trainer)
        self.write_solved_problems(trainer)
        self.write_report(trainer)  # at every round's end: a run stopped later (SIGTERM, Ctrl-C) keeps its report
        return result

    def last_evaluated_tokens(self) -> int:
        """Training tokens at the run's last held-out evaluation (0: the base, or none yet)."""
        done = [r["generated_tokens"] or 0 for r in self.rounds if r.get("eval_pass1") is not None]
        return done[-1] if done else 0

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.write_summary(trainer)
        if trainer.is_global_zero and self.rounds:
            cfg = self.port.eval
            log.info("held-out results (T=%s, %d samples per problem):\n%s", cfg.temperature, cfg.samples, self.table())
        written = self.write_report(trainer)
        if written:
            log.info("run report: %s, %s", *written)

    def write_report(self, trainer: L.Trainer) -> tuple[Path, Path] | None:
        """report.md and report.png beside summary.json (rank 0; None when nothing was written).
        `python -m flywheel report RUN_DIR` writes them again from summary.json."""
        log_dir = trainer.log_dir  # a collective under DDP: every rank must ask
        if not (trainer.is_global_zero and log_dir and self.rounds):
            return None
        return write_run_report(_finite(self.summary(trainer)), log_dir, title=Path(log_dir).parent.name)

    # ------------------------------------------------------------------ work
    def run_eval(self, trainer: L.Trainer, pl_module: L.LightningModule, label: str) -> dict[str, float]:
        port = self.port
        problems = port.eval_problems()
        mine = shard(problems, trainer.global_rank, trainer.world_size)  # uneven shards, no padding
        with wall_section(trainer, EVAL), sample_bar(port.generator, len(mine), port.eval.samples, f"eval {label}",
                                                     show=trainer.is_global_zero) as advance:
            result = evaluate_sharded(port.generator, pl_module.tokenizer, port.task, problems, port.eval,
                                      progress=advance, grade=port.grader.score)
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

    def record(self, trainer: L.Trainer, round_index: int, metrics: dict[str, Any]) -> None:
        """Add `metrics` to round `round_index`'s entry of summary.json (whichever callback
        finishes the round first) and rewrite the summary."""
        self.extras.setdefault(round_index, {}).update(metrics)
        self.write_summary(trainer)

    def record_run(self, trainer: L.Trainer, metrics: dict[str, Any]) -> None:
        """Set whole-run entries of summary.json (e.g. callbacks.wall_time's `wall_split`) and rewrite it."""
        self.run_extras.update(metrics)
        self.write_summary(trainer)

    def summary(self, trainer: L.Trainer) -> dict[str, Any]:
        cfg = self.port.eval
        rounds = [{**r, **self.extras.get(r["round"], {})} for r in self.rounds]
        return {
            "base_eval_pass1": self.base["pass1"] if self.base else None,
            "base_eval_passk": self.base["passk"] if self.base else None,
            "k": cfg.pass_k,
            "samples": cfg.samples,
            "temperature": cfg.temperature,
            "eval_problems": len(self.port.eval_problems()),
            "rounds": rounds,
            **self.run_extras,
        }

    def write_summary(self, trainer: L.Trainer) -> None:
        log_dir = trainer.log_dir  # a collective under DDP: every rank must ask
        if trainer.is_global_zero and log_dir:
            atomic_write_json(Path(log_dir) / "summary.json", _finite(self.summary(trainer)))

    def write_solved_problems(self, trainer: L.Trainer) -> None:
        """solved_problems.json beside summary.json: every training problem the run solved so far,
        from the data module's state (restored on resume), so the file is whole after each round."""
        log_dir = trainer.log_dir  # a collective under DDP: every rank must ask
        if trainer.is_global_zero and log_dir:
            atomic_write_json(Path(log_dir) / "solved_problems.json", self.port.solved_problems())

    def table(self) -> str:
        lines = [f"{'round':>5} {'epoch':>5} {'pass@1':>8} {'pass@k':>8} {'tokens':>12}"]
        if self.base:
            lines.append(f"{'base':>5} {'-':>5} {self.base['pass1']:8.4f} {self.base['passk']:8.4f} {0:>12}")
        for r in self.rounds:
            if r.get("eval_pass1") is None:  # skipped (--data.eval.every_tokens)
                continue
            lines.append(f"{r['round']:>5} {r['epoch']:>5} {r['eval_pass1']:8.4f} {r['eval_passk']:8.4f} {r['generated_tokens'] or 0:>12}")
        return "\n".join(lines)

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        return {"base": self.base, "rounds": self.rounds, "extras": self.extras, "wall_seconds": self.wall_seconds()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.base = state["base"]
        self.rounds = list(state["rounds"])
        self.extras = {int(k): dict(v) for k, v in state.get("extras", {}).items()}  # absent before it existed
        self._wall_before = float(state.get("wall_seconds", 0.0))


def config_file(trainer: L.Trainer) -> str | None:
    """The name of this part of the run's config file in the log folder (flywheel.run.settings)."""
    from lightning.pytorch.cli import SaveConfigCallback

    return next((c.config_filename for c in trainer.callbacks if isinstance(c, SaveConfigCallback)), None)


def _finite(obj: Any) -> Any:
    """JSON has no NaN: write missing numbers as null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj
