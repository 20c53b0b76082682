"""Exploration per generated token: does the tree find more solutions than flat sampling?

From ONE policy, on ONE problem set, two arms:
- tree: the search exactly as `fit` runs it with the given config(s) (search settings,
  task, generator backend, concurrency, credit rule: every switch of the config applies);
- flat: 64 independent samples per problem (the same task, step rule and sampling
  temperature), read as curves over n = 1..64 with unbiased estimators (the pass@k
  estimator for "solved with n samples", and its analogue for distinct correct answers),
  so flat needs no separate run per n.

Per arm one JSON line: generated tokens per problem, mean branching (children per expanded
non-root node, i.e. per node a generator request started from; flat chains have 1), solved fraction (at least one correct answer), distinct
correct answers per problem, terminals created per problem, trajectories trained per
problem. The last line compares the tree with flat sampling interpolated at the tree's
tokens per problem:

    RESULT tree_tokens_per_problem=... tree_solved=... flat_solved_at_equal_tokens=...
           solve_ratio=... mean_branching=... expansion=... fork_rule=... distinct_children=...

Each fork switch (`--data.search.fork_rule=entropy`, `--data.search.distinct_children=true`) is
measured by its own run; the RESULT line names the switches it ran with. The flat arm does not
depend on them, so `--flat-cache` shares one flat sample set between those runs.

With `--data.batching.flat_first=m` the tree arm is fit's "tree tokens only where flat fails"
(docs/search.md): m flat samples for every problem, then a rollout tree only for the problems
with none correct, started from those m responses (they count towards its K). It runs through
`data_modules.rollout.rollout`, the trainer's own code, so its m samples are drawn fresh, as fit
draws them: the same sampling settings as the flat arm (`flat_rollouts` with the search config:
temperature, top_p, step, max_depth) but the flat-first seed salt (`flat_first_config`), so they
are not the first m samples of `--flat-cache` (whose requests share the trees' root seed, and
hold no token ids to start a tree from). Its tokens per problem = the m samples' generated tokens
(every problem) + the trees' own (a tree's reused responses counted once); solved = solved by
the m samples or by the tree. The JSON line adds the split (`solved_by_flat_first`, `trees`,
`solved_by_tree`, `flat_first_tokens_per_problem`, `tree_own_tokens_per_problem`); branching and
expansions are the trees' only. The RESULT line names `flat_first=m` (0 without the switch).

    python tools/bench_explore.py --config conf/quickstart.yaml
    python tools/bench_explore.py --config conf/quickstart.yaml --split train --numbers 4 --limit 200
    python tools/bench_explore.py --config conf/quickstart.yaml --data.search.expansion_width=4
    python tools/bench_explore.py --config conf/quickstart.yaml --problems my_problems.jsonl

`--fork-gain` measures instead whether forking can pay at all, before any tree is run: from
failed flat samples, solves per generated token resampling from their step j / token midpoint /
highest-entropy token against fresh samples from the root (flywheel/reporting/fork_gain.py; one JSON line
per fork point kind, bootstrap SEs over problems), last line

    RESULT fork_gain=... fork_gain_se=... fork_gain_lo=... fork_gain_hi=... fork_point=...
           root_solves_per_ktok=... fork_solves_per_ktok=... gain_step1=... gain_mid=... gain_entropy=...

    python tools/bench_explore.py --config conf/quickstart.yaml --split train --numbers 4 --limit 64 --fork-gain
    python tools/bench_explore.py --config conf/deepsearch_cpu.yaml --split arith_train --limit 64 --fork-gain

`--problems` takes Countdown jsonl rows with `numbers`, `target` and an optional `id`.
Any other `--section.key=value` is passed to the config, as on the `fit` command line.
Tune on a training slice (`--split train --numbers 4`), never on the held-out split that
`tools/compare.py` evaluates on (test_hard).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Sequence
from flywheel.run.flags import StrictParser

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FLAT_SAMPLES = 64
FLAT_REPORTED = (8, 16, 32, 64)


def solved_at(n: int, total: int, correct: int) -> float:
    """P(a random n-subset of `total` samples holds a correct one) = 1 - C(total-c, n) / C(total, n).

    >>> solved_at(1, 4, 1), solved_at(4, 4, 1), solved_at(2, 4, 0)
    (0.25, 1.0, 0.0)
    """
    if total - correct < n:
        return 1.0
    return 1.0 - math.comb(total - correct, n) / math.comb(total, n)


def distinct_at(n: int, total: int, multiplicities: Sequence[int]) -> float:
    """Expected distinct correct answers in a random n-subset: each answer seen m times among
    `total` samples is in the subset with probability solved_at(n, total, m).

    >>> distinct_at(2, 4, [1, 1])  # each in a 2-subset of 4 with p = 1 - C(3,2)/C(4,2) = 1/2
    1.0
    """
    return sum(solved_at(n, total, m) for m in multiplicities)


def interpolate(x: float, xs: Sequence[float], ys: Sequence[float]) -> tuple[float, bool]:
    """y at x on the piecewise-linear curve (xs ascending); (value, False) past the curve's end
    (then the last y, an underestimate for a rising curve)."""
    if x <= xs[0]:
        return ys[0] * x / xs[0], True  # through the origin: 0 tokens solve nothing
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0), True
    return ys[-1], False


def tree_arm(results, rows_per_tree: Sequence[int]) -> dict:
    """The tree's line: counts over every node and terminal the search created. With
    `--data.batching.flat_first` some results are flat groups (mode "flat": the problems their m
    samples solved): tokens, solved, distinct answers and terminals count them too (they are
    this arm's cost and finds), the shape of the search (branching, expansions) only the trees.
    A tree that started from the m responses has its root marked expanded once for them
    (`expansions_by_depth` depth 0), though no request was made (`expansions_per_tree`)."""
    problems = len(results)
    searched = [r for r in results if r.searched]
    tokens = solved = distinct = terminals = 0
    branching: list[int] = []
    depths: dict[int, int] = {}
    for result in results:
        tree = result.tree
        tokens += result.stats.generated_tokens  # a tree's include the flat responses it started from, once
        terminals += result.stats.terminals
        answers = {tree.verdicts[t].answer for t in range(len(tree)) if tree.kind[t] == "correct"}
        solved += bool(answers)
        distinct += len(answers)
    for result in searched:
        tree = result.tree
        branching.extend(len(tree.children[v]) for v in range(1, len(tree)) if tree.expanded[v])
        for v in range(len(tree)):
            depths[tree.depth[v]] = depths.get(tree.depth[v], 0) + tree.expanded[v]
    trees = max(len(searched), 1)
    return {
        "arm": "tree",
        "tokens_per_problem": tokens / problems,
        "mean_branching": sum(branching) / len(branching) if branching else 0.0,
        "root_branching": sum(len(r.tree.children[0]) for r in searched) / trees,
        "solved": solved / problems,
        "distinct_correct_per_problem": distinct / problems,
        "terminals_per_problem": terminals / problems,
        "trained_per_problem": sum(rows_per_tree) / problems,
        "expansions_per_tree": sum(r.stats.expansions for r in searched) / trees,
        "expansions_by_depth": {d: round(n / trees, 2) for d, n in sorted(depths.items())},
        "trees_short": sum(not r.complete for r in searched),
    }


def flat_first_split(results, m: int) -> dict:
    """`--data.batching.flat_first=m`: how the arm's problems split between the m flat samples and
    the trees, and its tokens per problem as the m samples' (every problem's) + the trees' own.

    A flat group (mode "flat") is a problem its m samples solved; a tree's first m chains are
    its problem's m samples (`reused_tokens`), the rest its own rollouts."""
    problems = len(results)
    trees = [r for r in results if r.searched]
    flat_tokens = sum(r.stats.generated_tokens for r in results if not r.searched) + \
        sum(r.stats.reused_tokens for r in trees)
    return {
        "flat_first": m,
        "solved_by_flat_first": (problems - len(trees)) / problems,
        "trees": len(trees),
        "solved_by_tree": sum(any(t.verdict.correct for t in r.trajectories) for r in trees) / problems,
        "flat_first_tokens_per_problem": flat_tokens / problems,
        "tree_own_tokens_per_problem": sum(r.stats.generated_tokens - r.stats.reused_tokens for r in trees) / problems,
    }


