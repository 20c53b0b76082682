"""`VLLMSidecar`: the Generator seam on vLLM servers, launched and supervised by the trainer.

The servers run as child processes on 127.0.0.1 (free ports; `server`), or are attached to
with `url`; the search samples from them through `VLLMGenerator` (`generator`). Nobody but
the trainer can drive them: every route of a launched server, inference and control alike,
refuses a request without the run's secret (`middleware/flywheel_token_auth.py`, a fresh
secret per run, passed in the server's environment), and the client sends it on every
request (`client`); an attached server is asked for the same secret, and one whose control
routes answer without it is reported loudly.

Weights are synced after each epoch's updates, by one of two paths (`weight_transfer`):
through vLLM's weight-transfer API (`transfer`: the tensors streamed over nccl, CUDA IPC or,
on CPU, this project's gloo engine, one layer gathered at a time), or through the disk: the
policy written as safetensors to a staging folder only this user can write (`weights`;
gathered parameter by parameter from DeepSpeed ZeRO-3 shards when the model is partitioned),
then every server does pause -> reload_weights -> reset the prefix cache -> resume
(shared/notes/vllm-cpu.md §4). Either way a probe then compares each server's log-probs with
the trainer's. With a LoRA policy only the adapter is written, and loaded in place (disk).

In a distributed run (DDP, DeepSpeed) rank 0 launches the servers and pushes the weights;
every rank sends its own search traffic to them. Launch, sync and probe are collective: the
other ranks take part in the ZeRO-3 gather and the probe's forward pass, and raise the same
error as rank 0 when it fails, instead of waiting forever.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from itertools import count
from pathlib import Path
from typing import Any, Sequence

import torch

from flywheel.generation.backends import Collective, GeneratorBackend, SingleProcess
from flywheel.generation.base import GenerationRequest
from flywheel.generation.vllm import middleware
from flywheel.generation.vllm.cores import (CORES_ENV, CorePlan, available_cores, check_setting as check_cores, cores_text,
                                           pin_this_process, plan as plan_cores, unpin)
from flywheel.generation.vllm.client import MIN_TOKEN_CHARS, TOKEN_ENV, SidecarError, answers_without_secret, new_token, warn_if_open
from flywheel.generation.vllm.generator import VLLMGenerator, prefix_cache_counters, route
from flywheel.generation.vllm.nodes import node_refusal
from flywheel.generation.vllm.server import Server
from flywheel.generation.vllm.transfer import DISK, SETTING as TRANSFER_SETTING, TRANSFERS, WeightTransfer, paused
from flywheel.generation.vllm_plugin import BACKEND as GLOO, PLUGIN_GROUP
from flywheel.generation.vllm.weights import check_private, full_state, staging_folder, write_weights
from flywheel.logprobs import token_logprobs

log = logging.getLogger(__name__)

SERVED_NAME = "policy"
ADAPTER_NAME = "policy-lora"
PYTHON_ENV = "FLYWHEEL_VLLM_PYTHON"
PROBE_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.15, "float16": 0.15}
"""The weight-sync probe's default log-prob tolerance by the servers' dtype (`logprob_tolerance`)."""
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM accepts for --max-lora-rank."""


