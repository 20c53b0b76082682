"""Searching the next epoch while this one trains (`--data.async_search.max_staleness=1`, issue 35).

With the switch on, the data module and the round protocol (callbacks.rounds) run this
timeline; v(t) = the weights after epoch t's optimizer steps, pushed to the generator at
epoch t's end (v(-1) = the starting weights):

    train_dataloader(t)  take epoch t's search (started during epoch t-1), or run it now when
                         there is none (the first epoch, a resume); draw epoch t+1's problems
                         and start their search on a thread: the sidecar samples from v(t-1);
                         build epoch t's mini-batches (pi_old from the trainer's v(t-1))
    epoch t's steps      the trainer trains on epoch t's trees while the sidecar searches t+1
    epoch t's end        wait for search t+1 (a push mid-search would mix weight versions in a
                         tree), push v(t) once, then the round's end (screening, held-out
                         evaluation, value model) on the pushed v(t)

So epoch t+1 trains from v(t) on samples of v(t-1): one sync old (staleness 1; 0 for the
first epoch and for an epoch searched in place). The loss corrects the lag with the truncated
importance weight min(pi_old / pi_generator, tis_cap) (`--model.old_logprobs=recompute_tis`:
pi_old is the trainer's v(t), pi_generator the behaviour log-probs of v(t-1)).

Everything the search reads of the curriculum is fixed when it starts: its problems are drawn
on the main thread (the cursor moves there) and the replay buffer's solutions of those
problems are copied; the search thread only samples, grades and credits. The curriculum is
changed on the main thread only, after the search ended (the round's end) or before it
started (the replay buffer's `observe`).

Resume (the rule): a checkpoint holds the problems drawn for the search ahead (`state`), never
its result. A checkpoint is written at an epoch's end, after the wait: the finished search is
then dropped with the process, and the resumed run searches those same problems again, in
place, with the resumed weights (staleness 0 for that epoch). A stop (SIGTERM, Ctrl-C) abandons
the search at its next search round (`flywheel.run.preemption.stop_requested`) with the same
outcome. So no epoch's trees are lost, trained twice, or half-used.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from data_modules.rollout import Rollouts
from data_modules.settings import AsyncSearchConfig
from flywheel.tasks import Problem

log = logging.getLogger(__name__)

FLAG = "--data.async_search.max_staleness"


class Abandoned(Exception):
    """A search ahead stopped between two search rounds (`SearchAhead.finish(abandon=True)`, or
    a stop request)."""


@dataclass(frozen=True)
class Searched:
    """One epoch's search, done ahead or in place."""

    epoch: int
    problems: tuple[Problem, ...]
    rollouts: Rollouts
    seconds: float
    """Wall seconds of the search (on its own thread when done ahead)."""
    version: int
    """The optimizer step of the generator's weights it sampled from."""
    pushes: int
    """The generator's weight syncs before it started (`LiveGenerator.pushes`)."""


def staleness(searched: Searched, pushes_now: int, step_now: int) -> tuple[int, int]:
    """(weight syncs, optimizer steps) between the weights that sampled `searched` and the
    trainer's weights now."""
    return pushes_now - searched.pushes, step_now - searched.version


