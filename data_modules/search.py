"""SearchDataModule: every epoch, the current policy searches this epoch's problems and the
finished trees become the epoch's training data (DESIGN.md, "Data flow of one epoch").

Adaptive training (deepsearch.md §7) lives here as data-module state, so it is saved in
every checkpoint and restored by `--ckpt_path`: the Pass1@K hard set (screened with the
base policy, re-measured and shrunk at every round's end by the HardSetRefresh callback)
and the replay buffer of cached correct solutions (buffered problems get mixed rollouts
instead of a tree search).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, Sequence

import lightning as L
import torch
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from data_modules.examples import TrainingRow, collate, empty_batch, fill_behaviour, mixed_rows, rows_from_result
from data_modules.problems import load_problems
from flywheel.adaptive import (
    CachedSolution,
    DegenerateFilter,
    HardSet,
    HardSetConfig,
    ReplayBuffer,
    ReplayConfig,
    direct_samples_needed,
    pass1_rates,
)
from flywheel.evaluation import EvalConfig, encode_prompt, evaluate
from flywheel.generation.backends import GeneratorBackend, HFBackend
from flywheel.generation.base import Generator
from flywheel.io import atomic_write_bytes, atomic_write_json
from flywheel.search.config import SearchConfig
from flywheel.search.driver import DriverStats, SearchDriver, SearchProblem, derive_seed
from flywheel.search.flat import flat_rollouts
from flywheel.search.outputs import Trajectory, TreeResult
from flywheel.tasks import Problem, Task
from flywheel.tasks.countdown import CountdownTask

log = logging.getLogger(__name__)

Rollout = Literal["search", "flat", "best_of_n"]
STATE_FORMAT = "flywheel.search_data_module/v1"


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
        hard_set: the Pass1@K hard set: screening samples K, threshold delta, screening
            temperature (deepsearch.md §7). `--data.hard_set.enabled=false` trains on every
            problem.
        replay: the replay buffer of cached correct solutions and its registration rule.
        degenerate_filter: incorrect responses with garbled text or endless repetition are
            left out of training (deepsearch.md §7).
        train_files: jsonl/parquet problem files with `problem` and `answer` columns (or the
            task's own columns); default: the task's built-in `train_split`.
        train_split: built-in split used when `train_files` is not given.
        max_train_problems: use a seeded random subset of at most this many training
            problems (None = all); the hard set is screened from it.
        eval_files: held-out problem files; default: the task's built-in `eval_split`.
        eval_split: built-in held-out split.
        max_eval_problems: evaluate on the first this many held-out problems (None = all).
        eval: samples per problem, k, temperature of the held-out evaluation.
        problems_per_epoch: problems searched per epoch, over all ranks together.
        mini_batch_problems: problems per optimizer step (all trajectories of a problem stay
            in one mini-batch, as the group baseline needs).
        max_concurrent_trees: trees (or flat groups) kept in flight per generator call.
        epochs_per_round: epochs per flywheel round; at each round's end the hard set is
            re-measured and the held-out set evaluated.
        advantage: how a tree's trajectories are credited: "node" = Tree-GRPO node-level
            values q~(s_j) minus the tree's mean final score (the paper's default); "outcome"
            = every token gets its trajectory's final score minus the tree mean (the paper's
            "coarse scores" ablation); "subtree" = the TreeRL rule: a step's value is the mean
            final score of the tree's trajectories through it, credited against its parent and
            the root, scaled by 1 / sqrt(trajectories sharing it) (an all-wrong tree gives 0).
            Flat rollouts are DAPO either way.
        normalize_std: divide advantages by the group's std (off: mean-only, paper Table 4).
        drop_uniform_groups: leave out of training every tree (or flat group) whose
            trajectories all ended with the same final score (all wrong, or all right), as
            DAPO's dynamic sampling does (without refilling). Off in the paper and its code;
            with node values such a tree still carries a signal (its early steps score
            above the all-wrong mean), which is what this switch removes.
        skip_bad_rows: skip and count malformed problem rows instead of failing on the first.
        save_trees: trees (or flat groups) of each epoch written to
            `<log_dir>/trees/epoch_NNNN.jsonl` for the viewer (`python -m flywheel tree`); the
            first ones searched on rank 0; 0 = none.
        seed: seed of the problem order and of the search.
    """

    def __init__(
        self,
        task: Task | None = None,
        generator: GeneratorBackend | None = None,
        rollout: Rollout = "search",
        search: SearchConfig = SearchConfig(),
        flat_samples: int = 8,
        hard_set: HardSetConfig = HardSetConfig(),
        replay: ReplayConfig = ReplayConfig(),
        degenerate_filter: DegenerateFilter = DegenerateFilter(),
        train_files: list[str] | None = None,
        train_split: str = "train",
        max_train_problems: int | None = None,
        eval_files: list[str] | None = None,
        eval_split: str = "test",
        max_eval_problems: int | None = None,
        eval: EvalConfig = EvalConfig(),
        problems_per_epoch: int = 64,
        mini_batch_problems: int = 8,
        max_concurrent_trees: int = 64,
        epochs_per_round: int = 1,
        advantage: Literal["node", "outcome", "subtree"] = "node",
        normalize_std: bool = False,
        drop_uniform_groups: bool = False,
        skip_bad_rows: bool = False,
        save_trees: int = 2,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if rollout not in ("search", "flat", "best_of_n"):
            raise ValueError(f"--data.rollout={rollout!r}: choose 'search', 'flat' or 'best_of_n'")
        if problems_per_epoch < 1 or mini_batch_problems < 1:
            raise ValueError("--data.problems_per_epoch and --data.mini_batch_problems must be >= 1")
        if epochs_per_round < 1:
            raise ValueError(f"--data.epochs_per_round must be >= 1, got {epochs_per_round}")
        if advantage not in ("node", "outcome", "subtree"):
            raise ValueError(f"--data.advantage={advantage!r}: choose 'node' (Tree-GRPO), 'outcome' or 'subtree'")
        if flat_samples < 1:
            raise ValueError(f"--data.flat_samples must be >= 1, got {flat_samples}")
        if max_train_problems is not None and max_train_problems < 1:
            raise ValueError(f"--data.max_train_problems must be >= 1 or null, got {max_train_problems}")
        self.task = task if task is not None else CountdownTask()
        self.backend = generator if generator is not None else HFBackend()
        self.rollout = rollout
        self.search = search
        self.flat_samples = flat_samples
        self.hard_set_config = hard_set
        self.replay_config = replay
        self.degenerate_filter = degenerate_filter
        self.train_files = train_files
        self.train_split = train_split
        self.max_train_problems = max_train_problems
        self.eval_files = eval_files
        self.eval_split = eval_split
        self.max_eval_problems = max_eval_problems
        self.eval = eval
        self.problems_per_epoch = problems_per_epoch
        self.mini_batch_problems = mini_batch_problems
        self.max_concurrent_trees = max_concurrent_trees
        self.epochs_per_round = epochs_per_round
        self.advantage = advantage
        self.normalize_std = normalize_std
        self.drop_uniform_groups = drop_uniform_groups
        self.skip_bad_rows = skip_bad_rows
        if save_trees < 0:
            raise ValueError(f"--data.save_trees must be >= 0, got {save_trees}")
        self.save_trees = save_trees
        self.seed = seed
        self._train_pool: dict[str, Problem] | None = None
        self._eval_pool: tuple[Problem, ...] | None = None
        self._generator: Generator | None = None
        self._synced_step = 0
        self.skipped_rows = 0
        # State restored on resume (state_dict / load_state_dict):
        self.hard: HardSet | None = None
        """The current hard set; None until the first epoch screens it."""
        self.buffer = ReplayBuffer(replay)
        self.round = 0
        """Flywheel rounds completed."""
        self.cursor = 0
        """Problems of this round's shuffled hard-set stream consumed so far."""
        self.generated_tokens = 0
        """Tokens generated for training over the run (evaluation and screening excluded)."""
        self.screening_tokens = 0
        self.epoch_metrics: dict[str, float] = {}
        self.uniform_groups = 0
        """Groups left out of this epoch's training by `drop_uniform_groups`."""
        self.last_results: list[TreeResult] = []
        """This epoch's finished trees on this rank (read by the PRMUpdate callback)."""
        self.value_fn = None
        """A value model scoring new search nodes (set by PRMUpdate; None = none)."""

    # ------------------------------------------------------------------ problems
    def train_pool(self) -> dict[str, Problem]:
        """Training problems by id (a seeded subset when `max_train_problems` is set)."""
        if self._train_pool is None:
            loaded = load_problems(self.task, self.train_files, self.train_split, skip_bad_rows=self.skip_bad_rows)
            problems = list(loaded.problems)
            if self.max_train_problems is not None and len(problems) > self.max_train_problems:
                problems = random.Random(f"{self.seed}:subset").sample(problems, self.max_train_problems)
            self._train_pool = {p.id: p for p in problems}
            self.skipped_rows = loaded.skipped
        return self._train_pool

    def eval_problems(self) -> tuple[Problem, ...]:
        if self._eval_pool is None:
            loaded = load_problems(
                self.task, self.eval_files, self.eval_split, skip_bad_rows=self.skip_bad_rows, limit=self.max_eval_problems
            )
            self._eval_pool = loaded.problems
        return self._eval_pool

    @property
    def hard_set_size(self) -> int | None:
        return len(self.hard) if self.hard is not None else None

    @property
    def cached_count(self) -> int:
        return len(self.buffer)

    def next_problems(self, count: int) -> list[Problem]:
        """The next `count` problems of this round's endless stream over the hard set: each
        pass is a fresh seeded permutation, so the order depends only on (seed, round, cursor)."""
        pool = self.train_pool()
        ids = [i for i in self.hard.ids if i in pool] if self.hard is not None else list(pool)
        if not ids:
            return []
        out: list[Problem] = []
        while len(out) < count:
            epoch_pass, offset = divmod(self.cursor, len(ids))
            order = list(range(len(ids)))
            random.Random(f"{self.seed}:{self.round}:{epoch_pass}").shuffle(order)
            take = min(count - len(out), len(ids) - offset)
            out.extend(pool[ids[i]] for i in order[offset : offset + take])
            self.cursor += take
        return out

    # ------------------------------------------------------------------ generation
    def generator(self, module: L.LightningModule) -> Generator:
        """The backend's generator, in step with the policy: an out-of-process backend (the
        vLLM sidecar) gets the weights pushed whenever optimizer steps happened since the
        last push (before the epoch's search, a screening or an evaluation)."""
        step = self.trainer.global_step if self.trainer is not None else 0
        if self._generator is None:
            strategy = self.trainer.strategy if self.trainer is not None else None
            log_dir = self.trainer.log_dir if self.trainer is not None else None  # collective under DDP
            if log_dir:
                self.backend.run_dir = Path(log_dir)
            self._generator = self.backend.build(module.policy, module.tokenizer, strategy)
            self._synced_step = step
        elif step != self._synced_step:
            self.backend.sync_weights(module.policy, version=step)
            self._synced_step = step
        return self._generator

    def teardown(self, stage: str) -> None:
        """Release the generator backend (stops a launched vLLM server)."""
        if self._generator is not None:
            self.backend.close()
            self._generator = None

    def search_problems(self, tokenizer: Any, problems: Sequence[Problem]) -> list[SearchProblem]:
        return [
            SearchProblem(prompt_ids=encode_prompt(tokenizer, self.task, p), score=functools.partial(self.task.score, p), id=p.id)
            for p in problems
        ]

    def effective_search_config(self, epoch: int, rank: int) -> SearchConfig:
        """The search config of one (epoch, rank): a fresh seed, all else as configured."""
        return replace(self.search, seed=derive_seed(self.search.seed, self.seed, epoch, rank))

    def _search(self, module, problems, config, bar) -> tuple[list[TreeResult], DriverStats]:
        tokenizer = module.tokenizer
        driver = SearchDriver(
            self.generator(module), config, step=self.task.step, decode=_decoder(tokenizer),
            max_concurrent_trees=self.max_concurrent_trees, eos_token_ids=_eos(tokenizer),
            progress=lambda p: _advance(bar, p.trees_done, p.generated_tokens),
            value_fn=self.value_fn if config.prm_weight > 0 else _value_head_fn(module, config),
        )
        return driver.run(self.search_problems(tokenizer, problems)), driver.stats

    def _flat(self, module, problems, n, config, stats, on_done) -> list[TreeResult]:
        tokenizer = module.tokenizer
        return flat_rollouts(
            self.search_problems(tokenizer, problems), self.generator(module), n=n, step=self.task.step,
            decode=_decoder(tokenizer), config=config, max_concurrent_problems=self.max_concurrent_trees,
            eos_token_ids=_eos(tokenizer), stats=stats, progress=on_done,
        )

    # ------------------------------------------------------------------ hard set
    def screen(self, module: L.LightningModule, ids: Sequence[str], label: str) -> dict[str, float]:
        """Pass1@K of `ids` under the current policy (K samples at the screening temperature),
        computed on every rank's shard and gathered, so every rank gets the same rates."""
        cfg = self.hard_set_config
        trainer = self.trainer
        pool = self.train_pool()
        shard = [pool[i] for i in ids[trainer.global_rank :: trainer.world_size]]
        config = EvalConfig(samples=cfg.k, temperature=cfg.temperature, top_p=cfg.top_p, seed=derive_seed(self.seed, self.round, 7))
        bar = tqdm(total=len(shard), desc=f"screen {label}", unit="problem", leave=False, disable=not trainer.is_global_zero)
        result = evaluate(self.generator(module), module.tokenizer, self.task, shard, config, progress=lambda d: bar.update(d - bar.n))
        bar.close()
        self.screening_tokens += result.generated_tokens
        gathered = all_gather(trainer, (result.problem_ids, result.samples, result.correct))
        return pass1_rates(*(sum((list(part[i]) for part in gathered), []) for i in range(3)))

    def ensure_hard_set(self, module: L.LightningModule) -> None:
        """D_hard(0): screen the training pool with the policy as it starts (Eq. 8)."""
        if self.hard is not None:
            return
        ids = list(self.train_pool())
        rates = self.screen(module, ids, "base") if self.hard_set_config.enabled else {}
        self.hard = HardSet.initial(ids, rates, self.hard_set_config)
        if not self.hard_set_config.enabled:
            log.info("hard set off: training on all %d problems", len(ids))
            return
        log.info("hard set: %d of %d training problems have Pass1@%d %s %.2f under the base policy",
                 len(self.hard), len(ids), self.hard_set_config.k, "<" if self.hard_set_config.comparison == "lt" else "<=",
                 self.hard_set_config.delta)

    def end_round(self, module: L.LightningModule) -> dict[str, float]:
        """A flywheel round's end: re-measure the hard set with the trained policy and shrink
        it (Eq. 9); settle the replay buffer's candidates against the same rates."""
        assert self.hard is not None, "end_round before the first epoch screened the hard set"
        rates = self.screen(module, self.hard.ids, f"round {self.round + 1}") if self.hard_set_config.enabled else {}
        before = len(self.hard)
        self.hard = self.hard.refresh(rates)
        registered = self.buffer.settle(rates)
        self.buffer.retain(self.hard.ids)
        self.round += 1
        self.cursor = 0
        self.persist()
        log.info("round %d: hard set %d -> %d, %d newly cached, %d problems in the replay buffer",
                 self.round, before, len(self.hard), len(registered), len(self.buffer))
        return {"round/hard_set_size": float(len(self.hard)), "round/cached": float(len(self.buffer))}

    def persist(self) -> None:
        """Write the hard set and the replay buffer to the run directory (atomically)."""
        trainer = self.trainer
        if trainer is None:
            return
        log_dir = trainer.log_dir  # a collective under DDP: every rank must ask
        if not trainer.is_global_zero or not log_dir:
            return
        folder = Path(log_dir) / "flywheel_state"
        if self.hard is not None:
            atomic_write_json(folder / "hard_set.json", self.hard.to_dict())
        atomic_write_json(folder / "replay_buffer.json", self.buffer.to_dict())

    def write_trees(self, module: L.LightningModule, results: Sequence[TreeResult], epoch: int) -> None:
        """The epoch's first `save_trees` trees as JSON lines, for the tree viewer (rank 0)."""
        trainer = self.trainer
        log_dir = trainer.log_dir  # a collective under DDP: every rank must ask
        if not self.save_trees or not trainer.is_global_zero or not log_dir or not results:
            return
        decode = _decoder(module.tokenizer)
        lines = [json.dumps(r.to_json(decode, logprobs=False)) for r in results[: self.save_trees]]
        atomic_write_bytes(Path(log_dir) / "trees" / f"epoch_{epoch:04d}.jsonl", ("\n".join(lines) + "\n").encode())

    # ------------------------------------------------------------------ the epoch
    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        progress = trainer.fit_loop.epoch_progress.current
        if progress.processed > progress.completed:
            # Resuming from an end-of-epoch checkpoint: Lightning builds this loader for the
            # finished epoch and never iterates it; don't search for it (lightning-cpu.md §2).
            # It must not be empty, or the fit loop stops at once ("No training batches").
            return DataLoader([empty_batch(pad_id=trainer.lightning_module.tokenizer.pad_token_id)], batch_size=None)
        module = trainer.lightning_module
        epoch, rank, world = trainer.current_epoch, trainer.global_rank, trainer.world_size
        start = time.perf_counter()
        self.generator(module)  # every rank at once: a sidecar's launch and weight sync are collective
        self.ensure_hard_set(module)
        problems = self.next_problems(self.problems_per_epoch)[rank::world]
        per_problem, results, stats = self.rollouts(module, problems, epoch, rank)
        self.last_results = results
        seconds = time.perf_counter() - start
        batches = self.mini_batches(module, per_problem, world)
        self.generated_tokens += _all_sum(trainer, stats.generated_tokens)
        self.epoch_metrics = _epoch_metrics(results, stats, seconds, self.generated_tokens, self._generator)
        self.epoch_metrics.update({"data/hard_set_size": float(len(self.hard)), "data/cached": float(len(self.buffer)),
                                   "data/uniform_groups_dropped": float(self.uniform_groups),
                                   "compute/screening_tokens": float(self.screening_tokens)})
        self.persist()
        self.write_trees(module, results, epoch)
        log.info(
            "epoch %d: %d problems (%d cached), %d training rows in %d mini-batches, reward %.3f, %.1f s",
            epoch, len(problems), sum(p.id in self.buffer for p in problems), sum(len(g) for g in per_problem),
            len(batches), self.epoch_metrics.get("search/reward", float("nan")), seconds,
        )
        return DataLoader(batches, batch_size=None, shuffle=False)

    def rollouts(self, module, problems: Sequence[Problem], epoch: int, rank: int):
        """Training rows per problem (in problem order), the rollout results and their cost.

        Tree search for the problems without cached solutions; mixed rollouts (cached +
        direct samples, outcome reward) for the problems in the replay buffer."""
        config = self.effective_search_config(epoch, rank)
        buffered = [p for p in problems if p.id in self.buffer]
        fresh = [p for p in problems if p.id not in self.buffer]
        stats = DriverStats()
        results: dict[str, TreeResult] = {}
        rows: dict[str, list[TrainingRow]] = {}
        drop = self._drop_degenerate
        bar = tqdm(total=len(problems), desc=f"epoch {epoch} {self.rollout}", unit="problem", leave=False, disable=rank != 0)
        try:
            if self.rollout == "search" and fresh:
                found, search_stats = self._search(module, fresh, config, bar)
                stats = search_stats
                for problem, result in zip(fresh, found):
                    results[problem.id] = result
                    rows[problem.id] = rows_from_result(result, 0, self.advantage, self.normalize_std, drop=drop)
            elif fresh:
                weighting = "best_of_n" if self.rollout == "best_of_n" else "node"
                found = self._flat(module, fresh, self.flat_samples, config, stats, lambda done: _advance(bar, done, None))
                for problem, result in zip(fresh, found):
                    results[problem.id] = result
                    rows[problem.id] = rows_from_result(result, 0, weighting, self.normalize_std, drop=drop)
            n = self.search.trajectories_per_tree if self.rollout == "search" else self.flat_samples
            by_need: dict[int, list[Problem]] = {}
            for problem in buffered:
                by_need.setdefault(direct_samples_needed(len(self.buffer.solutions(problem.id)), n), []).append(problem)
            for need, group in by_need.items():
                direct = self._flat(module, group, need, config, stats, None) if need else [None] * len(group)
                for problem, result in zip(group, direct):
                    trajectories = result.trajectories if result is not None else ()
                    if result is not None:
                        results[problem.id] = result
                    rows[problem.id] = mixed_rows(
                        problem.id, encode_prompt(module.tokenizer, self.task, problem), self.buffer.solutions(problem.id),
                        trajectories, 0, n, self.normalize_std, drop,
                    )
        finally:
            bar.close()
        if self.rollout == "search":
            self._observe(fresh, results)
        self.uniform_groups = 0
        if self.drop_uniform_groups:
            for problem in problems:
                if problem.id in self.buffer:  # cached + direct samples: every row is kept
                    finals = {row.reward for row in rows[problem.id]}
                else:  # every trajectory of the search, the degenerate ones included
                    finals = {t.final_score for t in results[problem.id].trajectories}
                if len(finals) <= 1 and rows[problem.id]:
                    self.uniform_groups += 1
                    rows[problem.id] = []
        ordered = [results[p.id] for p in problems if p.id in results]
        return [rows[p.id] for p in problems], ordered, stats

    def _drop_degenerate(self, trajectory: Trajectory) -> bool:
        return not trajectory.verdict.correct and self.degenerate_filter(trajectory.response_text, trajectory.response_ids) is not None

    def _observe(self, problems: Sequence[Problem], results: dict[str, TreeResult]) -> None:
        """Offer every finished search to the replay buffer (same order on every rank)."""
        local = [
            (p.id, [(t.response_ids, t.response_text) for t in results[p.id].trajectories if t.verdict.correct],
             len(results[p.id].trajectories))
            for p in problems
        ]
        for part in all_gather(self.trainer, local):
            for problem_id, correct, count in part:
                if count:
                    responses = [CachedSolution(problem_id, tuple(ids), text, self.round) for ids, text in correct]
                    self.buffer.observe(problem_id, responses, round=self.round, search_trajectories=count)

    def mini_batches(self, module, per_problem: list[list[TrainingRow]], world: int) -> list[dict[str, torch.Tensor]]:
        # Every rank makes the same number of optimizer steps, or DDP's gradient all-reduce
        # would hang: a mini-batch slot with nothing to train on becomes an all-masked batch.
        slots = math.ceil(math.ceil(self.problems_per_epoch / world) / self.mini_batch_problems)
        pad_id = module.tokenizer.pad_token_id
        batches = []
        for slot in range(slots):
            first = slot * self.mini_batch_problems
            rows = [row for group, problem_rows in enumerate(per_problem[first : first + self.mini_batch_problems])
                    for row in _regroup(problem_rows, group)]
            if rows:
                batch = collate(rows, pad_id=pad_id)
                fill_behaviour(batch, module.score_batch(batch))
            elif world > 1:
                batch = empty_batch(pad_id=pad_id)
            else:
                continue
            batches.append(batch)
        return batches

    # ------------------------------------------------------------------ validate / test
    def val_dataloader(self) -> DataLoader:
        """Held-out problems in chunks, for `flywheel validate|test`. Empty during `fit`,
        where the HeldOutEval callback evaluates once per round instead."""
        if self.trainer is not None and self.trainer.state.fn == "fit":
            return DataLoader([], batch_size=None)
        # Batches are lists of positions in eval_problems(): Lightning's batch transfer cannot
        # walk frozen dataclasses, so the problems themselves stay here.
        positions = list(range(len(self.eval_problems())))
        if self.trainer is not None:
            positions = positions[self.trainer.global_rank :: self.trainer.world_size]
        chunk = self.eval.problems_per_batch
        return DataLoader([positions[i : i + chunk] for i in range(0, len(positions), chunk)], batch_size=None, collate_fn=list)

    test_dataloader = val_dataloader

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "round": self.round,
            "cursor": self.cursor,
            "generated_tokens": self.generated_tokens,
            "screening_tokens": self.screening_tokens,
            "hard_set": self.hard.to_dict() if self.hard is not None else None,
            "replay_buffer": self.buffer.to_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("format") != STATE_FORMAT:
            raise ValueError(
                f"the checkpoint's SearchDataModule state has format {state.get('format')!r}, expected "
                f"{STATE_FORMAT!r}: it was written by another flywheel version; start a new run without --ckpt_path"
            )
        try:
            self.round = int(state["round"])
            self.cursor = int(state["cursor"])
            self.generated_tokens = int(state["generated_tokens"])
            self.screening_tokens = int(state["screening_tokens"])
            self.hard = HardSet.from_dict(state["hard_set"], self.hard_set_config) if state["hard_set"] is not None else None
            self.buffer = ReplayBuffer.from_dict(state["replay_buffer"], self.replay_config)
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            source = getattr(self.trainer, "ckpt_path", None)
            raise ValueError(
                f"the SearchDataModule state in checkpoint {source or '(unknown file)'} is malformed "
                f"({type(err).__name__}: {err}); nothing was restored. Way out: resume from another checkpoint of "
                "the run (--ckpt_path FILE), or start again without --ckpt_path"
            ) from err


def _value_head_fn(module, config: SearchConfig):
    """The policy's own value head as the search's value function (search.selection=puct_agents)."""
    if config.selection == "puct_agents" and getattr(module, "value_head", None) is not None:
        return module.search_values
    return None


def _regroup(rows: list[TrainingRow], group: int) -> list[TrainingRow]:
    return [replace(row, group=group) for row in rows]


def _decoder(tokenizer: Any):
    return functools.partial(tokenizer.decode, skip_special_tokens=True)


def _eos(tokenizer: Any) -> list[int]:
    return [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []


def all_gather(trainer: L.Trainer, obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order (a list of one outside distributed runs)."""
    if trainer.world_size == 1 or not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return [obj]
    out: list[Any] = [None] * trainer.world_size
    torch.distributed.all_gather_object(out, obj)
    return out


def _all_sum(trainer: L.Trainer, value: int) -> int:
    return sum(all_gather(trainer, value))


def _advance(bar: tqdm, done: int, tokens: int | None) -> None:
    bar.update(done - bar.n)
    if tokens is not None:
        bar.set_postfix(tokens=tokens, refresh=False)


def _epoch_metrics(results: Sequence[TreeResult], stats: DriverStats, seconds: float, cumulative_tokens: int, generator: Generator | None) -> dict[str, float]:
    searched = [r for r in results if r.mode == "search"]
    trajectories = [t for r in results for t in r.trajectories]
    metrics = {
        "search/seconds": seconds,
        "search/trees": float(len(searched)),
        "search/trees_short": float(sum(not r.complete for r in searched)),
        "search/iterations_per_tree": sum(r.stats.expansions for r in searched) / max(len(searched), 1),
        "search/nodes_per_tree": sum(r.stats.nodes for r in searched) / max(len(searched), 1),
        "search/depth": sum(len(t.steps) for t in trajectories) / max(len(trajectories), 1),
        "search/max_depth": float(max((r.stats.max_depth for r in results), default=0)),
        "search/reward": sum(t.reward for t in trajectories) / max(len(trajectories), 1),
        "search/correct_fraction": sum(t.verdict.correct for t in trajectories) / max(len(trajectories), 1),
        "search/solved_fraction": sum(any(t.verdict.correct for t in r.trajectories) for r in results) / max(len(results), 1),
        "search/overhead_pct": stats.overhead_pct,
        "search/valued_nodes": float(stats.valued_nodes),
        "compute/generated_tokens": float(cumulative_tokens),
        "compute/epoch_generated_tokens": float(stats.generated_tokens),
    }
    if stats.valued_nodes:
        metrics["search/prm_value_mean"] = stats.value_sum / stats.valued_nodes
    if generator is not None:
        g = generator.stats
        metrics["compute/prefill_tokens"] = float(g.prefill_tokens)
        metrics["compute/prompt_tokens"] = float(g.prompt_tokens)
        metrics["compute/prefill_saved_tokens"] = float(g.prompt_tokens - g.prefill_tokens)
        queries = g.extra.get("server_prefix_cache_queries")
        if queries is not None:  # a server's own counters: shared by every rank, so its own ratio
            metrics["compute/prefix_hit_rate"] = g.extra["server_prefix_cache_hits"] / queries if queries else 0.0
        else:
            metrics["compute/prefix_hit_rate"] = 1.0 - g.prefill_tokens / g.prompt_tokens if g.prompt_tokens else 0.0
    return metrics