Sample = tuple[int, bool, str]
"""One flat sample: (generated tokens, correct, answer)."""


def flat_samples(results) -> list[list[Sample]]:
    """Per problem, its flat samples in sampling order."""
    out = []
    for result in results:
        tree = result.tree
        out.append([(tree.path_length[t.terminal_id], t.kind == "correct", str(t.verdict.answer))
                    for t in result.trajectories])
    return out


def flat_curve(samples: list[list[Sample]]) -> list[dict]:
    """Flat sampling at n = 1..N from one run of N samples per problem (unbiased estimators)."""
    problems = len(samples)
    total = min(len(s) for s in samples)
    tokens_per_sample = sum(t for s in samples for t, _, _ in s) / sum(len(s) for s in samples)
    stats = []
    for s in samples:
        counts: dict[str, int] = {}
        for _, correct, answer in s:
            if correct:
                counts[answer] = counts.get(answer, 0) + 1
        stats.append((len(s), sum(counts.values()), list(counts.values())))
    return [
        {
            "arm": f"flat_n{n}",
            "tokens_per_problem": n * tokens_per_sample,
            "mean_branching": 1.0,
            "solved": sum(solved_at(n, size, c) for size, c, _ in stats) / problems,
            "distinct_correct_per_problem": sum(distinct_at(n, size, m) for size, _, m in stats) / problems,
            "terminals_per_problem": float(n),
            "trained_per_problem": float(n),
        }
        for n in range(1, total + 1)
    ]


