"""Checks shared by the adaptive parts' saved states (hard set, replay buffer, replay rule):
a state read back from a checkpoint or a file is untrusted, so each field is checked before
it is used."""

from __future__ import annotations

from typing import Any, Mapping, TypeVar

C = TypeVar("C")


def is_int(value: object, minimum: int) -> bool:
    """An int (not a bool) >= minimum."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def is_rate(value: object) -> bool:
    """A number (not a bool) in [0, 1]; NaN is not."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0


def stored_config(data: Mapping[str, Any], config_type: type[C], what: str) -> C:
    """Rebuild the config saved under data["config"]; a bad one is a ValueError naming `what`."""
    stored = data.get("config", {})
    if not isinstance(stored, Mapping):
        raise ValueError(f"{what}: 'config' must be a dict, got {type(stored).__name__}")
    try:
        return config_type(**stored)
    except TypeError as err:
        raise ValueError(f"{what}: bad 'config' {dict(stored)!r}: {err}") from None
