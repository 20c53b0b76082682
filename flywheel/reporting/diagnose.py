"""`python -m flywheel diagnose`: do trees pay on MY task with MY policy? Measured before training.

    python -m flywheel diagnose --policy tiny-chain --task flywheel.tasks.chain.ChainTask --split train
    python -m flywheel diagnose --policy path/to/hf_folder --task flywheel.tasks.math.MathTask \\
        --files [train.jsonl] --max_problems 128 --max_tokens 2000000

A tree pays only where resampling from a prefix of a FAILED response solves more per generated
token than a fresh sample from the prompt (flywheel.reporting.fork_gain): on a task whose
failures are local (one wrong step in an otherwise good response) forking from the step
before the mistake keeps the good part; on a task where a failed response is dead after its
first step, forking inherits the dead end. The command draws `samples` responses per problem,
forks every failed one at its step boundaries (`step<j>`), its token midpoint (`mid`) and its
most uncertain token (`entropy`), resamples `resamples` continuations from each and as many
fresh responses from the prompt, and prints per fork point the solves per 1000 generated
tokens, the gain over the fresh samples and its bootstrap interval over problems, then ONE
line of advice: tree (some fork point's interval lies above 1), flat (every interval below 1),
or cannot tell at this sample size. The intervals behind the advice are widened for the number
of fork points compared (Bonferroni). Problems are measured in parts of at most `problems_per_part`
until `max_tokens` generated tokens are spent, so the cost is bounded whatever the policy's
response lengths. Sampling follows the search's rollouts (the task's prompt and step rule,
`temperature`, `top_p`, at most `max_depth` steps). Run it on training problems, never on
the split you will report. Results: `<out>/diagnose.json`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from pathlib import Path
from typing import Any

import torch

from flywheel.generation.backends import GeneratorBackend, HFBackend
from flywheel.io import atomic_write_json
from flywheel.reporting.bars import progress_bar
from flywheel.tasks import Task
from flywheel.tasks.columns import Columns
from flywheel.tasks.environment import EnvironmentTask

log = logging.getLogger("flywheel.diagnose")

DIAGNOSE_FORMAT = "flywheel.diagnose/v1"


def run_diagnose(
    policy: str | None = None,
    checkpoint: str | None = None,
    files: list[str] | str | None = None,
    split: str = "train",
    task: Task | None = None,
    generator: GeneratorBackend | None = None,
    max_problems: int | None = 256,
    samples: int = 8,
    resamples: int = 4,
    fork_steps: int = 4,
    max_depth: int | None = None,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_tokens: int = 1_000_000,
    problems_per_part: int = 16,
    seed: int = 0,
    bootstrap: int = 1000,
    skip_bad_rows: bool = False,
    columns: Columns = Columns(),
    device: str = "auto",
    dtype: str = "auto",
    out: str = "runs/diagnose",
) -> dict[str, Any]:
    """Measure fork_gain of a policy on problems and advise tree or flat search.

    Args:
        policy: a Hugging Face model folder or a built-in policy name; with `checkpoint`, the
            policy the checkpoint was trained from.
        checkpoint: a `flywheel fit` checkpoint (.ckpt); its policy weights are measured.
        files: problem files (jsonl / parquet) in the task's row format, `[a.jsonl,b.parquet]`
            or one path; default: the task's built-in `split`.
        split: a built-in split of the task when no files are given (default "train": measure
            on training problems, never on the split you will report).
        task: the task that prompts and grades, e.g. `flywheel.tasks.chain.ChainTask` or
            `flywheel.tasks.math.MathTask`. Default: with `checkpoint`, the task its run trained
            on (recorded in the checkpoint; `--task.init_args.*` and a fit overlay layer on it);
            without, Countdown.
        generator: the sampling backend (default: in-process transformers).
        max_problems: measure at most the first this many problems (None: all; the token
            budget may stop earlier).
        samples: responses per problem in the pool the failed samples come from.
        resamples: continuations from each fork point, and fresh responses per failed sample.
        fork_steps: step fork points step1 .. step<fork_steps>.
        max_depth: most steps in one response (the search's `--data.search.max_depth`; a
            rollout may take max_depth x the task's step cap in tokens, which must fit the
            policy's context); default 8, or an environment's turn limit (its `max_turns`).
        temperature: sampling temperature (the search's).
        top_p: nucleus sampling (the search's).
        max_tokens: stop after the part of problems that brings the generated tokens to this.
        problems_per_part: the most problems measured per part (the budget is checked between parts;
            under a budget parts are sized to what it still pays for, the first is one problem).
        seed: seed of the samples and of the bootstrap.
        bootstrap: bootstrap replicates over problems.
        skip_bad_rows: skip and count malformed problem rows instead of failing.
        columns: where the problem, answer and id are in the files' rows (`fit`'s
            `--data.problems.columns.*`, docs/data.md), e.g. `--columns.problem=question`.
        device: where the policy runs: auto (CUDA when present, else the CPU), cpu, cuda or cuda:N.
        dtype: parameter dtype of the policy; auto: the device's own (bfloat16 on a CUDA device
            with bf16, else float32; flywheel.policies.device).
        out: folder of diagnose.json.
    """
    # Long: the command's steps in order (its flags checked, the policy and problems loaded, the two measurements, the report), each a few lines
    from flywheel.policies.device import placement
    from flywheel.reporting.eval_command import load_eval_policy
    from flywheel.run.preflight import PreflightError, check_folder, context_limit, prompt_fits
    from flywheel.tasks.sources import load_problems

    check_settings(policy, checkpoint, samples, resamples, fork_steps, max_depth, temperature, top_p, max_tokens,
                   problems_per_part, bootstrap, max_problems)
    device, dtype = placement(device, dtype)
    check_folder(out, "--out")
    files = [files] if isinstance(files, str) else files
    backend = generator if generator is not None else HFBackend()
    backend.flag = "--generator"  # its messages name this command's flag
    if checkpoint is not None and not Path(checkpoint).exists():
        raise PreflightError(f"--checkpoint {checkpoint}: no such file; pass a checkpoint of `flywheel fit`, "
                             "or --policy FOLDER_OR_NAME")
    model, tokenizer, _, task = load_eval_policy(checkpoint, policy, dtype, task, device)
    if max_depth is None:  # an environment's episodes run to its own turn limit
        max_depth = task.max_turns if isinstance(task, EnvironmentTask) else 8
    check = prompt_fits(tokenizer, task, context_limit(model), "--task.init_args.max_response_tokens")
    try:
        loaded = load_problems(task, files, split, skip_bad_rows=skip_bad_rows, limit=max_problems, check=check,
                               columns=columns, flags="--")
    except FileNotFoundError as err:
        raise PreflightError(f"{err}; fix the path in --files") from err
    except (ValueError, ImportError) as err:
        raise PreflightError(str(err)) from err
    check_rollout_fits(tokenizer, task, loaded.problems, max_depth, context_limit(model))
    try:
        report = measure_policy(model, tokenizer, task, backend, loaded.problems, samples=samples, resamples=resamples,
                                fork_steps=fork_steps, max_depth=max_depth, temperature=temperature, top_p=top_p,
                                max_tokens=max_tokens, problems_per_part=problems_per_part, seed=seed,
                                replicates=bootstrap)
    finally:
        backend.close()
    report = {"format": DIAGNOSE_FORMAT, "policy": policy, "checkpoint": checkpoint, "files": files,
              "split": None if files else split, "task": type(task).__name__,
              "device": str(device), "dtype": dtype,
              "first_prompt": task.prompt(loaded.problems[0]), **report}
    Path(out).mkdir(parents=True, exist_ok=True)
    atomic_write_json(Path(out) / "diagnose.json", finite_or_text(report))
    print_report(report)
    print(f"written: {Path(out) / 'diagnose.json'}")
    return report


def measure_policy(model, tokenizer, task: Task, backend: GeneratorBackend, problems, *, samples: int, resamples: int,
                   fork_steps: int, max_depth: int, temperature: float, top_p: float, max_tokens: int,
                   problems_per_part: int, seed: int, replicates: int) -> dict[str, Any]:
    """fork_gain of `model` on `problems` within `max_tokens`: the pool's line, one line per fork
    point kind, the fresh samples' line, and the recommendation (flywheel.reporting.fork_gain)."""
    from flywheel.reporting.problem_view import search_problems
    from flywheel.reporting.fork_gain import ROOT_KIND, ForkSetup, kind_line, kind_order, measure_within, recommend
    from flywheel.search.expansion import StepEnds
    from flywheel.search.config import SearchConfig
    from flywheel.tasks.grading import Grader

    config = SearchConfig(max_depth=max_depth, temperature=temperature, top_p=top_p)
    generator = backend.build(model, tokenizer)
    decode = functools.partial(tokenizer.decode, skip_special_tokens=True)
    eos = frozenset([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])
    grader = Grader(task)  # the grading guard's defaults: one pathological response cannot stall the measurement
    problems_seen = search_problems(tokenizer, task, problems, grader)  # an environment's: with its answers
    setup = ForkSetup(problems_seen, generator, config, task.step, StepEnds(task.step, decode), decode, eos, chatty=False)
    start = time.perf_counter()
    with progress_bar(len(problems), "diagnose", "problem", True, leave=True) as bar, torch.no_grad(), \
            contextlib.closing(grader):
        def progress(done: int, tokens: int) -> None:
            bar.update(done - bar.n)
            bar.set_postfix_str(f"{tokens / 1000:.0f}k of {max_tokens / 1000:.0f}k tokens, "
                                f"{tokens / max(time.perf_counter() - start, 1e-9):.0f} tok/s")

        pool, forks, root = measure_within(setup, samples=samples, resamples=resamples, max_step_forks=fork_steps,
                                           seed=seed, chunk=512, max_tokens=max_tokens,
                                           problems_per_part=problems_per_part, progress=progress)
    pool["seconds"] = time.perf_counter() - start
    pool.update({f"grading_{key}": value for key, value in grader.counts().items()})
    lines = [kind_line(k, forks[k], root, replicates, seed) for k in sorted(forks, key=kind_order)]
    fresh = kind_line(ROOT_KIND, list(root.values()), root, replicates, seed)
    fresh = {key: value for key, value in fresh.items() if not key.startswith(("root_", "gain", "kept"))}
    advice, widened = recommend(pool, forks, root, replicates=replicates, seed=seed)
    for line in lines:
        line["gain_ci_widened"] = list(widened.get(line["fork"], (float("nan"), float("nan"))))
    return {"settings": {"samples": samples, "resamples": resamples, "fork_steps": fork_steps, "max_depth": max_depth,
                         "temperature": temperature, "top_p": top_p, "max_tokens": max_tokens, "seed": seed,
                         "bootstrap": replicates},
            "pool": pool, "fork_points": lines, "fresh": fresh,
            "recommendation": {"verdict": advice.verdict, "text": advice.text, "fork_point": advice.kind,
                               "interval": list(advice.interval) if advice.interval else None}}


def finite_or_text(value: Any) -> Any:
    """`value` with every non-finite float written as text ("inf": only the forks solved; "nan":
    neither did), so that diagnose.json is strict JSON.

    >>> finite_or_text({"gain": float("inf"), "ci": [float("nan"), 1.5]})
    {'gain': 'inf', 'ci': ['nan', 1.5]}
    """
    import math

    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: finite_or_text(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_text(v) for v in value]
    return value


def print_report(report: dict[str, Any]) -> None:
    """The fork points as a table, then the one line of advice."""
    pool = report["pool"]
    print(f"{pool['problems']} problems x {report['settings']['samples']} samples: solve rate {pool['solve_rate']:.3f}, "
          f"{pool['failed']} failed samples; {pool['diagnostic_tokens']} tokens generated in {pool['seconds']:.0f} s")
    print(f"{'fork point':<12} {'failed':>7} {'kept tok':>8} {'solved/try':>10} {'solves/1k tok':>13} {'gain':>7}  "
          f"{'95% interval':<16} {'widened':<16}")
    fresh = report["fresh"]
    print(f"{'fresh':<12} {fresh['failed_samples']:>7} {0:>8} {fresh['solve_rate']:>10.3f} "
          f"{fresh['solves_per_ktok']:>13.2f} {1:>7}")
    for line in report["fork_points"]:
        ci, wide = line["gain_ci95"], line["gain_ci_widened"]
        print(f"{line['fork']:<12} {line['failed_samples']:>7} {line['kept_tokens']:>8.1f} {line['solve_rate']:>10.3f} "
              f"{line['solves_per_ktok']:>13.2f} {line['gain']:>7.2f}  [{ci[0]:.2f}, {ci[1]:.2f}]{'':<4} "
              f"[{wide[0]:.2f}, {wide[1]:.2f}]")
    print(f"recommendation: {report['recommendation']['text']}")


def check_rollout_fits(tokenizer, task: Task, problems, max_depth: int, limit: int | None) -> None:
    """A rollout asks for up to max_depth x the step cap new tokens after its prompt (as the
    search's rollouts do): refused here, naming the flag, when that exceeds the context."""
    from flywheel.reporting.problem_view import encode_prompt
    from flywheel.run.preflight import PreflightError

    if limit is None:
        return
    longest = max(len(encode_prompt(tokenizer, task, p)) for p in problems)
    room = max_depth * task.step.max_tokens
    if longest + room > limit:
        fits = (limit - longest) // task.step.max_tokens
        raise PreflightError(f"--max_depth={max_depth}: a rollout of {max_depth} steps of up to {task.step.max_tokens} "
                             f"tokens ({room}) after the longest prompt ({longest} tokens) exceeds the policy's context "
                             f"of {limit}; lower --max_depth to {fits} or less")


def check_settings(policy, checkpoint, samples, resamples, fork_steps, max_depth, temperature, top_p, max_tokens,
                   problems_per_part, bootstrap, max_problems) -> None:
    """The command's settings, in its own flags' names, before any policy loads."""
    import math

    from flywheel.run.preflight import PreflightError

    if policy is None and checkpoint is None:
        raise PreflightError("give --policy FOLDER_OR_NAME or --checkpoint FILE.ckpt (or both)")
    for flag, value in (("samples", samples), ("resamples", resamples), ("fork_steps", fork_steps),
                        ("max_depth", 1 if max_depth is None else max_depth), ("max_tokens", max_tokens), ("problems_per_part", problems_per_part),
                        ("bootstrap", bootstrap)):
        if value < 1:
            raise PreflightError(f"--{flag}={value}: must be >= 1")
    if max_problems is not None and max_problems < 1:
        raise PreflightError(f"--max_problems={max_problems}: must be >= 1, or null for every problem")
    if not 0 <= temperature < math.inf:
        raise PreflightError(f"--temperature={temperature}: must be a finite number >= 0")
    if not 0 < top_p <= 1:
        raise PreflightError(f"--top_p={top_p}: must be in (0, 1]")


def main(args: list[str]) -> dict[str, Any]:
    """`diagnose`'s command line: a fit config's task and columns as its flags
    (flywheel.run.overlays), on top of the task recorded in `--checkpoint`."""
    from flywheel.reporting.eval_command import recorded_task_flags
    from flywheel.run.command_line import function_cli
    from flywheel.run.overlays import fit_config_flags

    args = fit_config_flags(args, run_diagnose, "diagnose")
    return function_cli(run_diagnose, recorded_task_flags(args) + args, "diagnose")
