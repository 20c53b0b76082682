"""Tree search vs flat baselines on Countdown, chain arithmetic or Mastermind, from the same tiny policy, at
EQUAL generated-token budgets, over several seeds (the paper's efficiency claim, measured here).

`--task countdown` (default): the arms on conf/step_tree.yaml, 4-number problems, held-out
test_hard. `--task chain`: the arms on conf/chain.yaml (ChainTask with tiny-chain), held-out
test; `--task mastermind`: the arms on conf/mastermind.yaml (episodes of an environment with
tiny-mastermind; the step tree forks at turns), held-out test; e.g. the long-chain comparison of
docs/results.md ("Where trees pay"):

    python tools/compare.py --task chain --seeds 3 --tokens 3000000 --data.task.init_args.lengths=[6,7,8] \
        --model.optimizer.lr=3e-5 --arms dapo bon step_node deepsearch rollout_mb16 rollout_entropy_mb16 rest_mcts

Each arm is a real `python -m flywheel fit` run: conf/step_tree.yaml (the step tree, the
quickstart when these arms were measured) with the arm's overlays and overrides, all trained
and evaluated on the same split, each stopped by `--budget.max_tokens` (tokens generated for
training; held-out evaluation and hard-set screening are not counted). At the end of a round
once every `--eval-every-tokens` training tokens (and always at the budget) each run evaluates
the held-out split with 16 samples per problem: pass@1 (= mean@16, the seed's Countdown write-up's number) and
pass@8, read from each run's summary.json.

    python tools/compare.py --seeds 3                      # every arm, 3 seeds (CPU, hours)
    python tools/compare.py --tokens 300000 --numbers 3 --eval-split test --arms rollout dapo

Arms: that step tree (deepsearch), the same credited by Tree-GRPO's node values (step_node),
the paper's defaults (deepsearch_paper: node credit and the most confident terminal), the
rollout tree (rollout: whole rollouts forked from the steps found, subtree credit, every
trajectory trained, solved trees stop early; rollout_mb16: the same in mini-batches of 16 problems; rollout_bon: the same trees credited as
best-of-N, the correct trajectories only; rollout_entropy_mb16: forking at the highest-entropy
tokens, TreeRL's EPTree), its control that never forks below the root
(rollout_root: flat sampling under the same stopping rule and credit), the flat baselines DAPO (8 samples),
CISPO (16 samples) and best-of-N (8), and the ReST-MCTS* recipe (rest_mcts: the step
tree guided by the previous round's value model, the policy self-trained on the weighted
correct paths with a KL to the round's start; its summary also holds the value model's
held-out AUC per round, printed beside pass@k), and the seed's Countdown MCTS recipe (countdown_mcts:
agents sharing one pUCT tree, a value head, one greedy trajectory per tree, CISPO, KL). The last line is
`RESULT <arm>_pass1=mean <arm>_pass1_sd=... <arm>_pass8=... base_pass1=... base_pass8=... tokens=...`.

From a plateau (issue 32 item 3): `--init P` starts every arm from the checkpoint P of an earlier
run (its policy weights, and its AdamW moments where the optimizers match; not its counters or
data state), and the arms of the 2 x 2 {flat DAPO, rollout tree} x {all problems, hard set +
solution cache} are dapo, rollout, dapo_hard and rollout_hard (rollout_mb16 and rollout_hard_mb16: the
trees in DAPO's mini-batches of 16 problems); breadth is the BroRL control (flat,
64 samples per prompt, hard set only) and flat_first trains flat groups where 8 flat samples
solve a problem and grows trees from those 8 where none does (docs/search.md). Seeds may run as
separate processes into one --out (`--seed-list 1`, ...), read together by `--report --seeds 3`:

    python tools/compare.py --init 'runs/plateau/dapo_seed{seed}/checkpoints/last.ckpt' --seed-list 0 \\
        --tokens 2000000 --arms dapo rollout dapo_hard rollout_hard breadth flat_first --out runs/continue

Before a seed's first arm runs, every problem of the training pool is screened once under that
seed's P with 8 flat samples (tools/headroom.py, OUT/init_screen_seed<s>.json); the report then
counts each run's newly solved training problems, those P failed that the run's own rollouts
solved (its solved_problems.json), per round and per 1M tokens / 100 steps / 1000 s
(tools/compare_report.py).

A comparison is resumable and can grow: every run keeps its last.ckpt under OUT/<arm>_seed<s>/,
so running the same command again skips the finished runs and resumes an interrupted one from
its last epoch, and a larger `--tokens` (or `--seeds`) continues the finished runs from where
they stopped (the same as one longer run: a run stopped by its budget inside a round evaluated
the policy it left as a partial round, which the resumed run's whole round replaces).
`--report` prints the tables of whatever has finished, running nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from flywheel.io import atomic_write_json  # noqa: E402
from flywheel.run.flags import StrictParser  # noqa: E402
from tools.compare_report import (  # noqa: E402,F401 (fit_seconds, last_round, rates: this module's API too)
    EVAL_K, EVAL_SAMPLES, Newly, failed_under_init, fit_seconds, last_round, newest_part, newly_by_round, rates,
    report,
)

EVAL_EVERY_TOKENS = 1_000_000
"""--eval-every-tokens' default: held-out evaluations at round ends at least this many tokens apart."""

