"""SearchDataModule: every epoch, the current policy searches this epoch's problems and the
finished trees become the epoch's training data (DESIGN.md, "Data flow of one epoch").

Thin glue over plain parts: the `Curriculum` (hard set, replay buffer, round, cursor:
data_modules.curriculum), the epoch's `rollout` (data_modules.rollout), the mini-batches
(data_modules.examples), the run files (data_modules.run_files) and the epoch's scalars
(data_modules.epoch_metrics). The curriculum is data-module state, saved in every checkpoint
and restored by `--ckpt_path`. Callbacks drive the epoch's end (callbacks.rounds): weight
sync, then at a round's end the hard-set refresh, the held-out evaluation and the value model.
"""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import lightning as L
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from data_modules.curriculum import Curriculum
from data_modules.epoch_metrics import epoch_metrics
from data_modules.examples import PathWeighting, empty_batch, mini_batches
from data_modules.rollout import Advantage, Credit, Rollout, Rollouts, ValueFn, decoder, rollout, search_outcomes
from data_modules.run_files import write_state, write_trees
from data_modules.screening import screen as screen_pass1
from flywheel.adaptive import DegenerateFilter, HardSetConfig, ReplayConfig
from flywheel.distributed import all_gather, all_sum
from flywheel.evaluation import EvalConfig
from flywheel.generation.backends import GeneratorBackend, HFBackend, LiveGenerator
from flywheel.generation.base import Generator
from flywheel.preemption import SIGTERMException, stop_point
from flywheel.search.config import SearchConfig
from flywheel.search.driver import derive_seed
from flywheel.tasks import Problem, Task
from flywheel.tasks.countdown import CountdownTask
from flywheel.tasks.sources import load_problems

