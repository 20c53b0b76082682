"""SearchDataModule: every epoch, the current policy searches this epoch's problems and the
finished trees become the epoch's training data (docs/architecture.md, "One epoch").

Thin glue over plain parts: the settings' sections (data_modules.settings), the problems
(data_modules.pool), the `Curriculum` (hard set, replay buffer, round, cursor:
data_modules.curriculum), the epoch's `rollout` (data_modules.rollout) and its credit
(flywheel.objectives.credit), the mini-batches with pi_old (data_modules.examples), the run
files (data_modules.run_files), the epoch's scalars (data_modules.epoch_metrics), the
checkpointed state (data_modules.resume) and, with `--data.async_search`, the next epoch's
search running beside this one's training (data_modules.search_ahead). Callbacks drive the
epoch's end (callbacks.rounds): weight sync, then at a round's end the hard-set refresh, the
held-out evaluation and the value model.
"""

from __future__ import annotations

import functools

import logging
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence

import lightning as L
from torch.utils.data import DataLoader

from data_modules.curriculum import Curriculum
from data_modules.epoch_metrics import epoch_metrics
from data_modules.examples import Pack, Score, empty_batch, mini_batches
from data_modules.pool import ProblemPool
from data_modules.progress import progress
from data_modules.resume import data_state, restore_data_state
from data_modules.rollout import Rollouts, check_flat_first, rollout, search_outcomes, value_head_fn
from data_modules.run_files import write_run_files
from data_modules.screening import Screening
from data_modules.search_ahead import SearchAhead, Searched, refusal, staleness
from data_modules.token_split import TokenSplit
from data_modules.settings import AsyncSearchConfig, BatchingConfig, ProblemsConfig, check_data_settings
from flywheel.adaptive import HardSetConfig, ReplayConfig
from flywheel.run.distributed import all_gather, all_sum
from flywheel.reporting.evaluation import EvalConfig
from flywheel.reporting.problem_view import decoder
from flywheel.generation.backends import GeneratorBackend, HFBackend, LiveGenerator
from flywheel.generation.base import Generator
from flywheel.objectives.credit import ROLLOUTS, Credit, check as check_credit, fit_cautions
from flywheel.ports import PolicyPort, WallClock
from flywheel.prm import ValueFn
from flywheel.run.preemption import SIGTERMException, stop_requested
from flywheel.search.config import SearchConfig
from flywheel.search.driver import derive_seed
from flywheel.tasks import Problem, Task
from flywheel.tasks.countdown import CountdownTask
from flywheel.tasks.grading import Grader, GradingConfig
from flywheel.training.batch import TrainingBatch
from flywheel.reporting.wall_split import SEARCH_AHEAD, SEARCH_WAIT, TRAIN, UNTIMED, search_section, timed

log = logging.getLogger(__name__)


def rebuilding_a_finished_epoch(trainer: L.Trainer) -> bool:
    """Resumed from an end-of-epoch checkpoint: the loader asked for is that finished epoch's."""
    done = trainer.fit_loop.epoch_progress.current
    return done.processed > done.completed