BASE = "conf/step_tree.yaml"
"""The recipe every Countdown arm modifies: the step tree that was the quickstart when these arms were
measured (the quickstart now credits the same trees by Pass@k with a KL, which would change every arm)."""
TASKS = {
    # --task: (the base recipe, its held-out split, its task settings from --numbers)
    "countdown": (BASE, "test_hard", True),
    "chain": ("conf/chain.yaml", "test", False),  # chain arithmetic with tiny-chain (docs/results.md, "Where trees pay")
    # Mastermind episodes with tiny-mastermind (docs/results.md, "Trees where the environment answers");
    # learning rates and budgets chosen with `--eval-split val`, the verdict on test
    "mastermind": ("conf/mastermind.yaml", "test", False),
    # SmolLM2-135M-Instruct from its SFT cold start (conf/smollm2_chain.yaml, docs/real-model.md): chains of
    # 2-4 operations on the chat prompt; learning rate chosen with `--eval-split val`, the verdict on test
    "smollm2_chain": ("conf/smollm2_chain.yaml", "test", False),
}
ROLLOUT = [
    "--data.search.expansion=rollout", "--data.search.trajectories_per_tree=32", "--data.search.stop_when_solved=8",
    "--data.credit.advantage=subtree",
    # A rollout tree trains ~20 trajectories per problem: mini-batches of 4 problems keep the
    # rows per optimizer step, and the steps per generated token, near DAPO's (16 x 8 samples).
    "--data.batching.mini_batch_problems=4",
]
FILTER = ["--data.hard_set.enabled=true", "--data.hard_set.rescreen=all", "--data.hard_set.screen_problems=512",
          "--data.hard_set.comparison=le"]
