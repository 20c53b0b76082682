"""Data files shipped inside the package (problem splits, the tiny policy), found by path."""

from pathlib import Path

__all__ = ["asset_path"]

_ROOT = Path(__file__).resolve().parent


def asset_path(*parts: str) -> Path:
    """The path of `flywheel/assets/<parts...>` in the installed package.

    It does not check that the file exists: tools use it to write assets too.

    >>> asset_path("countdown", "test.jsonl").name
    'test.jsonl'
    """
    return _ROOT.joinpath(*parts)
