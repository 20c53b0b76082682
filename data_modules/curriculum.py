"""Curriculum: which problems the flywheel trains on, round after round (deepsearch.md §7).

A plain object (no Lightning, no I/O): the Pass1@K hard set, the replay buffer of cached
correct solutions, the round counter, the cursor into this round's problem stream, the
token split per round (data_modules.token_split) and the problems the run solved
(data_modules.solved). It is the one place that decides when a round ends (`round_ends`);
the data module saves it in every checkpoint (`state_dict`) and the round protocol
(callbacks.rounds) ends its rounds.
"""

from __future__ import annotations

import copy

import logging
import random
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from data_modules.solved import SolvedLedger
from data_modules.token_split import TokenLedger, TokenSplit
from flywheel.adaptive import CachedSolution, HardSet, HardSetConfig, ReplayBuffer, ReplayConfig, screening_ids
from flywheel.search.driver import derive_seed
from flywheel.tasks import Problem

log = logging.getLogger(__name__)

SearchOutcome = tuple[str, list[tuple[tuple[int, ...], str]], int]
"""One finished search as the replay buffer sees it: (problem id, the correct responses as
(token ids, text), the number of trajectories searched)."""


@dataclass(frozen=True)
class RoundChange:
    """What one round's end changed: hard-set size before and after, problems newly cached."""

    before: int
    after: int
    newly_cached: int


