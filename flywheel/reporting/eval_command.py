"""`python -m flywheel eval`: pass@k and mean@n of a policy on held-out problem files.

    python -m flywheel eval --checkpoint runs/quickstart/checkpoints/last.ckpt --split test
    python -m flywheel eval --policy path/to/hf_folder --files [a.jsonl,b.parquet] --samples 16 --k [1,4,16]

The policy comes from a Lightning checkpoint of `flywheel fit` (its policy weights on top of
the architecture named in its hyperparameters) or from a Hugging Face folder. Every problem
gets `samples` responses; pass@k uses the unbiased estimator, mean@n is the mean accuracy
of the n samples (the same number as pass@1, reported under both names). Results go to
`<out>/eval.json` and to TensorBoard events in `<out>`.

Under `torchrun --nproc_per_node N` each rank evaluates every N-th problem and rank 0 merges
the per-problem counts: every problem is counted exactly once, with no padded duplicates,
so the result equals the single-process one.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Sequence

import torch

from flywheel.reporting.evaluation import EvalConfig, EvalResult, check_sampling, evaluate_sharded, shard
from flywheel.reporting.sample_bar import sample_bar
from flywheel.generation.backends import GeneratorBackend, HFBackend
from flywheel.io import atomic_write_json
from flywheel.run.settings import SETTINGS_KEY
from flywheel.tasks import Task
from flywheel.tasks.columns import Columns
from flywheel.tasks.grading import Grader, GradingConfig

log = logging.getLogger("flywheel.eval")

EVAL_FORMAT = "flywheel.eval/v1"


def load_checkpoint_policy(checkpoint: str, policy: str | None = None, dtype: str = "float32",
                           task: Task | None = None):
    """(model, tokenizer, global_step) from a `flywheel fit` checkpoint file.

    The architecture and tokenizer come from the policy the checkpoint's run was started from
    (its `hyper_parameters`); `policy` must name the same one, or the recorded folder must be
    gone (then `policy` is where it is now). `task` must be of the class the run trained on
    (its settings in the checkpoint), when they name one."""
    from flywheel.run.checkpoint import read_checkpoint

    ckpt = read_checkpoint(checkpoint, "--checkpoint")
    if task is not None:
        check_task(ckpt.get(SETTINGS_KEY) or {}, task, checkpoint)
    return checkpoint_policy(ckpt, checkpoint, policy, dtype)


def checkpoint_policy(ckpt: dict[str, Any], checkpoint: str, policy: str | None, dtype: str):
    """(model, tokenizer, global_step) of the read checkpoint `ckpt` (load_checkpoint_policy)."""
    from flywheel.policies.load import LoraSettings, add_lora, merged
    from flywheel.policies.check import load_checked_policy
    from flywheel.run.preflight import check_policy

    recorded = (ckpt.get("hyper_parameters") or {}).get("policy")
    check_policy(recorded, policy, checkpoint, "--policy", ", or leave --policy out to use the checkpoint's own")
    source = policy or recorded
    if source is None:
        raise ValueError(f"{checkpoint} names no policy in its hyper_parameters; pass --policy FOLDER_OR_NAME")
    model, tokenizer = load_checked_policy(source, dtype, "--policy" if policy else f"{checkpoint}'s policy", "--dtype")
    weights = {k.removeprefix("policy."): v for k, v in ckpt["state_dict"].items() if k.startswith("policy.")}
    if not weights:
        raise ValueError(f"{checkpoint} holds no policy.* weights; is it a `flywheel fit` checkpoint?")
    if any("lora_" in k for k in weights):  # trained with --model.lora: rebuild the adapters, then fold them in
        lora = (ckpt.get("hyper_parameters") or {}).get("lora")
        lora = LoraSettings(**lora) if isinstance(lora, dict) else lora
        if not isinstance(lora, LoraSettings) or not lora.rank:
            raise ValueError(f"{checkpoint} holds LoRA weights but its hyper_parameters name no lora settings")
        model = add_lora(model, lora)
    model.load_state_dict(weights)
    return merged(model).eval(), tokenizer, int(ckpt.get("global_step", 0))


def check_task(settings: dict[str, Any], task: Task, checkpoint: str) -> None:
    """Refuse to evaluate a checkpoint with another task than the one its run trained on (the
    prompts and the verifier would be another task's: the scores mean nothing, or a prompt
    overflows the context). `settings`: the run's flattened settings stored in the checkpoint."""
    from flywheel.run.errors import PreflightError

    recorded = settings.get("--data.task.class_path")
    given = f"{type(task).__module__}.{type(task).__qualname__}"
    if isinstance(recorded, str) and recorded != given and named_class(recorded) is not type(task):
        raise PreflightError(
            f"--task {given}: {checkpoint} was trained on {recorded}; leave --task (and a --config that sets "
            f"data.task) out to evaluate it with the task recorded in it (--task {recorded} with its run's settings), "
            f"or pass a checkpoint of a "
            f"{type(task).__name__} run")