HARD = FILTER + ["--data.replay.enabled=true", "--data.replay.rule=paper"]
"""The hard filter + solution cache of conf/deepsearch_plateau.yaml: every round re-screens 512
training problems (Pass1@4 <= 25%: the hard set), trains on those, and replays the cached
correct solutions of the ones searched to a solution (deepsearch.md §7). Flat rollouts offer the
buffer nothing (the data module observes searches only), so dapo_hard has the filter without
the cache."""
ARMS: dict[str, tuple[list[str], list[str]]] = {
    # name: (overlay configs, overrides) on top of BASE
    "deepsearch": ([], []),  # the step tree: random terminal choice, outcome credit
    "deepsearch_paper": ([], ["--data.credit.advantage=node", "--data.search.terminal_choice=mean_nll"]),  # paper defaults
    "rollout": ([], ROLLOUT),
    # the same with mini-batches of 16 problems (DAPO's), so ~320 rows per optimizer step
    "rollout_mb16": ([], ROLLOUT + ["--data.batching.mini_batch_problems=16"]),
    # the step tree credited by Tree-GRPO's node values (the paper's rule), the terminal choice kept
    # (deepsearch_paper also takes the paper's most confident terminal)
    "step_node": ([], ["--data.credit.advantage=node"]),
    # the same step trees credited by TreeRL's subtree values: added once step_node had collapsed on
    # long chains and tools/mistake_credit.py had read its trees (node credit rewarded the wrong step in
    # ~80% of failures, subtree credit in 6-18%); its prediction written in docs/results.md first
    "step_subtree": ([], ["--data.credit.advantage=subtree"]),
    # the same trees as rejection sampling: only their correct trajectories train, each token +1
    # (best-of-N's credit; added once bon and rollout_mb16 had finished at 3M, where bon won, and run unchanged)
    "rollout_bon": ([], ROLLOUT + ["--data.batching.mini_batch_problems=16", "--data.credit.advantage=best_of_n"]),
    "rollout_root": ([], ROLLOUT + ["--data.search.fork_rule=root"]),  # the same, never forking below the root
    # rollout_mb16's control: its trees never forking below the root (flat episodes under its stopping
    # rule, credit and mini-batches of 16); added once rollout_mb16 had beaten the flat arms on Mastermind
    "rollout_root_mb16": ([], ROLLOUT + ["--data.batching.mini_batch_problems=16", "--data.search.fork_rule=root"]),
    # the rollout tree in mini-batches of 16 forking at the highest-entropy tokens of its responses
    # (TreeRL's EPTree): the fork point `flywheel diagnose` found best on long chains (issue 45)
    "rollout_entropy_mb16": ([], ROLLOUT + ["--data.batching.mini_batch_problems=16", "--data.search.fork_rule=entropy"]),
    "rollout_outcome": ([], ROLLOUT + ["--data.credit.advantage=outcome"]),  # the same trees, DAPO's credit
    "dapo": (["conf/dapo.yaml"], []),
    # GiGPO (verl-agent): flat groups, each step credited against the group's steps from the same
    # environment state (the same guesses so far) as well as by its episode: the flat competitor
    # with step credit in multi-turn RL (issue 59); std-normalized as in its paper
    "gigpo": (["conf/dapo.yaml"], ["--data.credit.advantage=gigpo", "--data.credit.normalize_std=true"]),
    "cispo": (["conf/cispo.yaml"], []),
    "bon": (["conf/best_of_n.yaml"], []),
    # ReST-MCTS*: value-guided search, the value model refitted every round, self-training
    "rest_mcts": (["conf/rest_mcts.yaml"], []),
    "countdown_mcts": (["conf/countdown_mcts.yaml"], []),  # the seed's Countdown MCTS recipe
    # Issue 32 item 3's 2 x 2 from a plateau (--init): {flat DAPO, rollout tree} x {all problems
    # (dapo, rollout), the Pass1@K hard set + the replay buffer's solution cache (below)}.
    "dapo_hard": (["conf/dapo.yaml"], HARD),
    "rollout_hard": ([], ROLLOUT + HARD),
    # the same in DAPO's mini-batches of 16 problems (added once rollout_mb16 matched DAPO from P
    # where rollout, in mini-batches of 4, collapsed)
    "rollout_hard_mb16": ([], ROLLOUT + HARD + ["--data.batching.mini_batch_problems=16"]),
    # BroRL's control: flat, 64 samples per prompt, hard set only (no solution cache). 8 problems
    # per epoch in mini-batches of 2 keep DAPO's samples per epoch (64 x 8) and rows per step (128).
    "breadth": (["conf/dapo.yaml"], ["--data.batching.flat_samples=64", "--data.batching.problems_per_epoch=8",
                                     "--data.batching.mini_batch_problems=2", *FILTER, "--data.replay.enabled=false"]),
    # Tree tokens only where flat fails (issue 32 item 4, docs/search.md): 8 flat samples per problem,
    # a rollout tree (from those 8) only for the problems with none correct. Most groups are flat
    # (8 rows), so mini-batches of 8 problems, between DAPO's 16 and the rollout tree's 4.
    "flat_first": ([], ROLLOUT + ["--data.batching.flat_first=8", "--data.batching.mini_batch_problems=8"]),
}


