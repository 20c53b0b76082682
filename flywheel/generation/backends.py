"""Generator backends as configuration: what `--data.generator` selects.

A backend builds a `Generator` for the live policy and keeps it in step with the trainer's
weights. The in-process backend shares the module's parameters, so it needs no sync; the
vLLM sidecar (flywheel.generation.vllm) pushes weights to its server after each epoch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Protocol

from flywheel.generation.base import PREFIX_CACHE_MB, SAMPLING_DTYPES, Generator, SamplingDtype


class Collective(Protocol):
    """The processes of a distributed run, as a backend needs them (a Lightning strategy is one)."""

    @property
    def global_rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    def broadcast(self, obj: Any, src: int = 0) -> Any: ...

    def barrier(self, name: str | None = None) -> None: ...


class SingleProcess:
    """The Collective of a run with one process."""

    global_rank = 0
    world_size = 1

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return obj

    def barrier(self, name: str | None = None) -> None:
        pass


class GeneratorBackend(ABC):
    """Builds and owns the Generator the search and the evaluation sample from."""

    own_weights: bool = False
    """The generator samples from weights of its own, which only `sync_weights` changes (a
    server process), so it can search while the trainer trains (`--data.async_search`). False
    for one that reads the trainer's live parameters."""

    distinct_first_token: bool = False
    """Its generator honours `SamplingParams.distinct_first_token` (`--data.search.distinct_children`
    is refused for a backend that does not)."""

    flag: str = "--data.generator"
    """The running command's flag of the backend, which its messages name (`fit`'s; `eval` and
    `diagnose` set theirs, `--generator`)."""

    run_dir: Path | None = None
    """The run's log folder (set by the data module before `build`): where a backend that
    starts processes writes their logs."""

    beside_training: bool = False
    """The generator will search while the trainer trains (`--data.async_search`; set by the
    data module before `build`): a backend that starts processes on this machine's CPU splits
    the cores with the trainer (flywheel.generation.vllm.cores)."""

    @abstractmethod
    def build(self, model: Any, tokenizer: Any, dist: Collective | None = None) -> Generator:
        """The Generator for `model` (the trainer's live policy); called once per run, on every
        rank of a distributed run together (`dist`; None = a single process)."""

    def sync_weights(self, model: Any, version: int) -> None:
        """Make the generator sample from `model`'s current weights (stamped `version`); called
        on every rank together."""

    def node_refusal(self, num_nodes: int) -> str | None:
        """Why this backend cannot serve a run on `num_nodes` nodes (checked before the run), or None."""
        return None

    def close(self) -> None:
        """Release processes or memory the backend holds."""


class HFBackend(GeneratorBackend):
    """In-process sampling with transformers, sharing the trainer's weights (the CPU default).

    Args:
        max_batch_size: most sequences decoded together; a larger generator call runs in
            chunks of this many samples.
        compact_fraction: drop finished rows from the decode batch once this fraction of it
            has finished (see HFGenerator).
        seed: seed of the sampling stream for requests that carry no seed of their own.
        prefix_cache_mb: memory for the KV of search nodes kept from one search round to the
            next, so expanding a node computes only its new tokens (0 = off). Emptied when
            the weights change.
        dtype: what the generator samples in (flywheel.generation.precision). "auto": bf16 for
            a policy of 20M parameters or more on a CPU with native bf16 matmuls (a copy of the
            policy that follows the trainer's fp32 weights; the log-probs are the ones it sampled
            with), else the policy's own dtype; the choice is logged. "float32" or "bfloat16" to choose.
    """

    distinct_first_token = True

    def __init__(self, max_batch_size: int = 512, compact_fraction: float = 0.25, seed: int = 0,
                 prefix_cache_mb: float = PREFIX_CACHE_MB, dtype: SamplingDtype = "auto") -> None:
        # Checked here, at construction, so a bad value fails before any model loads.
        for name, value, low in (("max_batch_size", max_batch_size, 1), ("compact_fraction", compact_fraction, 0),
                                 ("prefix_cache_mb", prefix_cache_mb, 0)):
            if value < low:
                raise ValueError(f"--data.generator.init_args.{name} must be >= {low}, got {value}; set it to {low} or more")
        self.max_batch_size = max_batch_size
        self.compact_fraction = compact_fraction
        self.seed = seed
        self.prefix_cache_mb = prefix_cache_mb
        if dtype not in SAMPLING_DTYPES:
            raise ValueError(f"--data.generator.init_args.dtype must be one of {', '.join(SAMPLING_DTYPES)}, "
                             f"got {dtype!r}")
        self.dtype = dtype

    def build(self, model: Any, tokenizer: Any, dist: Collective | None = None) -> Generator:
        from flywheel.generation.hf import HFGenerator

        return HFGenerator(
            model, tokenizer, max_batch_size=self.max_batch_size, compact_fraction=self.compact_fraction, seed=self.seed,
            prefix_cache_mb=self.prefix_cache_mb, dtype=self.dtype, dtype_flag=f"{self.flag}.init_args.dtype",
        )


class LiveGenerator:
    """A backend's generator over one run: built once for the live policy, then kept at the
    weights of a given optimizer step (`version`). `generator` has no side effects."""

    def __init__(self, backend: GeneratorBackend) -> None:
        self.backend = backend
        self._generator: Generator | None = None
        self.version = 0
        """The optimizer step whose weights the generator samples from."""
        self.pushes = 0
        """Weight syncs in this process (a search's staleness is the syncs between its start and
        its training: data_modules.search_ahead)."""

    @property
    def started(self) -> bool:
        return self._generator is not None

    @property
    def generator(self) -> Generator:
        if self._generator is None:
            raise RuntimeError("the generator is not started: the data module starts it before the first search "
                               "(train_dataloader) or evaluation (val_dataloader / test_dataloader)")
        return self._generator

    def start(self, model: Any, tokenizer: Any, dist: Collective | None, run_dir: Path | None, version: int,
              beside_training: bool = False) -> None:
        """Build the generator for `model` once (collective under a distributed run)."""
        if self._generator is not None:
            return
        if run_dir:
            self.backend.run_dir = run_dir
        self.backend.beside_training = beside_training
        self._generator = self.backend.build(model, tokenizer, dist)
        self.version = version

    def push(self, model: Any, version: int) -> bool:
        """Sync `model`'s weights as of step `version`; False when already there or not started."""
        if self._generator is None or version == self.version:
            return False
        self.backend.sync_weights(model, version=version)
        self.version = version
        self.pushes += 1
        return True

    def close(self) -> None:
        if self._generator is not None:
            self.backend.close()
            self._generator = None
