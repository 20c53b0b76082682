"""A run's settings across resumes: each part of a run keeps its own config file, the
checkpoint records the settings it was written under, and a resume with changed settings
says what changed (issue 22: a resume used to overwrite config.yaml, so the run's record
claimed the new settings for every round).

    <log_dir>/config.yaml            the first part of the run
    <log_dir>/config.resume-1.yaml   the first resume, and so on
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from lightning.pytorch.cli import SaveConfigCallback

SETTINGS_KEY = "flywheel_settings"
"""Checkpoint key of the run's flattened settings when the checkpoint was written."""


def flat_settings(nested: Any, prefix: str = "") -> dict[str, Any]:
    """{"--section.field": value} of a nested config dict."""
    if isinstance(nested, dict) and nested:
        out: dict[str, Any] = {}
        for key, value in nested.items():
            out.update(flat_settings(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {f"--{prefix}": nested}


def changed_settings(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Lines `--flag: old -> new` for every setting that differs (what to resume from is not
    a setting of the run)."""
    skip = {"--ckpt_path", "--last_missing_ok", "--config"}
    keys = sorted(k for k in set(before) | set(now) if k not in skip and before.get(k) != now.get(k))
    return [f"{k}: {before.get(k, '(unset)')!r} -> {now.get(k, '(unset)')!r}" for k in keys]


def next_config_name(log_dir: str | Path) -> str:
    """config.yaml for a run's first part, then config.resume-N.yaml for the N-th resume."""
    folder = Path(log_dir)
    if not (folder / "config.yaml").exists():
        return "config.yaml"
    taken = [int(m.group(1)) for p in folder.glob("config.resume-*.yaml") if (m := re.fullmatch(r"config\.resume-(\d+)\.yaml", p.name))]
    return f"config.resume-{max(taken, default=0) + 1}.yaml"


class RunSettings(SaveConfigCallback):
    """LightningCLI's config saver that never overwrites an earlier part's config file and
    stores the flattened settings in every checkpoint."""

    resuming = False
    """Set by the CLI when `fit` resumes from a checkpoint (Lightning knows it only after setup)."""

    def settings(self) -> dict[str, Any]:
        return flat_settings(yaml.safe_load(self.parser.dump(self.config, skip_none=False)) or {})

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.already_saved:
            return
        log_dir = trainer.log_dir  # a collective under DDP: every rank asks
        if log_dir and self.resuming:  # a resume logging on in the run's folder keeps the earlier configs
            self.config_filename = next_config_name(log_dir)
        super().setup(trainer, pl_module, stage)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        checkpoint[SETTINGS_KEY] = self.settings()
