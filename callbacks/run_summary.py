"""RunSummary: the run's one record of results, written beside its logs and kept across resumes.

    summary.json          the base and per-round held-out pass@k (HeldOutEval), each round's
                          curriculum facts, and what the other parts add: a round's value-model
                          numbers (PRMUpdate), its wall split and the run's (WallTime), its
                          search staleness (RoundProtocol)
    solved_problems.json  every training problem the run solved so far (the data module's state)
    report.md, report.png the run report (flywheel.reporting.report), rewritten at every round's end

The CLI wiring (flywheel.run.cli.add_round_protocol) makes one and hands it to each part that
writes to it; no part looks for another among the trainer's callbacks. Rank 0 writes; every
rank asks `trainer.log_dir` (a collective under DDP).
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

from flywheel.io import atomic_write_json
from flywheel.ports import PortClient
from flywheel.reporting.report import write_run_report

log = logging.getLogger(__name__)

CURRICULUM_FACTS = ("hard_set_size", "cached", "generated_tokens")
"""The facts of `DataPort.round_facts` every round row has; any further ones are copied as given."""


class RunSummary(PortClient, Callback):
    """summary.json, solved_problems.json and the report of one run (above). The evaluation
    settings it describes and the solved problems are the data module's, read through the port."""

    def __init__(self) -> None:
        self.base: dict[str, float] | None = None
        """The held-out result before training (None: not evaluated)."""
        self.rounds: list[dict[str, Any]] = []
        """One row per round, in order (a partial round's row is replaced when the round ends)."""
        self.extras: dict[int, dict[str, Any]] = {}
        """Per-round numbers of the other parts (`record`), merged into the rounds when written."""
        self.run_extras: dict[str, Any] = {}
        """Whole-run numbers of the other parts (`record_run`), top-level keys of summary.json."""
        self._started = time.perf_counter()
        self._wall_before = 0.0
        """Wall seconds of the run before this process (restored on resume)."""
        self._fit_ended = False
        """`on_fit_end` ran: the report is drawn at teardown."""

    def wall_seconds(self) -> float:
        """Wall time of the run so far, over every resumed part."""
        return self._wall_before + time.perf_counter() - self._started

    # ------------------------------------------------------------------ hooks
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # The clock of the wall split (callbacks.wall_time) starts here too, so a round's
        # `wall_seconds` and its split agree; from `on_train_start` it missed the first
        # epoch's search (the data loader is built before it) in every part of a resumed run.
        if stage == "fit":
            self._started = time.perf_counter()

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.write(trainer)
        if trainer.is_global_zero and self.rounds:
            cfg = self.port.eval
            log.info("held-out results (T=%s, %d samples per problem):\n%s", cfg.temperature, cfg.samples, self.table())
        self._fit_ended = True

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """The report of a fit that ended, drawn after every callback's `on_fit_end`: the wall
        split (callbacks.wall_time) adds the last round's own time in its own, after this one's."""
        if stage != "fit" or not self._fit_ended:
            return
        self._fit_ended = False
        written = self.write_report(trainer)
        if written:
            log.info("run report: %s, %s", *written)

    # ------------------------------------------------------------------ what the parts add
    def set_base(self, trainer: L.Trainer, result: dict[str, float]) -> None:
        self.base = result
        self.write(trainer)

    def end_round(self, trainer: L.Trainer, row: dict[str, Any]) -> None:
        """Round `row["round"]`'s row, replacing a partial one of the same round; then every file
        is rewritten (a run stopped later, by SIGTERM or Ctrl-C, keeps its report)."""
        self.drop_round(row["round"])
        self.rounds.append(row)
        self.write(trainer)
        self.write_solved_problems(trainer)
        self.write_report(trainer)

    def drop_round(self, round_index: int) -> None:
        self.rounds = [r for r in self.rounds if r["round"] != round_index]

    def record(self, trainer: L.Trainer, round_index: int, metrics: dict[str, Any]) -> None:
        """Add `metrics` to round `round_index`'s entry (whichever part finishes the round first)."""
        self.extras.setdefault(round_index, {}).update(metrics)
        self.write(trainer)

    def record_run(self, trainer: L.Trainer, metrics: dict[str, Any]) -> None:
        """Set whole-run entries (e.g. WallTime's `wall_split`)."""
        self.run_extras.update(metrics)
        self.write(trainer)

    def last_evaluated_tokens(self) -> int:
        """Training tokens at the run's last held-out evaluation (0: the base, or none yet)."""
        done = [r["generated_tokens"] or 0 for r in self.rounds if r.get("eval_pass1") is not None]
        return done[-1] if done else 0

    # ------------------------------------------------------------------ the files
    def summary(self) -> dict[str, Any]:
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

    def write(self, trainer: L.Trainer) -> None:
        log_dir = trainer.log_dir  # a collective under DDP: every rank must ask
        if trainer.is_global_zero and log_dir:
            atomic_write_json(Path(log_dir) / "summary.json", finite(self.summary()))

    def write_solved_problems(self, trainer: L.Trainer) -> None:
        """Every training problem the run solved so far, from the data module's state (restored
        on resume), so the file is whole after each round."""
        log_dir = trainer.log_dir
        if trainer.is_global_zero and log_dir:
            atomic_write_json(Path(log_dir) / "solved_problems.json", self.port.solved_problems())

    def write_report(self, trainer: L.Trainer) -> tuple[Path, Path] | None:
        """report.md and report.png beside summary.json (None when nothing was written).
        `python -m flywheel report RUN_DIR` writes them again from summary.json."""
        log_dir = trainer.log_dir
        if not (trainer.is_global_zero and log_dir and self.rounds):
            return None
        return write_run_report(finite(self.summary()), log_dir, title=Path(log_dir).parent.name)

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
        return {"base": self.base, "rounds": self.rounds, "extras": self.extras, "run_extras": self.run_extras,
                "wall_seconds": self.wall_seconds()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Also reads a checkpoint from before the summary had its own state (HeldOutEval's, which
        held everything but `run_extras`: those come back as their parts close their next epoch)."""
        self.base = state["base"]
        self.rounds = list(state["rounds"])
        self.extras = {int(k): dict(v) for k, v in state.get("extras", {}).items()}
        self.run_extras = dict(state.get("run_extras", {}))
        self._wall_before = float(state.get("wall_seconds", 0.0))


def finite(obj: Any) -> Any:
    """JSON has no NaN: write missing numbers as null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [finite(v) for v in obj]
    return obj
