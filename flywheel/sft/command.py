"""`python -m flywheel sft`: supervised fine-tuning of a policy folder on (prompt, response) rows,
the cold start before RL. It reads top to bottom:

1. check the settings and the output folder (a finished policy there is never overwritten;
   an unfinished run there resumes only with --resume=true);
2. load the policy (a built-in name, a registry policy, or a Hugging Face folder);
3. the training rows: a problem file's worked solutions (`--files` with `--response_column`,
   read through the same column mapping as RL problem files), or the task's own solver
   traces of `--split` (chains, Countdown; Mastermind's noisy-solver episodes), each with the
   task's prompt and chat template, so SFT and RL see identical prompts;
4. the steps (flywheel.sft.train: response tokens only, progress bar with tokens/s and ETA,
   checkpoints, Ctrl-C and resume);
5. the policy folder written into `--out` (what `fit --model.policy`, `eval` and `diagnose`
   take), then the held-out loss and the task's pass@k measured from that folder;
6. `sft.json` beside it: the settings, the losses, the held-out numbers, the wall time and the machine.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

import torch

from flywheel.io import atomic_write_json, file_sha256
from flywheel.sft.loop import SftSettings, SftState, collate, lr_at
from flywheel.sft.train import CHECKPOINT, train as run_steps
from flywheel.sft.traces import Trace, episode_traces, file_traces, solver_episodes, solver_traces
from flywheel.tasks import Task
from flywheel.tasks.columns import Columns
from flywheel.tasks.sources import check_no_file_twice

log = logging.getLogger("flywheel.sft")

SFT_FORMAT = 1
"""Version of sft.json's layout."""


def run_sft(
    policy: str,
    out: str,
    task: Task | None = None,
    files: list[str] | str | None = None,
    response_column: str = "solution",
    split: str = "train",
    columns: Columns = Columns(),
    skip_bad_rows: bool = False,
    max_rows: int | None = None,
    max_solutions: int = 16,
    solver_noise: float = 0.3,
    solver_pick: str = "lowest",
    train: SftSettings = SftSettings(),
    save_every: int = 100,
    resume: bool = False,
    threads: int | None = None,
    eval_split: str | None = "val",
    eval_files: list[str] | str | None = None,
    eval_samples: int = 8,
    eval_max_problems: int | None = 200,
    eval_temperature: float = 1.0,
) -> dict[str, Any]:
    """Fine-tune `policy` on worked solutions and write the result as a policy folder `out`.

    Args:
        policy: the policy to start from: a built-in name (tiny-chain), a registry policy
            (smollm2-135m-instruct, after `flywheel get-policy`) or a Hugging Face model folder.
        out: the folder the fine-tuned policy is written to (with sft.json and eval/); an
            unfinished run's checkpoint waits there for --resume=true.
        task: the task whose prompts (and chat template) the rows get and whose verifier grades
            the held-out samples (default: Countdown), e.g. --task flywheel.tasks.chain.ChainTask.
        files: problem files whose rows also hold a worked solution (jsonl, parquet, a
            `Dataset.save_to_disk` folder; docs/data.md); without them, the task's own solver
            traces of `split` (chains and Countdown: verified solutions; Mastermind: episodes of
            a noisy solver).
        response_column: the column of a row's worked solution (GSM8K: answer; MATH: solution);
            a dotted path reaches a nested field.
        split: the task's built-in split the solver traces come from (without --files).
        columns: where the problem, answer and id are in the files' rows (`fit`'s
            `--data.problems.columns.*`), e.g. --columns.problem=question.
        skip_bad_rows: skip and count malformed rows instead of refusing the first one.
        max_rows: train on the first this many problems (rows) only.
        max_solutions: solver traces kept per problem (Countdown: distinct solutions; Mastermind:
            episodes per secret); each step picks one of a problem's at random.
        solver_noise: Mastermind: the share of the solver's guesses that are mistakes.
        solver_pick: Mastermind: the code the solver plays among those that fit ("lowest" or "random").
        train: the steps, batch, learning rate schedule, packing and precision
            (`--train.steps`, `--train.lr`, ...; flywheel.sft.SftSettings).
        save_every: write the resumable checkpoint every this many steps (0: only when stopped).
        resume: continue the unfinished run whose checkpoint is in `out`.
        threads: torch CPU threads (default: torch's own choice).
        eval_split: the task's built-in held-out split measured at the end (held-out loss of its
            solver traces, pass@k of samples); None: no evaluation.
        eval_files: held-out problem files instead of `eval_split` (the loss needs their
            `response_column`; pass@k needs only problem and answer).
        eval_samples: samples per held-out problem (pass@1 and pass@eval_samples are reported).
        eval_max_problems: measure the first this many held-out problems.
        eval_temperature: sampling temperature of the held-out samples.
    """
    from flywheel.policies.check import load_checked_policy
    from flywheel.run.preflight import PreflightError, check_folder
    from flywheel.tasks.countdown import CountdownTask

    # 1. Settings and the output folder, before anything loads.
    task = task if task is not None else CountdownTask()
    folder = Path(out).expanduser()
    check_out(folder, resume)
    check_folder(folder, "--out", what="the fine-tuned policy")
    if threads is not None:
        torch.set_num_threads(threads)
    # 2. The policy.
    model, tokenizer = load_checked_policy(policy, "float32", "--policy", "--dtype")
    # 3. The rows.
    try:
        traces = training_traces(task, tokenizer, files, response_column, split, columns, skip_bad_rows, max_rows,
                                 max_solutions, solver_noise, solver_pick, train.seed)
    except (ValueError, TypeError, FileNotFoundError) as err:
        raise PreflightError(str(err)) from None
    check_lengths(traces, model, "training")
    log.info("%d problems, %d traces (%d trained tokens in one trace of each problem)", len(traces),
             sum(map(len, traces)), sum(group[0].trained_tokens for group in traces))
    # 4. The steps.
    started = time.perf_counter()
    state = run_steps(model, traces, train, tokenizer.pad_token_id, checkpoint=folder / CHECKPOINT,
                      save_every=save_every, resume=resume, on_step=step_reporter(train))
    sft_seconds = time.perf_counter() - started
    # 5. The policy folder, then what it measures.
    save_policy_folder(model, tokenizer, folder)
    record = sft_record(folder, policy, task, train, traces, state, sft_seconds)
    record.update(held_out(folder, model, tokenizer, task, eval_split, eval_files, response_column, columns,
                           eval_samples, eval_max_problems, eval_temperature, train))
    # 6. The record; the checkpoint is spent.
    atomic_write_json(folder / "sft.json", record)
    (folder / CHECKPOINT).unlink(missing_ok=True)
    log.info("written: %s (the policy; sft.json beside it)", folder)
    return record