def run_folder(args: argparse.Namespace, arm: str, seed: int) -> Path:
    return args.out / f"{arm}_seed{seed}"


def finished(folder: Path) -> dict | None:
    """The record compare.py wrote when the run in `folder` ended (its budget and command)."""
    done = folder / "done.json"
    return json.loads(done.read_text()) if done.is_file() else None


def finished_at(folder: Path, tokens: int) -> dict | None:
    """The record of the run in `folder` when it has run to `tokens` or more, else None."""
    done = finished(folder)
    return done if done is not None and done["tokens"] >= tokens else None


def latest_summary(folder: Path) -> dict:
    """summary.json of the run's newest part (a resumed part carries every earlier round)."""
    return json.loads(newest_part(folder, "summary.json").read_text())


def init_checkpoint(args: argparse.Namespace, seed: int) -> Path | None:
    """The plateau checkpoint P seed `seed`'s arms start from (`--init`, `{seed}` filled in), or None."""
    if args.init is None:
        return None
    path = Path(args.init.format(seed=seed)).resolve()
    if not path.is_file():
        raise RuntimeError(f"--init {args.init}: {path} is not a checkpoint file (for seed {seed})")
    return path


def init_overrides(folder: Path, checkpoint: Path) -> list[str]:
    """The overrides that start a fresh run from `checkpoint`'s policy weights (exported once into
    `folder`/init_policy by tools/export_hf.py) and, where the optimizers match, its optimizer
    moments (callbacks.optimizer_from); its counters and data state are not taken."""
    policy, record = folder / "init_policy", folder / "init.json"
    started = json.loads(record.read_text())["checkpoint"] if record.is_file() else None
    if started is None and (folder / "checkpoints" / "last.ckpt").is_file():
        raise RuntimeError(f"{folder.name} ran without --init; it cannot go on from {checkpoint} (use another --out)")
    if started is not None and started != str(checkpoint):
        raise RuntimeError(f"{folder.name} started from {started}, not {checkpoint}; use another --out")
    if started is None:
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / "export.log").open("w") as fh:
            proc = subprocess.run([sys.executable, "tools/export_hf.py", str(checkpoint), str(policy)], cwd=ROOT,
                                  stdout=fh, stderr=subprocess.STDOUT)
        if proc.returncode:
            raise RuntimeError(f"exporting {checkpoint} failed (exit {proc.returncode}); see {folder / 'export.log'}")
        atomic_write_json(record, {"checkpoint": str(checkpoint)})
    return [f"--model.policy={policy}", "--trainer.callbacks+=callbacks.optimizer_from.OptimizerStateFrom",
            f"--trainer.callbacks.checkpoint={checkpoint}"]


@contextmanager
def claimed(folder: Path):
    """Hold `folder` for this process (a `running.pid` file), so that two compare.py processes
    (`--seed-list` in parallel, overlapping by mistake) never run one arm and seed at once."""
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / "running.pid"
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        pid = int(lock.read_text() or 0)  # 0: being written by the process that just made it
        if not pid or pid_alive(pid):
            raise RuntimeError(f"{folder.name} is being run by process {pid}; not started twice") from None
        lock.unlink()  # left by a process that is gone
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        pass
    return True


def run(arm: str, seed: int, args: argparse.Namespace) -> dict:
    """One arm's run at `args.tokens`: reused when it already ran that far, resumed from its
    last.ckpt when it stopped earlier (interrupted, or finished on a smaller budget)."""
    folder = run_folder(args, arm, seed)
    done = finished_at(folder, args.tokens)
    if done is not None:
        print(f"  {folder.name}: finished earlier at {done['tokens']} tokens; reused", flush=True)
        return latest_summary(folder)
    with claimed(folder):
        return fit(arm, seed, folder, args)