class SearchAhead:
    """The one search of the next epoch in flight, and the problems drawn for it until its
    epoch takes it (see the module docstring)."""

    def __init__(self) -> None:
        self.pending: tuple[int, tuple[str, ...]] | None = None
        """(epoch, problem ids) of a search started and not yet trained on (in checkpoints)."""
        self._thread: threading.Thread | None = None
        self._cancel = threading.Event()
        self._outcome: Searched | BaseException | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def launch(self, epoch: int, problems: Sequence[Problem], version: int, pushes: int,
               search: Callable[[Callable[..., None]], Rollouts], stop: Callable[[], bool] = lambda: False) -> None:
        """Start `search(advance)` for `epoch`'s `problems` on a thread. `advance(done, tokens)`
        is its progress callback, called after every search round: it raises `Abandoned` once
        `finish(abandon=True)` or `stop()` asks."""
        if self._thread is not None or self._outcome is not None:
            raise RuntimeError(f"a search ahead is already in flight (for epoch {self.pending and self.pending[0]})")
        problems = tuple(problems)
        self.pending = (epoch, tuple(p.id for p in problems))
        self._cancel.clear()

        def advance(done: int, tokens: int | None = None) -> None:
            if self._cancel.is_set() or stop():
                raise Abandoned(f"the search ahead of epoch {epoch} was abandoned")

        def work() -> None:
            start = time.perf_counter()
            try:
                out = search(advance)
                self._outcome = Searched(epoch, problems, out, time.perf_counter() - start, version, pushes)
            except BaseException as err:  # handed to the main thread by `finish`
                self._outcome = err

        self._thread = threading.Thread(target=work, name=f"flywheel-search-ahead-{epoch}", daemon=True)
        self._thread.start()
        log.info("epoch %d: searching its %d problems ahead, with the weights of step %d", epoch, len(problems), version)

    def finish(self, abandon: bool = False) -> float:
        """Wait for the search in flight; with `abandon` stop it first (at its next search
        round) and drop it: its problems stay `pending`, to be searched again. Raises the
        search's error. Returns the seconds waited (0.0 with nothing in flight)."""
        if self._thread is None:
            return 0.0
        start = time.perf_counter()
        if abandon:
            self._cancel.set()
        self._thread.join()
        self._thread = None
        outcome = self._outcome
        if abandon or isinstance(outcome, Abandoned):
            self._outcome = None
            log.info("the search ahead of epoch %d was not kept: its %d problems are searched again when the run "
                     "goes on", self.pending[0], len(self.pending[1]))
            if isinstance(outcome, BaseException) and not isinstance(outcome, Abandoned):
                log.warning("the abandoned search ahead had failed: %s: %s", type(outcome).__name__, outcome)
        elif isinstance(outcome, BaseException):
            self._outcome = None
            raise outcome
        return time.perf_counter() - start

    def take(self, epoch: int) -> Searched | None:
        """The finished search of `epoch` (then nothing is pending), or None: none was kept
        (the first epoch, an abandoned search, a resumed run; `redo` names the problems)."""
        self.finish()
        outcome, self._outcome = self._outcome, None
        if outcome is None:
            return None
        if outcome.epoch != epoch:  # cannot happen: the loop builds every epoch's loader in turn
            raise RuntimeError(f"the search ahead was for epoch {outcome.epoch}, epoch {epoch} asks for it")
        self.pending = None
        return outcome

    def redo(self, epoch: int) -> tuple[str, ...] | None:
        """The problem ids drawn for `epoch` whose search was not kept, or None."""
        if self.pending is not None and self.pending[0] == epoch:
            return self.pending[1]
        return None

    def done(self, epoch: int) -> None:
        """`epoch`'s problems were searched in place: none of them is pending any more."""
        if self.pending is not None and self.pending[0] == epoch:
            self.pending = None

    def close(self, timeout: float = 30.0) -> None:
        """Stop a search still in flight (the run ends or fails): it ends at its next search
        round; waited for at most `timeout` seconds (a daemon thread: it never holds the process
        up, and its requests fail once the servers are stopped)."""
        if self._thread is not None:
            self._cancel.set()
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("the search ahead did not stop within %.0f s; leaving it to end with its generator", timeout)
            self._thread, self._outcome = None, None

    # ------------------------------------------------------------------ resume
    def state(self) -> dict[str, Any] | None:
        if self.pending is None:
            return None
        return {"epoch": self.pending[0], "problems": list(self.pending[1])}

    def load(self, state: Mapping[str, Any] | None) -> None:
        """Restore `state()` (None: nothing pending); raises KeyError / TypeError / ValueError on a malformed one."""
        if state is None:
            self.pending = None
            return
        ids = state["problems"]
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise ValueError(f"search_ahead.problems must be a list of problem ids, got {ids!r}")
        self.pending = (int(state["epoch"]), tuple(ids))


def refusal(config: AsyncSearchConfig, *, own_weights: bool, world_size: int, old_logprobs: str, loss_type: str,
            stream: bool, value_head_search: bool) -> str | None:
    """Why `config` cannot run with these settings (one line naming the flags and the fix), or
    None. Checked before the run starts (flywheel.run.preflight)."""
    if not config.enabled:
        return None
    on = f"{FLAG}={config.max_staleness}"
    if not own_weights:
        return (f"{on} searches the next epoch while this one trains, which needs a generator with weights of its "
                "own: the in-process generator samples from the trainer's parameters, which the optimizer changes "
                "under it mid-search. Use the vLLM sidecar (--data.generator=flywheel.generation.vllm.VLLMSidecar) "
                f"or set {FLAG}=0")
    if world_size > 1:
        return f"{on} runs in one process only for now (this run has {world_size}); set {FLAG}=0 or --trainer.devices=1"
    if stream:
        return (f"{on} does not work with --data.problems.stream=true yet (each epoch's draw is screened with the "
                f"generator); set {FLAG}=0 or --data.problems.stream=false")
    if value_head_search:
        return (f"{on} does not work with --data.search.selection=puct_agents and a value head: the search would "
                "score its nodes with the policy the trainer is updating; set "
                f"{FLAG}=0 or --model.objective.value_coef=0")
    if loss_type != "self_training" and old_logprobs != "recompute_tis":
        return (f"{on} trains on samples from weights one sync older than the trained ones, which the loss must "
                f"correct with the truncated importance weight: set --model.old_logprobs=recompute_tis (now "
                f"{old_logprobs!r}: {_WHY.get(old_logprobs, 'no correction')})")
    return None


_WHY = {"recompute": "the lag goes uncorrected", "behaviour": "the stale generator would be the PPO ratio's pi_old, "
        "uncorrected and clipped around old weights"}