def check_out(folder: Path, resume: bool) -> None:
    """A finished policy in `folder` is never overwritten; an unfinished run's checkpoint there
    resumes only when asked, and --resume=true needs one."""
    from flywheel.run.preflight import PreflightError

    unfinished = (folder / CHECKPOINT).exists()
    if (folder / "config.json").exists() and not unfinished:
        raise PreflightError(f"--out {folder} holds a policy already (config.json); choose another --out")
    if unfinished and not resume:
        raise PreflightError(f"--out {folder} holds an unfinished SFT run ({CHECKPOINT}); continue it with "
                             "--resume=true and the same settings, or choose another --out")
    if resume and not unfinished:
        raise PreflightError(f"--resume=true: --out {folder} holds no unfinished SFT run ({CHECKPOINT}) to continue")


def training_traces(task: Task, tokenizer: Any, files: list[str] | str | None, response_column: str, split: str,
                    columns: Columns, skip_bad_rows: bool, max_rows: int | None, max_solutions: int,
                    solver_noise: float, solver_pick: str, seed: int) -> list[list[Trace]]:
    """The training traces: every file's worked solutions, or the task's solver traces of `split`."""
    if files:
        files = [files] if isinstance(files, str) else files
        check_no_file_twice(files)
        out: list[list[Trace]] = []
        for file in files:  # max_rows counts over all files together, read no further than it needs
            if max_rows is not None and len(out) >= max_rows:
                break
            left = None if max_rows is None else max_rows - len(out)
            traces, skipped = file_traces(task, tokenizer, file, response_column, columns, skip_bad_rows, left)
            if skipped:
                log.warning("%s: %d bad rows skipped", file, skipped)
            out += traces
    else:
        out = task_traces(task, tokenizer, task.problems(split)[:max_rows], max_solutions, solver_noise, solver_pick,
                          seed)
    if not out:
        raise ValueError("no training rows: the files (or the split) hold none")
    return out


def task_traces(task: Task, tokenizer: Any, problems: Sequence[Any], max_solutions: int, solver_noise: float,
                solver_pick: str, seed: int) -> list[list[Trace]]:
    """A task's own worked solutions of `problems`: an environment's noisy-solver episodes
    (Mastermind), else verified solver traces (chains, Countdown)."""
    from flywheel.tasks.mastermind import MastermindTask

    if isinstance(task, MastermindTask):
        episodes = solver_episodes(task, problems, max_solutions, solver_noise, solver_pick, seed)
        return episode_traces(task, tokenizer, problems, episodes)
    return solver_traces(task, tokenizer, problems, max_solutions)


def check_lengths(traces: Sequence[Sequence[Trace]], model: Any, what: str) -> None:
    """Every trace fits the policy's context."""
    from flywheel.run.preflight import PreflightError, context_limit

    limit = context_limit(model)
    longest = max(len(t.input_ids) for group in traces for t in group)
    if limit is not None and longest > limit:
        raise PreflightError(f"a {what} row has {longest} tokens, more than the policy's context of {limit}; "
                             "shorten the worked solutions or drop the longest rows")