def flat_adaptive_curve(samples: list[list[Sample]], width: int, stop_when_solved: int) -> list[dict]:
    """Flat sampling with the tree's stopping rule, as a curve over the cap K = width, 2 width, ...:
    a problem draws `width` samples at a time (in sampling order) and stops once it holds a
    correct one and at least `stop_when_solved` samples, or K samples. The fair control for
    a tree that moves budget to unsolved problems."""
    total = min(len(s) for s in samples)
    curve = []
    for cap in range(width, total + 1, width):
        tokens = solved = taken_all = 0
        for s in samples:
            taken = 0
            while taken < cap:
                taken += width
                if any(c for _, c, _ in s[:taken]) and taken >= max(stop_when_solved, 1):
                    break
            solved += any(c for _, c, _ in s[:taken])
            tokens += sum(t for t, _, _ in s[:taken])
            taken_all += taken
        curve.append({"arm": f"flat_adaptive_k{cap}", "tokens_per_problem": tokens / len(samples),
                      "mean_branching": 1.0, "solved": solved / len(samples), "trained_per_problem": taken_all / len(samples)})
    return curve


def load_problems(task, args) -> list:
    """The problem set: a jsonl file of the task's rows, or a shipped split (Countdown: optionally
    only the problems with `--numbers` numbers; chains: `--data.task.init_args.lengths=[3]`)."""
    from flywheel.tasks.base import read_split_file
    from flywheel.tasks.countdown import CountdownTask

    if args.problems is not None:
        problems = []
        for number, line in enumerate(args.problems.read_text(encoding="utf-8").splitlines(), start=1):
            if line.strip():
                row = json.loads(line)
                row.setdefault("id", f"{args.problems.name}:{number}")
                problems.append(task.problem_from_row(row, f"{args.problems}:{number}"))
    elif isinstance(task, CountdownTask):  # every problem of the file; --numbers filters
        problems = read_split_file(task, task.split_files[args.split], "countdown")
        if args.numbers is not None:
            problems = [p for p in problems if len(p.numbers) == args.numbers]
    else:  # another task's built-in split (MathTask: --split arith_train; ChainTask: --split train)
        problems = task.problems(args.split)
    if args.limit is not None:
        problems = problems[args.offset : args.offset + args.limit]
    if not problems:
        raise SystemExit("no problems to search: check --problems / --split / --numbers / --limit")
    return problems


