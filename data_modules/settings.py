"""The data module's settings, one typed dataclass per `--help` section: where the problems
come from (`--data.problems.*`), how many are searched and trained on at once
(`--data.batching.*`) and whether the next epoch is searched while this one trains
(`--data.async_search.*`). Each checks itself when built and names the flag and the fix; every
default is written here once.

The search (`--data.search.*`), the credit (`--data.credit.*`, flywheel.objectives.credit,
with its rules), the hard set (`--data.hard_set.*`), the replay buffer (`--data.replay.*`)
and the held-out evaluation (`--data.eval.*`) have their own dataclasses next to the code
that reads them. Flags of the flat layout these sections replaced
(`--data.credit.advantage`, `--data.batching.mini_batch_problems`, ...) are translated by flywheel.run.renames.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from flywheel.adaptive import HardSetConfig, ReplayConfig
from flywheel.objectives.credit import ROLLOUTS
from flywheel.search.config import MAX_CONCURRENT_TREES
from flywheel.tasks.columns import Columns


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclass(frozen=True)
class ProblemsConfig:
    """The training and held-out problems.

    Args:
        train_files: problem files (jsonl / parquet), `Dataset.save_to_disk` folders or
            `hf://` datasets (docs/data.md) with `problem` and `answer` columns, or columns
            mapped to them by `columns` (or the task's own columns), `[a.jsonl,b.parquet]` or
            one path; default: the task's built-in `train_split`.
        train_split: built-in split used when `train_files` is not given.
        max_train_problems: use a seeded random subset of at most this many training
            problems (None = all); the hard set is screened from it.
        eval_files: held-out problem files (a list, or one path); default: the task's built-in
            `eval_split`.
        eval_split: built-in held-out split.
        max_eval_problems: evaluate on the first this many held-out problems (None = all),
            over all `eval_files` together in their order (the split between files is logged).
        skip_bad_rows: skip and count malformed problem rows instead of failing on the first.
        columns: where the problem, answer and id are in the files' rows (a column name or a
            dotted path; a chat column's user turn is the problem); docs/data.md.
        eval_columns: the same for `eval_files` when they are in another shape (None: `columns`).
        drop_eval_overlap: remove from the training problems those whose normalised text
            (case, spacing and Unicode forms ignored) is a held-out problem's. Off: they are
            counted and named in a warning at load, as are repeats within the training set.
        stream: read `train_files` as a litdata stream instead of loading them (the `stream`
            extra; for files too large to hold or screen whole): optimized once into
            `stream_cache`, each epoch's problems drawn from it, shuffled, sharded across
            ranks without duplicates, its position saved in every checkpoint. The hard set
            then screens each epoch's draw with the current policy and searches the hard
            ones; the replay buffer must be off (it re-screens a pool a stream does not keep).
        stream_cache: folder of the optimized dataset (default: `.flywheel_stream` beside the
            first training file, or in the working directory for an `hf://` dataset); a
            changed file is optimized again, an unchanged one never.
    """

    train_files: list[str] | str | None = None
    train_split: str = "train"
    max_train_problems: int | None = None
    eval_files: list[str] | str | None = None
    eval_split: str = "test"
    max_eval_problems: int | None = None
    skip_bad_rows: bool = False
    columns: Columns = Columns()
    eval_columns: Columns | None = None
    drop_eval_overlap: bool = False
    stream: bool = False
    stream_cache: str | None = None

    def __post_init__(self) -> None:
        for name in ("train_files", "eval_files"):  # one path stands for a list of one (issue 37)
            if isinstance(getattr(self, name), str):
                object.__setattr__(self, name, [getattr(self, name)])
        for name in ("max_train_problems", "max_eval_problems"):
            value = getattr(self, name)
            _check(value is None or value >= 1,
                   f"--data.problems.{name}={value}: must be >= 1, or null to use every problem")
        if self.stream:
            _check(bool(self.train_files), "--data.problems.stream=true streams --data.problems.train_files, which "
                   "is empty: give the files (--data.problems.train_files=[big.jsonl]) or set --data.problems.stream=false")
            _check(self.max_train_problems is None, "--data.problems.max_train_problems takes a subset of a loaded "
                   "pool; a stream draws from every row: leave it out (null) with --data.problems.stream=true")

    @property
    def cache_folder(self) -> str:
        """Where the streamed dataset is optimized (`stream_cache` or beside the first file)."""
        if self.stream_cache:
            return self.stream_cache
        first = self.train_files[0]
        return ".flywheel_stream" if first.startswith("hf://") else str(Path(first).parent / ".flywheel_stream")


@dataclass(frozen=True)
class BatchingConfig:
    """How many problems are searched per epoch, per optimizer step and per generator call.

    Args:
        problems_per_epoch: problems searched per epoch, over all ranks together.
        mini_batch_problems: problems per optimizer step (all trajectories of a problem stay
            in one mini-batch, as the group baseline needs).
        max_concurrent_trees: trees (or flat groups) kept in flight per generator call.
        flat_samples: responses per problem for the flat and best-of-N rollouts
            (`--data.rollout=flat|best_of_n`).
        flat_first: m, tree tokens only where flat fails (issue 32; `--data.rollout=search` with
            `--data.search.expansion=rollout`): each epoch first samples m flat responses per
            problem; a problem with a correct one trains on them as a flat group (credited by
            the configured rule), and only a problem with 0 of m gets a tree, which starts from
            those m responses as its first chains (counted towards K, their tokens counted once
            in the budget) and spends the rest of its K rollouts forking from them. 0 (default):
            off, every problem gets a tree.
    """

    problems_per_epoch: int = 64
    mini_batch_problems: int = 8
    max_concurrent_trees: int = MAX_CONCURRENT_TREES
    flat_samples: int = 8
    flat_first: int = 0

    def __post_init__(self) -> None:
        for name in ("problems_per_epoch", "mini_batch_problems", "max_concurrent_trees", "flat_samples"):
            value = getattr(self, name)
            _check(value >= 1, f"--data.batching.{name}={value}: must be >= 1; set it to 1 or more")
        _check(self.flat_first >= 0, f"--data.batching.flat_first={self.flat_first}: must be >= 0 (0 = off); set it "
               "to the flat samples per problem taken before any tree, or 0")


@dataclass(frozen=True)
class AsyncSearchConfig:
    """Search the next epoch while this one trains (data_modules.search_ahead; docs/vllm-sidecar.md,
    "Searching ahead"). Off by default.

    Args:
        max_staleness: weight syncs the searching weights may lag the trained ones. 0 (default):
            off, every epoch searches with the weights its training starts from. 1: epoch t+1's
            search runs on the vLLM sidecar during epoch t's optimizer steps, with the weights of
            the last sync (the end of epoch t-1): its rows are one sync old when they are trained,
            and the truncated importance weight corrects for it (needs
            `--model.old_logprobs=recompute_tis`). Needs a generator with weights of its own (the
            sidecar) and one process.
    """

    max_staleness: int = 0

    def __post_init__(self) -> None:
        _check(self.max_staleness in (0, 1), f"--data.async_search.max_staleness={self.max_staleness}: must be 0 (off) "
               "or 1 (search the next epoch during this one's training); deeper pipelines are not supported")

    @property
    def enabled(self) -> bool:
        return self.max_staleness > 0


def check_data_settings(rollout: str, problems: ProblemsConfig, hard_set: HardSetConfig, replay: ReplayConfig,
                        save_trees: int) -> None:
    """Refuse the data module's setting combinations that cannot work, naming the flag and the fix."""
    ROLLOUTS.check(rollout)
    _check(save_trees >= 0, f"--data.save_trees must be >= 0 (0 = none), got {save_trees}")
    _check(not (problems.stream and replay.enabled),
           "--data.problems.stream=true needs --data.replay.enabled=false: the replay buffer re-screens its problems at "
           "every round's end, and a stream keeps no pool to find them in")
    _check(not (problems.stream and hard_set.enabled and hard_set.rescreen == "all"),
           "--data.hard_set.rescreen=all re-screens the training pool every round, and --data.problems.stream=true keeps "
           "none (each epoch's draw is screened instead): set --data.hard_set.rescreen=hard, or load the files whole "
           "(--data.problems.stream=false)")