class SearchDataModule(L.LightningDataModule):
    """Regenerates the training data every epoch with the current policy.

    It is the `flywheel.ports.DataPort` the CLI hands to the round protocol, the held-out evaluation,
    the budget and the LightningModule.

    Args:
        task: the reasoning task (prompt format, step definition, verifier, built-in
            problems). Default: Countdown (`flywheel.tasks.countdown.CountdownTask`).
        generator: the sampling backend. Default: in-process transformers
            (`flywheel.generation.backends.HFBackend`).
        rollout: what is sampled for each problem, a kind in `ROLLOUTS`
            (flywheel.objectives.credit; --help lists them): "search" = tree search, credited by
            `credit.advantage` (default; with `batching.flat_first` = m, trees only for the
            problems m flat samples all fail); a kind that does not search samples
            `batching.flat_samples` independent responses per problem, credited by its own rule
            (DAPO for "flat", the correct ones only for "best_of_n").
        search: the tree-search rules and their parameters (expansion width, K, selection...).
        problems: the training and held-out problem files, splits and limits.
        batching: problems per epoch, per optimizer step and per generator call; flat samples.
        credit: how trajectories are credited (advantage rule, std normalisation, uniform
            groups, the degenerate-response filter, ReST-MCTS* path weights).
        hard_set: the Pass1@K hard set: screening samples K, threshold delta, screening
            temperature (the DeepSearch paper's Eq. 8-9, arXiv 2509.25454); `rescreen=all` re-measures the pool every round.
            `--data.hard_set.enabled=false` trains on every problem.
        replay: the replay buffer of cached correct solutions and its registration rule.
        eval: the held-out evaluation: samples per problem, k, temperature, before training.
        grading: the grading guard every response of the search, the screening and the
            evaluation goes through (flywheel.tasks.grading): a verdict over `timeout_s` of CPU,
            one asleep past `backstop_s` or one that fails is graded wrong (reasons "timeout" / "error") and counted
            (`search/grading_timeouts`, `search/grading_errors`; the run's totals in summary.json).
        epochs_per_round: epochs per flywheel round; at each round's end the hard set is
            re-measured and the held-out set evaluated.
        save_trees: trees (or flat groups) of each epoch written to
            `<log_dir>/trees/epoch_NNNN.jsonl` for the viewer (`python -m flywheel tree`); the
            first ones searched on rank 0; 0 = none.
        seed: seed of the problem order and of the search; default (None): the run's
            `seed_everything` (the command line fills it in), 0 where it is off or outside the CLI.
        async_search: search the next epoch while this one trains, with the weights of the last
            sync (`--data.async_search.max_staleness=1`; off by default; the vLLM sidecar only).
    """

    def __init__(
        self,
        task: Task | None = None,
        generator: GeneratorBackend | None = None,
        rollout: str = "search",
        search: SearchConfig = SearchConfig(),
        problems: ProblemsConfig = ProblemsConfig(),
        batching: BatchingConfig = BatchingConfig(),
        credit: Credit = Credit(),
        hard_set: HardSetConfig = HardSetConfig(),
        replay: ReplayConfig = ReplayConfig(),
        eval: EvalConfig = EvalConfig(),
        grading: GradingConfig = GradingConfig(),
        epochs_per_round: int = 1,
        save_trees: int = 2,
        seed: int | None = None,
        async_search: AsyncSearchConfig = AsyncSearchConfig(),
    ) -> None:
        super().__init__()
        check_data_settings(rollout, problems, hard_set, replay, save_trees)
        check_flat_first(batching.flat_first, rollout, search)
        for warning in check_credit(credit, rollout, search.trajectories_per_tree):  # an ignored setting is refused
            log.warning(warning)
        self.task = task if task is not None else CountdownTask()
        self.backend = generator if generator is not None else HFBackend()
        if search.distinct_children and not self.backend.distinct_first_token:
            raise ValueError(f"--data.search.distinct_children=true: {type(self.backend).__name__} cannot draw first tokens "
                             "without replacement; use --data.generator=HFBackend or set --data.search.distinct_children=false")
        self.rollout, self.search, self.batching, self.credit, self.eval = rollout, search, batching, credit, eval
        seed = 0 if seed is None else seed
        self.save_trees, self.seed, self.async_search = save_trees, seed, async_search
        self.grader = Grader(self.task, grading)
        """The task's verifier under the grading guard's limits (`--data.grading.*`)."""
        self._graded = self.grader.counts()
        """The guard's counts at the last epoch's metrics (the epoch's are the difference)."""
        self.pool = ProblemPool(self.task, problems, seed)
        """The training and held-out problems (`--data.problems.*`)."""
        self.curriculum = Curriculum(hard_set, replay, epochs_per_round, seed)
        """Hard set, replay buffer, round and cursor (saved in every checkpoint)."""
        self.live = LiveGenerator(self.backend)
        self.value_fn: ValueFn | None = None
        """The value model scoring new search nodes (handed over by the round protocol)."""
        self.wall: WallClock = UNTIMED
        """The run's wall clock (callbacks.wall_time.WallTime, handed over by the CLI wiring): the
        epoch's sections are timed on it; untimed without one."""
        self.screening = Screening(self.pool, self.curriculum, self.task, self.grader)
        """Pass1@K screening: the hard set, its refresh, a stream's draws."""
        self.generated_tokens = 0
        """Tokens generated for training over the run, all ranks (evaluation and screening excluded)."""
        self.epoch_metrics: dict[str, float] = {}
        """This epoch's search and compute scalars (logged by the round protocol)."""
        self.epoch_results: list = []
        """This epoch's finished trees on this rank (the value model learns from them)."""
        self.ahead = SearchAhead()
        """The next epoch's search in flight beside this epoch's training (`async_search`)."""

    # ------------------------------------------------------------------ problems
    def check_rows_with(self, check: Callable[[Problem], None] | None) -> None:
        """Every problem row read from now on goes through `check` (pre-flight's "the prompt fits
        the policy's context", flywheel.run.preflight.load_inputs); None: no check."""
        self.pool.row_check = check

    def train_pool(self) -> dict[str, Problem]:
        """Training problems by id (`--data.problems.*`)."""
        return self.pool.train()

    def eval_problems(self) -> tuple[Problem, ...]:
        """The held-out problems (`--data.problems.eval_*`)."""
        return self.pool.held_out()

    def next_problems(self, count: int) -> list[Problem]:
        """The next `count` problems of this round's stream (the same on every rank)."""
        return self.curriculum.next_problems(self.train_pool(), count)

    # ------------------------------------------------------------------ generation
    @property
    def generator(self) -> Generator:
        """The backend's generator (no side effects): started by `start_generator`, kept in
        step with the policy by `push_weights` (at every epoch's end, callbacks.rounds)."""
        return self.live.generator

    def start_generator(self, policy: Any, tokenizer: Any) -> None:
        """Build the generator for `policy` once (collective: a sidecar launches on every rank together)."""
        trainer = self.trainer
        log_dir = trainer.log_dir if trainer is not None else None  # a collective under DDP
        self.live.start(policy, tokenizer, trainer.strategy if trainer is not None else None,
                        Path(log_dir) if log_dir else None, trainer.global_step if trainer is not None else 0,
                        beside_training=self.async_search.enabled)

    def push_weights(self, policy: Any, version: int) -> bool:
        """Make the generator sample from `policy` as of optimizer step `version` (collective)."""
        return self.live.push(policy, version)

    @property
    def policy_port(self) -> PolicyPort | None:
        """The trainer's LightningModule, as the data module reads it (flywheel.ports.PolicyPort);
        the one place the data module reaches it."""
        return self.trainer.lightning_module

    def use_value_model(self, value_fn: ValueFn | None) -> None:
        """Score the next searches' new nodes with `value_fn` (None = no value model)."""
        self.value_fn = value_fn

    def setup(self, stage: str) -> None:
        """At the start of every fit (resumed ones too), rank 0 logs the measured flaw of the rule
        crediting the trees (`fit_cautions`: the paper's node credit on chains, docs/credit.md)."""
        if stage != "fit" or getattr(self.trainer, "global_rank", 0) != 0:
            return
        for caution in fit_cautions(self.credit, self.rollout):
            log.warning(caution)

    def teardown(self, stage: str) -> None:
        """Release the generator backend (stops a search ahead, then a launched vLLM server) and
        the grading worker."""
        self.ahead.close()
        self.live.close()
        self.grader.close()

    def overlap_refusal(self, world_size: int, model: Any) -> str | None:
        """Why `async_search` cannot run in this run (data_modules.search_ahead.refusal), or None."""
        return refusal(self.async_search, own_weights=self.backend.own_weights, world_size=world_size,
                       old_logprobs=model.old_logprobs, loss_type=model.objective.loss_type, stream=self.pool.config.stream,
                       value_head_search=value_head_fn(model, self.search) is not None)

    # ------------------------------------------------------------------ the epoch
    def train_dataloader(self) -> DataLoader:
        """One epoch's training data (Lightning asks at every epoch's start: flywheel.__main__ sets
        `reload_dataloaders_every_n_epochs=1`), built on the run's wall clock."""
        with self.wall.rebuild():  # the epoch boundary of the run's wall split
            return self.epoch_loader()

    def epoch_loader(self) -> DataLoader:
        """What one epoch does before its training steps, in order:
        1. search this epoch's problems with the current policy (or take the search that ran
           ahead, beside the last epoch's training);
        2. record what the search found and cost (the curriculum's counts, the epoch's scalars);
        3. with `--data.async_search`, start the next epoch's search on a thread;
        4. turn the trees' training rows into mini-batches, each laid out (packed or not) by the
           module and scored by pi_old (the policy before this epoch's updates);
        5. write the run files (trees, hard set, replay buffer)."""
        trainer, module = self.trainer, self.policy_port
        tokenizer = module.tokenizer
        if rebuilding_a_finished_epoch(trainer):
            # Lightning builds a loader for the epoch an end-of-epoch checkpoint finished and never
            # iterates it: no search (lightning-cpu.md §2); one batch, or the fit loop stops at once.
            return DataLoader([empty_batch(pad_id=tokenizer.pad_token_id)], batch_size=None)
        epoch, rank, world = trainer.current_epoch, trainer.global_rank, trainer.world_size
        searched = self.search_epoch(module.policy, tokenizer, epoch, rank, world)
        lag = self.record_epoch(searched)
        self.search_next(tokenizer, epoch + 1, rank, world)  # after the generator's stats were read
        batches = self.training_batches(searched, tokenizer, module.pack_batch, module.score_batch, world, lag)
        out = searched.rollouts
        write_run_files(trainer, self.curriculum.hard, self.curriculum.buffer,
                        (epoch, out.results, decoder(tokenizer), self.save_trees,
                         functools.partial(tokenizer.decode, skip_special_tokens=False)))
        log.info(
            "epoch %d: %d problems (%d cached), %d training rows in %d mini-batches, reward %.3f, %.1f s",
            epoch, len(searched.problems), sum(p.id in self.curriculum.buffer for p in searched.problems),
            sum(len(g) for g in out.rows), len(batches), self.epoch_metrics.get("search/reward", float("nan")),
            searched.seconds,
        )
        if not any(out.rows) and world == 1:
            log.warning("epoch %d: nothing to train on (every group was left out: unsolved, uniform or degenerate)", epoch)
        return DataLoader(batches, batch_size=None, shuffle=False)

    def search_epoch(self, policy: Any, tokenizer: Any, epoch: int, rank: int, world: int) -> Searched:
        """Step 1: the generator in step with `policy`, then this epoch's search. A SIGTERM between
        search rounds restores the data module as it was (the checkpoint restarts the epoch)."""
        start = time.perf_counter()
        at_start = self.state_dict()
        try:
            with self.wall.once():  # a no-op after the first epoch of this process
                self.start_generator(policy, tokenizer)  # every rank at once: a sidecar's launch is collective
            return self.epoch_search(tokenizer, epoch, rank, world, start)
        except SIGTERMException:
            self.load_state_dict(at_start)
            raise

    def record_epoch(self, searched: Searched) -> tuple[int, int]:
        """Step 2: the hard set and the replay buffer observe the trees; the curriculum counts
        every rank's tokens and solved problems; the epoch's scalars are set (logged at its end).
        Returns the rows' staleness (pushes, steps) behind the policy about to train."""
        problems, out = searched.problems, searched.rollouts
        if ROLLOUTS[self.rollout].searches:
            self.observe(problems, out)
        self.epoch_results = out.results
        self.generated_tokens += all_sum(out.stats.generated_tokens)
        curriculum = self.curriculum
        split = TokenSplit(*map(sum, zip(*all_gather((out.tokens.tree, out.tokens.flat)))))  # every rank's
        curriculum.count_tokens(split)
        curriculum.count_solved(all_gather(out.solved), self.generated_tokens)  # every rank's
        self.epoch_metrics = {**epoch_metrics(out.results, out.stats, searched.seconds, self.generated_tokens,
                                              self.live.generator, hard_set_size=len(curriculum.hard),
                                              cached=curriculum.cached_count, answer_rules=self.task.answer_rules,
                                              uniform_groups_dropped=out.uniform_groups),
                              **split.epoch_metrics(), "compute/screening_tokens": float(self.screening_tokens),
                              **self.grading_metrics()}
        lag = staleness(searched, self.live.pushes, self.trainer.global_step)
        if self.async_search.enabled:
            self.epoch_metrics.update({"search/staleness": float(lag[0]), "search/staleness_steps": float(lag[1])})
        return lag

    def training_batches(self, searched: Searched, tokenizer: Any, pack: Pack, score: Score, world: int,
                         lag: tuple[int, int]) -> list[TrainingBatch]:
        """Step 4: the epoch's training rows (stamped with the weights that sampled them and, with
        `--data.async_search`, the syncs they lag behind: the module logs compute/staleness) as
        this rank's mini-batches, each laid out by `pack` and scored by `score` (the module's
        packing decision and pi_old log-probs, both counted as training time)."""
        rows = [[replace(row, weight_version=searched.version) for row in group] for group in searched.rollouts.rows]
        return mini_batches(rows, problems_per_rank=math.ceil(self.batching.problems_per_epoch / world),
                            problems_per_batch=self.batching.mini_batch_problems, world=world,
                            pad_id=tokenizer.pad_token_id, pack=timed(self.wall, TRAIN, pack),
                            score=timed(self.wall, TRAIN, score), staleness=lag[0] if self.async_search.enabled else None)

    def epoch_problems(self, tokenizer: Any, rank: int, world: int) -> list[Problem]:
        """This rank's problems of the epoch: its share of the round's hard-set stream, or with
        `--data.problems.stream` its screened draw from the file stream (collective)."""
        run = {"trainer": self.trainer, "generator": self.generator, "tokenizer": tokenizer, "wall": self.wall}
        if self.pool.config.stream:
            return self.screening.draw(self.batching.problems_per_epoch, **run)
        with self.wall.once():  # D_hard(0): a no-op once screened, and in a resumed run
            self.screening.start(**run)
        return self.next_problems(self.batching.problems_per_epoch)[rank::world]

    def rollouts(self, problems: Sequence[Problem], tokenizer: Any, epoch: int, rank: int) -> Rollouts:
        """This data module's `rollout` of `problems` with the search seed of (epoch, rank), now."""
        with progress(len(problems), f"epoch {epoch} {self.rollout}", self.trainer, show=rank == 0) as advance, \
                search_section(self.wall, self.generator):
            return self.rollout_of(problems, tokenizer, epoch, rank, advance)

    def rollout_of(self, problems: Sequence[Problem], tokenizer: Any, epoch: int, rank: int,
                   advance: Callable[..., None] | None, cached: Callable[[str], Sequence] | None = None) -> Rollouts:
        """`rollout` of `problems` with the search seed of (epoch, rank); `advance(done, tokens)`
        after every search round; `cached`: the replay buffer's solutions (default: as they are
        when asked)."""
        return rollout(
            problems, generator=self.generator, task=self.task, tokenizer=tokenizer, kind=self.rollout,
            search=self.effective_search_config(epoch, rank), flat_samples=self.batching.flat_samples,
            flat_first=self.batching.flat_first,
            max_concurrent_trees=self.batching.max_concurrent_trees, credit=self.credit,
            cached=cached or self.curriculum.cached, value_fn=self.value_fn,
            node_values=value_head_fn(self.policy_port, self.search), progress=advance,
            grader=self.grader,
        )

    def grading_metrics(self) -> dict[str, float]:
        """The grading guard's verdicts since the last epoch's metrics, all ranks (the
        search's, the screening's and the evaluation's): search/grading_timeouts, search/grading_errors."""
        now = self.grader.counts()
        epoch = all_gather({key: now[key] - self._graded[key] for key in now})
        self._graded = now
        return {f"search/grading_{key}": float(sum(part[key] for part in epoch)) for key in now}

    def grading_counts(self) -> dict[str, int]:
        """The run's grading-guard verdicts so far, all ranks: {"grading_timeouts": n, "grading_errors": m}."""
        return {f"grading_{key}": count for key, count in self.grading_totals().items()}

    def grading_totals(self) -> dict[str, int]:
        """The grader's counts summed over the ranks: {"timeouts": n, "errors": m}. Collective."""
        mine = self.grader.counts()
        return {key: int(sum(part[key] for part in all_gather(mine))) for key in mine}

    # ------------------------------------------------------------------ searching ahead
    def epoch_search(self, tokenizer: Any, epoch: int, rank: int, world: int, start: float) -> Searched:
        """This epoch's search: done ahead during the last epoch (`async_search`), or now (from
        `start`, perf_counter), on the problems drawn for a search ahead that was not kept (a
        stop, a resume: data_modules.search_ahead), else on this epoch's draw."""
        taken = self.ahead.take(epoch)
        if taken is not None:
            self.wall.add_overlapped(SEARCH_AHEAD, taken.seconds)  # it ran beside the last epoch's training
            return taken
        version, pushes = self.live.version, self.live.pushes
        problems = self.drawn_problems(tokenizer, epoch, rank, world)
        out = self.rollouts(problems, tokenizer, epoch, rank)
        self.ahead.done(epoch)
        return Searched(epoch, tuple(problems), out, time.perf_counter() - start, version, pushes)

    def drawn_problems(self, tokenizer: Any, epoch: int, rank: int, world: int) -> list[Problem]:
        """`epoch`'s problems: those drawn for it ahead whose search was not kept (a stop, a
        resume), searched again, never drawn twice; else this epoch's draw."""
        redo = self.ahead.redo(epoch)
        if redo is None:
            return self.epoch_problems(tokenizer, rank, world)
        pool = self.train_pool()
        log.info("epoch %d: searching its %d problems drawn before (that search was not kept), with the weights of "
                 "step %d", epoch, len(redo), self.live.version)
        return [pool[i] for i in redo if i in pool]

    def search_next(self, tokenizer: Any, epoch: int, rank: int, world: int) -> None:
        """With `async_search`: draw epoch `epoch`'s problems now (on this thread: the curriculum's
        cursor moves here), copy their cached solutions, and start their search on a thread with
        the generator's current weights, to run while this epoch trains. Not past the last epoch,
        and not when the last epoch's end already started it (`search_after_push`)."""
        if not self.may_search_ahead(epoch):
            return
        problems = self.drawn_problems(tokenizer, epoch, rank, world)
        self.launch_ahead(tokenizer, epoch, rank, problems, {p.id: self.curriculum.cached(p.id) for p in problems})

    def search_after_push(self) -> None:
        """With `async_search`, at the end of epoch t once the weights are pushed (and a round's
        end has sampled from them): start epoch t+2's search, so that the generator searches
        through the checkpoint's write and the next loader's build. Its cached solutions are the
        replay buffer's with epoch t+1's finished trees observed, as if it were started when
        epoch t+1 is recorded. Nothing when epoch t+1's search was not kept (then its loader
        searches it in place and starts t+2 itself) or t+2 is past the last epoch."""
        trainer = self.trainer
        epoch, following = trainer.current_epoch + 2, self.ahead.finished(trainer.current_epoch + 1)
        if following is None or not self.may_search_ahead(epoch):
            return
        tokenizer, rank, world = self.policy_port.tokenizer, trainer.global_rank, trainer.world_size
        problems = self.drawn_problems(tokenizer, epoch, rank, world)
        seen = search_outcomes(following.problems, following.rollouts) if ROLLOUTS[self.rollout].searches else ()
        self.launch_ahead(tokenizer, epoch, rank, problems, self.curriculum.cached_after(seen, [p.id for p in problems]))

    def may_search_ahead(self, epoch: int) -> bool:
        """`async_search` is on, no search runs or is held for `epoch`, and `epoch` is not past the last one."""
        max_epochs = self.trainer.max_epochs
        return (self.async_search.enabled and not self.ahead.running and not self.ahead.holds(epoch)
                and not (max_epochs is not None and 0 <= max_epochs <= epoch))

    def launch_ahead(self, tokenizer: Any, epoch: int, rank: int, problems: Sequence[Problem],
                     cached: dict[str, Sequence]) -> None:
        """Start `epoch`'s search of `problems` on a thread with the generator's current weights
        and the solutions `cached` (fixed now: the thread never reads the curriculum)."""
        trainer = self.trainer
        self.ahead.launch(epoch, problems, self.live.version, self.live.pushes,
                          lambda advance: self.rollout_of(problems, tokenizer, epoch, rank, advance,
                                                          cached=lambda i: cached.get(i, ())),
                          stop=lambda: stop_requested(trainer))

    def finish_search_ahead(self, abandon: bool) -> None:
        """The search ahead ends before the weights are pushed: waited for, or with `abandon`
        (the run stops) stopped and left for the resumed run to search again. Nothing when none
        is in flight."""
        if not self.ahead.running:
            return
        with self.wall.section(SEARCH_WAIT):
            waited = self.ahead.finish(abandon=abandon)
        self.epoch_metrics["search/ahead_wait_s"] = waited

    def effective_search_config(self, epoch: int, rank: int) -> SearchConfig:
        """The search config of one (epoch, rank): a fresh seed, all else as configured."""
        return replace(self.search, seed=derive_seed(self.search.seed, self.seed, epoch, rank))

    def observe(self, problems: Sequence[Problem], out: Rollouts) -> None:
        """Offer every rank's finished searches to the replay buffer (collective)."""
        self.curriculum.observe(o for part in all_gather(search_outcomes(problems, out)) for o in part)

    # ------------------------------------------------------------------ rounds
    @property
    def rounds_completed(self) -> int:
        """Flywheel rounds completed (the curriculum's round counter)."""
        return self.curriculum.round

    def round_starts(self, epoch: int) -> bool:
        """Whether `epoch` (0-based) is the first of a round."""
        return self.curriculum.round_starts(epoch)

    def round_ends(self, epoch: int) -> bool:
        """Whether `epoch` (0-based) is the last of a round (`Curriculum.round_ends` decides)."""
        return self.curriculum.round_ends(epoch)

    def round_facts(self) -> dict[str, float | None]:
        """The curriculum's numbers that go into a round's summary row (after its refresh):
        the hard set (None when it is off), its cached problems, the run's training tokens, the round's own token
        split (tree, flat, tree fraction, screening: data_modules.token_split) and the problems
        its rollouts solved, first solves among them (data_modules.solved), and the run's
        grading-guard verdicts so far (grading_timeouts, grading_errors; collective)."""
        curriculum = self.curriculum
        enabled = curriculum.hard is not None and curriculum.hard_set_config.enabled  # off: no hard set, no size
        return {"hard_set_size": len(curriculum.hard) if enabled else None,
                "cached": curriculum.cached_count, "generated_tokens": self.generated_tokens,
                **curriculum.tokens.this_round.round_facts(), **curriculum.solved.round_facts(), **self.grading_counts()}

    def solved_problems(self) -> dict[str, Any]:
        """Every training problem the run solved so far, with its first solve (data_modules.solved)."""
        return self.curriculum.solved.to_json()

    # ------------------------------------------------------------------ hard set
    @property
    def screening_tokens(self) -> int:
        """Tokens generated for Pass1@K screening over the run, all ranks."""
        return self.screening.tokens

    def end_round(self, tokenizer: Any) -> dict[str, float]:
        """A flywheel round's end: re-screen with the trained policy (the hard set, Eq. 9, or
        with rescreen=all the pool); settle the replay buffer's candidates against the same rates."""
        change = self.screening.end_round(trainer=self.trainer, generator=self.generator, tokenizer=tokenizer, wall=self.wall)
        curriculum = self.curriculum
        write_run_files(self.trainer, curriculum.hard, curriculum.buffer)
        return {"round/hard_set_size": float(change.after), "round/cached": float(curriculum.cached_count)}

    # ------------------------------------------------------------------ validate / test
    def val_dataloader(self) -> DataLoader:
        """One batch for `flywheel validate|test`, the same on every rank: the positions of
        every held-out problem, which the module's step evaluates with the sharded evaluator
        (Lightning's batch transfer cannot walk frozen dataclasses, so the problems stay
        here). Empty during `fit`, where the HeldOutEval callback evaluates once per round."""
        trainer = self.trainer
        if trainer is not None and trainer.state.fn == "fit":
            return DataLoader([], batch_size=None)
        module = self.policy_port if trainer is not None else None
        if module is not None:
            self.start_generator(module.policy, module.tokenizer)
        return DataLoader([list(range(len(self.eval_problems())))], batch_size=None, collate_fn=list)

    test_dataloader = val_dataloader

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        """The checkpointed state. Collective (Lightning writes a checkpoint on every rank
        together): the grading guard's counts are every rank's, summed."""
        return data_state(self.curriculum, self.generated_tokens, self.screening.tokens, self.pool.stream_position(),
                          self.ahead.state(), self.grading_totals())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        source = getattr(self.trainer, "ckpt_path", None)
        self.generated_tokens, self.screening.tokens, stream = restore_data_state(state, self.curriculum, source, self.ahead,
                                                                                  self.grader)
        if getattr(self.trainer, "global_rank", 0) != 0:
            # The checkpoint holds every rank's counts summed: rank 0 carries them on, so their
            # sum over the ranks continues on any world size (each rank restoring them counted
            # them once per rank: 6 raising verdicts after a 2-node resume of a run that had 3).
            self.grader.restore({})
        self._graded = self.grader.counts()
        self.pool.load_stream_position(stream)