def step_reporter(settings: SftSettings):
    """The progress bar of the steps: loss, learning rate and trained tokens per second, with an ETA."""
    from flywheel.reporting.bars import progress_bar

    bar = progress_bar(settings.steps, "sft", "step", show=True)
    started: list[int] = []

    def report(state: SftState) -> None:
        if not started:  # a resumed run's bar starts where it stands
            started.append(state.step - 1)
            bar.update(state.step - 1)
        tokens_per_s = state.tokens / max(sum(state.seconds), 1e-9)
        bar.set_postfix_str(f"loss {state.losses[-1]:.4f} lr {lr_at(state.step - 1, settings):.2e} "
                            f"{tokens_per_s:,.0f} tok/s", refresh=False)
        bar.update(1)
        if state.step == settings.steps:
            bar.close()

    return report


def save_policy_folder(model: Any, tokenizer: Any, folder: Path) -> None:
    """The model and tokenizer written into `folder` whole: saved beside it, then each file moved
    in (a crash leaves the earlier files, never half a weights file)."""
    config = model.config
    if getattr(config, "_attn_implementation", None) not in (None, "sdpa", "eager"):
        config._attn_implementation = "sdpa"  # packing's tree attention is the trainer's own, not the folder's
    folder.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.saving-"))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        for file in sorted(staging.iterdir()):
            os.replace(file, folder / file.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def sft_record(folder: Path, policy: str, task: Task, settings: SftSettings, traces: Sequence[Sequence[Trace]],
               state: SftState, sft_seconds: float) -> dict[str, Any]:
    """sft.json's record of the run before its held-out numbers: the command, the settings, the
    rows, the losses, the speed, the weights' SHA-256 and the machine."""
    tail = state.losses[-20:]
    return {"format": SFT_FORMAT, "policy": policy, "task": f"{type(task).__module__}.{type(task).__qualname__}",
            "command": "python -m flywheel sft " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["sft"] else None,
            "settings": asdict(settings), "problems": len(traces), "traces": sum(map(len, traces)),
            "steps": state.step, "first_loss": state.losses[0], "last_loss": sum(tail) / len(tail),
            "trained_tokens": state.tokens,
            "tokens_per_second": round(state.tokens / max(sum(state.seconds), 1e-9), 1),
            "sft_seconds": round(sft_seconds, 1), "machine": machine(),
            "weights_sha256": {f.name: file_sha256(f) for f in sorted(folder.glob("*.safetensors"))}}


def heldout_loss(model: Any, traces: Sequence[Sequence[Trace]], pad_id: int, batch_size: int) -> float:
    """The mean token cross-entropy of every held-out trace (all of a problem's), padded rows."""
    rows = [t for group in traces for t in group]
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for i in range(0, len(rows), batch_size):
            ids, mask, labels = collate(rows[i : i + batch_size], pad_id)
            n = int((labels[:, 1:] != -100).sum())
            total += float(model(input_ids=ids, attention_mask=mask, labels=labels).loss) * n
            count += n
    return total / max(count, 1)


def held_out(folder: Path, model: Any, tokenizer: Any, task: Task, split: str | None, files: list[str] | str | None,
             response_column: str, columns: Columns, samples: int, max_problems: int | None, temperature: float,
             settings: SftSettings) -> dict[str, Any]:
    """The held-out loss (of the split's solver traces, or the files' worked solutions when they
    have them) and pass@k of samples from the folder just written (`flywheel eval`)."""
    from flywheel.reporting.eval_command import run_eval

    if split is None and not files:
        return {}
    name = split if not files else ",".join([files] if isinstance(files, str) else files)
    out: dict[str, Any] = {"heldout": name}
    try:
        traces = training_traces(task, tokenizer, files, response_column, split or "val", columns, False, max_problems,
                                 1, 0.0, "lowest", settings.seed)
        out["heldout_loss"] = heldout_loss(model, traces, tokenizer.pad_token_id, settings.batch_size)
        log.info("held-out loss on %s: %.4f (%d rows)", name, out["heldout_loss"], sum(map(len, traces)))
    except (ValueError, TypeError) as err:  # no worked solutions there: pass@k only
        log.info("no held-out loss on %s (%s)", name, err)
    started = time.perf_counter()
    report = run_eval(policy=str(folder), task=task, files=files, split=split, samples=samples,
                      k=sorted({1, samples}), temperature=temperature, max_problems=max_problems, dtype="float32",
                      out=str(folder / "eval"))
    out["eval"] = {source: {k: v for k, v in result.items() if k.startswith(("pass@", "mean@")) or k == "problems"}
                   for source, result in report["results"].items()}
    out["eval_seconds"] = round(time.perf_counter() - started, 1)
    return out


def machine() -> str:
    from flywheel.generation.precision import cpu_has_bf16

    return f"{os.cpu_count()} cores visible, {'native bf16 (AVX512-BF16/AMX)' if cpu_has_bf16() else 'no native bf16'}"


def main(args: list[str]) -> dict[str, Any]:
    """`sft`'s command line: run_sft's arguments as flags."""
    from flywheel.run.command_line import function_cli

    return function_cli(run_sft, args, "sft")