class VLLMSidecar(GeneratorBackend):
    """vLLM servers beside the trainer (CPU: the `vllm-cpu` package; GPU: `vllm`).

    Args:
        url: attach to these running servers (one URL or a list, e.g.
            "http://127.0.0.1:8000") instead of launching; the weights are still pushed to
            them, so they must run with VLLM_SERVER_DEV_MODE=1 (and
            VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 --enable-lora for a LoRA policy), and should
            demand the secret (`token`) on every route: README, "vLLM sidecar".
        replicas: servers to launch (one per GPU group: see `replica_devices`); the search
            traffic is spread over them, one tree per server, and every sync reaches all.
        replica_devices: CUDA_VISIBLE_DEVICES of each launched server (e.g. ["0,1", "2,3"]
            with extra_args ["--tensor-parallel-size", "2"]); None = inherit.
        python: the interpreter with vLLM installed (default: $FLYWHEEL_VLLM_PYTHON, else this one).
        dtype: weights dtype on the servers ("float32" matches the trainer's CPU log-probs).
        max_model_len: context length of the servers.
        max_num_seqs: sequences one server decodes together.
        kv_cache_gb: KV cache memory per server on CPU (VLLM_CPU_KVCACHE_SPACE).
        extra_args: more server flags (e.g. ["--gpu-memory-utilization", "0.4"]).
        startup_timeout: seconds to wait for /health.
        request_timeout: seconds before one request counts as failed.
        max_retries: attempts per request; a launched server that died is restarted first.
        max_concurrency: requests in flight at once, over all servers.
        logprob_tolerance: largest |server - trainer| log-prob allowed by the probe after a sync.
            None: `PROBE_TOLERANCE` for the servers' dtype, 1e-3 in float32 (where a server
            that missed a sync shows) and 0.15 in bfloat16 / float16, where rounding alone
            moves a 30-layer model's log-probs by ~0.07 (SmolLM2-135M, bf16 trainer against an
            fp32 server), so the probe there catches a wrong model, not a missed small step.
        log_dir: where the servers' logs go (vllm_server.log, vllm_server_1.log, ...; default:
            the run's log folder).
        send_seeds: pass each request's seed to the server (reproducible samples). Default:
            on with CUDA, off on CPU, where vllm-cpu 0.32 crashes its worker ("CPU Generator
            does not use offset") once many seeded requests share a batch.
        staging_dir: the folder the weights are written to for the servers to load (default: a
            private temporary folder); servers on another machine must see it (a shared
            filesystem). Created 0700 when missing; refused when other users can write it.
        block_size: KV-cache block size, the prefix cache's granularity (only whole blocks are
            reused). None: 32 on CPU, where vLLM's own default of 128 leaves every prefix under
            128 tokens uncached (measured: a 50-token prompt sent 3 times, 0 hits at 128, 64 at
            32; 16 crashes vllm-cpu's worker); vLLM's default on GPU.
        access_log: log every HTTP request in the server log (one line per search request:
            megabytes per epoch on a GPU run; off by default).
        token: the secret sent with every request (`Authorization: Bearer ...`). Default:
            $FLYWHEEL_VLLM_TOKEN, which is better than this setting (a run saves its settings
            in config.yaml); launched servers get a fresh random one when neither is set.
            Attached servers must hold the same one in their $FLYWHEEL_VLLM_TOKEN.
        weight_transfer: how a sync reaches the servers. "nccl" (GPU to GPU over NCCL, vLLM's
            engine), "ipc" (CUDA IPC, for a server on the trainer's own GPU), "gloo" (CPU
            tensors over a gloo group: this project's vLLM plugin, which must be installed in
            the servers' environment), or "disk" (safetensors in `staging_dir`, reloaded by
            each server). None: with CUDA "ipc" for launched servers without
            `replica_devices` (they share the trainer's GPU, where NCCL refuses a second
            rank) and "nccl" otherwise; "disk" without CUDA. A LoRA policy always syncs
            its adapter through the disk. Attached servers must run with
            --weight-transfer-config '{"backend": "<the same>"}'. docs/scaling.md.
        transfer_address: the address the servers reach the trainer on for a weight transfer
            (None: 127.0.0.1 when every server is on this machine, else this machine's name).
        cpu_cores: on a CPU machine, the cores of the launched servers, the trainer keeping
            the others (flywheel.generation.vllm.cores): "auto" splits this process's cores when
            the servers search while the trainer trains (`--data.async_search`; half to the
            servers, so that the two never ask for more cores than there are) and leaves them
            shared otherwise; "shared" never pins; core ids ("1", "2-3", "0,4-5") pin the servers
            there (replicas share them evenly). Ignored with CUDA, attached servers, or several
            trainer processes.

    When the policy carries LoRA adapters (`--model.lora.rank`), the servers launch with LoRA
    enabled on the frozen base, sample through the adapter, and each sync loads only the
    adapter, in place (`/v1/load_lora_adapter`).
    """

    own_weights = True  # the servers hold a copy that only a sync changes: they can search while the trainer trains

    def __init__(
        self,
        url: str | list[str] | None = None,
        replicas: int = 1,
        replica_devices: list[str] | None = None,
        python: str | None = None,
        dtype: str = "float32",
        max_model_len: int = 512,
        max_num_seqs: int = 256,
        kv_cache_gb: float = 1.0,
        extra_args: list[str] | None = None,
        startup_timeout: float = 300.0,
        request_timeout: float = 300.0,
        max_retries: int = 3,
        max_concurrency: int = 64,
        logprob_tolerance: float | None = None,
        log_dir: str | None = None,
        send_seeds: bool | None = None,
        staging_dir: str | None = None,
        block_size: int | None = None,
        access_log: bool = False,
        token: str | None = None,
        weight_transfer: str | None = None,
        transfer_address: str | None = None,
        cpu_cores: str = "auto",
    ) -> None:
        # Long: one line per setting of the sidecar (its --data.generator.init_args), each checked where it is stored
        self.urls = [url] if isinstance(url, str) else list(url or [])
        self.attached = bool(self.urls)
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {replicas}")
        if replica_devices is not None and len(replica_devices) != replicas:
            raise ValueError(f"replica_devices names {len(replica_devices)} device groups for {replicas} replicas")
        self.replicas = replicas
        self.replica_devices = replica_devices
        self.python = python or os.environ.get(PYTHON_ENV) or sys.executable
        self.dtype = dtype
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.kv_cache_gb = kv_cache_gb
        self.extra_args = list(extra_args or [])
        self.startup_timeout = startup_timeout
        self.request_timeout = request_timeout
        self.max_retries = max_retries
        self.max_concurrency = max_concurrency
        self.logprob_tolerance = PROBE_TOLERANCE.get(dtype, 0.15) if logprob_tolerance is None else logprob_tolerance
        self.log_dir = Path(log_dir) if log_dir else None
        self.send_seeds = torch.cuda.is_available() if send_seeds is None else send_seeds
        self.access_log = access_log
        self.block_size = block_size if block_size is not None else (None if torch.cuda.is_available() else 32)
        self.lora_rank = 0  # the policy's, set by build()
        self.servers: list[Server] = []
        self.staging: Path | None = Path(staging_dir) if staging_dir else None
        if self.staging is not None and self.staging.exists():
            check_private(self.staging)  # at once, not after the model is loaded
        self.token = token or os.environ.get(TOKEN_ENV) or None
        if self.token is not None and len(self.token) < MIN_TOKEN_CHARS:
            raise ValueError(f"the vLLM secret (--data.generator.init_args.token or ${TOKEN_ENV}) has {len(self.token)} "
                             f"characters; use at least {MIN_TOKEN_CHARS}, e.g. "
                             "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`")
        chosen = weight_transfer or default_transfer(attached=bool(self.urls), replica_devices=replica_devices)
        if chosen not in (DISK, *TRANSFERS):
            raise ValueError(f"{TRANSFER_SETTING}={weight_transfer}: choose one of {(DISK, *TRANSFERS)}")
        self.weight_transfer = chosen
        self.transfer_address = transfer_address
        check_cores(cpu_cores)
        self.cpu_cores = cpu_cores
        self.core_plan: CorePlan | None = None  # set by build() where it applies
        self._unpinned: tuple[tuple[int, ...], int] | None = None  # the trainer's cores and threads before the plan
        self.transfer: WeightTransfer | None = None  # set by build() unless the sync goes through the disk
        self._rpc_dir: Path | None = None
        self.weight_version = 0
        self.dist: Collective = SingleProcess()
        self._generator: VLLMGenerator | None = None
        self._tokenizer = None
        self._round_robin = count()

    @property
    def model_name(self) -> str:
        return ADAPTER_NAME if self.lora_rank else SERVED_NAME

    @property
    def restarts(self) -> int:
        return sum(s.restarts for s in self.servers)

    @property
    def process(self) -> subprocess.Popen | None:
        """The first launched server's process (None when attached or stopped)."""
        return self.servers[0].process if self.servers else None

    def node_refusal(self, num_nodes: int) -> str | None:
        return node_refusal(self.urls, num_nodes)

    # ------------------------------------------------------------------ lifecycle
    def build(self, model: Any, tokenizer: Any, dist: Collective | None = None) -> VLLMGenerator:
        """Launch (rank 0) or reach the servers; every rank gets their URLs. Collective."""
        self.dist = dist or SingleProcess()
        self._tokenizer = tokenizer
        self.lora_rank = int(model.peft_config["default"].r) if hasattr(model, "peft_config") else 0
        if self.lora_rank and self.weight_transfer != DISK:
            log.info("a LoRA policy syncs its adapter through the disk (%s=%s applies to full weights)",
                     TRANSFER_SETTING, self.weight_transfer)
            self.weight_transfer = DISK
        if self.weight_transfer != DISK:
            self.transfer = WeightTransfer(self.weight_transfer, self.dtype, self.transfer_address, self.request_timeout)
        if not self.attached:
            self._stage(model, adapter=False)
        if self.lora_rank:
            self._stage(model, adapter=True)
        urls, token, error = None, None, None
        if self.dist.global_rank == 0:
            try:
                if not self.attached and self.token is None:
                    self.token = new_token()  # per run; reaches the other ranks below, never a command line
                if not self.attached and self.weight_transfer == GLOO:
                    self._check_plugin()
                self._place()
                self.servers = self._start_servers()
                urls, token = [s.url for s in self.servers], self.token
            except Exception as err:  # every rank must hear of it, or they wait forever
                error = _describe(err)
        urls, token, error = self.dist.broadcast((urls, token, error), src=0)
        if error is not None:
            self.close()
            raise SidecarError(error if self.dist.global_rank == 0 else f"rank 0 could not start the vLLM servers: {error}")
        if self.dist.global_rank != 0:
            self.token = token
            self.servers = [self._server(u) for u in urls]
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        self._generator = VLLMGenerator(self.servers, self.model_name, eos, self.send_seeds, self.max_concurrency)
        return self._generator

    def _server(self, url: str | None, index: int = 0) -> Server:
        command = env = log_path = None
        if url is None:
            command = self._command
            env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1",
                   "VLLM_CPU_KVCACHE_SPACE": str(max(1, int(self.kv_cache_gb))), **self._private_env()}
            if self.lora_rank:
                env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
            if self.weight_transfer == "ipc":
                env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # vLLM's IPC handles travel pickled over HTTP
            if self.replica_devices is not None:
                env["CUDA_VISIBLE_DEVICES"] = self.replica_devices[index]
            if self.core_plan is not None and self.core_plan.servers is not None:
                env[CORES_ENV] = env["VLLM_CPU_OMP_THREADS_BIND"] = cores_text(self.core_plan.servers[index])
            folder = self.log_dir or self.run_dir or Path(tempfile.mkdtemp(prefix="flywheel-vllm-log-"))
            log_path = folder / ("vllm_server.log" if index == 0 else f"vllm_server_{index}.log")
        after_start = self._load_adapter if self.lora_rank else None
        return Server(url, command, env, log_path, self.startup_timeout, self.request_timeout, self.max_retries, after_start,
                      token=self.token)

    def _place(self) -> None:
        """On a CPU machine, with servers to launch and one trainer process: split the cores
        (`cpu_cores`), pinning this process now and the servers at their launch."""
        if self.attached or torch.cuda.is_available() or self.dist.world_size > 1:
            return
        self.core_plan = plan_cores(self.cpu_cores, available_cores(), self.replicas, self.beside_training)
        log.info("CPU cores: %s", self.core_plan.why)
        if self.core_plan.trainer is not None:
            self._unpinned = pin_this_process(self.core_plan.trainer)

    def _private_env(self) -> dict[str, str]:
        """What keeps a launched server to this run: the secret its middleware demands on every
        route (in the environment, which only this user can read, not on the command line),
        the middleware on its PYTHONPATH, and vLLM's internal sockets in a 0700 folder."""
        if self._rpc_dir is None:
            self._rpc_dir = Path(tempfile.mkdtemp(prefix="flywheel-vllm-rpc-"))
        path = os.pathsep.join(p for p in (str(middleware.PATH), os.environ.get("PYTHONPATH")) if p)
        return {TOKEN_ENV: self.token or "", "PYTHONPATH": path, "VLLM_RPC_BASE_PATH": str(self._rpc_dir)}

    def _command(self, port: int) -> list[str]:
        cmd = [
            self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.staging),
            "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port), "--dtype", self.dtype,
            "--max-model-len", str(self.max_model_len), "--max-num-seqs", str(self.max_num_seqs),
            "--max-logprobs", "20", "--enable-prefix-caching", "--seed", "0", "--middleware", middleware.MIDDLEWARE,
        ]
        if self.weight_transfer != DISK:
            cmd += ["--weight-transfer-config", json.dumps({"backend": self.weight_transfer})]
        if self.lora_rank:
            cap = min((r for r in VLLM_LORA_RANKS if r >= self.lora_rank), default=self.lora_rank)
            cmd += ["--enable-lora", "--max-lora-rank", str(cap), "--max-loras", "1"]
        if self.block_size is not None:
            cmd += ["--block-size", str(self.block_size)]
        if not self.access_log:
            cmd.append("--disable-uvicorn-access-log")
        if not torch.cuda.is_available():
            cmd.append("--enforce-eager")
        return cmd + self.extra_args  # last: a flag given here wins over ours

    def _start_servers(self) -> list[Server]:
        if self.attached:
            servers = [self._server(u) for u in self.urls]
        else:
            servers = [self._server(None, i) for i in range(self.replicas)]
            atexit.register(self.close)
            self.servers = servers  # stopped by close() even if a later one fails to start
            for server in servers:
                server.launch()

        def ready(server: Server) -> None:
            server.wait_healthy()
            if server.after_start is not None:
                server.after_start(server)

        with ThreadPoolExecutor(max_workers=len(servers)) as pool:  # they start in parallel
            list(pool.map(ready, servers))
        for server in servers:
            if not server.launched:
                warn_if_open(server.url)
            elif answers_without_secret(server.url):
                raise SidecarError(f"the vLLM server launched at {server.url} answers without the run's secret: its "
                                   f"--middleware flag was overridden or ignored (extra_args {self.extra_args}); see "
                                   f"{server.log_path}")
        return servers

    def close(self) -> None:
        """Stop the launched servers (their whole process groups) and the request threads."""
        if self._generator is not None:
            self._generator.close()
        if self.transfer is not None and self.dist.global_rank == 0:
            self.transfer.close(self.servers)
        for server in self.servers:
            server.stop()
        if self._rpc_dir is not None and all(s.process is None for s in self.servers):
            shutil.rmtree(self._rpc_dir, ignore_errors=True)
            self._rpc_dir = None
        if self._unpinned is not None:  # the trainer gets its cores back (a process that goes on after the fit)
            unpin(self._unpinned)
            self._unpinned = None

    # ------------------------------------------------------------------ requests
    def route(self, requests: Sequence[GenerationRequest]) -> list[Server]:
        """The server of each request: by affinity (one tree, one server), else round-robin."""
        return route(self.servers, requests, self._round_robin)

    def prefix_cache_counters(self) -> tuple[float, float] | None:
        """(queries, hits) of all the servers' prefix caches together, in tokens."""
        return prefix_cache_counters(self.servers)

    def _fan_out(self, fn) -> list[Any]:
        with ThreadPoolExecutor(max_workers=len(self.servers)) as pool:
            return list(pool.map(fn, self.servers))

    # ------------------------------------------------------------------ weights
    def sync_weights(self, model: Any, version: int) -> None:
        """Push `model`'s weights to every server, then check their log-probs against the
        trainer's. Collective: every rank calls it together."""
        if self.transfer is not None:
            self.transfer.push(model, version, self.servers, self.dist)
            self.weight_version = version
            self.probe(model)
            return
        self._stage(model, adapter=bool(self.lora_rank))
        error = None
        if self.dist.global_rank == 0:
            try:
                self._fan_out(lambda s: self._reload(s, version))
            except Exception as err:
                error = _describe(err)
        error = self.dist.broadcast(error, src=0)
        if error is not None:
            raise SidecarError(error if self.dist.global_rank == 0 else f"weight sync failed on rank 0: {error}")
        self.weight_version = version
        self.probe(model)

    def _stage(self, model: Any, adapter: bool) -> None:
        """Rank 0 writes the weights to the staging folder (`weights.write_weights`). With
        ZeRO-3 every rank helps gather them."""
        state = dict(full_state(model, rank=self.dist.global_rank, adapter_only=adapter))
        if self.dist.global_rank != 0:
            return
        if self.staging is None or not self.staging.exists():
            self.staging = staging_folder(self.staging)
        write_weights(self.staging, model, state, self._tokenizer, adapter=adapter, lora=bool(self.lora_rank))

    def _check_plugin(self) -> None:
        """Refuse at once, with the fix, when the servers' interpreter cannot load the gloo
        engine (this project installed there: its `vllm.general_plugins` entry point)."""
        listing = (f"import importlib.metadata as m; print([e.value for e in m.entry_points(group={PLUGIN_GROUP!r})])")
        try:
            out = subprocess.run([self.python, "-c", listing], capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.TimeoutExpired) as err:
            raise SidecarError(f"could not run the vLLM interpreter {self.python}: {err}") from err
        if "flywheel.generation.vllm_plugin:register" not in out:
            raise SidecarError(
                f"{TRANSFER_SETTING}={GLOO} needs this project's vLLM plugin in the servers' environment, and "
                f"{self.python} does not have it (its {PLUGIN_GROUP} entry points: {out.strip() or 'none'}): "
                f"run `{self.python} -m pip install --no-deps -e <this repository>` or choose {TRANSFER_SETTING}={DISK}")

    def _reload(self, server: Server, version: int) -> None:
        if self.lora_rank:
            self._load_adapter(server)
        else:
            with paused([server]):
                server.post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(self.staging)}})
        try:
            server.post("/update_weight_version", {"new_version": str(version)})
        except SidecarError:
            pass  # servers without the endpoint: the trainer's stamp is the record

    def _load_adapter(self, server: Server) -> None:
        server.post("/v1/load_lora_adapter",
                    {"lora_name": ADAPTER_NAME, "lora_path": str(self.staging / "adapter"), "load_inplace": True})
        server.post("/reset_prefix_cache", None)

    @torch.no_grad()
    def probe(self, model: Any, prompt: Sequence[int] | None = None, tokens: int = 8) -> float:
        """Greedy-sample a few tokens on every server and compare their log-probs with the
        trainer's; raise SidecarError when they differ by more than `logprob_tolerance`.
        Collective: rank 0 asks the servers, every rank runs the forward pass (ZeRO-3
        forward passes are collective)."""
        if prompt is None:
            prompt = self._tokenizer("1 2 3|6\n")["input_ids"]
        payload = {"model": self.model_name, "prompt": list(prompt), "max_tokens": tokens, "temperature": 0.0,
                   "logprobs": 1, "return_token_ids": True, "skip_special_tokens": False}
        answers, error = None, None
        if self.dist.global_rank == 0:
            try:
                choices = self._fan_out(lambda s: s.post("/v1/completions", payload)["choices"][0])
                answers = [([int(t) for t in c["token_ids"]], [float(x) for x in c["logprobs"]["token_logprobs"]])
                           for c in choices]
            except Exception as err:
                error = _describe(err)
        answers, error = self.dist.broadcast((answers, error), src=0)
        if error is not None:
            raise SidecarError(f"the probe after weight sync {self.weight_version} failed: {error}")
        was_training = model.training
        model.eval()
        gaps = []
        try:
            for ids, served in answers:
                sequence = torch.tensor([list(prompt) + ids], device=_device(model))
                logits = model(input_ids=sequence).logits[:, len(prompt) - 1 : -1]
                trainer = token_logprobs(logits, sequence[:, len(prompt):])[0].tolist()
                gaps.append(max((abs(a - b) for a, b in zip(served, trainer)), default=0.0))
        finally:
            model.train(was_training)
        worst = max(range(len(gaps)), key=gaps.__getitem__)
        if gaps[worst] > self.logprob_tolerance:
            raise SidecarError(
                f"after weight sync {self.weight_version} the log-probs of the vLLM server at {self.servers[worst].url} differ from the "
                f"trainer's by {gaps[worst]:.2e} (tolerance {self.logprob_tolerance:g}): it is not sampling from the "
                "trained policy"
            )
        return gaps[worst]


def default_transfer(attached: bool, replica_devices: list[str] | None) -> str:
    """The weight-transfer engine when none is named (see `VLLMSidecar`'s `weight_transfer`)."""
    if not torch.cuda.is_available():
        return DISK
    return "ipc" if not attached and replica_devices is None else "nccl"


def _describe(err: Exception) -> str:
    return str(err) if isinstance(err, SidecarError) else f"{type(err).__name__}: {err}"


def _device(model: Any) -> torch.device:
    return next(model.parameters()).device


