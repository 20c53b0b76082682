"""Strict flags: no command of the project takes a flag it does not know.

argparse takes any unambiguous prefix of a flag by default, so a misspelt or partial flag can
pass silently as another (`--trainer.max_epoch=2` ran as `--trainer.max_epochs=2`). Every
parser of the project (`fit|validate|test`, `eval`, `diagnose`, `tree`, `get-policy` and the
tools under tools/) refuses abbreviations, and an unknown flag's error names the closest known
one ("did you mean --trainer.max_epochs?"). `StrictParser` is the argparse parser of the
commands and tools; `suggestion` words the hint for jsonargparse's errors too.
"""

from __future__ import annotations

import argparse
import difflib
import re
from typing import Any, Iterable, Iterator

_UNRECOGNIZED = re.compile(r"unrecognized arguments?:\s*(.*)", re.IGNORECASE)


def option_strings(parser: Any) -> list[str]:
    """Every long option of `parser` and of its subcommands' parsers (argparse or jsonargparse)."""
    return sorted(set(_options(parser, set())))


def _options(parser: Any, seen: set[int]) -> Iterator[str]:
    if id(parser) in seen:
        return
    seen.add(id(parser))
    for action in getattr(parser, "_actions", ()):
        yield from (s for s in action.option_strings if s.startswith("--"))
        for sub in (getattr(action, "_name_parser_map", None) or {}).values():
            yield from _options(sub, seen)


def unknown_flags(message: str) -> list[str]:
    """The flag names (without `=value`) of an "unrecognized arguments: ..." error."""
    found = _UNRECOGNIZED.search(message)
    if not found:
        return []
    return [word.split("=", 1)[0] for word in found.group(1).split() if word.startswith("--")]


def closest(flag: str, known: Iterable[str]) -> str | None:
    """The known flag `flag` most likely meant: one it abbreviates, else the nearest spelling.
    A value and a Literal's choices read the same way (flywheel.run.command_line.parse_error_line).

    >>> closest("--trainer.max_epoch", ["--trainer.max_epochs", "--trainer.max_steps"])
    '--trainer.max_epochs'
    >>> closest("--smaples", ["--samples", "--seed"])
    '--samples'
    >>> closest("--zzz", ["--samples"]) is None
    True
    """
    known = list(known)
    prefixed = [k for k in known if k.startswith(flag)]
    if prefixed:
        return min(prefixed, key=len)
    near = difflib.get_close_matches(flag, known, n=1, cutoff=0.75)
    return near[0] if near else None


def suggestion(message: str, known: Iterable[str]) -> str:
    """ "; did you mean --x?" for the unknown flags of `message` that have a close known flag,
    else ""."""
    known = list(known)
    hints = [f"{flag} -> {match}" if len(unknown_flags(message)) > 1 else match
             for flag in unknown_flags(message) if (match := closest(flag, known)) is not None]
    return f"; did you mean {', '.join(hints)}?" if hints else ""


class StrictParser(argparse.ArgumentParser):
    """argparse.ArgumentParser without abbreviations, whose unknown-flag error suggests the
    closest flag."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # type: ignore[override]
        super().error(message + suggestion(message, option_strings(self)))
