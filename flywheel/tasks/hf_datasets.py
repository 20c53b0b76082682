"""Problem rows from Hugging Face `datasets` (the `datasets` extra): a `save_to_disk` folder,
local files read by `load_dataset`, or a dataset on the hub.

A source is named where a problem file is (`--data.problems.train_files`, `flywheel eval --files`):

- a folder written by `Dataset.save_to_disk` (a `DatasetDict`'s folder holds one such folder
  per split: pass `folder/train`);
- `hf://json:PATTERN`, `hf://parquet:PATTERN`, `hf://csv:PATTERN`: local files (a glob; gzip
  and JSON arrays included) read by `load_dataset(builder, data_files=PATTERN)`;
- `hf://OWNER/NAME:SPLIT` or `hf://OWNER/NAME:CONFIG:SPLIT` (`hf://openai/gsm8k:main:train`): a hub
  dataset, read from the local cache or fetched when the machine reaches the hub. One that
  cannot be loaded fails with one line naming the source and what to do.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Iterator

PREFIX = "hf://"
FILE_BUILDERS = ("json", "parquet", "csv")
"""`load_dataset`'s builders for local files, named as `hf://BUILDER:PATTERN`."""


def is_hf_source(source: str) -> bool:
    """Whether `source` is read by `datasets`: an `hf://` name or a `save_to_disk` folder."""
    return source.startswith(PREFIX) or is_saved_folder(Path(source))


def is_saved_folder(path: Path) -> bool:
    return path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file())


def _require_datasets():
    try:
        import datasets
    except ImportError as err:
        raise ImportError("reading a Hugging Face dataset needs the datasets library: "
                          "pip install 'flywheel[datasets]' (or pip install datasets)") from err
    return datasets


def parse(source: str) -> tuple[str, str | None, str]:
    """(name or builder, config or data_files, split) of an `hf://` source.

    >>> parse("hf://openai/gsm8k:main:train"), parse("hf://zwhe99/DeepMath-103K:train")
    (('openai/gsm8k', 'main', 'train'), ('zwhe99/DeepMath-103K', None, 'train'))
    >>> parse("hf://json:data/train-*.jsonl")
    ('json', 'data/train-*.jsonl', 'train')
    """
    body = source[len(PREFIX):]
    builder, _, rest = body.partition(":")
    if builder in FILE_BUILDERS:
        if not rest:
            raise ValueError(f"{source}: name the local files, e.g. {PREFIX}{builder}:data/train-*.{builder}")
        return builder, rest, "train"
    parts = body.split(":")
    if len(parts) not in (2, 3) or not all(parts):
        raise ValueError(f"{source}: write a hub dataset as {PREFIX}OWNER/NAME:SPLIT or {PREFIX}OWNER/NAME:CONFIG:SPLIT "
                         f"(e.g. {PREFIX}openai/gsm8k:main:train), local files as {PREFIX}json:PATTERN or "
                         f"{PREFIX}parquet:PATTERN")
    return parts[0], parts[1] if len(parts) == 3 else None, parts[-1]


def open_dataset(source: str) -> Any:
    """The `datasets.Dataset` of `source` (module docstring); one clear error when it cannot be."""
    if not source.startswith(PREFIX):
        return _open_folder(Path(source))
    name, second, split = parse(source)
    datasets = _require_datasets()
    try:
        if name in FILE_BUILDERS:
            return datasets.load_dataset(name, data_files=second, split=split)
        return datasets.load_dataset(name, second, split=split)
    except Exception as err:  # noqa: BLE001  (datasets raises many kinds; all mean "cannot load it")
        detail = (str(err).splitlines() or [""])[0][:300]
        if name in FILE_BUILDERS:
            fix = f"check the pattern {second!r} (relative to the working directory)"
        else:
            fix = ("check the name, config and split; it needs the Hugging Face hub or the dataset in the local cache "
                   "(HF_HOME): on a machine that reaches the hub, save it with Dataset.save_to_disk and pass that folder")
        raise ValueError(f"{source}: cannot load it with datasets ({type(err).__name__}: {detail}); {fix}") from None


def _open_folder(path: Path) -> Any:
    if (path / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in path.iterdir() if (p / "state.json").is_file())
        raise ValueError(f"{path} holds a DatasetDict; pass one split's folder: "
                         + ", ".join(str(path / s) for s in splits))
    datasets = _require_datasets()
    try:
        return datasets.load_from_disk(str(path))
    except Exception as err:  # noqa: BLE001
        detail = (str(err).splitlines() or [""])[0][:300]
        raise ValueError(f"{path}: cannot be read as a save_to_disk folder ({type(err).__name__}: {detail})") from None


def rows(source: str) -> Iterator[tuple[str, Any]]:
    """(location `source:row N`, row) for every row of the dataset."""
    for i, row in enumerate(open_dataset(source), start=1):
        yield f"{source}:row {i}", row


def digest(source: str) -> bytes:
    """A hash of the dataset's bytes (its arrow files), for the stream's cache key."""
    dataset = open_dataset(source)
    h = hashlib.sha256(source.encode())
    for cache in sorted(f["filename"] for f in dataset.cache_files):
        with open(cache, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.digest()