log = logging.getLogger(__name__)

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
            "self_training" = ReST-MCTS*'s self-training data: each path's weight from
            `path_weights` (goes with `--model.objective.loss_type=self_training`). Flat
            rollouts are DAPO either way, except under "self_training".
        path_weights: how "self_training" weights the paths (value model or outcome, per-
            problem softmax temperature, correct-only and threshold filters).
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
        advantage: Advantage = "node",
        path_weights: PathWeighting = PathWeighting(),
        normalize_std: bool = False,
        drop_uniform_groups: bool = False,
        skip_bad_rows: bool = False,
        save_trees: int = 2,
        seed: int = 0,
    ) -> None:
        super().__init__()
        _check(rollout in ("search", "flat", "best_of_n"), f"--data.rollout={rollout!r}: choose 'search', 'flat' or 'best_of_n'")
        _check(advantage in ("node", "outcome", "subtree", "self_training"),
               f"--data.advantage={advantage!r}: choose 'node' (Tree-GRPO), 'outcome', 'subtree' or 'self_training'")
        for name, value in (("problems_per_epoch", problems_per_epoch), ("mini_batch_problems", mini_batch_problems),
                            ("flat_samples", flat_samples), ("max_concurrent_trees", max_concurrent_trees)):
            _check(value >= 1, f"--data.{name} must be >= 1, got {value}; set it to 1 or more")
        _check(max_train_problems is None or max_train_problems >= 1,
               f"--data.max_train_problems must be >= 1 or null (all), got {max_train_problems}")
        _check(save_trees >= 0, f"--data.save_trees must be >= 0 (0 = none), got {save_trees}")
        if rollout != "search" and advantage not in ("node", "self_training"):
            log.warning("--data.advantage=%s is not used with --data.rollout=%s: flat groups are credited DAPO-style "
                        "(reward minus the group mean); remove --data.advantage or use --data.rollout=search",
                        advantage, rollout)
        self.task = task if task is not None else CountdownTask()
        self.backend = generator if generator is not None else HFBackend()
        self.rollout = rollout
        self.search = search
        self.flat_samples = flat_samples
        self.credit = Credit(advantage, normalize_std, drop_uniform_groups, degenerate_filter, path_weights)
        self.train_files, self.train_split, self.max_train_problems = train_files, train_split, max_train_problems
        self.eval_files, self.eval_split, self.max_eval_problems = eval_files, eval_split, max_eval_problems
        self.eval = eval
        self.problems_per_epoch = problems_per_epoch
        self.mini_batch_problems = mini_batch_problems
        self.max_concurrent_trees = max_concurrent_trees
        self.skip_bad_rows = skip_bad_rows
        self.save_trees = save_trees
        self.seed = seed
        self.curriculum = Curriculum(hard_set, replay, epochs_per_round, seed)
        """Hard set, replay buffer, round and cursor (saved in every checkpoint)."""
        self._train_pool: dict[str, Problem] | None = None
        self._eval_pool: tuple[Problem, ...] | None = None
        self.live = LiveGenerator(self.backend)
        self.value_fn: ValueFn | None = None
        """The value model scoring new search nodes (handed over by the round protocol)."""
        self.skipped_rows = 0
        self.row_check = None
        """Raises ValueError for a problem row the policy cannot take (set by flywheel.preflight)."""
        self.generated_tokens = 0
        """Tokens generated for training over the run, all ranks (evaluation and screening excluded)."""
        self.screening_tokens = 0
        self.epoch_metrics: dict[str, float] = {}
        """This epoch's search and compute scalars (logged by the round protocol)."""
        self.epoch_results: list = []
        """This epoch's finished trees on this rank (the value model learns from them)."""

    # ------------------------------------------------------------------ problems
    def train_pool(self) -> dict[str, Problem]:
        """Training problems by id (a seeded subset when `max_train_problems` is set)."""
        if self._train_pool is None:
            loaded = load_problems(self.task, self.train_files, self.train_split, skip_bad_rows=self.skip_bad_rows,
                                   check=self.row_check)
            problems = list(loaded.problems)
            if self.max_train_problems is not None and len(problems) > self.max_train_problems:
                problems = random.Random(f"{self.seed}:subset").sample(problems, self.max_train_problems)
            self._train_pool = {p.id: p for p in problems}
            self.skipped_rows = loaded.skipped
        return self._train_pool

    def eval_problems(self) -> tuple[Problem, ...]:
        if self._eval_pool is None:
            loaded = load_problems(self.task, self.eval_files, self.eval_split, skip_bad_rows=self.skip_bad_rows,
                                   limit=self.max_eval_problems, check=self.row_check)
            self._eval_pool = loaded.problems
        return self._eval_pool

    def next_problems(self, count: int) -> list[Problem]:
        """The next `count` problems of this round's stream (the same on every rank)."""
        return self.curriculum.next_problems(self.train_pool(), count)

    # ------------------------------------------------------------------ generation
    @property
    def generator(self) -> Generator:
        """The backend's generator (no side effects): started by `start_generator`, kept in
        step with the policy by `push_weights` (callbacks.WeightSync)."""
        return self.live.generator

    def start_generator(self, policy: Any, tokenizer: Any) -> None:
        """Build the generator for `policy` once (collective: a sidecar launches on every rank together)."""
        trainer = self.trainer
        log_dir = trainer.log_dir if trainer is not None else None  # a collective under DDP
        self.live.start(policy, tokenizer, trainer.strategy if trainer is not None else None,
                        Path(log_dir) if log_dir else None, trainer.global_step if trainer is not None else 0)

    def push_weights(self, policy: Any, version: int) -> bool:
        """Make the generator sample from `policy` as of optimizer step `version` (collective)."""
        return self.live.push(policy, version)

    def use_value_model(self, value_fn: ValueFn | None) -> None:
        """Score the next searches' new nodes with `value_fn` (None = no value model)."""
        self.value_fn = value_fn

    def teardown(self, stage: str) -> None:
        """Release the generator backend (stops a launched vLLM server)."""
        self.live.close()

    # ------------------------------------------------------------------ the epoch
    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        module = trainer.lightning_module
        tokenizer = module.tokenizer
        progress = trainer.fit_loop.epoch_progress.current
        if progress.processed > progress.completed:
            # Resuming from an end-of-epoch checkpoint: Lightning builds this loader for the
            # finished epoch and never iterates it; don't search for it (lightning-cpu.md §2).
            # It must not be empty, or the fit loop stops at once ("No training batches").
            return DataLoader([empty_batch(pad_id=tokenizer.pad_token_id)], batch_size=None)
        epoch, rank, world = trainer.current_epoch, trainer.global_rank, trainer.world_size
        start = time.perf_counter()
        at_start = self.state_dict()
        try:
            self.start_generator(module.policy, tokenizer)  # every rank at once: a sidecar's launch is collective
            self.ensure_hard_set(tokenizer)
            problems = self.next_problems(self.problems_per_epoch)[rank::world]
            out = self.rollouts(problems, tokenizer, epoch, rank)
        except SIGTERMException:  # stopped between search rounds: the checkpoint restarts this epoch
            self.load_state_dict(at_start)
            raise
        if self.rollout == "search":
            self.observe(problems, out)
        self.epoch_results = out.results
        seconds = time.perf_counter() - start
        batches = mini_batches(out.rows, problems_per_rank=math.ceil(self.problems_per_epoch / world),
                               problems_per_batch=self.mini_batch_problems, world=world, pad_id=tokenizer.pad_token_id,
                               score=module.score_batch)
        self.generated_tokens += all_sum(out.stats.generated_tokens)
        curriculum = self.curriculum
        self.epoch_metrics = epoch_metrics(out.results, out.stats, seconds, self.generated_tokens, self.live.generator)
        self.epoch_metrics.update({"data/hard_set_size": float(len(curriculum.hard)), "data/cached": float(len(curriculum.buffer)),
                                   "data/uniform_groups_dropped": float(out.uniform_groups),
                                   "compute/screening_tokens": float(self.screening_tokens)})
        self.persist()
        log_dir = trainer.log_dir  # a collective under DDP: every rank must ask
        if trainer.is_global_zero and log_dir:
            write_trees(log_dir, epoch, out.results, decoder(tokenizer), self.save_trees)
        log.info(
            "epoch %d: %d problems (%d cached), %d training rows in %d mini-batches, reward %.3f, %.1f s",
            epoch, len(problems), sum(p.id in curriculum.buffer for p in problems), sum(len(g) for g in out.rows),
            len(batches), self.epoch_metrics.get("search/reward", float("nan")), seconds,
        )
        return DataLoader(batches, batch_size=None, shuffle=False)

    def rollouts(self, problems: Sequence[Problem], tokenizer: Any, epoch: int, rank: int) -> Rollouts:
        """This data module's `rollout` of `problems` with the search seed of (epoch, rank)."""
        bar = tqdm(total=len(problems), desc=f"epoch {epoch} {self.rollout}", unit="problem", leave=False, disable=rank != 0)
        try:
            return rollout(
                problems, generator=self.generator, task=self.task, tokenizer=tokenizer, kind=self.rollout,
                search=self.effective_search_config(epoch, rank),
                flat_samples=self.flat_samples, max_concurrent_trees=self.max_concurrent_trees, credit=self.credit,
                cached=self.curriculum.cached, value_fn=self.value_fn,
                node_values=_value_head_fn(self.trainer.lightning_module, self.search), progress=lambda done, tokens: _advance(bar, done, tokens, self.trainer),
            )
        finally:
            bar.close()

    def effective_search_config(self, epoch: int, rank: int) -> SearchConfig:
        """The search config of one (epoch, rank): a fresh seed, all else as configured."""
        return replace(self.search, seed=derive_seed(self.search.seed, self.seed, epoch, rank))

    def observe(self, problems: Sequence[Problem], out: Rollouts) -> None:
        """Offer every rank's finished searches to the replay buffer (collective)."""
        self.curriculum.observe(o for part in all_gather(search_outcomes(problems, out.results)) for o in part)

    # ------------------------------------------------------------------ hard set
    def screen(self, tokenizer: Any, ids: Sequence[str], label: str) -> dict[str, float]:
        """Pass1@K of `ids` under the current policy, the same on every rank (collective)."""
        trainer, pool = self.trainer, self.train_pool()
        shard = [pool[i] for i in ids[trainer.global_rank :: trainer.world_size]]
        bar = tqdm(total=len(shard), desc=f"screen {label}", unit="problem", leave=False, disable=not trainer.is_global_zero)
        rates, tokens = screen_pass1(shard, generator=self.generator, tokenizer=tokenizer, task=self.task,
                               config=self.curriculum.hard_set_config, seed=self.curriculum.screening_seed(),
                               progress=lambda d: _advance(bar, d, None, trainer))
        bar.close()
        self.screening_tokens += tokens
        return rates

    def ensure_hard_set(self, tokenizer: Any) -> None:
        """D_hard(0): screen the training pool with the policy as it starts (Eq. 8)."""
        curriculum, cfg = self.curriculum, self.curriculum.hard_set_config
        if curriculum.started:
            return
        ids = list(self.train_pool())
        curriculum.start(ids, self.screen(tokenizer, ids, "base") if cfg.enabled else {})
        if not cfg.enabled:
            log.info("hard set off: training on all %d problems", len(ids))
            return
        log.info("hard set: %d of %d training problems have Pass1@%d %s %.2f under the base policy",
                 len(curriculum.hard), len(ids), cfg.k, "<" if cfg.comparison == "lt" else "<=", cfg.delta)

    def end_round(self, tokenizer: Any) -> dict[str, float]:
        """A flywheel round's end: re-measure the hard set with the trained policy and shrink
        it (Eq. 9); settle the replay buffer's candidates against the same rates."""
        curriculum = self.curriculum
        if curriculum.hard is None:
            raise RuntimeError("a round ended before the first epoch screened the hard set")
        enabled = curriculum.hard_set_config.enabled
        rates = self.screen(tokenizer, curriculum.hard.ids, f"round {curriculum.round + 1}") if enabled else {}
        change = curriculum.end_round(rates)
        self.persist()
        log.info("round %d: hard set %d -> %d, %d newly cached, %d problems in the replay buffer",
                 curriculum.round, change.before, change.after, change.newly_cached, len(curriculum.buffer))
        return {"round/hard_set_size": float(change.after), "round/cached": float(len(curriculum.buffer))}

    def persist(self) -> None:
        """Write the hard set and the replay buffer to the run directory (rank 0, atomically)."""
        trainer = self.trainer
        if trainer is None:
            return
        log_dir = trainer.log_dir  # a collective under DDP: every rank must ask
        if trainer.is_global_zero and log_dir:
            write_state(log_dir, self.curriculum.hard, self.curriculum.buffer)

    # ------------------------------------------------------------------ validate / test
    def val_dataloader(self) -> DataLoader:
        """Held-out problems in chunks, for `flywheel validate|test`. Empty during `fit`,
        where the HeldOutEval callback evaluates once per round instead."""
        trainer = self.trainer
        if trainer is not None and trainer.state.fn == "fit":
            return DataLoader([], batch_size=None)
        if trainer is not None and trainer.lightning_module is not None:
            self.start_generator(trainer.lightning_module.policy, trainer.lightning_module.tokenizer)
        # Batches are lists of positions in eval_problems(): Lightning's batch transfer cannot
        # walk frozen dataclasses, so the problems themselves stay here.
        positions = list(range(len(self.eval_problems())))
        if trainer is not None:
            positions = positions[trainer.global_rank :: trainer.world_size]
        chunk = self.eval.problems_per_batch
        return DataLoader([positions[i : i + chunk] for i in range(0, len(positions), chunk)], batch_size=None, collate_fn=list)

    test_dataloader = val_dataloader

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        return {"format": STATE_FORMAT, **self.curriculum.state_dict(), "generated_tokens": self.generated_tokens,
                "screening_tokens": self.screening_tokens}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("format") != STATE_FORMAT:
            raise ValueError(
                f"the checkpoint's SearchDataModule state has format {state.get('format')!r}, expected "
                f"{STATE_FORMAT!r}: it was written by another flywheel version; start a new run without --ckpt_path"
            )
        try:
            self.curriculum.load_state_dict(state)
            self.generated_tokens = int(state["generated_tokens"])
            self.screening_tokens = int(state["screening_tokens"])
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


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _advance(bar: tqdm, done: int, tokens: int | None, trainer: L.Trainer | None) -> None:
    stop_point(trainer)  # after every search round: a SIGTERM stops here (flywheel.preemption)
    bar.update(done - bar.n)
    if tokens is not None:
        bar.set_postfix(tokens=tokens, refresh=False)
