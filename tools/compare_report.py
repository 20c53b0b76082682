"""tools/compare.py's tables: held-out pass@1 / pass@k per round against training tokens,
optimizer steps and fit seconds, the gains per token, step and second, and the newly solved
training problems of runs started from a plateau checkpoint P.

Newly solved (`--init` comparisons): a training problem counts when the run's own rollouts
solved it (its solved_problems.json, data_modules/solved.py) and P failed it in a screen of
every training problem with 8 flat samples (tools/headroom.py `--samples 0`, run once per seed
by compare.py into OUT/init_screen_seed<s>.json). Cumulative per round in the table; per 1M
tokens, per 100 optimizer steps and per 1000 fit seconds at each run's last evaluation.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Callable

EVAL_SAMPLES, EVAL_K = 16, 8
Newly = dict[tuple[str, int], dict[int, int]]
"""(arm, seed) -> {summary round: newly solved training problems up to that round's end}."""


def spread(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def evaluated(summary: dict) -> list[dict]:
    """The run's rounds that were evaluated (`--data.eval.every_tokens` skips some)."""
    return [r for r in summary.get("rounds", []) if r.get("eval_pass1") is not None]


def last_round(summary: dict) -> dict | None:
    rounds = evaluated(summary)
    return rounds[-1] if rounds else None


def fit_seconds(rounds: list[dict]) -> list[float | None]:
    """Per round, the run's wall seconds to its end without the held-out evaluations (search,
    training, hard-set screening, weight syncs, checkpoints: what the arm costs), summed from
    each round's wall split; None from a round without one on."""
    out, total = [], 0.0
    for r in rounds:
        split = r.get("wall_split")
        total = total + split["wall_s"] - split["eval_s"] if split is not None and total is not None else None
        out.append(total)
    return out


def newest_part(folder: Path, name: str) -> Path | None:
    """`name` in the run's newest part (version_<n>/, the highest n that holds it), or None: a
    resumed run's part carries every earlier round, so the newest is the whole run."""
    parts = sorted(folder.glob(f"version_*/{name}"), key=lambda p: int(p.parent.name.split("_")[1]))
    return parts[-1] if parts else None


def failed_under_init(screen: Path) -> frozenset[str] | None:
    """The training problems P failed (0 correct) in its screen file (tools/headroom.py --out), or
    None when there is none yet."""
    if not screen.is_file():
        return None
    return frozenset(r["id"] for r in json.loads(screen.read_text())["records"] if r["screen_correct"] == 0)


def newly_by_round(folder: Path, rounds: list[dict], failed: frozenset[str]) -> dict[int, int] | None:
    """Per summary round, the problems of `failed` the run in `folder` had solved by that round's
    end (its newest solved_problems.json, rewritten whole every round); None when it has none
    (a run from before the file existed).

    A file's rounds are the summary rows' (1-based)."""
    newest = newest_part(folder, "solved_problems.json")
    if newest is None:
        return None
    first = json.loads(newest.read_text())["problems"]
    new = [s["round"] for i, s in first.items() if i in failed]
    return {r["round"]: sum(x <= r["round"] for x in new) for r in rounds}


def observation_tokens(folder: Path) -> float | None:
    """The observation tokens an environment run prefilled for training (the sum of its epochs'
    `compute/epoch_observation_tokens` in the newest part's TensorBoard events; prefilled, never
    generated, so not in the token budget); None for a run without them (a task with no turns)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    parts = sorted(folder.glob("version_*"), key=lambda p: int(p.name.split("_")[-1]))
    by_step: dict[int, float] = {}  # a resumed part's re-run epoch replaces the interrupted one's value
    for part in parts:
        for events in part.glob("events.*"):
            accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})
            accumulator.Reload()
            if "compute/epoch_observation_tokens" in accumulator.Tags()["scalars"]:
                by_step.update({e.step: e.value for e in accumulator.Scalars("compute/epoch_observation_tokens")})
    return sum(by_step.values()) if by_step else None


def report(results: dict[str, list[tuple[int, dict]]], args: argparse.Namespace, newly: Newly | None = None) -> None:
    newly = newly or {}
    print(f"\nheld-out {args.eval_split}: pass@1 (= mean@{EVAL_SAMPLES}) and pass@{EVAL_K} against training tokens, "
          "optimizer steps and fit seconds (wall time without the held-out evaluations); new: training problems P "
          "failed that the run solved by then")
    print(f"{'arm':<18} {'seed':>4} {'round':>7} {'tokens':>10} {'steps':>6} {'fit s':>7} {'pass@1':>7} "
          f"{f'pass@{EVAL_K}':>7} {'wall s':>7} {'new':>5}")
    for arm, runs in results.items():
        for seed, summary in runs:
            print(f"{arm:<18} {seed:>4} {'base':>7} {0:>10} {0:>6} {0:>7} {summary['base_eval_pass1']:7.4f} "
                  f"{summary['base_eval_passk']:7.4f}")
            rounds, counts = summary.get("rounds", []), newly.get((arm, seed), {})
            for r, seconds in zip(rounds, fit_seconds(rounds)):
                if r.get("eval_pass1") is None:
                    continue
                label = f"{r['round']}{'*' if r.get('partial') else ''}"
                auc = f" prm_auc {r['prm_auc']:.4f}" if r.get("prm_auc") is not None else ""
                print(f"{arm:<18} {seed:>4} {label:>7} {r['generated_tokens']:>10} {cell(r.get('optimizer_steps'), 'd', 6)} "
                      f"{cell(seconds, '.0f', 7)} {r['eval_pass1']:7.4f} {r['eval_passk']:7.4f} "
                      f"{r.get('wall_seconds', 0):7.0f} {cell(counts.get(r['round']), 'd', 5)}{auc}")
    print("(* a partial round: the budget ended the run inside it; - : not recorded by that run)")
    if not newly:
        print("newly solved train problems: not reported (they need --init P, P's screen and runs that record "
              "solved_problems.json)")
    fields = []
    print(f"\nlast evaluation, mean +- sd over the seeds that have one; the pass@1 gain over each run's base per 1M "
          "tokens, per 100 optimizer steps and per 1000 fit seconds")
    for arm, runs in results.items():
        ends = [(s, last_round(s)) for _, s in runs if last_round(s) is not None]
        if not ends:
            continue
        p1, pk = [r["eval_pass1"] for _, r in ends], [r["eval_passk"] for _, r in ends]
        tokens = statistics.mean(r["generated_tokens"] for _, r in ends)
        print(f"{arm:<18} pass@1 {statistics.mean(p1):.4f} +- {spread(p1):.4f}   pass@{EVAL_K} "
              f"{statistics.mean(pk):.4f} +- {spread(pk):.4f}   {len(ends)} seed(s), {tokens:,.0f} tokens")
        out = getattr(args, "out", None)
        observed = [observation_tokens(out / f"{arm}_seed{seed}") for seed, _ in runs] if out is not None else []
        if observed and all(o is not None for o in observed):
            print(f"{'':<18} observation tokens prefilled in training {statistics.mean(observed):,.0f} a run (not in the "
                  "token budget: the environment wrote them)")
        gains = rates(ends)
        if gains:
            print(f"{'':<18} gain per 1M tokens {gains['per_mtok']:+.4f}   per 100 steps {cell(gains['per_100_steps'], '+.4f')}"
                  f"   per 1000 s {cell(gains['per_1000_s'], '+.4f')}")
        counted = [(s, r, newly[(arm, seed)][r["round"]]) for seed, s in runs if (arm, seed) in newly
                   for r in [last_round(s)] if r is not None]
        found = rates([(s, r) for s, r, _ in counted], [c for _, _, c in counted]) if len(counted) == len(ends) else {}
        if found:
            print(f"{'':<18} newly solved per 1M tokens {found['per_mtok']:.1f}   per 100 steps "
                  f"{cell(found['per_100_steps'], '.2f')}   per 1000 s {cell(found['per_1000_s'], '.2f')}")
            fields.append(f"{arm}_newly_per_mtok={found['per_mtok']:.2f}")
        fields += [f"{arm}_pass1={statistics.mean(p1):.4f}", f"{arm}_pass1_sd={spread(p1):.4f}",
                   f"{arm}_pass{EVAL_K}={statistics.mean(pk):.4f}", f"{arm}_seeds={len(ends)}"]
    bases = [s for runs in results.values() for _, s in runs if s.get("base_eval_pass1") is not None]
    if not bases:
        print("RESULT none: no run has finished")
        return
    base1 = statistics.mean(s["base_eval_pass1"] for s in bases)
    basek = statistics.mean(s["base_eval_passk"] for s in bases)
    print(f"RESULT {' '.join(fields)} base_pass1={base1:.4f} base_pass{EVAL_K}={basek:.4f} tokens={args.tokens} "
          f"seeds={len(args.seeds)}")


def rates(ends: list[tuple[dict, dict]], counts: list[float] | None = None) -> dict[str, float | None]:
    """The mean over seeds of each run's pass@1 gain (last evaluation - its base), or of its
    `counts` (newly solved problems) when given, per 1M training tokens, per 100 optimizer steps
    and per 1000 fit seconds (None where a run did not record steps or its wall split); {} when
    no run has a base evaluation."""
    runs = [(s, r, None if counts is None else counts[i]) for i, (s, r) in enumerate(ends)
            if s.get("base_eval_pass1") is not None and r["generated_tokens"]]
    if not runs:
        return {}

    def mean_per(amount: Callable[[dict, dict], float | None]) -> float | None:
        values = []
        for summary, row, count in runs:
            spent = amount(summary, row)
            if not spent:
                return None
            values.append((row["eval_pass1"] - summary["base_eval_pass1"] if count is None else count) / spent)
        return statistics.mean(values)

    def seconds(summary: dict, row: dict) -> float | None:
        rounds = summary["rounds"]
        return fit_seconds(rounds)[rounds.index(row)]

    return {"per_mtok": mean_per(lambda s, r: r["generated_tokens"] / 1e6),
            "per_100_steps": mean_per(lambda s, r: (r.get("optimizer_steps") or 0) / 100),
            "per_1000_s": mean_per(lambda s, r: (seconds(s, r) or 0) / 1000)}


def cell(value, spec: str, width: int = 0) -> str:
    return f"{'-' if value is None else format(value, spec):>{width}}"