def named_class(path: str) -> type | None:
    """The class a dotted `path` names (`flywheel.tasks.MathTask` is `flywheel.tasks.math.MathTask`), or None."""
    import importlib

    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None


def recorded_task_config(settings: dict[str, Any]) -> dict[str, Any] | None:
    """{"class_path", "init_args"} of the task a run trained on, from its flattened settings
    stored in a checkpoint (flywheel.run.settings); None when they name none (an older checkpoint)."""
    class_path = settings.get("--data.task.class_path")
    if not isinstance(class_path, str):
        return None
    init_args: dict[str, Any] = {}
    prefix = "--data.task.init_args."
    for key, value in settings.items():
        if key.startswith(prefix):  # flattened: a dict-valued argument's keys are dotted on
            *parents, last = key.removeprefix(prefix).split(".")
            place = init_args
            for parent in parents:
                place = place.setdefault(parent, {})
            place[last] = value
    return {"class_path": class_path, "init_args": init_args}


def recorded_task_flags(args: list[str]) -> list[str]:
    """With `--checkpoint FILE` among `args`: the task its run trained on as one `--task` flag,
    to put before `args`, so that --task.init_args.*, a fit overlay (--config) and --task
    itself layer on it as they do on a recipe's task in `fit`; [] without a checkpoint, or for
    one that records no task."""
    import json

    from flywheel.run.checkpoint import read_checkpoint

    named = [a.split("=", 1)[1] for a in args if a.startswith("--checkpoint=")]
    named += [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--checkpoint"]
    if not named or not Path(named[-1]).is_file():
        return []  # the command says what is wrong with the flag
    settings = read_checkpoint(named[-1], "--checkpoint", mmap=True).get(SETTINGS_KEY) or {}
    config = recorded_task_config(settings)
    return [f"--task={json.dumps(config)}"] if config is not None else []


def build_task(config: dict[str, Any], checkpoint: str) -> Task:
    """The Task of a {"class_path", "init_args"} `config`, built as `fit` builds it (jsonargparse)."""
    from jsonargparse import ArgumentParser

    from flywheel.run.errors import PreflightError

    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--task", type=Task)
    instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes  # renamed in jsonargparse 4.49
    try:
        return instantiate(parser.parse_object({"task": config})).task
    except (ValueError, TypeError, ImportError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise PreflightError(f"{checkpoint} was trained on {config['class_path']}, which cannot be built here "
                             f"({first}); pass --task") from None


def checkpoint_task(settings: dict[str, Any], task: Task | None, checkpoint: str) -> Task:
    """The task to evaluate `checkpoint` with: `task` (None: the one its run trained on, else
    Countdown for a checkpoint that records none). Another task class than the recorded one is
    refused (check_task); the recorded class with other settings is a warning naming each; the
    task used is said in one log line."""
    from flywheel.tasks.countdown import CountdownTask

    if task is not None:
        check_task(settings, task, checkpoint)
    config = recorded_task_config(settings)
    if config is None:
        task = task if task is not None else CountdownTask()
        log.info("%s records no task (written before runs recorded their settings); using %s", checkpoint,
                 type(task).__name__)
        return task
    recorded = build_task(config, checkpoint)
    if task is None or task_settings(task) == task_settings(recorded):
        shown = {k: v for k, v in config["init_args"].items() if v != default_argument(type(recorded), k)}
        log.info("evaluating with the task recorded in %s: %s(%s)", checkpoint, type(recorded).__name__,
                 ", ".join(f"{k}={v!r}" for k, v in shown.items()))
        return recorded
    differ = sorted(k for k in task_settings(task).keys() | task_settings(recorded).keys()
                    if task_settings(task).get(k) != task_settings(recorded).get(k))
    log.warning("the task given differs from the one %s was trained with: %s; the scores are of the task as "
                "given (leave --task and the --config overlays out to evaluate with the recorded one)", checkpoint,
                "; ".join(f"{k} {task_settings(recorded).get(k)!r} -> {task_settings(task).get(k)!r}" for k in differ))
    return task


def task_settings(task: Task) -> dict[str, Any]:
    """What a task was built with, read back from its public attributes."""
    return {k: v for k, v in vars(task).items() if not k.startswith("_")}


def default_argument(cls: type, name: str) -> Any:
    """The default of `cls`'s constructor argument `name` (a sentinel where it has none)."""
    import inspect

    parameter = inspect.signature(cls).parameters.get(name)
    return parameter.default if parameter is not None else inspect.Parameter.empty


def metrics(result: EvalResult, ks: Sequence[int]) -> dict[str, float]:
    n = min(result.samples) if result.samples else 0
    out = {f"pass@{k}": result.pass_at(k) for k in ks}
    out[f"mean@{n}"] = result.pass_at(1)
    return out


def _distributed() -> tuple[int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank() if world > 1 else 0
    return rank, world


def run_eval(
    checkpoint: str | None = None,
    policy: str | None = None,
    files: list[str] | str | None = None,
    split: str | None = None,
    task: Task | None = None,
    generator: GeneratorBackend | None = None,
    samples: int = 8,
    k: list[int] | None = None,
    temperature: float = EvalConfig.temperature,
    top_p: float = EvalConfig.top_p,
    seed: int = EvalConfig.seed,
    max_problems: int | None = None,
    skip_bad_rows: bool = False,
    columns: Columns = Columns(),
    problems_per_batch: int = EvalConfig.problems_per_batch,
    device: str = "auto",
    dtype: str = "auto",
    grading: GradingConfig = GradingConfig(),
    out: str = "runs/eval",
) -> dict[str, Any]:
    """Evaluate a policy on held-out problems: unbiased pass@k and mean@n per problem file.

    The sampling settings are `fit`'s `--data.eval.*` (flywheel.reporting.evaluation.EvalConfig, whose
    defaults these are), except that several k can be reported and `samples` defaults to 8.

    Args:
        checkpoint: a `flywheel fit` checkpoint (.ckpt); its policy weights are evaluated.
        policy: a Hugging Face model folder or a built-in policy name; with `checkpoint`, it
            must be the policy the checkpoint was trained from (refused otherwise: same-shaped
            weights would load silently into another model), unless the recorded folder moved.
        files: held-out problem files (jsonl/parquet with `problem` and `answer`),
            `Dataset.save_to_disk` folders or `hf://` datasets (docs/data.md), `[a.jsonl,b.parquet]`
            or one path; each is reported on its own.
        split: a built-in split of the task (used when no files are given; default "test").
        task: the task that prompts and grades. Default: with `checkpoint`, the task its run
            trained on (its class and settings, recorded in the checkpoint), on which
            `--task.init_args.*` and a fit overlay (`--config conf/data/gsm8k.yaml`) layer as on
            a recipe's; another task class is refused. Without: Countdown.
        generator: the sampling backend (default: in-process transformers).
        samples: responses per problem (the n of pass@k and mean@n).
        k: the k values of pass@k (default: 1 and `samples`).
        temperature: sampling temperature.
        top_p: nucleus sampling.
        seed: sampling seed; request seeds depend on (seed, problem id) only.
        max_problems: evaluate the first this many problems of each source.
        skip_bad_rows: skip and count malformed problem rows instead of failing.
        columns: where the problem, answer and id are in the files' rows (`fit`'s
            `--data.problems.columns.*`, docs/data.md), e.g. `--columns.problem=question`.
        problems_per_batch: problems per generator call.
        device: where the policy runs: auto (CUDA when present, else the CPU), cpu, cuda or cuda:N.
        dtype: parameter dtype of the evaluated policy; auto: the device's own (bfloat16 on a
            CUDA device with bf16, else float32; flywheel.policies.device).
        grading: the grading guard (flywheel.tasks.grading, `fit`'s `--data.grading.*`): a
            verdict over `timeout_s` of CPU, one asleep past `backstop_s`, or one that fails, is
            graded wrong and counted
            (grading_timeouts, grading_errors in eval.json).
        out: folder of eval.json and the TensorBoard events.
    """
    from flywheel.policies.device import placement
    from flywheel.run.preflight import PreflightError, check_folder

    # 1. Every setting, the checkpoint's existence and the output folder, before anything loads.
    if checkpoint is None and policy is None:
        raise PreflightError("give --checkpoint FILE.ckpt or --policy FOLDER_OR_NAME (or both)")
    ks = sorted(set(k or [1, samples]))
    check_eval_settings(samples, ks, temperature, top_p, max_problems, problems_per_batch)
    device, dtype = placement(device, dtype)
    check_policy_flags(checkpoint)
    config = EvalConfig(samples=samples, k=max(ks), temperature=temperature, top_p=top_p, seed=seed,
                        problems_per_batch=problems_per_batch)
    sources = eval_sources(files, split)
    check_folder(out, "--out")
    # 2. The policy, then every source read and every prompt checked against its context.
    model, tokenizer, step, task = load_eval_policy(checkpoint, policy, dtype, task, device)
    loaded = load_sources(sources, task, tokenizer, model, split or "test", skip_bad_rows, max_problems, columns)
    # 3. Sample and grade every source; rank 0 writes the report.
    rank, world = _distributed()
    report: dict[str, Any] = {
        "format": EVAL_FORMAT, "checkpoint": checkpoint, "policy": policy, "global_step": step,
        "task": f"{type(task).__module__}.{type(task).__qualname__}", "device": str(device), "dtype": dtype,
        "samples": samples, "k": ks, "temperature": temperature, "top_p": top_p, "seed": seed, "world_size": world, "results": {},
    }
    backend = generator if generator is not None else HFBackend()
    backend.flag = "--generator"  # its messages name this command's flag
    grader = Grader(task, grading)
    try:
        sampler = backend.build(model, tokenizer)
        for name, source in loaded.items():
            report["results"][name] = evaluate_source(sampler, tokenizer, task, source, config, ks, grader, name, rank, world)
    finally:
        grader.close()
        backend.close()
    if rank == 0:
        write_report(report, Path(out))
    return report


def check_policy_flags(checkpoint: str | None) -> None:
    """--checkpoint, when given, is a file."""
    from flywheel.run.preflight import PreflightError

    if checkpoint is not None and not Path(checkpoint).exists():
        raise PreflightError(f"--checkpoint {checkpoint}: no such file; pass a checkpoint of `flywheel fit` "
                             "(e.g. runs/quickstart/checkpoints/last.ckpt), or --policy FOLDER_OR_NAME")


def eval_sources(files: list[str] | str | None, split: str | None) -> dict[str, list[str] | None]:
    """The sources by report name: each problem file by its name stem (one path is a list of one),
    or without files the task's built-in split (None: "test")."""
    from flywheel.run.preflight import PreflightError

    files = [files] if isinstance(files, str) else files
    sources = {Path(f).stem: [f] for f in files} if files else {split or "test": None}
    if files and len(sources) != len(files):
        raise PreflightError(f"--files: two problem files share a name stem: {files}; rename one")
    return sources


def load_eval_policy(checkpoint: str | None, policy: str | None, dtype: str, task: Task | None,
                     device: torch.device) -> tuple[Any, Any, int, Task]:
    """(model in eval mode on `device`, tokenizer, global_step, task): a checkpoint's policy and
    the task to evaluate it with (checkpoint_task), or a policy folder or name at step 0 and
    `task` (default Countdown); with a warning when a chat task meets a tokenizer without a
    chat template."""
    from flywheel.policies.check import chat_template_warning, load_checked_policy
    from flywheel.run.checkpoint import read_checkpoint
    from flywheel.tasks.countdown import CountdownTask

    if checkpoint is not None:
        ckpt = read_checkpoint(checkpoint, "--checkpoint")
        task = checkpoint_task(ckpt.get(SETTINGS_KEY) or {}, task, checkpoint)  # before the policy loads
        model, tokenizer, step = checkpoint_policy(ckpt, checkpoint, policy, dtype)
    else:
        task = task if task is not None else CountdownTask()
        model, tokenizer = load_checked_policy(policy, dtype, "--policy", "--dtype")
        model.eval()
        step = 0
    model.to(device)
    if policy is not None and (warning := chat_template_warning(task, tokenizer, policy, "--task.init_args.chat_template")):
        log.warning(warning)
    return model, tokenizer, step, task


def load_sources(sources: dict[str, list[str] | None], task: Task, tokenizer: Any, model: Any, split: str,
                 skip_bad_rows: bool, max_problems: int | None, columns: Columns) -> dict[str, Any]:
    """Every source's problems (a file, or the task's built-in `split` for None), each prompt checked
    to fit the policy's context, before any sampling; a bad source is a PreflightError naming it."""
    from flywheel.run.preflight import PreflightError, context_limit, prompt_fits
    from flywheel.tasks.sources import load_problems

    check = prompt_fits(tokenizer, task, context_limit(model), "--task.init_args.max_response_tokens")
    loaded = {}
    for name, source in sources.items():
        try:
            loaded[name] = load_problems(task, source, split, skip_bad_rows=skip_bad_rows, limit=max_problems,
                                         check=check, columns=columns, flags="--")
        except FileNotFoundError as err:
            raise PreflightError(f"{err}; fix the path in --files") from err
        except (ValueError, ImportError) as err:
            raise PreflightError(str(err)) from err
    return loaded


def evaluate_source(generator: Any, tokenizer: Any, task: Task, loaded: Any, config: EvalConfig, ks: Sequence[int],
                    grader: Grader, name: str, rank: int, world: int) -> dict[str, Any]:
    """One source's report: pass@k and mean@n, tokens, this rank's grading counts and sampling
    time, and every problem's counts (each rank samples its shard; the counts are every rank's)."""
    problems = loaded.problems
    seconds, graded = generator.stats.seconds, grader.counts()
    with sample_bar(generator, len(shard(problems, rank, world)), config.samples, f"eval {name}", show=rank == 0) as advance:
        with torch.no_grad():
            result = evaluate_sharded(generator, tokenizer, task, problems, config, progress=advance, grader=grader)
    scores = metrics(result, ks)
    if rank == 0:
        log.info("%s: %s on %d problems", name, ", ".join(f"{m} {v:.4f}" for m, v in scores.items()), len(problems))
    return {
        "problems": len(problems), "skipped_rows": loaded.skipped, **scores,
        "generated_tokens": result.generated_tokens,
        **{f"grading_{key}": value - graded[key] for key, value in grader.counts().items()},  # this rank's
        "generation_seconds": round(generator.stats.seconds - seconds, 3),  # this rank's sampling time
        "per_problem": [{"id": i, "n": n, "correct": c} for i, n, c in zip(result.problem_ids, result.samples, result.correct)],
    }


def check_eval_settings(samples: int, ks: Sequence[int], temperature: float, top_p: float, max_problems: int | None,
                        problems_per_batch: int) -> None:
    """The eval command's settings, in its own flags' names."""
    from flywheel.run.preflight import PreflightError

    try:
        check_sampling(samples, temperature, top_p, problems_per_batch, "--")
    except ValueError as err:
        raise PreflightError(str(err)) from None
    bad = [k for k in ks if not 1 <= k <= samples]
    if bad:
        raise PreflightError(f"--k={list(ks)}: every k must be between 1 and --samples={samples}; "
                             f"e.g. --samples {max(bad)} to report pass@{max(bad)}")
    if max_problems is not None and max_problems < 1:
        raise PreflightError(f"--max_problems={max_problems}: must be >= 1, or left out to evaluate every problem")


def write_report(report: dict[str, Any], out: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "eval.json", report)
    writer = SummaryWriter(str(out))
    try:
        for name, result in report["results"].items():
            for metric, value in result.items():
                if metric.startswith(("pass@", "mean@")):
                    writer.add_scalar(f"eval/{name}/{metric}", value, report["global_step"])
    finally:
        writer.close()
    rows = [f"{'source':<16} {'problems':>8} " + " ".join(f"{m:>8}" for m in _metric_names(report))]
    for name, result in report["results"].items():
        rows.append(f"{name:<16} {result['problems']:>8} " + " ".join(f"{result[m]:8.4f}" for m in _metric_names(report)))
    print("\n".join(rows))
    print(f"written: {out / 'eval.json'} (TensorBoard events beside it)")


def _metric_names(report: dict[str, Any]) -> list[str]:
    first = next(iter(report["results"].values()))
    return [m for m in first if m.startswith(("pass@", "mean@"))]


def main(args: list[str]) -> dict[str, Any]:
    """`eval`'s command line: a fit config's task, columns and grading as eval's flags
    (flywheel.run.overlays), on top of the task recorded in `--checkpoint`."""
    from flywheel.run.command_line import function_cli
    from flywheel.run.overlays import fit_config_flags

    args = fit_config_flags(args, run_eval, "eval")
    return function_cli(run_eval, recorded_task_flags(args) + args, "eval")
