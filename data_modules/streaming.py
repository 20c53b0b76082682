"""Training problems streamed with litdata, for problem files too large to hold or screen whole.

`optimize_files` turns problem files into a litdata dataset once: every row is checked by the
task exactly as `load_problems` checks it (columns mapped; bad rows name `file:line`, or are
skipped and counted with `skip_bad_rows`; duplicate ids are refused; held-out problems left
out with `drop_eval_overlap`), then written as chunks under `<cache>/<key>` where the key
hashes the files' bytes, the task, the row rule and the column mapping, so a changed file is
optimized again and an unchanged one never is. The folder is written beside
its final name and renamed, so a killed optimization leaves nothing half-made.

`StreamingProblems` reads it: each pass over the data is one `litdata.StreamingDataset`
epoch, chunk order and items within a chunk shuffled by (seed, pass) over rows permuted once
when optimized, sharded across ranks so that no two ranks draw the same problem. Its position
(pass and problems drawn in it) is a small state dict, so a resumed reader draws exactly the
problems the uninterrupted one would have drawn. `--data.problems.stream=true` selects it
(data_modules.pool.ProblemPool.draw); the hard set then screens each epoch's draw, since a
stream never holds the whole pool.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator, Sequence

from flywheel.tasks import Problem, Task
from flywheel.tasks import hf_datasets
from flywheel.tasks.columns import Columns
from flywheel.tasks.overlap import normalise
from flywheel.tasks.sources import checked_rows

log = logging.getLogger(__name__)

FORMAT = 2
"""Layout of an optimized dataset; part of its key, so a change rebuilds old caches (2: rows
stored with their columns mapped)."""


def _require_litdata():
    try:
        import litdata
    except ImportError as err:
        raise ImportError(
            "streaming problem files needs litdata: pip install 'flywheel[stream]' (on a CPU machine then "
            "`pip uninstall -y torchvision`: litdata pulls a CUDA torchvision that breaks `import lightning`)"
        ) from err
    return litdata


def dataset_key(task: Task, files: Sequence[str], skip_bad_rows: bool, columns: Columns = Columns(),
                exclude: frozenset[str] = frozenset()) -> str:
    """A name for the optimized dataset of these files: it changes when a file's bytes do, or
    the column mapping, or the set of held-out texts kept out."""
    digest = hashlib.sha256(f"{FORMAT}:{type(task).__module__}.{type(task).__qualname__}:{skip_bad_rows}:"
                            f"{columns!r}".encode())
    for text in sorted(exclude):
        digest.update(f"\0x{text}".encode())
    for file in files:
        if hf_datasets.is_hf_source(file):
            digest.update(hf_datasets.digest(file))
            continue
        digest.update(f"\0{Path(file).name}\0".encode())
        with open(file, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def usable_rows(task: Task, files: Sequence[str], skip_bad_rows: bool, columns: Columns = Columns(),
                exclude: frozenset[str] = frozenset()) -> tuple[list[dict[str, Any]], int]:
    """Every usable row, its columns mapped, as {"row": JSON text with its id, "where": file:line},
    and the rows skipped. A row whose normalised prompt is in `exclude` (the held-out problems'
    with `--data.problems.drop_eval_overlap`) is left out and counted in the log."""
    items: list[dict[str, Any]] = []
    seen: set[str] = set()
    skipped = 0
    dropped: list[str] = []
    for file in files:
        for where, row, problem in checked_rows(task, file, skip_bad_rows=skip_bad_rows, columns=columns):
            if problem is None:
                skipped += 1
                continue
            if problem.id in seen:
                raise ValueError(f"duplicate problem id {problem.id!r} at {where}; ids must be unique")
            seen.add(problem.id)
            if exclude and normalise(task.problem_key(problem)) in exclude:
                dropped.append(problem.id)
                continue
            items.append({"row": json.dumps({**row, "id": problem.id}, default=str), "where": where})
    if dropped:
        log.info("left %d training problems that are held-out problems out of the stream "
                 "(--data.problems.drop_eval_overlap), first: %s", len(dropped), ", ".join(dropped[:5]))
    if not items:
        raise ValueError(f"no usable problems in {', '.join(files)}")
    return items, skipped


def _encode(item: dict[str, Any]) -> dict[str, Any]:
    return item


def optimize_files(task: Task, files: Sequence[str], cache: Path, skip_bad_rows: bool = False,
                   columns: Columns = Columns(), exclude: frozenset[str] = frozenset()) -> Path:
    """The optimized dataset of `files` under `cache`, built once (atomically) if missing
    (`columns`, `exclude`: as `usable_rows`)."""
    target = cache / dataset_key(task, files, skip_bad_rows, columns, exclude)
    if (target / "index.json").is_file():
        return target
    litdata = _require_litdata()
    items, skipped = usable_rows(task, files, skip_bad_rows, columns, exclude)
    # litdata shuffles chunk order and items within a small window of a chunk, so rows that
    # sit together in the file (sorted by source or difficulty) would be drawn together:
    # the rows are permuted once here, with a fixed seed, before they are chunked.
    random.Random(f"{FORMAT}:stream").shuffle(items)
    if skipped:
        log.warning("skipped %d malformed problem rows in %s", skipped, ", ".join(files))
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=cache))
    try:
        log.info("optimizing %d problems of %s into %s (once)", len(items), ", ".join(files), target)
        litdata.optimize(fn=_encode, inputs=items, output_dir=str(staging), chunk_bytes="1MB", num_workers=1,
                         start_method="fork", keep_data_ordered=True)
        try:
            os.rename(staging, target)
        except OSError:  # another process finished the same dataset first: theirs is identical
            if not (target / "index.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


class StreamingProblems:
    """An endless, resumable stream of training problems read from an optimized dataset.

    `take(count)` returns the next `count` problems of this rank's shard; a pass that runs out
    starts the next one, reshuffled. `state_dict()` is the position: (pass, drawn in it).
    """

    def __init__(self, task: Task, directory: Path, seed: int, rank: int = 0, world: int = 1) -> None:
        self.task, self.directory, self.seed, self.rank, self.world = task, Path(directory), seed, rank, world
        self.epoch = 0
        self.drawn = 0
        self._iter: Iterator[dict[str, Any]] | None = None
        self._dataset = None

    def __len__(self) -> int:
        """Problems in this rank's shard of one pass."""
        return len(self._open(self.epoch, 0))

    def _open(self, epoch: int, drawn: int):
        litdata = _require_litdata()
        from litdata.utilities.env import _DistributedEnv

        dataset = litdata.StreamingDataset(str(self.directory), shuffle=True, seed=self.seed, drop_last=True)
        # The trainer's ranks, not whatever torch.distributed says in this process: the shard
        # must match the rank that trains on it (and tests can ask for any rank).
        dataset.distributed_env = _DistributedEnv(world_size=self.world, global_rank=self.rank, num_nodes=1)
        dataset.set_epoch(epoch + 1)  # litdata's epochs count from 1
        if drawn:
            state = dataset.state_dict(num_samples_yielded=drawn, num_workers=0, batch_size=1)
            dataset.load_state_dict(state)
        self._dataset = dataset
        return dataset

    def take(self, count: int) -> list[Problem]:
        out: list[Problem] = []
        restarted = False
        while len(out) < count:
            if self._iter is None:
                self._iter = iter(self._open(self.epoch, self.drawn))
            try:
                item = next(self._iter)
            except StopIteration:
                if self.drawn == 0 and restarted:
                    raise ValueError(f"the streamed dataset {self.directory} has no problems for rank {self.rank}")
                self.epoch, self.drawn, self._iter, restarted = self.epoch + 1, 0, None, True
                continue
            self.drawn += 1
            out.append(self.task.problem_from_row(json.loads(item["row"]), item["where"]))
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "drawn": self.drawn}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.drawn, self._iter = int(state["epoch"]), int(state["drawn"]), None
