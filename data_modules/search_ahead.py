"""Searching the next epoch while this one trains (`--data.async_search.max_staleness=1`, issue 35).

With the switch on, the data module and the round protocol (callbacks.rounds) run this
timeline; v(t) = the weights after epoch t's optimizer steps, pushed to the generator at
epoch t's end (v(-1) = the starting weights):

    train_dataloader(t)  take epoch t's search (finished during epoch t-1), or run it now when
                         there is none (the first epoch, a resume); when epoch t+1's search
                         is not already in flight, draw its problems and start it on a thread
                         (the sidecar samples from v(t-1)); build epoch t's mini-batches
                         (pi_old from the trainer's v(t-1))
    epoch t's steps      the trainer trains on epoch t's trees while the sidecar searches t+1
    epoch t's end        wait for search t+1 (a push mid-search would mix weight versions in a
                         tree) and keep it for its epoch, push v(t) once, then the round's end
                         (screening, held-out evaluation, value model) on the pushed v(t); then
                         draw epoch t+2's problems and start their search on v(t), so the
                         generator searches while the checkpoint is written and epoch t+1's
                         loader is built (its cached solutions: the replay buffer's with epoch
                         t+1's trees observed, as if t+1 were recorded first)

So epoch t+1 trains from v(t) on samples of v(t-1): one sync old (staleness 1; 0 for the
first epoch and for an epoch searched in place). The loss corrects the lag with the truncated
importance weight min(pi_old / pi_generator, tis_cap) (`--model.old_logprobs=recompute_tis`:
pi_old is the trainer's v(t), pi_generator the behaviour log-probs of v(t-1)).

Everything the search reads of the curriculum is fixed when it starts: its problems are drawn
on the main thread (the cursor moves there) and the replay buffer's solutions of those
problems are copied; the search thread only samples, grades and credits, and never reads the
curriculum, which the main thread changes as before (the replay buffer observing the epoch
before it, while it runs; the round's end, after it ended).

Resume (the rule): a checkpoint holds the problems drawn for every search not yet trained on
(`state`: at an epoch's end, epoch t+1's finished one and epoch t+2's in flight), never a
search's result. A resumed run searches epoch t+1's problems again, in place, with the resumed
weights (staleness 0 for that epoch), then starts epoch t+2's on the problems drawn for it. A
stop (SIGTERM, Ctrl-C) abandons the search in flight at its next search round
(`flywheel.run.preemption.stop_requested`) and starts none, with the same outcome. So no
epoch's trees are lost, trained twice, or half-used, and no problem is drawn twice.
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
    """The searches of later epochs: the one in flight, those finished and not yet trained on,
    and the problems drawn for each until its epoch takes it (see the module docstring)."""

    def __init__(self) -> None:
        self.drawn: dict[int, tuple[str, ...]] = {}
        """epoch -> problem ids of every search started and not yet trained on (in checkpoints)."""
        self._finished: dict[int, Searched] = {}
        self._thread: threading.Thread | None = None
        self._epoch: int | None = None
        """The epoch of the search in flight."""
        self._cancel = threading.Event()
        self._outcome: Searched | BaseException | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def holds(self, epoch: int) -> bool:
        """A search of `epoch` is in flight or finished (nothing to start for it)."""
        return epoch in self._finished or (self._thread is not None and self._epoch == epoch)

    def launch(self, epoch: int, problems: Sequence[Problem], version: int, pushes: int,
               search: Callable[[Callable[..., None]], Rollouts], stop: Callable[[], bool] = lambda: False) -> None:
        """Start `search(advance)` for `epoch`'s `problems` on a thread. `advance(done, tokens)`
        is its progress callback, called after every search round: it raises `Abandoned` once
        `finish(abandon=True)` or `stop()` asks."""
        if self._thread is not None:
            raise RuntimeError(f"a search ahead is already in flight (for epoch {self._epoch})")
        problems = tuple(problems)
        self.drawn[epoch] = tuple(p.id for p in problems)
        self._epoch, self._outcome = epoch, None
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
        """Wait for the search in flight and keep it for its epoch; with `abandon` stop it first
        (at its next search round) and drop it: its problems stay drawn, to be searched again.
        Raises the search's error. Returns the seconds waited (0.0 with nothing in flight)."""
        if self._thread is None:
            return 0.0
        start = time.perf_counter()
        if abandon:
            self._cancel.set()
        self._thread.join()
        self._thread = None
        epoch, outcome, self._outcome = self._epoch, self._outcome, None
        if abandon or isinstance(outcome, Abandoned):
            log.info("the search ahead of epoch %d was not kept: its %d problems are searched again when the run "
                     "goes on", epoch, len(self.drawn[epoch]))
            if isinstance(outcome, BaseException) and not isinstance(outcome, Abandoned):
                log.warning("the abandoned search ahead had failed: %s: %s", type(outcome).__name__, outcome)
        elif isinstance(outcome, BaseException):
            raise outcome
        else:
            self._finished[epoch] = outcome
        return time.perf_counter() - start

    def finished(self, epoch: int) -> Searched | None:
        """`epoch`'s finished search, still held for its epoch (None: none is)."""
        return self._finished.get(epoch)

    def take(self, epoch: int) -> Searched | None:
        """The finished search of `epoch` (waited for when it is the one in flight; then nothing
        is drawn for `epoch` any more), or None: none was kept (the first epoch, an abandoned
        search, a resumed run; `redo` names the problems)."""
        if self._thread is not None and self._epoch == epoch:
            self.finish()
        searched = self._finished.pop(epoch, None)
        if searched is not None:
            self.drawn.pop(epoch, None)
        return searched

    def redo(self, epoch: int) -> tuple[str, ...] | None:
        """The problem ids drawn for `epoch` whose search was not kept, or None."""
        return None if epoch in self._finished else self.drawn.get(epoch)

    def done(self, epoch: int) -> None:
        """`epoch`'s problems were searched in place: none of them is drawn ahead any more."""
        self.drawn.pop(epoch, None)

    def close(self, timeout: float = 30.0) -> None:
        """Stop a search still in flight (the run ends or fails): it ends at its next search
        round; waited for at most `timeout` seconds (a daemon thread: it never holds the process
        up, and its requests fail once the servers are stopped). Finished searches are dropped."""
        if self._thread is not None:
            self._cancel.set()
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("the search ahead did not stop within %.0f s; leaving it to end with its generator", timeout)
            self._thread, self._outcome = None, None
        self._finished.clear()

    # ------------------------------------------------------------------ resume
    def state(self) -> dict[str, Any] | None:
        """The problems drawn ahead, by epoch (never a search's result: a resumed run searches them again)."""
        if not self.drawn:
            return None
        return {"drawn": [{"epoch": epoch, "problems": list(ids)} for epoch, ids in sorted(self.drawn.items())]}

    def load(self, state: Mapping[str, Any] | None) -> None:
        """Restore `state()` (None: nothing drawn ahead; a checkpoint of one draw,
        {"epoch", "problems"}, from before two could be); raises KeyError / TypeError /
        ValueError on a malformed one."""
        self._finished.clear()
        if state is None:
            self.drawn = {}
            return
        drawn = {}
        for entry in state["drawn"] if "drawn" in state else [state]:
            ids = entry["problems"]
            if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
                raise ValueError(f"search_ahead.problems must be a list of problem ids, got {ids!r}")
            drawn[int(entry["epoch"])] = tuple(ids)
        self.drawn = drawn


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
