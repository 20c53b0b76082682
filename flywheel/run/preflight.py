"""Pre-flight checks of `flywheel fit|validate|test`: every setting, input file, output folder
and the checkpoint to resume from are checked once, before the first search starts, and a
problem is one short error naming the flag (`--section.field`) and the fix.

Without them a missing held-out file, a prompt longer than the policy's context or a full
checkpoint folder surfaced only after an epoch's search (issue 22). Called by the CLI
(flywheel/run/cli.py) with the instantiated trainer, model and data module.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

import torch

from flywheel.reporting.problem_view import encode_prompt
from flywheel.run.settings import SETTINGS_KEY
from flywheel.run.errors import CheckpointReadError, PreflightError  # noqa: F401  (PreflightError: raised here and imported from here)
from flywheel.tasks import Problem, Task

if TYPE_CHECKING:
    from data_modules.search import SearchDataModule

log = logging.getLogger("flywheel.run.preflight")

SPACE_MARGIN = 1.05
"""A checkpoint file is this much larger than its weights and optimizer moments (the loops',
data module's and callbacks' state, the pickle's framing)."""


# ---------------------------------------------------------------------- settings
def check_overlap(trainer: Any, model: Any, datamodule: SearchDataModule) -> None:
    """`--data.async_search` where it cannot work: the in-process generator, several processes,
    a loss that would not correct the lag (the data module's `overlap_refusal`)."""
    message = datamodule.overlap_refusal(trainer.world_size, model)
    if message:
        raise PreflightError(message)


def check_precision(trainer: Any) -> None:
    """bf16 on a CPU without native bf16 matmuls (AVX512-BF16 / AMX-BF16): autocast still runs,
    but emulated, slower than fp32. Warned, not refused: the numbers stay right."""
    from flywheel.generation.precision import cpu_has_bf16

    precision = str(getattr(trainer, "precision", ""))
    on_cpu = type(getattr(trainer, "accelerator", None)).__name__ == "CPUAccelerator"
    if precision.startswith("bf16") and on_cpu and not cpu_has_bf16():
        log.warning("--trainer.precision=%s on a CPU without native bf16 matmuls (no AVX512-BF16 or AMX-BF16 in "
                    "/proc/cpuinfo): its matmuls are emulated and train slower than fp32; use "
                    "--trainer.precision=32-true on this machine", precision)


def check_nodes(trainer: Any, datamodule: SearchDataModule) -> None:
    """A generator backend that cannot serve a run on several nodes (`--trainer.num_nodes`):
    vLLM servers the other nodes cannot reach or the weight sync misses."""
    message = datamodule.backend.node_refusal(trainer.num_nodes)
    if message:
        raise PreflightError(message)


def check_epochs(trainer: Any) -> None:
    """A fit that would run no epoch: Lightning still builds the first epoch's data (a whole
    search) before it stops (issue 37)."""
    for flag, value in (("--trainer.max_epochs", trainer.max_epochs), ("--trainer.max_steps", trainer.max_steps)):
        if value == 0:
            raise PreflightError(f"{flag}=0: the run would train nothing (and still search one epoch first); "
                                 "set it to 1 or more, or -1 for no limit")


# ---------------------------------------------------------------------- inputs
def context_limit(model: Any) -> int | None:
    """The policy's longest sequence (prompt + response) in tokens, if its config says."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, "max_position_embeddings", None)


def prompt_fits(tokenizer: Any, task: Task, limit: int | None, budget_flag: str) -> Callable[[Problem], None] | None:
    """A row check for `load_problems`: the problem's encoded prompt plus the task's response
    budget must fit the policy's context, or the generator refuses the request epochs later."""
    if limit is None:
        return None
    response = task.max_response_tokens
    if response >= limit:
        raise PreflightError(
            f"{budget_flag}={response}: the response budget alone fills the policy's context of {limit} tokens; "
            f"lower it below {limit} minus the prompt length"
        )

    def check(problem: Problem) -> None:
        n = len(encode_prompt(tokenizer, task, problem))
        if n + response > limit:
            raise ValueError(
                f"problem {problem.id!r}: its prompt ({n} tokens) + the response budget ({budget_flag}={response}) "
                f"exceeds the policy's context of {limit} tokens"
            )

    return check


def load_inputs(datamodule: SearchDataModule, model: Any, train: bool) -> None:
    """Read every problem file now (held-out, and training when `train`), each row checked
    against the policy's context, so a missing or corrupt file or an unusable row fails
    before the first search; the data module keeps what it loaded. A task that asks for a chat
    template the tokenizer lacks is warned of (flywheel.policies.check.chat_template_warning)."""
    from flywheel.policies.check import chat_template_warning

    policy = getattr(getattr(model, "hparams", None), "policy", None)
    if policy is not None and (warning := chat_template_warning(datamodule.task, model.tokenizer, str(policy),
                                                                "--data.task.init_args.chat_template")):
        log.warning(warning)
    try:
        datamodule.check_rows_with(prompt_fits(
            model.tokenizer, datamodule.task, context_limit(model.policy), "--data.task.init_args.max_response_tokens"
        ))
        budget_error = None
    except PreflightError as err:  # reported after the problem files, which a user sets up first
        datamodule.check_rows_with(None)
        budget_error = err
    # Held-out first: the training pool reads it too (repeats, leaks, drop_eval_overlap), and
    # its errors must name its own flag.
    loads = [("--data.problems.eval_files", datamodule.eval_problems)]
    loads += [("--data.problems.train_files", datamodule.train_pool)] if train else []
    for flag, load in loads:
        try:
            load()
        except FileNotFoundError as err:
            raise PreflightError(f"{err}; fix the path in {flag}") from err
        except (ValueError, ImportError) as err:
            raise PreflightError(f"{err} [{flag}]" if flag.split(".")[-1] not in str(err) else str(err)) from err
    if budget_error is not None:
        raise budget_error


# ---------------------------------------------------------------------- outputs
def checkpoint_bytes(model: torch.nn.Module) -> int:
    """About the size of one checkpoint: the weights, plus AdamW's two moments of every
    trainable weight."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return weights + 2 * trainable


def check_folder(folder: str | os.PathLike, flag: str, need_bytes: int = 0, what: str = "a checkpoint",
                 fix: str = "") -> None:
    """The folder can be created, written, and has room for `need_bytes` more (`what` needs
    them; `fix` is a further way out)."""
    folder = Path(folder).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".flywheel-preflight-", delete=True) as probe:
            probe.write(b"x")
            probe.flush()
    except OSError as err:
        if err.errno == 28:  # ENOSPC
            raise PreflightError(f"no space left on {folder}; free space there or write elsewhere with {flag}=FOLDER") from None
        raise PreflightError(
            f"cannot write to {folder} ({type(err).__name__}: {err.strerror or err}); choose a writable folder "
            f"with {flag}=FOLDER"
        ) from None
    free = shutil.disk_usage(folder).free
    if need_bytes and free < need_bytes * SPACE_MARGIN:
        raise PreflightError(
            f"no space left on {folder}: {what} needs about {_mb(need_bytes * SPACE_MARGIN)}, "
            f"{_mb(free)} are free; free space there{fix} or write elsewhere with {flag}=FOLDER"
        )


def _mb(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def output_folders(trainer: Any) -> Iterable[tuple[str, str, bool]]:
    """(folder, the flag that moves it, whether checkpoints go there) of a fit run."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    logger = trainer.logger
    if logger is not None and getattr(logger, "save_dir", None):
        yield str(logger.save_dir), "--trainer.logger.init_args.save_dir", False
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.dirpath:
            yield str(callback.dirpath), "--trainer.callbacks.init_args.dirpath", True


def checkpoints_at_once(trainer: Any, folder: str) -> tuple[int, str]:
    """The most checkpoint files the run has in `folder` at one time, and what they are: each
    ModelCheckpoint's top k (every save when k = -1), `last.ckpt` (preemption writes it even
    without save_last), and one being written beside the file it replaces (issue 37: one
    checkpoint was counted, so a folder with room for two failed at the first epoch's end)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    kept, lasts = 0, 0
    for callback in trainer.checkpoint_callbacks:
        if not isinstance(callback, ModelCheckpoint) or str(callback.dirpath) != folder:
            continue
        if callback.save_top_k < 0:  # every save is kept: one per every_n_epochs over the run
            epochs = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else 1
            kept += math.ceil(epochs / max(1, callback.every_n_epochs or 1))
        else:
            kept += callback.save_top_k
        lasts += bool(callback.save_last)
    lasts = max(1, lasts)
    return kept + lasts + 1, f"top {kept}, {'last.ckpt' if lasts == 1 else f'{lasts} last checkpoints'}, one being written"


def check_outputs(trainer: Any, model: Any) -> None:
    one = checkpoint_bytes(model)
    for folder, flag, checkpoints in output_folders(trainer):
        if not checkpoints:
            check_folder(folder, flag)
            continue
        copies, parts = checkpoints_at_once(trainer, folder)
        present = len(list(Path(folder).glob("*.ckpt"))) if Path(folder).is_dir() else 0  # a resume replaces them
        need = max(1, copies - present)
        check_folder(folder, flag, need * one, what=f"the run's checkpoints ({copies} at once: {parts}; {_mb(one)} "
                     f"each{f', {present} there already' if present else ''})",
                     fix=", keep fewer (--trainer.callbacks.init_args.save_top_k)")


# ---------------------------------------------------------------------- the checkpoint
def resolve_ckpt_path(trainer: Any, ckpt_path: str | None, missing_ok: bool) -> str | None:
    """The checkpoint file `--ckpt_path` names ("last" = the newest last*.ckpt of the run's
    ModelCheckpoint folders), or None to start fresh. A "last" that finds nothing fails with
    the folders searched and what is in them, unless `missing_ok`."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    if ckpt_path is None or ckpt_path in ("best", "hpc", "registry") or "://" in str(ckpt_path):
        return ckpt_path
    if ckpt_path == "last":
        found: list[str] = []
        folders: list[str] = []
        for callback in trainer.checkpoint_callbacks:
            if isinstance(callback, ModelCheckpoint):
                found += [p for p in callback._find_last_checkpoints(trainer) if Path(p).exists()]
                folders.append(str(callback.dirpath))
        if found:
            return max(found, key=os.path.getmtime)
        if missing_ok:
            log.info("--ckpt_path last: no last.ckpt in %s; starting a fresh run (--last_missing_ok=true)",
                     ", ".join(folders) or "(no checkpoint folder)")
            return None
        present = sorted(str(p) for f in folders if Path(f).is_dir() for p in Path(f).glob("*.ckpt"))
        raise PreflightError(
            f"--ckpt_path last: no last.ckpt in {', '.join(folders) or '(the run has no ModelCheckpoint)'}"
            + (f" (checkpoints there: {', '.join(present)}; pass one as --ckpt_path FILE)" if present else " (the folder holds no checkpoints)")
            + ". Check --trainer.logger.init_args.save_dir / name or --trainer.callbacks.init_args.dirpath, "
            "or pass --last_missing_ok=true to start a fresh run when there is nothing to resume"
        )
    path = Path(ckpt_path)
    if path.is_dir() and not (path / "latest").exists():  # a DeepSpeed checkpoint is a folder with `latest`
        inside = sorted(str(p) for p in path.glob("*.ckpt"))
        raise PreflightError(
            f"--ckpt_path {path} is a folder, not a checkpoint file; "
            + (f"pass one of: {', '.join(inside)}" if inside else "it holds no .ckpt files")
        )
    if not path.exists():
        raise PreflightError(f"--ckpt_path {path}: no such file; pass an existing .ckpt file, or `last`")
    return str(path)


def check_deepspeed_resume(trainer: Any, resolved: str | None) -> None:
    """A DeepSpeed checkpoint folder resumed on another number of processes than wrote it:
    DeepSpeed would fail inside its engine, after the setup (flywheel.run.zero_checkpoint)."""
    from flywheel.run.zero_checkpoint import world_size_refusal

    if resolved is not None and Path(str(resolved)).is_dir():
        message = world_size_refusal(resolved, trainer.world_size)
        if message:
            raise PreflightError(message)


def checkpoint_folders(trainer: Any) -> list[Path]:
    """The local folders the run's ModelCheckpoints write to."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    return [Path(c.dirpath).expanduser().resolve() for c in trainer.checkpoint_callbacks
            if isinstance(c, ModelCheckpoint) and c.dirpath and "://" not in str(c.dirpath)]


def rerun_to_resume(trainer: Any, settings: dict[str, Any] | None) -> str | None:
    """A new fit whose checkpoint folder holds the last.ckpt of a run with exactly these settings
    is the same command run again (the quickstart's first line, a second time): it resumes that
    run (a finished run has nothing left to do and ends at once) instead of failing. Returns that
    last.ckpt, or None (no such run, or one with other settings: check_one_run_per_folder)."""
    from flywheel.run.settings import changed_settings

    if settings is None:
        return None
    for folder in checkpoint_folders(trainer):
        last = folder / "last.ckpt"
        if not last.is_file():
            continue
        try:
            meta = read_checkpoint_meta(str(last))
        except CheckpointReadError:  # damaged: not resumed without being asked (the refusal names it)
            continue
        if not meta.get(SETTINGS_KEY) or changed_settings(meta[SETTINGS_KEY], settings):
            continue
        epochs = int(meta.get("epoch", -1)) + 1
        done = trainer.max_epochs is not None and trainer.max_epochs >= 0 and epochs >= trainer.max_epochs
        log.info("%s holds a run of this same command (the same settings): resuming it from last.ckpt%s. To start "
                 "afresh instead, write elsewhere: --trainer.logger.init_args.name=NEW_NAME", folder,
                 f"; it had finished its {epochs} epochs, so there is nothing left to train" if done
                 else f" after its {epochs} finished epochs")
        return str(last)
    return None


def check_one_run_per_folder(trainer: Any, resolved: str | None, settings: dict[str, Any] | None = None) -> None:
    """A checkpoint folder holds one run: a new run (no checkpoint to resume) or a run resumed
    from a checkpoint kept elsewhere must not write where another run's checkpoints are, or
    its `last.ckpt` and the old run's would be mixed up (issue 37). The error names the settings
    that differ from that run's, when its last.ckpt records them."""
    for folder in checkpoint_folders(trainer):
        present = sorted(p.name for p in folder.glob("*.ckpt")) if folder.is_dir() else []
        if not present or (resolved is not None and Path(str(resolved)).expanduser().resolve().parent == folder):
            continue
        what = "a new run" if resolved is None else f"a run resumed from {resolved}"
        raise PreflightError(
            f"checkpoint folder {folder} already holds checkpoints of an earlier run ({', '.join(present[:3])}"
            f"{', ...' if len(present) > 3 else ''}){_other_settings(folder / 'last.ckpt', settings)}; {what} would "
            "overwrite them. Resume that run with --ckpt_path last, or write elsewhere: another "
            "--trainer.logger.init_args.name (or save_dir), or --trainer.callbacks.init_args.dirpath=FOLDER"
        )


def say_what_the_checkpoint_folders_hold(trainer: Any, resolved: str | None) -> None:
    """Lightning warns of any checkpoint folder that is not empty ("Checkpoint directory ... exists
    and is not empty"), so every intended resume warned. Silent for the folder the run resumes
    from (it holds the run's own checkpoints); for another folder that holds files (not
    checkpoints: check_one_run_per_folder refused those), one line naming them instead."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    resumed_in = Path(str(resolved)).expanduser().resolve().parent if resolved is not None else None
    for callback in trainer.checkpoint_callbacks:
        if not isinstance(callback, ModelCheckpoint) or not callback.dirpath or "://" in str(callback.dirpath):
            continue
        folder = Path(callback.dirpath).expanduser().resolve()
        held = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
        if not held:
            continue
        if folder != resumed_in and trainer.is_global_zero:
            log.warning("checkpoint folder %s holds files of no run (%s%s); this run writes its checkpoints beside them",
                        folder, ", ".join(held[:3]), ", ..." if len(held) > 3 else "")
        warnings.filterwarnings("ignore", message=re.escape(f"Checkpoint directory {callback.dirpath} exists and is not empty"))


def _other_settings(last: Path, settings: dict[str, Any] | None) -> str:
    """`, run with other settings (--flag: theirs -> now, ...)` when `last` records its settings."""
    from flywheel.run.settings import changed_settings

    if settings is None or not last.is_file():
        return ""
    try:
        recorded = read_checkpoint_meta(str(last)).get(SETTINGS_KEY)
    except CheckpointReadError:  # a damaged last.ckpt: the refusal stands without the list
        return ""
    changes = changed_settings(recorded, settings) if recorded else []
    shown = "; ".join(changes[:4]) + ("; ..." if len(changes) > 4 else "")
    return f", run with other settings ({shown})" if changes else ""


def read_checkpoint_meta(path: str) -> dict[str, Any]:
    """The small parts of a checkpoint (hyperparameters, saved settings), loaded lazily
    (memory-mapped; the weights are not read). A damaged file fails with its way out."""
    from flywheel.run.checkpoint import read_checkpoint

    if Path(path).is_dir():  # DeepSpeed: nothing light to read
        return {}
    return read_checkpoint(path, "--ckpt_path", mmap=True)


def check_policy(recorded: str | None, given: str | None, source: str, flag: str, way_out: str) -> None:
    """Refuse weights trained from one policy loaded into another: same-shaped weights load
    without a word and the scores are wrong (issue 22)."""
    from flywheel.policies.load import same_policy

    if recorded is None or given is None or same_policy(str(recorded), str(given)):
        return
    if os.sep in str(recorded) and not Path(str(recorded)).expanduser().exists():
        log.warning("checkpoint %s was trained from policy folder %s, which no longer exists; loading its weights "
                    "into %s=%s unverified", source, recorded, flag, given)
        return
    raise PreflightError(
        f"checkpoint {source} was trained from policy {recorded!r}, but {flag}={given}: its weights would load "
        f"into another model and give wrong results. Fix: {flag}={recorded}{way_out}"
    )


def preflight(trainer: Any, model: Any, datamodule: SearchDataModule, subcommand: str, ckpt_path: str | None,
              missing_ok: bool = False, settings: dict[str, Any] | None = None) -> str | None:
    """Every check, in the order a user fixes things; returns the checkpoint to resume from
    (None = fresh). Raises PreflightError."""
    check_nodes(trainer, datamodule)
    if subcommand == "fit":
        check_epochs(trainer)
        check_precision(trainer)
        check_overlap(trainer, model, datamodule)
        check_outputs(trainer, model.policy)
    resolved = resolve_ckpt_path(trainer, ckpt_path, missing_ok)
    check_deepspeed_resume(trainer, resolved)
    if subcommand == "fit":
        if ckpt_path is None:  # the same command again resumes its run (README: running it twice)
            resolved = rerun_to_resume(trainer, settings)
        check_one_run_per_folder(trainer, resolved, settings)
        say_what_the_checkpoint_folders_hold(trainer, resolved)
    if resolved is not None and Path(str(resolved)).is_file():
        meta = read_checkpoint_meta(str(resolved))
        recorded = (meta.get("hyper_parameters") or {}).get("policy")
        check_policy(recorded, getattr(model.hparams, "policy", None), str(resolved), "--model.policy",
                     ", or start a new run without --ckpt_path")
        if settings is not None and meta.get(SETTINGS_KEY):
            from flywheel.run.settings import changed_settings

            changes = changed_settings(meta[SETTINGS_KEY], settings)
            if changes:
                log.warning("resuming %s with %d changed settings (the checkpoint's -> now):\n  %s",
                            resolved, len(changes), "\n  ".join(changes))
    load_inputs(datamodule, model, train=subcommand == "fit")  # repeats and leaks are logged as the pool loads
    return resolved