class Curriculum:
    """The hard set, the replay buffer, the round and the cursor of one run.

    Args:
        hard_set: the Pass1@K screening rule (`--data.hard_set.*`).
        replay: the replay buffer's registration rule (`--data.replay.*`).
        epochs_per_round: epochs per flywheel round (`--data.epochs_per_round`).
        seed: seed of the problem order (`--data.seed`).
    """

    def __init__(self, hard_set: HardSetConfig, replay: ReplayConfig, epochs_per_round: int, seed: int) -> None:
        if epochs_per_round < 1:
            raise ValueError(f"--data.epochs_per_round must be >= 1, got {epochs_per_round}; set it to 1 or more")
        self.hard_set_config = hard_set
        self.replay_config = replay
        self.epochs_per_round = epochs_per_round
        self.seed = seed
        self.hard: HardSet | None = None
        """The current hard set; None until the first epoch screens it."""
        self.buffer = ReplayBuffer(replay)
        self.round = 0
        """Flywheel rounds completed."""
        self.cursor = 0
        """Problems of this round's shuffled hard-set stream consumed so far."""
        self.tokens = TokenLedger()
        """Tokens generated in trees, flat samples and screening, per run and per round."""
        self.solved = SolvedLedger()
        """The training problems the run's rollouts solved: each one's first solve, and this round's."""

    # ------------------------------------------------------------------ rounds
    def round_starts(self, epoch: int) -> bool:
        """Whether `epoch` (0-based) is the first epoch of a round."""
        return epoch % self.epochs_per_round == 0

    def round_ends(self, epoch: int) -> bool:
        """Whether epoch `epoch` (0-based) is the last of a round: THE place that decides it."""
        return (epoch + 1) % self.epochs_per_round == 0

    @property
    def started(self) -> bool:
        return self.hard is not None

    def start(self, ids: Sequence[str], rates: Mapping[str, float]) -> None:
        """D_hard(0) from the base policy's Pass1@K rates (Eq. 8); every id when screening is off."""
        cfg = self.hard_set_config
        self.hard = HardSet.initial(list(ids), rates, cfg)
        if not cfg.enabled:
            log.info("hard set off: training on all %d problems", len(ids))
        else:
            log.info("hard set: %d of %d screened training problems have Pass1@%d %s %.2f under the base policy",
                     len(self.hard), len(ids), cfg.k, "<" if cfg.comparison == "lt" else "<=", cfg.delta)

    def start_streaming(self) -> None:
        """Problems streamed from files (`--data.problems.stream`): no pool to screen, so the
        hard set stays empty and each epoch's draw is screened instead."""
        self.hard = HardSet.initial([], {}, self.hard_set_config)
        log.info("problems streamed: each epoch's draw is %s", "screened, the hard ones searched"
                 if self.hard_set_config.enabled else "searched whole (hard set off)")

    def to_screen(self, pool_ids: Sequence[str]) -> list[str]:
        """The training problems the next screening measures: before the first, the pool
        (Eq. 8); at a round's end the hard set (Eq. 9). With `--data.hard_set.rescreen=all`
        both are the pool, or a seeded sample of `screen_problems` of it (new every round)
        plus the replay buffer's pending candidates (flywheel.adaptive.rescreen)."""
        cfg = self.hard_set_config
        if cfg.rescreen == "all":
            return list(screening_ids(pool_ids, sample=cfg.screen_problems, seed=derive_seed(self.seed, self.round, 11),
                                      always=self.buffer.pending))
        return list(pool_ids) if self.hard is None else list(self.hard.ids)

    def end_round(self, rates: Mapping[str, float], screened: Sequence[str] | None = None) -> RoundChange:
        """Refresh the hard set with the trained policy's rates, settle the replay buffer's
        candidates against the same rates, and start the next round's stream.

        `--data.hard_set.rescreen=hard` (Eq. 9): the set shrinks to its members still hard,
        and the buffer keeps only them (`retain`: the paper's Table 6, cached + unsolved =
        |D_hard|). `rescreen=all`: the set is the `screened` problems still hard, so it can
        grow again; the buffer keeps every problem's solutions, since a problem that leaves
        may come back, and then gets its mixed rollout instead of a new search (its size is
        bounded by `--data.replay.max_problems`)."""
        if self.hard is None:
            raise RuntimeError("a round ended before the first epoch screened the hard set")
        before = len(self.hard)
        regrow = self.hard_set_config.enabled and self.hard_set_config.rescreen == "all"
        if regrow and screened is None:
            raise ValueError("--data.hard_set.rescreen=all: a round's end needs the problems it screened")
        self.hard = self.hard.rescreen(screened, rates) if regrow else self.hard.refresh(rates)
        registered = self.buffer.settle(rates)
        if not regrow:
            self.buffer.retain(self.hard.ids)
        self.round += 1
        self.cursor = 0
        log.info("round %d: hard set %d -> %d%s, %d newly cached, %d problems in the replay buffer",
                 self.round, before, len(self.hard), f" ({len(screened)} problems re-screened)" if regrow else "",
                 len(registered), len(self.buffer))
        return RoundChange(before, len(self.hard), len(registered))

    @property
    def cached_count(self) -> int:
        """Hard-set problems with cached solutions: those that get mixed rollouts (the paper's
        Table 6 "cached"; the whole buffer under rescreen=hard, which keeps it inside the set)."""
        if self.hard is None:
            return len(self.buffer)
        return sum(pid in self.hard for pid in self.buffer)

    def count_tokens(self, split: TokenSplit) -> None:
        """Add generated tokens (summed over the ranks) to this round's and the run's split."""
        self.tokens.add(split, self.round)

    def count_solved(self, per_rank: Iterable[Iterable[str]], tokens: int) -> None:
        """Add an epoch's solved problems (every rank's ids: `Rollouts.solved`, all-gathered) to
        this round's, with `tokens` the run's training tokens at the epoch's end."""
        self.solved.add((i for ids in per_rank for i in ids), self.round, tokens)

    def screening_seed(self) -> int:
        """Seed of this round's Pass1@K screening samples."""
        return derive_seed(self.seed, self.round, 7)

    # ------------------------------------------------------------------ problems
    def next_problems(self, pool: Mapping[str, Problem], count: int) -> list[Problem]:
        """The next `count` problems of this round's endless stream over the hard set: each
        pass is a fresh seeded permutation, so the order depends only on (seed, round, cursor).
        One draw never holds a problem twice (an epoch's results are keyed by problem id: a
        second copy would be searched for nothing and its twin trained twice): at most the
        hard set's size, and a draw that runs into the next pass skips the problems it already
        holds (the cursor moves past them)."""
        ids = [i for i in self.hard.ids if i in pool] if self.hard is not None else list(pool)
        if count > len(ids) > 0:
            log.info("round %d: %d problems left to draw from, fewer than the %d asked for; the epoch takes each once",
                     self.round, len(ids), count)
        count = min(count, len(ids))
        out: list[Problem] = []
        taken: set[str] = set()
        while len(out) < count:
            epoch_pass, offset = divmod(self.cursor, len(ids))
            order = list(range(len(ids)))
            random.Random(f"{self.seed}:{self.round}:{epoch_pass}").shuffle(order)
            for i in order[offset:]:
                self.cursor += 1
                if ids[i] not in taken:
                    taken.add(ids[i])
                    out.append(pool[ids[i]])
                    if len(out) == count:
                        break
        return out

    # ------------------------------------------------------------------ replay buffer
    def cached(self, problem_id: str) -> tuple[CachedSolution, ...]:
        """The cached solutions of a problem (empty when it has none)."""
        return self.buffer.solutions(problem_id) if problem_id in self.buffer else ()

    def observe(self, outcomes: Iterable[SearchOutcome]) -> None:
        """Offer finished searches to the replay buffer (the same outcomes, in the same order,
        on every rank)."""
        for problem_id, correct, count in outcomes:
            if count:
                responses = [CachedSolution(problem_id, tuple(ids), text, self.round) for ids, text in correct]
                self.buffer.observe(problem_id, responses, round=self.round, search_trajectories=count)

    def cached_after(self, outcomes: Iterable[SearchOutcome], ids: Iterable[str]) -> dict[str, tuple[CachedSolution, ...]]:
        """The cached solutions of problems `ids` as they will be once `outcomes` are observed,
        the buffer itself unchanged (a search started before an earlier epoch's trees are
        recorded sees the solutions they hold: data_modules.search_ahead)."""
        ahead = copy.copy(self)
        ahead.buffer = copy.deepcopy(self.buffer)
        ahead.observe(outcomes)
        return {i: ahead.cached(i) for i in ids}

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "cursor": self.cursor,
            "hard_set": self.hard.to_dict() if self.hard is not None else None,
            "replay_buffer": self.buffer.to_dict(),
            "tokens": self.tokens.state_dict(),
            "solved": self.solved.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from `state_dict()`; raises KeyError / TypeError / ValueError on a malformed one."""
        round_, cursor = int(state["round"]), int(state["cursor"])
        hard = HardSet.from_dict(state["hard_set"], self.hard_set_config) if state["hard_set"] is not None else None
        buffer = ReplayBuffer.from_dict(state["replay_buffer"], self.replay_config)
        tokens = TokenLedger()
        if state.get("tokens") is not None:  # absent in checkpoints from before the split was counted
            tokens.load_state_dict(state["tokens"])
        solved = SolvedLedger()
        if state.get("solved") is not None:  # absent in checkpoints from before solved problems were kept
            solved.load_state_dict(state["solved"])
        self.round, self.cursor, self.hard, self.buffer = round_, cursor, hard, buffer
        self.tokens, self.solved = tokens, solved