def fit(arm: str, seed: int, folder: Path, args: argparse.Namespace) -> dict:
    """Run (or resume) the arm's `flywheel fit` to `args.tokens`; its summary."""
    overlays, overrides = ARMS[arm]
    checkpoint = init_checkpoint(args, seed)
    cmd = [sys.executable, "-m", "flywheel", "fit", "--config", args.base]
    for overlay in overlays:
        cmd += ["--config", overlay]
    cmd += overrides
    cmd += [
        f"--trainer.logger.init_args.save_dir={args.out}",
        f"--trainer.logger.init_args.name={folder.name}",  # checkpoints: OUT/<name>/checkpoints
        "--trainer.max_epochs=100000",
        f"--budget.max_tokens={args.tokens}",
        f"--data.epochs_per_round={args.epochs_per_round}",
        f"--data.problems.eval_split={args.eval_split}",
        f"--data.eval.samples={EVAL_SAMPLES}",
        f"--data.eval.k={EVAL_K}",
        f"--data.eval.every_tokens={args.eval_every_tokens}",
        *task_overrides(args),
        f"--seed_everything={seed}",
        f"--data.seed={seed}",
        *args.extra,
        *(init_overrides(folder, checkpoint) if checkpoint is not None else []),
    ]
    if (folder / "checkpoints" / "last.ckpt").is_file():
        cmd += ["--ckpt_path", "last"]
        print(f"  {folder.name}: resuming from its last.ckpt", flush=True)
    folder.mkdir(parents=True, exist_ok=True)
    parts = len(list(folder.glob("fit-*.log")))
    log = folder / f"fit-{parts}.log"
    with log.open("w") as fh:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
    if proc.returncode:
        raise RuntimeError(f"{folder.name} failed (exit {proc.returncode}); see {log}")
    atomic_write_json(folder / "done.json", {"tokens": args.tokens, "command": cmd[1:]})
    return latest_summary(folder)


def init_screen(args: argparse.Namespace, seed: int) -> Path:
    """OUT/init_screen_seed<s>.json: every problem of the runs' training pool screened under
    the seed's P with 8 flat samples (tools/headroom.py --samples 0): the problems P fails, against
    which the report counts the runs' newly solved ones. Made once; a file of another P is refused."""
    screen = args.out / f"init_screen_seed{seed}.json"
    if args.report:
        return screen
    checkpoint = init_checkpoint(args, seed)
    if screen.is_file():
        if json.loads(screen.read_text())["policy"] != str(checkpoint):
            raise RuntimeError(f"{screen} screened another P; use another --out")
        return screen
    cmd = [sys.executable, "tools/headroom.py", "--config", args.base, "--config", "conf/dapo.yaml",
           *task_overrides(args), "--pool", "--limit", "0", "--screen", "8",
           "--samples", "0", "--seed", str(seed), "--policy", str(checkpoint), "--out", str(screen), *args.extra]
    print(f"screening the training problems under {checkpoint} (seed {seed}) ...", flush=True)
    with (args.out / f"init_screen_seed{seed}.log").open("w") as fh:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
    if proc.returncode:
        raise RuntimeError(f"screening P failed (exit {proc.returncode}); see {args.out}/init_screen_seed{seed}.log")
    return screen


def task_overrides(args: argparse.Namespace) -> list[str]:
    """The task's settings every run of the comparison gets: Countdown's number count."""
    return [f"--data.task.init_args.numbers_count={args.numbers}"] if TASKS[args.task][2] else []


def newly_solved(results: dict[str, list[tuple[int, dict]]], args: argparse.Namespace) -> Newly:
    """(arm, seed) -> newly solved problems per round, for the runs whose seed has P's screen."""
    out: Newly = {}
    for arm, runs in results.items():
        for seed, summary in runs:
            failed = failed_under_init(args.out / f"init_screen_seed{seed}.json")
            counts = None if failed is None else newly_by_round(run_folder(args, arm, seed), summary.get("rounds", []),
                                                                failed)
            if counts is not None:
                out[(arm, seed)] = counts
    return out


