"""SearchDataModule: every epoch, the current policy searches this epoch's problems and the
finished trees become the epoch's training data (DESIGN.md, "Data flow of one epoch").
"""

from __future__ import annotations

import functools
import math
import logging
import random
import time
from dataclasses import replace
from typing import Any, Literal, Sequence

import lightning as L
import torch
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from data_modules.examples import TrainingRow, collate, empty_batch, rows_from_result
from data_modules.problems import load_problems
from flywheel.generation.backends import GeneratorBackend, HFBackend
from flywheel.evaluation import EvalConfig
from flywheel.generation.base import Generator
from flywheel.search.config import SearchConfig
from flywheel.search.driver import DriverStats, SearchDriver, SearchProblem, derive_seed
from flywheel.search.flat import flat_rollouts
from flywheel.search.outputs import TreeResult
from flywheel.tasks import Problem, Task
from flywheel.tasks.countdown import CountdownTask

log = logging.getLogger(__name__)

Rollout = Literal["search", "flat", "best_of_n"]


class SearchDataModule(L.LightningDataModule):
    """Regenerates the training data every epoch with the current policy.

    Args:
        task: the reasoning task (prompt format, step definition, verifier, built-in
            problems). Default: Countdown (`flywheel.tasks.countdown.CountdownTask`).
        generator: the sampling backend. Default: in-process transformers
            (`flywheel.generation.backends.HFBackend`).
        rollout: "search" = DeepSearch MCTS with Tree-GRPO advantages (default); "flat" =
            `flat_samples` independent responses per problem with DAPO advantages
            (reward - group mean); "best_of_n" = `flat_samples` responses, train on the
            correct ones only (rejection-sampling fine-tuning).
        search: the tree-search rules and their parameters (expansion width, K, selection...).
        flat_samples: responses per problem for the flat and best-of-N rollouts.
        train_files: jsonl/parquet problem files with `problem` and `answer` columns (or the
            task's own columns); default: the task's built-in `train_split`.
        train_split: built-in split used when `train_files` is not given.
        eval_files: held-out problem files; default: the task's built-in `eval_split`.
        eval_split: built-in held-out split.
        max_eval_problems: evaluate on the first this many held-out problems (None = all).
        eval: samples per problem, k, temperature of the held-out evaluation.
        problems_per_epoch: problems searched per epoch, over all ranks together.
        mini_batch_problems: problems per optimizer step (all trajectories of a problem stay
            in one mini-batch, as the group baseline needs).
        max_concurrent_trees: trees (or flat groups) kept in flight per generator call.
        epochs_per_round: epochs per flywheel round; at each round's end the held-out set
            is evaluated (and, with the hard-set callback, the hard set re-measured).
        normalize_std: divide advantages by the group's std (off: mean-only, paper Table 4).
        skip_bad_rows: skip and count malformed problem rows instead of failing on the first.
        seed: seed of the problem order and of the search.
    """

    def __init__(
        self,
        task: Task | None = None,
        generator: GeneratorBackend | None = None,
        rollout: Rollout = "search",
        search: SearchConfig = SearchConfig(),
        flat_samples: int = 8,
        train_files: list[str] | None = None,
        train_split: str = "train",
        eval_files: list[str] | None = None,
        eval_split: str = "test",
        max_eval_problems: int | None = None,
        eval: EvalConfig = EvalConfig(),
        problems_per_epoch: int = 64,
        mini_batch_problems: int = 8,
        max_concurrent_trees: int = 64,
        epochs_per_round: int = 1,
        normalize_std: bool = False,
        skip_bad_rows: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if rollout not in ("search", "flat", "best_of_n"):
            raise ValueError(f"--data.rollout={rollout!r}: choose 'search', 'flat' or 'best_of_n'")
        if problems_per_epoch < 1 or mini_batch_problems < 1:
            raise ValueError("--data.problems_per_epoch and --data.mini_batch_problems must be >= 1")
        if epochs_per_round < 1:
            raise ValueError(f"--data.epochs_per_round must be >= 1, got {epochs_per_round}")
        if flat_samples < 1:
            raise ValueError(f"--data.flat_samples must be >= 1, got {flat_samples}")
        self.task = task if task is not None else CountdownTask()
        self.backend = generator if generator is not None else HFBackend()
        self.rollout = rollout
        self.search = search
        self.flat_samples = flat_samples
        self.train_files = train_files
        self.train_split = train_split
        self.eval_files = eval_files
        self.eval_split = eval_split
        self.max_eval_problems = max_eval_problems
        self.eval = eval
        self.problems_per_epoch = problems_per_epoch
        self.mini_batch_problems = mini_batch_problems
        self.max_concurrent_trees = max_concurrent_trees
        self.epochs_per_round = epochs_per_round
        self.normalize_std = normalize_std
        self.skip_bad_rows = skip_bad_rows
        self.seed = seed
        self._train_pool: tuple[Problem, ...] | None = None
        self._eval_pool: tuple[Problem, ...] | None = None
        self._generator: Generator | None = None
        self.cursor = 0
        """Problems of the shuffled training stream consumed so far (restored on resume)."""
        self.generated_tokens = 0
        """Tokens generated for training over the run (evaluation excluded)."""
        self.epoch_metrics: dict[str, float] = {}
        self.hard_set_size: int | None = None
        """Problems in the hard set (None while no hard set is kept)."""
        self.cached_count: int | None = None
        """Problems with cached solutions in the replay buffer (None while there is none)."""

    # ------------------------------------------------------------------ problems
    def train_pool(self) -> tuple[Problem, ...]:
        if self._train_pool is None:
            loaded = load_problems(self.task, self.train_files, self.train_split, skip_bad_rows=self.skip_bad_rows)
            self._train_pool = loaded.problems
            self.skipped_rows = loaded.skipped
        return self._train_pool

    def eval_problems(self) -> tuple[Problem, ...]:
        if self._eval_pool is None:
            loaded = load_problems(
                self.task, self.eval_files, self.eval_split, skip_bad_rows=self.skip_bad_rows, limit=self.max_eval_problems
            )
            self._eval_pool = loaded.problems
        return self._eval_pool

    def next_problems(self, count: int) -> list[Problem]:
        """The next `count` problems of an endless stream: each pass over the pool is a fresh
        seeded permutation, so the order depends only on (seed, cursor)."""
        pool = self.train_pool()
        out = []
        while len(out) < count:
            epoch_pass, offset = divmod(self.cursor, len(pool))
            order = list(range(len(pool)))
            random.Random(f"{self.seed}:{epoch_pass}").shuffle(order)
            take = min(count - len(out), len(pool) - offset)
            out.extend(pool[i] for i in order[offset : offset + take])
            self.cursor += take
        return out

    # ------------------------------------------------------------------ generation
    def generator(self, module: L.LightningModule) -> Generator:
        if self._generator is None:
            self._generator = self.backend.build(module.policy, module.tokenizer)
        return self._generator

    def encode_prompt(self, tokenizer: Any, problem: Problem) -> tuple[int, ...]:
        return tuple(tokenizer(self.task.prompt(problem))["input_ids"])

    def search_problems(self, tokenizer: Any, problems: Sequence[Problem]) -> list[SearchProblem]:
        return [
            SearchProblem(prompt_ids=self.encode_prompt(tokenizer, p), score=functools.partial(self.task.score, p), id=p.id)
            for p in problems
        ]

    def effective_search_config(self, epoch: int, rank: int) -> SearchConfig:
        """The search config of one (epoch, rank): `search` with a fresh seed."""
        return replace(self.search, seed=derive_seed(self.search.seed, self.seed, epoch, rank))

    def rollouts(self, module: L.LightningModule, problems: Sequence[Problem], epoch: int, rank: int) -> tuple[list[TreeResult], DriverStats]:
        tokenizer = module.tokenizer
        generator = self.generator(module)
        config = self.effective_search_config(epoch, rank)
        decode = functools.partial(tokenizer.decode, skip_special_tokens=True)
        eos_ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        items = self.search_problems(tokenizer, problems)
        bar = tqdm(total=len(items), desc=f"epoch {epoch} {self.rollout}", unit="tree", leave=False, disable=rank != 0)
        stats = DriverStats()
        try:
            if self.rollout == "search":
                driver = SearchDriver(
                    generator, config, step=self.task.step, decode=decode, max_concurrent_trees=self.max_concurrent_trees,
                    eos_token_ids=eos_ids, progress=lambda p: _advance(bar, p.trees_done, p.generated_tokens),
                )
                results = driver.run(items)
                stats = driver.stats
            else:
                results = flat_rollouts(
                    items, generator, n=self.flat_samples, step=self.task.step, decode=decode, config=config,
                    max_concurrent_problems=self.max_concurrent_trees, eos_token_ids=eos_ids, stats=stats,
                    progress=lambda done: _advance(bar, done, None),
                )
        finally:
            bar.close()
        return results, stats

    # ------------------------------------------------------------------ the epoch
    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        progress = trainer.fit_loop.epoch_progress.current
        if progress.processed > progress.completed:
            # Resuming from an end-of-epoch checkpoint: Lightning builds this loader for the
            # finished epoch and never iterates it; don't search for it (lightning-cpu.md §2).
            return DataLoader([], batch_size=None)
        module = trainer.lightning_module
        epoch, rank, world = trainer.current_epoch, trainer.global_rank, trainer.world_size
        problems = self.next_problems(self.problems_per_epoch)[rank::world]
        start = time.perf_counter()
        results, stats = self.rollouts(module, problems, epoch, rank)
        seconds = time.perf_counter() - start
        weighting = "best_of_n" if self.rollout == "best_of_n" else "advantage"
        per_problem = [rows_from_result(r, group=i, weighting=weighting, normalize_std=self.normalize_std) for i, r in enumerate(results)]
        # Every rank makes the same number of optimizer steps, or DDP's gradient all-reduce
        # would hang: a mini-batch slot with nothing to train on becomes an all-masked batch.
        slots = math.ceil(math.ceil(self.problems_per_epoch / world) / self.mini_batch_problems)
        batches = []
        for slot in range(slots):
            first = slot * self.mini_batch_problems
            rows: list[TrainingRow] = [row for group in per_problem[first : first + self.mini_batch_problems] for row in group]
            if rows:
                batch = collate(rows, pad_id=module.tokenizer.pad_token_id)
                batch["old_logprobs"] = module.score_batch(batch) if module.old_logprobs != "behaviour" else batch["behaviour_logprobs"]
            elif world > 1:
                batch = empty_batch(pad_id=module.tokenizer.pad_token_id)
            else:
                continue
            batches.append(batch)
        self.generated_tokens += stats.generated_tokens
        self.epoch_metrics = _epoch_metrics(results, stats, seconds, self.generated_tokens, self._generator)
        log.info(
            "epoch %d: %d %s rollouts, %d training rows in %d mini-batches, reward %.3f, %.1f s",
            epoch, len(results), self.rollout, sum(len(g) for g in per_problem), len(batches),
            self.epoch_metrics.get("search/reward", float("nan")), seconds,
        )
        return DataLoader(batches, batch_size=None, shuffle=False)

    # ------------------------------------------------------------------ validate / test
    def val_dataloader(self) -> DataLoader:
        """Held-out problems in chunks, for `flywheel validate|test`. Empty during `fit`,
        where the HeldOutEval callback evaluates once per round instead."""
        if self.trainer is not None and self.trainer.state.fn == "fit":
            return DataLoader([], batch_size=None)
        problems = list(self.eval_problems())
        if self.trainer is not None:
            problems = problems[self.trainer.global_rank :: self.trainer.world_size]
        chunk = self.eval.problems_per_batch
        return DataLoader([problems[i : i + chunk] for i in range(0, len(problems), chunk)], batch_size=None, collate_fn=list)

    test_dataloader = val_dataloader

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        return {"cursor": self.cursor, "generated_tokens": self.generated_tokens}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cursor = int(state["cursor"])
        self.generated_tokens = int(state["generated_tokens"])


def _advance(bar: tqdm, done: int, tokens: int | None) -> None:
    bar.update(done - bar.n)
    if tokens is not None:
        bar.set_postfix(tokens=tokens, refresh=False)


def _epoch_metrics(results: Sequence[TreeResult], stats: DriverStats, seconds: float, cumulative_tokens: int, generator: Generator | None) -> dict[str, float]:
    trajectories = [t for r in results for t in r.trajectories]
    metrics = {
        "search/seconds": seconds,
        "search/trees": float(len(results)),
        "search/trees_short": float(sum(not r.complete for r in results)),
        "search/iterations_per_tree": sum(r.stats.expansions for r in results) / max(len(results), 1),
        "search/nodes_per_tree": sum(r.stats.nodes for r in results) / max(len(results), 1),
        "search/depth": sum(len(t.steps) for t in trajectories) / max(len(trajectories), 1),
        "search/max_depth": float(max((r.stats.max_depth for r in results), default=0)),
        "search/reward": sum(t.reward for t in trajectories) / max(len(trajectories), 1),
        "search/correct_fraction": sum(t.verdict.correct for t in trajectories) / max(len(trajectories), 1),
        "search/solved_fraction": sum(any(t.verdict.correct for t in r.trajectories) for r in results) / max(len(results), 1),
        "search/overhead_pct": stats.overhead_pct,
        "compute/generated_tokens": float(cumulative_tokens),
        "compute/epoch_generated_tokens": float(stats.generated_tokens),
    }
    if generator is not None:
        g = generator.stats
        metrics["compute/prefill_tokens"] = float(g.prefill_tokens)
        metrics["compute/prompt_tokens"] = float(g.prompt_tokens)
        metrics["compute/prefill_saved_tokens"] = float(g.prompt_tokens - g.prefill_tokens)
    return metrics
