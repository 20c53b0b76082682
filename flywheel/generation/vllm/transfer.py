"""The trainer's half of a weight sync through vLLM's weight-transfer API (no staging folder).

vLLM's servers take weights over /init_weight_transfer_engine, /start_weight_update,
/update_weights and /finish_weight_update, with the bytes on a side channel that the server's
weight-transfer engine opens (`--weight-transfer-config '{"backend": ...}'`): `nccl` (vLLM's,
GPU to GPU), `ipc` (vLLM's, CUDA IPC handles for a server on the trainer's own GPU) and
`gloo` (this project's vLLM plugin, `flywheel.generation.vllm_plugin`: CPU tensors over a gloo
group). The trainer side is vLLM's trainer engine for the backend, built through vLLM's
`WeightTransferTrainerFactory`, over

- `SyncClient`: vLLM's four-call client protocol (`VLLMWeightSyncClient`) over every server at
  once, with the run's secret on each request (vLLM's own `HTTPVLLMWeightSyncClient` sends no
  secret, so it cannot pass the servers' middleware), each server given its own ranks in the
  transfer group, and an error that names the server;
- `StreamedWeights`: vLLM's weight-source protocol (`metadata()` and a fresh pass per sync)
  over the policy's state dict, gathered one decoder layer at a time from DeepSpeed ZeRO-3
  shards and cast to the servers' dtype, so the whole model is never in memory twice.

The gloo trainer engine (`GlooTrainerWeightTransferEngine`) lives here too: it needs only
torch, so a trainer whose environment has no vLLM (the CPU test setup: vLLM runs in a venv
of its own) still syncs through it; `nccl` and `ipc` need vllm importable by the trainer.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
import time
import urllib.error
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from itertools import groupby
from typing import Any, ClassVar, Iterator, Sequence

import torch

from flywheel.generation.vllm.client import SidecarError, http_get, http_post, refused_secret
from flywheel.generation.vllm.server import UNREACHABLE, Server, free_port
from flywheel.generation.vllm_plugin import BACKEND as GLOO
from flywheel.generation.vllm_plugin.gloo import DTYPES, GlooInitInfo, GlooUpdateInfo, broadcast, open_group

log = logging.getLogger(__name__)

DISK = "disk"
TRANSFERS = ("nccl", "ipc", GLOO)
"""The weight-transfer engines the sidecar drives (vLLM's `nccl` and `ipc`, this project's `gloo`)."""
SETTING = "--data.generator.init_args.weight_transfer"
ABANDON = "flywheel_abandon_open_sync"
"""The field of the /update_weights a server refuses on purpose (`SyncClient.abandon_weight_update`)."""


# ---------------------------------------------------------------------------- the weights
@dataclass(frozen=True)
class ParamMeta:
    """One tensor of a sync: name (the Hugging Face checkpoint's), wire dtype, full shape
    (vLLM's `ParamMeta`, which the trainer engines read)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]


def layer_key(name: str) -> str | None:
    """The decoder layer a parameter belongs to (`model.layers.3.mlp.up_proj.weight` ->
    `model.layers.3`), None outside the layer stack (embeddings, final norm, head)."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return None


class StreamedWeights:
    """The policy's weights as vLLM's trainer engines read them (`WeightSource`): `metadata()`
    without gathering anything, and a fresh pass of (name, tensor) per iteration.

    A pass gathers one run of parameters at a time (a decoder layer, or the parameters around
    the stack), so with ZeRO-3 the full weights of one layer are in memory at once, not the
    model's. Every trainer rank iterates in step (the gather is a collective); a rank that
    stopped halfway (a failed send) must `drain` the pass so the others are not left waiting.

    Args:
        model: the policy (not a PEFT model: LoRA adapters go through the disk path).
        dtype: the dtype the servers hold (the tensors travel in it).
        device: where the tensors must be for the backend (CPU for gloo, the trainer's GPU
            for nccl and ipc).
    """

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype, device: torch.device | str) -> None:
        self.model = model
        self.dtype = dtype
        self.device = torch.device(device)
        self._pass: Iterator[tuple[str, torch.Tensor]] | None = None

    def _tensors(self) -> list[tuple[str, torch.Tensor]]:
        # Tied weights appear under both names: vLLM's in-place reload does not re-tie them.
        return list(self.model.state_dict(keep_vars=True).items())

    def metadata(self) -> list[ParamMeta]:
        return [ParamMeta(n, self.dtype, tuple(getattr(t, "ds_shape", t.shape))) for n, t in self._tensors()]

    def held_names(self) -> None:
        return None  # every rank can produce every tensor (ZeRO-3 gathers it)

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        self._pass = self._stream()
        return self._pass

    def _stream(self) -> Iterator[tuple[str, torch.Tensor]]:
        for _, run in groupby(self._tensors(), key=lambda item: layer_key(item[0])):
            run = list(run)
            with gathered([t for _, t in run]):
                for name, tensor in run:
                    yield name, tensor.detach().to(device=self.device, dtype=self.dtype).contiguous()

    def drain(self) -> None:
        """Finish the current pass, or run a whole one when none started, without using it
        (the gathers only): what a rank that failed owes the ranks still gathering."""
        current, self._pass = self._pass, None
        for _ in current if current is not None else self._stream():
            pass


def gathered(tensors: Sequence[torch.Tensor]):
    """DeepSpeed ZeRO-3 partitioned parameters gathered in full on every rank for the block
    (collective); anything else as it is."""
    partitioned = [t for t in tensors if hasattr(t, "ds_id")]
    if not partitioned:
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(partitioned, modifier_rank=None)


# ---------------------------------------------------------------------------- the control plane
class SyncClient:
    """vLLM's weight-sync client protocol over all the sidecar's servers at once.

    Each call goes to every server concurrently (a server blocks in /update_weights and in
    /init_weight_transfer_engine until the trainer's side of the transfer meets it) and
    fails with a SidecarError naming every server that refused, and why. A call is sent
    once: a retried /update_weights would wait for tensors the trainer has already sent.

    `init_weight_transfer_engine` gives server i the group ranks after those of servers
    0..i-1 (`workers[i]` each), whatever `rank_offset` the trainer engine wrote: vLLM's
    engines assume one server.
    """

    def __init__(self, servers: Sequence[Server], workers: Sequence[int], timeout: float) -> None:
        self.servers = list(servers)
        self.workers = list(workers)
        self.timeout = timeout
        self.failures: list[str] = []
        """What each server that failed a call said, as soon as it said it (a failed transfer
        reports them even while the other calls are still waiting)."""
        self._in_flight = threading.Semaphore(0)
        self._calls = 0

    def settle(self, timeout: float) -> list[str]:
        """Wait up to `timeout` seconds for the calls in flight; the failures so far."""
        deadline = time.monotonic() + timeout
        while self._calls and self._in_flight.acquire(timeout=max(0.0, deadline - time.monotonic())):
            self._calls -= 1
        return list(self.failures)

    def _call(self, path: str, payloads: Sequence[dict | None]) -> None:
        def one(i: int) -> str | None:
            server, failure = self.servers[i], None
            server.posts += 1
            try:
                http_post(f"{server.url}{path}", payloads[i], timeout=self.timeout, token=server.token)
            except urllib.error.HTTPError as err:
                if err.code in (401, 403):
                    failure = str(refused_secret(server.url, err))
                else:
                    failure = f"the vLLM server at {server.url} refused {path} ({err.code}): " \
                              f"{err.read().decode(errors='replace')[:400]}"
            except UNREACHABLE as err:
                failure = f"the vLLM server at {server.url} did not answer {path}: {err}"
            if failure is not None:
                self.failures.append(failure)
            self._in_flight.release()
            return failure

        self._calls += len(self.servers)

        with ThreadPoolExecutor(max_workers=len(self.servers)) as pool:
            errors = [e for e in pool.map(one, range(len(self.servers))) if e is not None]
        if errors:
            raise SidecarError("; ".join(errors))

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        offsets = [1 + sum(self.workers[:i]) for i in range(len(self.servers))]
        payloads = [{"init_info": {**init_info, "rank_offset": o} if "rank_offset" in init_info else init_info}
                    for o in offsets]
        self._call("/init_weight_transfer_engine", payloads)

    def shutdown_weight_transfer_engine(self) -> None:
        self._call("/shutdown_weight_transfer_engine", [None] * len(self.servers))

    def start_weight_update(self) -> None:
        self._call("/start_weight_update", [None] * len(self.servers))

    def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]]) -> None:
        self._call("/update_weights", [{"update_info": _json_safe(update_info)}] * len(self.servers))

    def abandon_weight_update(self) -> None:
        """End any sync a server still holds open (one whose trainer died or timed out before
        finishing it: vLLM refuses the next /start_weight_update until it ends). vLLM's worker
        ends a sync whose /update_weights fails, so each server gets one that its engine
        cannot parse, and the refusal is the expected answer."""
        try:
            self._call("/update_weights", [{"update_info": {ABANDON: True}}] * len(self.servers))
        except SidecarError:
            pass
        self.failures.clear()

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        body = {"weight_version": weight_version} if weight_version is not None else None
        self._call("/finish_weight_update", [body] * len(self.servers))


def _json_safe(update_info: Any) -> Any:
    """CUDA IPC handles pickled for HTTP the way vLLM's own HTTP client does (ipc only; the
    servers need VLLM_ALLOW_INSECURE_SERIALIZATION=1 to read them)."""
    if isinstance(update_info, dict) and "ipc_handles" not in update_info:
        return update_info
    from vllm.distributed.weight_transfer.clients import _json_safe_update_payload

    return _json_safe_update_payload(update_info)


def worker_count(server: Server, timeout: float = 30.0) -> int:
    """The server's workers (tensor x pipeline x data parallel): the ranks it takes in a
    transfer group."""
    import json

    try:
        return int(json.loads(http_get(f"{server.url}/get_world_size", timeout=timeout, token=server.token))["world_size"])
    except (urllib.error.HTTPError, *UNREACHABLE, KeyError, ValueError) as err:
        raise SidecarError(f"could not ask the vLLM server at {server.url} for its world size: {err}") from err


# ---------------------------------------------------------------------------- the gloo engine, trainer side
@dataclass
class GlooTrainerInitInfo:
    """Trainer-side init info of the gloo engine (vLLM's `TrainerInitInfo` shape: `backend`
    picks the engine in `WeightTransferTrainerFactory`, `rank` 0 sends)."""

    backend: ClassVar[str] = GLOO

    master_address: str
    master_port: int
    world_size: int
    timeout_s: float = 300.0
    rank: int = 0

    @property
    def is_sender(self) -> bool:
        return self.rank == 0


class GlooTrainerWeightTransferEngine:
    """Sends the weights over a gloo group to every server's workers (see the module
    docstring); vLLM's `TrainerWeightTransferEngine` interface."""

    init_info_cls = GlooTrainerInitInfo

    def __init__(self, *, client: Any, source: Any, is_sender: bool = True) -> None:
        self.client = client
        self.source = source
        self.is_sender = is_sender
        self.group = None

    @classmethod
    def trainer_init(cls, init_info: GlooTrainerInitInfo, *, client: Any, source: Any = None):
        if source is None:
            raise ValueError("the gloo weight transfer needs a weight source")
        engine = cls(client=client, source=source, is_sender=init_info.is_sender)
        if not engine.is_sender:
            return engine
        worker = asdict(GlooInitInfo(init_info.master_address, init_info.master_port, 1, init_info.world_size,
                                     init_info.timeout_s))
        # The workers join inside /init_weight_transfer_engine, which returns once the group
        # is complete: call it beside hosting the group, and stop at the first failure.
        pool = ThreadPoolExecutor(max_workers=2)
        try:
            joined = pool.submit(client.init_weight_transfer_engine, worker)
            hosted = pool.submit(open_group, init_info.master_address, init_info.master_port, 0,
                                 init_info.world_size, init_info.timeout_s)
            done, _ = wait([joined, hosted], return_when=FIRST_EXCEPTION)
            for future in (joined, hosted):
                if future in done and future.exception() is not None:
                    raise future.exception()
            engine.group = hosted.result()
            joined.result()
        finally:
            pool.shutdown(wait=False)  # a side left waiting for a peer that failed times out on its own
        return engine

    def send_weights(self) -> None:
        meta = self.source.metadata()
        if not self.is_sender:
            for _ in self.source:  # the gathers only
                pass
            return
        info = GlooUpdateInfo([m.name for m in meta], [str(m.dtype).removeprefix("torch.") for m in meta],
                              [list(m.shape) for m in meta])
        self.client.start_weight_update()
        pool = ThreadPoolExecutor(max_workers=1)
        try:
            receiving = pool.submit(self.client.update_weights, asdict(info))
            sent = 0
            for (name, tensor), expected in zip(self.source, meta):
                if receiving.done():  # a server refused before taking every tensor
                    receiving.result()
                if name != expected.name or tuple(tensor.shape) != expected.shape:
                    raise SidecarError(f"weight stream out of step at tensor {sent}: {name} {tuple(tensor.shape)}, "
                                       f"announced {expected.name} {expected.shape}")
                broadcast(self.group, tensor)
                sent += 1
            if sent != len(meta):
                raise SidecarError(f"the weight stream ended after {sent} of {len(meta)} tensors")
            receiving.result()
        except BaseException:
            self.shutdown()  # closes the sockets: the servers' receive fails instead of waiting
            raise
        finally:
            pool.shutdown(wait=False)
        self.client.finish_weight_update()

    def shutdown(self) -> None:
        group, self.group = self.group, None
        if group is not None:
            try:
                group.abort()
            except Exception:
                pass


# ---------------------------------------------------------------------------- building one
def trainer_init_info(backend: str, rank: int, address: str, world_size: int, timeout_s: float) -> Any:
    """The trainer engine's init info for `backend` (vLLM's dataclass for nccl / ipc)."""
    if backend == GLOO:
        return GlooTrainerInitInfo(address, free_port(), world_size, timeout_s, rank=rank)
    if backend == "nccl":
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        return NCCLTrainerInitInfo(master_address=address, master_port=free_port(), world_size=world_size, rank=rank)
    if backend == "ipc":
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

        return IPCTrainerInitInfo(rank=rank)
    raise ValueError(f"{SETTING}={backend}: not a weight-transfer engine; choose one of {(DISK, *TRANSFERS)}")


def trainer_engine(init_info: Any, client: SyncClient, source: StreamedWeights) -> Any:
    """vLLM's trainer engine for `init_info.backend`, from vLLM's factory (the gloo engine is
    registered there by this project's plugin); without vLLM in the trainer's environment only
    the gloo engine, directly."""
    try:
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
    except ImportError as err:
        if init_info.backend != GLOO:
            raise SidecarError(f"{SETTING}={init_info.backend} runs vLLM's trainer engine, which needs vllm importable "
                               f"by the trainer ({err}): `pip install vllm` into the training environment, or use "
                               f"{SETTING}={GLOO} / {DISK}") from err
        return GlooTrainerWeightTransferEngine.trainer_init(init_info, client=client, source=source)
    from flywheel.generation.vllm_plugin import register

    register()
    return WeightTransferTrainerFactory.trainer_init(init_info, client=client, source=source)


def transfer_address(urls: Sequence[str]) -> str:
    """The address the servers reach the trainer's side of the transfer on: loopback when
    they all run on this machine, else this machine's address on the route to the first
    remote server (what the kernel would send from; a UDP connect sends nothing)."""
    from urllib.parse import urlparse

    remote = [urlparse(u) for u in urls if urlparse(u).hostname not in ("127.0.0.1", "localhost", "::1")]
    if not remote:
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((remote[0].hostname, remote[0].port or 80))
            return probe.getsockname()[0]
    except OSError as err:
        raise SidecarError(f"no route from this machine to the vLLM server at {remote[0].geturl()} ({err}); name the "
                           "address the servers reach the trainer on with "
                           "--data.generator.init_args.transfer_address") from err


@contextmanager
def paused(servers: Sequence[Server]) -> Iterator[None]:
    """Every server paused (in-flight requests finished first) for the block, its prefix
    cache reset at the end (it holds keys and values of the old weights), then resumed."""
    for server in servers:
        server.post("/pause?mode=wait", None)
    try:
        yield
        for server in servers:
            server.post("/reset_prefix_cache", None)
    finally:
        unresumed = []
        for server in servers:
            try:
                server.post("/resume", None)
            except SidecarError as err:
                log.warning("could not resume the vLLM server at %s: %s", server.url, err)
                unresumed.append(err)
        if unresumed and sys.exc_info()[0] is None:  # else the block's own error says more
            raise unresumed[0]


def dtype_of(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"{SETTING}: the servers' dtype {name!r} cannot travel through a weight transfer; "
                         f"use one of {sorted(DTYPES)}")
    return DTYPES[name]


# ---------------------------------------------------------------------------- one sidecar's transfers
class WeightTransfer:
    """A sidecar's weight syncs through one weight-transfer engine, across all its servers.

    The transfer group is opened at the first sync and again after a failed one or when a
    server was restarted (a restarted server has left it). Every sync: all servers paused,
    the weights streamed, the prefix caches reset, resumed, stamped with the version. A sync
    that fails is refused: the error names the server and the reason, and with the gloo
    engine every server keeps serving the previous version (it loads a sync only once all of
    it arrived). Collective: every trainer rank calls `push` together.

    Args:
        backend: the engine (`TRANSFERS`).
        dtype: the servers' dtype name (the wire dtype).
        address: where the servers reach the trainer (None: `transfer_address`).
        timeout_s: how long one side of the transfer waits for the other.
    """

    def __init__(self, backend: str, dtype: str, address: str | None, timeout_s: float) -> None:
        if backend not in TRANSFERS:
            raise ValueError(f"{SETTING}={backend}: choose one of {(DISK, *TRANSFERS)}")
        self.backend = backend
        self.dtype = dtype_of(dtype)
        self.address = address
        self.timeout_s = timeout_s
        self.engine: Any = None
        self._opened_at: tuple[int, ...] | None = None  # the servers' restart counts when the group opened

    def push(self, model: torch.nn.Module, version: int, servers: Sequence[Server], dist: Any) -> None:
        device = "cpu" if self.backend == GLOO else next(model.parameters()).device
        source = StreamedWeights(model, self.dtype, device)
        for attempt in (1, 2):
            fresh, error = self._attempt(source, version, servers, dist)
            if error is None:
                return
            if fresh or attempt == 2:
                raise SidecarError(f"weight sync {version} through {self.backend} was refused, the servers keep the "
                                   f"previous weights: {error}" if dist.global_rank == 0 else
                                   f"weight sync failed on rank 0: {error}")
            # A group opened at an earlier sync may be gone (another trainer took the servers
            # over, a server restarted unnoticed): once more over a fresh one.
            log.warning("weight sync %d through %s failed, retrying over a fresh group: %s", version, self.backend, error)

    def _attempt(self, source: StreamedWeights, version: int, servers: Sequence[Server], dist: Any) -> tuple[bool, str | None]:
        """One try: (whether the group was opened for it, the error or None), alike on every rank."""
        sender = dist.global_rank == 0
        fresh, error = self.engine is None, None
        if sender:
            try:
                fresh = self._open(servers, source)
            except Exception as err:
                self._close(servers)
                error = f"could not open the transfer: {_describe(err)}"
        fresh, error = dist.broadcast((fresh, error), src=0)
        if error is not None:
            return True, error
        if not sender and self.engine is None:
            info = trainer_init_info(self.backend, dist.global_rank, "127.0.0.1", 1, self.timeout_s)
            self.engine = trainer_engine(info, SyncClient([], [], self.timeout_s), source)
        self.engine.source = source
        try:
            with paused(servers) if sender else nullcontext():
                self.engine.send_weights()
            if sender:
                SyncClient(servers, [1] * len(servers), self.timeout_s)._call(
                    "/update_weight_version", [{"new_version": str(version)}] * len(servers))
        except Exception as err:
            if dist.world_size > 1:
                source.drain()  # the other ranks are still gathering
            error = _describe(err)
            if sender:
                client = getattr(self.engine, "client", None)
                self._close(servers)
                said = [f for f in (client.settle(10.0) if isinstance(client, SyncClient) else []) if f not in error]
                error = "; ".join([*said, f"the trainer's side: {error}"])
        return fresh, dist.broadcast(error, src=0)

    def _open(self, servers: Sequence[Server], source: StreamedWeights) -> bool:
        """Open the group unless the one open still holds every server; whether it opened one."""
        restarts = tuple(s.restarts for s in servers)
        if self.engine is not None and restarts == self._opened_at:
            return False
        self._close(servers)
        workers = [worker_count(s) for s in servers]
        client = SyncClient(servers, workers, self.timeout_s)
        client.abandon_weight_update()
        address = self.address or transfer_address([s.url for s in servers])
        info = trainer_init_info(self.backend, 0, address, 1 + sum(workers), self.timeout_s)
        log.info("opening the %s weight transfer to %d vLLM server(s) (%d workers) via %s",
                 self.backend, len(servers), sum(workers), address)
        self.engine = trainer_engine(info, client, source)
        self._opened_at = restarts
        return True

    def _close(self, servers: Sequence[Server]) -> None:
        engine, self.engine, self._opened_at = self.engine, None, None
        if engine is None:
            return
        engine.shutdown()
        try:
            SyncClient(servers, [1] * len(servers), self.timeout_s).shutdown_weight_transfer_engine()
        except SidecarError as err:  # a dead or restarted server has no group to leave
            log.info("closing the weight transfer: %s", err)

    def close(self, servers: Sequence[Server]) -> None:
        self._close(servers)


def _describe(err: Exception) -> str:
    return str(err) if isinstance(err, SidecarError) else f"{type(err).__name__}: {err}"
