"""The SFT run's loop around `sft_step`: progress, checkpoints, Ctrl-C / SIGTERM, resume.

A checkpoint (`OUT/sft_checkpoint.pt`, written atomically) holds the weights, the optimizer,
the step reached, the losses so far, the settings and a fingerprint of the traces. A run
stopped by Ctrl-C (or SIGTERM) finishes its current step, writes one and exits 130 (143); a
second Ctrl-C stops at once (the newest checkpoint stays). Resuming restores it and skips the
batches already trained on, so the weights come out as an uninterrupted run's.
"""

from __future__ import annotations

import hashlib
import logging
import signal
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from flywheel.io import atomic_writer
from flywheel.sft.loop import (
    SftSettings,
    SftState,
    autocast_bf16,
    loss_function,
    lr_at,
    make_optimizer,
    sft_batches,
    sft_step,
)
from flywheel.sft.traces import Trace

log = logging.getLogger("flywheel.sft")

CHECKPOINT = "sft_checkpoint.pt"
"""The resumable state of an unfinished run, inside its output folder."""
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}


class SftStopped(SystemExit):
    """Ctrl-C or SIGTERM stopped the run after a step; its checkpoint is written."""


def traces_fingerprint(traces: Sequence[Sequence[Trace]]) -> str:
    """A digest of the training data, so a resume refuses other traces than its run's."""
    digest = hashlib.sha256()
    for group in traces:
        for trace in group:
            digest.update(repr((trace.input_ids, trace.prompt_len, trace.loss_mask)).encode())
        digest.update(b"|")
    return digest.hexdigest()[:16]


def save_checkpoint(path: Path, model: Any, optimizer: torch.optim.Optimizer, state: SftState,
                    settings: SftSettings, fingerprint: str) -> None:
    payload = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "state": asdict(state),
               "settings": asdict(settings), "traces": fingerprint}
    with atomic_writer(path) as fh:
        torch.save(payload, fh)


def load_checkpoint(path: Path, model: Any, optimizer: torch.optim.Optimizer, settings: SftSettings,
                    fingerprint: str) -> SftState:
    """The state saved at `path`, its weights loaded into `model` and its moments into `optimizer`;
    ValueError when the run it belongs to had other settings or other traces."""
    payload = torch.load(path, map_location="cpu", weights_only=True)
    saved, given = payload["settings"], asdict(settings)
    if saved != given:
        differ = ", ".join(f"{k} {saved.get(k)!r} there, {given[k]!r} here" for k in sorted(given) if saved.get(k) != given[k])
        raise ValueError(f"{path} was written by a run with other settings ({differ}); give the same settings to "
                         "resume it, or another --out to start afresh")
    if payload["traces"] != fingerprint:
        raise ValueError(f"{path} was written by a run on other training rows; give the same data to resume it, "
                         "or another --out to start afresh")
    model.load_state_dict(payload["model"])
    optimizer.load_state_dict(payload["optimizer"])
    return SftState(**payload["state"])


class StopSignals:
    """While in use, the first Ctrl-C or SIGTERM is remembered (`received`) for the loop to stop
    at its step's end; a second Ctrl-C raises KeyboardInterrupt at once. Handlers are put back
    on exit. Outside the main thread it does nothing (signals reach only that one)."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in EXIT_CODES:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signum
        log.warning("%s: stopping after this step (the checkpoint is written; Ctrl-C again stops at once)",
                    signal.Signals(signum).name)

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def train(model: Any, traces: Sequence[Sequence[Trace]], settings: SftSettings, pad_id: int, *,
          checkpoint: Path | None = None, save_every: int = 0, resume: bool = False,
          on_step: Callable[[SftState], None] | None = None) -> SftState:
    """Run the SFT steps on `model` in place and return the finished state.

    checkpoint: where the resumable state is written every `save_every` steps (0: only when
        stopped) and read from with `resume`; None: no checkpoints (the tiny recipe).
    on_step: called after every step with the state (progress bars, logs).
    """
    fingerprint = traces_fingerprint(traces) if checkpoint is not None else ""
    optimizer = make_optimizer(model, settings)
    state = SftState()
    if resume and checkpoint is not None and checkpoint.exists():
        state = load_checkpoint(checkpoint, model, optimizer, settings, fingerprint)
        log.info("resuming %s at step %d of %d", checkpoint, state.step, settings.steps)
    model.train()
    loss_of = loss_function(model, traces, settings)
    bf16 = autocast_bf16(settings, model)
    with StopSignals() as signals:
        for step, batch in enumerate(sft_batches(traces, settings, pad_id, start=state.step), start=state.step):
            started = time.perf_counter()
            state.losses.append(sft_step(model, optimizer, loss_of, batch, lr_at(step, settings), settings, bf16))
            state.seconds.append(time.perf_counter() - started)
            state.tokens += int((batch[2] != -100).sum())
            state.step = step + 1
            if on_step is not None:
                on_step(state)
            due = save_every and state.step % save_every == 0 and state.step < settings.steps
            if checkpoint is not None and (due or signals.received is not None):
                save_checkpoint(checkpoint, model, optimizer, state, settings, fingerprint)
            if signals.received is not None:
                where = f"; {checkpoint} resumes it (--resume=true)" if checkpoint is not None else ""
                log.warning("stopped at step %d of %d%s", state.step, settings.steps, where)
                raise SftStopped(EXIT_CODES[signals.received])
    model.eval()
    return state