def main() -> None:
    parser = StrictParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=3_000_000, help="training generation budget per run")
    parser.add_argument("--task", choices=list(TASKS), default="countdown",
                        help="countdown (the arms on conf/step_tree.yaml), chain (on conf/chain.yaml: chain arithmetic "
                             "with the tiny chain policy, held-out split test) or mastermind (on conf/mastermind.yaml: "
                             "episodes of Mastermind with tiny-mastermind, held-out split test) or smollm2_chain (on "
                             "conf/smollm2_chain.yaml: SmolLM2 from its SFT folder on chains of 2-4 operations)")
    parser.add_argument("--numbers", type=int, default=4, help="Countdown numbers per problem (4 = the hard problems)")
    parser.add_argument("--eval-split", default=None,
                        help="held-out split (default: the task's: Countdown test_hard, 500 4-number hard problems; "
                             "chain test, 500 chains of 2-8 operations; mastermind test, 200 secrets)")
    parser.add_argument("--epochs-per-round", type=int, default=5, help="epochs per flywheel round")
    parser.add_argument("--eval-every-tokens", type=int, default=EVAL_EVERY_TOKENS,
                        help="held-out evaluations at round ends at least this many training tokens apart, and always "
                             "at the budget (a flat arm's round is ~0.14M tokens; 500 x 16 samples cost more than it)")
    parser.add_argument("--seeds", type=int, default=None, help="runs per arm, seeds 0 .. seeds-1 (default 1)")
    parser.add_argument("--seed-list", type=int, nargs="+", default=None, metavar="SEED",
                        help="run these seeds only (e.g. --seed-list 1 2): seeds as separate processes side by side, "
                             "each into the same --out (folders are per arm and seed, and a folder another process is "
                             "running is never started twice); --report --seeds N then reads them all")
    parser.add_argument("--init", default=None, metavar="P",
                        help="start every run from P, a `flywheel fit` .ckpt (`{seed}` in P is the run's seed: "
                             "'runs/plateau/dapo_seed{seed}/checkpoints/last.ckpt') as a fresh run: P's policy weights "
                             "(exported into the run's init_policy/ by tools/export_hf.py) and, where the arm's optimizer "
                             "has P's parameters (not with a value head or LoRA; else weights only, as its log says), "
                             "P's AdamW moments (callbacks/optimizer_from.py); new step counters, learning-rate "
                             "schedule, hard set, replay buffer and problem cursor; --tokens counts from 0")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "compare")
    parser.add_argument("--arms", "--methods", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--report", action="store_true", help="print the tables of the runs found in --out; run nothing")
    # Any other --key=value is passed to every run, e.g. --data.hard_set.enabled=false.
    args, args.extra = parser.parse_known_args()
    if args.seeds is not None and args.seed_list is not None:
        parser.error("Can't provide both `--seeds` and `--seed-list`. Choose one.")
    if args.init is not None and any(e.startswith("--model.policy") for e in args.extra):
        parser.error("Can't provide both `--init` and `--model.policy`: --init sets the policy to P's. Choose one.")
    args.seeds = args.seed_list or list(range(args.seeds if args.seeds is not None else 1))
    args.base, default_split, _ = TASKS[args.task]
    args.eval_split = args.eval_split or default_split
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)

    results: dict[str, list[tuple[int, dict]]] = {}
    failed = []
    for seed in args.seeds:  # seed-major: a stopped comparison still has every arm
        if args.init is not None:
            try:
                init_screen(args, seed)
            except RuntimeError as err:  # the arms still run; their newly solved counts are left out
                print(f"  {err}", flush=True)
        for arm in args.arms:
            folder = run_folder(args, arm, seed)
            if args.report:
                if finished_at(folder, args.tokens) is not None:
                    results.setdefault(arm, []).append((seed, latest_summary(folder)))
                elif list(folder.glob("version_*/summary.json")):
                    print(f"{folder.name}: not finished at {args.tokens} tokens; left out (run without --report to go on)")
                continue
            print(f"running {arm} seed {seed} ...", flush=True)
            try:
                results.setdefault(arm, []).append((seed, run(arm, seed, args)))
            except RuntimeError as err:  # the other arms still run; the failure is listed at the end
                print(f"  {err}", flush=True)
                failed.append(folder.name)
    report(results, args, newly_solved(results, args))
    if failed:
        raise SystemExit(f"failed runs: {', '.join(failed)} (their logs are in their folders)")


if __name__ == "__main__":
    main()
