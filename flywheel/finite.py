"""Non-finite numbers in settings.

YAML reads `.nan` and `.inf` as floats, and a range check written `x < 0` lets NaN through:
`temperature: .nan` collapsed the search to greedy without a word and `.inf` sampled
uniform noise (issue 37). Every float a run reads is checked here: the command line's whole
parsed configuration (`non_finite_settings`, before anything is built), and each settings
dataclass at construction (`check_finite_fields`).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from typing import Any, Iterable, Iterator

INFINITY_ALLOWED = frozenset({"model.objective.dual_clip"})
"""Settings where +inf is documented to mean "off" (flywheel.objectives.config)."""


def _finite_or_allowed(value: float, key: str, allow_inf: Iterable[str]) -> bool:
    return math.isfinite(value) or (value == math.inf and key in allow_inf)


def non_finite_settings(config: Any, prefix: str = "", allow_inf: Iterable[str] = INFINITY_ALLOWED) -> Iterator[tuple[str, float]]:
    """(dotted key, value) of every NaN or infinite float in a parsed configuration (nested
    namespaces, dicts, lists and dataclasses), except +inf where `allow_inf` names the key."""
    allow_inf = frozenset(allow_inf)
    if isinstance(config, bool):
        return
    if isinstance(config, float):
        if not _finite_or_allowed(config, prefix, allow_inf):
            yield prefix, config
        return
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        items: Iterable[tuple[str, Any]] = ((f.name, getattr(config, f.name)) for f in dataclasses.fields(config))
    elif isinstance(config, argparse.Namespace):  # jsonargparse's too
        items = vars(config).items()
    elif isinstance(config, dict):
        items = config.items()
    elif isinstance(config, (list, tuple)):
        for i, value in enumerate(config):
            yield from non_finite_settings(value, f"{prefix}[{i}]", allow_inf)
        return
    else:
        return
    for name, value in items:
        key = f"{prefix}.{name}" if prefix else str(name)
        yield from non_finite_settings(value, key, allow_inf)


def non_finite_message(key: str, value: float, flag_prefix: str = "--") -> str:
    """One line: the flag, why a non-finite value is refused, and the fix."""
    return (f"{flag_prefix}{key}={value}: not a finite number (YAML reads .nan and .inf as floats); "
            "give a finite value")


def check_finite_fields(settings: Any, section: str, allow_inf: Iterable[str] = ()) -> None:
    """Raise ValueError naming `--{section}.{field}` for a NaN or infinite float field of the
    settings dataclass `settings` (+inf allowed for the fields in `allow_inf`). Called first in
    `__post_init__`, so the range checks after it see finite numbers."""
    for key, value in non_finite_settings(settings, allow_inf=allow_inf):
        raise ValueError(non_finite_message(f"{section}.{key}", value))