def check_fork_flags(args) -> None:
    """The --fork-* flags, checked before the policy loads."""
    from flywheel.reporting.fork_gain import FORK_POINT

    if not FORK_POINT.fullmatch(args.fork_point):
        raise SystemExit(f"--fork-point must be best, step<j> (j >= 1), mid or entropy, got {args.fork_point!r}")
    for flag in ("fork_samples", "fork_resamples", "fork_steps", "bootstrap"):
        if getattr(args, flag) < 1:
            raise SystemExit(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")


def fork_gain_mode(args, search_problems, generator, config, task, decode, eos) -> None:
    """--fork-gain: the fork value of failed flat samples (flywheel.reporting.fork_gain), last line RESULT."""
    import torch

    from flywheel.reporting.fork_gain import ForkSetup, measure, report
    from flywheel.search.expansion import StepEnds

    # the matcher of the task's step delimiter in token ids (a BPE token may hold it)
    setup = ForkSetup(search_problems, generator, config, task.step, StepEnds(task.step, decode), decode, frozenset(eos))
    start = time.perf_counter()
    with torch.no_grad():
        pool, forks, root = measure(setup, samples=args.fork_samples, resamples=args.fork_resamples,
                                    max_step_forks=args.fork_steps, seed=args.fork_seed, chunk=512)
    pool["diagnostic_seconds"] = time.perf_counter() - start
    report(pool, forks, root, fork_point=args.fork_point, replicates=args.bootstrap, seed=args.fork_seed)


def main() -> None:
    parser = StrictParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", action="append", required=True, help="the recipe, then overlays (as for fit)")
    parser.add_argument("--problems", type=Path, help="jsonl rows of the config's task (Countdown: numbers, target, "
                        "optional id)")
    parser.add_argument("--split", default="test_hard", help="a shipped split of the task when --problems is not given")
    parser.add_argument("--numbers", type=int, help="keep only problems with this many numbers (e.g. 4 on train)")
    parser.add_argument("--limit", type=int, help="search only this many problems")
    parser.add_argument("--offset", type=int, default=0, help="skip this many problems first (with --limit)")
    parser.add_argument("--policy", help="the policy to search with (default: the config's --model.policy)")
    parser.add_argument("--skip-flat", action="store_true", help="the tree arm only (e.g. to compare tree settings)")
    parser.add_argument("--oracle", type=float, default=0.0, metavar="W",
                        help="upper bound: an exact Countdown value oracle (can the numbers left still reach the "
                             "target?) as the search's value function with weight W (search.prm_weight)")
    parser.add_argument("--flat-cache", type=Path, help="read the flat samples from this file if it exists, else "
                        "sample them and write it (same policy and problems only: the file records both)")
    parser.add_argument("--fork-gain", action="store_true", help="instead of the tree: the fork value of failed flat "
                        "samples, solves per token resampling from their steps / top-entropy token vs from the root "
                        "(flywheel.reporting.fork_gain; `python -m flywheel diagnose` runs it on any policy and problem file)")
    parser.add_argument("--fork-samples", type=int, default=8, help="--fork-gain: flat samples per problem (the pool)")
    parser.add_argument("--fork-resamples", type=int, default=4,
                        help="--fork-gain: fresh continuations per fork point, and from the root per failed sample")
    parser.add_argument("--fork-steps", type=int, default=4, help="--fork-gain: step fork points step1..stepJ")
    parser.add_argument("--fork-point", default="best", help="--fork-gain: the kind fork_gain reports (step1, step2, "
                        "..., mid, entropy) or best (the largest gain: biased up, read its interval)")
    parser.add_argument("--fork-seed", type=int, default=0, help="--fork-gain: seed of the samples and the bootstrap")
    parser.add_argument("--bootstrap", type=int, default=1000, help="--fork-gain: bootstrap replicates over problems")
    args, overrides = parser.parse_known_args()
    if args.fork_gain:
        check_fork_flags(args)

    from flywheel.objectives.credit import Group, credit_groups
    from data_modules.rollout import rollout
    from data_modules.rollout import search_problems as make_search_problems
    from flywheel.search import SearchDriver
    from flywheel.search.flat import flat_rollouts
    from tools.policy_setup import load

    setup = load(args.config, overrides, args.policy)
    module, dm, tokenizer, task, generator = setup.module, setup.dm, setup.tokenizer, setup.task, setup.generator
    decode, eos, config = setup.decode, setup.eos, setup.config
    problems = load_problems(task, args)
    search_problems = make_search_problems(tokenizer, task, problems)
    value_fn = None
    if args.oracle:
        from dataclasses import replace

        from flywheel.tasks.countdown_oracle import prompt_value

        config = replace(config, prm_weight=args.oracle)
        value_fn = lambda prefixes: [prompt_value(tokenizer.decode(p, skip_special_tokens=True)) for p in prefixes]  # noqa: E731
    elif config.selection == "puct_agents" and getattr(module, "value_head", None) is not None:
        value_fn = module.search_values  # the policy's own value head, as fit's search uses it
    print(f"{len(problems)} problems; search: {json.dumps(config.to_dict())}", file=sys.stderr, flush=True)
    if args.fork_gain:
        fork_gain_mode(args, search_problems, generator, config, task, decode, eos)
        return

    start = time.perf_counter()
    flat_first = dm.batching.flat_first
    if flat_first:  # fit's own split (data_modules/rollout.py): m flat samples each, trees where all m fail
        with __import__("torch").no_grad():
            out = rollout(problems, generator=generator, task=task, tokenizer=tokenizer, kind="search", search=config,
                          flat_samples=dm.batching.flat_samples, max_concurrent_trees=dm.batching.max_concurrent_trees,
                          credit=dm.credit, flat_first=flat_first, value_fn=value_fn if config.prm_weight > 0 else None,
                          node_values=value_fn)
        trees, rows = out.results, [len(group) for group in out.rows]
    else:
        driver = SearchDriver(generator, config, step=task.step, decode=decode,
                              max_concurrent_trees=dm.batching.max_concurrent_trees, eos_token_ids=eos, value_fn=value_fn)
        with __import__("torch").no_grad():
            trees = driver.run(search_problems)
        rows = [len(group) for group in credit_groups([Group.of(r) for r in trees], dm.credit).rows]  # what fit trains on
    tree = tree_arm(trees, rows)
    if flat_first:
        tree.update(flat_first_split(trees, flat_first))
    tree["seconds"] = time.perf_counter() - start
    print(json.dumps(tree), flush=True)
    # the fork switches the tree ran with, so each RESULT line names what its solve_ratio measures
    switches = (f"expansion={config.expansion} fork_rule={config.fork_rule} "
                f"distinct_children={str(config.distinct_children).lower()} flat_first={flat_first}")
    if args.skip_flat:
        print(f"RESULT tree_tokens_per_problem={tree['tokens_per_problem']:.1f} tree_solved={tree['solved']:.4f} "
              f"mean_branching={tree['mean_branching']:.3f} {switches}")
        return

    key = {"policy": module.hparams.get("policy"), "problems": [p.id for p in problems], "samples": FLAT_SAMPLES}
    if args.flat_cache is not None and args.flat_cache.is_file():
        cached = json.loads(args.flat_cache.read_text())
        if cached["key"] != key:
            raise SystemExit(f"{args.flat_cache} holds flat samples of another policy or problem set")
        samples, seconds = cached["samples"], cached["seconds"]
    else:
        start = time.perf_counter()
        with __import__("torch").no_grad():
            flat = flat_rollouts(search_problems, generator, n=FLAT_SAMPLES, step=task.step, decode=decode, config=config,
                                 max_concurrent_problems=max(1, dm.batching.max_concurrent_trees // 4), eos_token_ids=eos)
        samples, seconds = flat_samples(flat), time.perf_counter() - start
        if args.flat_cache is not None:
            args.flat_cache.write_text(json.dumps({"key": key, "samples": samples, "seconds": seconds}))
    curve = flat_curve(samples)
    for line in curve:
        if int(line["arm"][6:]) in FLAT_REPORTED:
            print(json.dumps({**line, "seconds": seconds}), flush=True)
    if config.stop_when_solved:
        adaptive = flat_adaptive_curve(samples, config.expansion_width, config.stop_when_solved)
        for line in adaptive:
            print(json.dumps(line), flush=True)
        adaptive_equal, _ = interpolate(tree["tokens_per_problem"], [c["tokens_per_problem"] for c in adaptive],
                                        [c["solved"] for c in adaptive])
    xs = [c["tokens_per_problem"] for c in curve]
    at_equal, inside = interpolate(tree["tokens_per_problem"], xs, [c["solved"] for c in curve])
    distinct_equal, _ = interpolate(tree["tokens_per_problem"], xs, [c["distinct_correct_per_problem"] for c in curve])
    if not inside:
        print(f"note: the tree spent more than {FLAT_SAMPLES} flat samples' tokens; flat is read at n = {FLAT_SAMPLES} "
              "(an underestimate)", file=sys.stderr)
    ratio = tree["solved"] / at_equal if at_equal else math.inf
    if tree["mean_branching"] < 2:
        verdict = "not a tree (mean branching < 2): it does not count"
    elif ratio < 1.0:
        verdict = "flat sampling explores better per token"
    elif config.stop_when_solved and tree["solved"] < adaptive_equal:
        verdict = "the tree beats fixed-n flat sampling, but flat sampling with the tree's stop rule beats the tree"
    else:
        verdict = "the tree explores better per token"
    print(f"at {tree['tokens_per_problem']:.0f} tokens per problem: tree solves {tree['solved']:.3f}, flat "
          f"{at_equal:.3f}: {verdict}; distinct correct answers per problem {tree['distinct_correct_per_problem']:.2f} "
          f"vs {distinct_equal:.2f}")
    print(f"RESULT tree_tokens_per_problem={tree['tokens_per_problem']:.1f} tree_solved={tree['solved']:.4f} "
          f"flat_solved_at_equal_tokens={at_equal:.4f} solve_ratio={ratio:.3f} mean_branching={tree['mean_branching']:.3f} "
          f"tree_distinct={tree['distinct_correct_per_problem']:.3f} flat_distinct_at_equal_tokens={distinct_equal:.3f}"
          + (f" flat_adaptive_solved_at_equal_tokens={adaptive_equal:.4f}" if config.stop_when_solved else "")
          + f" {switches}")


if __name__ == "__main__":
    main()
