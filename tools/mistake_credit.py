"""What each credit rule says about the step that went wrong: read from a run's saved trees.

A chain's failed response usually holds one wrong line (tools/chain_failures.py); a lost
Mastermind episode holds a first bad guess (a line that is not a code, or one the feedback had
ruled out). A credit rule that is to teach the policy WHICH step was wrong must give that step a
negative advantage. This tool reads the trees a `flywheel fit` run saved (the newest
RUN/version_*/trees/epoch_*.jsonl), finds in each failed trajectory its first wrong step
(`--task chain`: the step holding the first wrong line, flywheel.tasks.chain_data.line_errors
against the training chain; `--task mastermind`: the first bad guess,
flywheel.tasks.mastermind_data.first_mistake against the secret), and feeds every tree's
trajectories to the library's own credit rules (flywheel.objectives.credit.RULES), so the
numbers are the ones a run with that rule would have trained on for the same trees:

    python tools/mistake_credit.py runs/chain_long/step_node_seed0 --rules node outcome subtree
    python tools/mistake_credit.py runs/mastermind/deepsearch_seed0 --task mastermind

Per run and rule: the mean advantage of the mistake step, the share of mistake steps with a
positive advantage (the rule REWARDS the mistake), and the mean advantage of the correct steps
before it. Last line: `RESULT <run>_<rule>_mistake_positive=... ...`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from flywheel.objectives.credit import RULES, Credit, Scored
from flywheel.reporting.viewer import trees_folder
from flywheel.run.preflight import PreflightError
from flywheel.tasks.chain import ChainTask
from flywheel.tasks.chain_data import line_errors
from flywheel.tasks.mastermind import MastermindTask
from flywheel.tasks.mastermind_data import first_mistake
from flywheel.run.flags import StrictParser

SHAPE_RULES = ("node", "outcome", "subtree")
"""The rules that credit a tree's shape (best_of_n drops failed responses; self_training needs a value model)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = StrictParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="`flywheel fit` run folders of the chain task (RUN/version_0/trees)")
    parser.add_argument("--rules", nargs="+", choices=SHAPE_RULES, default=list(SHAPE_RULES))
    parser.add_argument("--split", default="train", help="the built-in split the runs trained on")
    parser.add_argument("--task", choices=sorted(FIRST_WRONG), default="chain", help="the task the runs trained on")
    return parser.parse_args(argv)


def scored(tree: dict) -> list[Scored]:
    """A saved tree's trajectories as the credit rules read them (credit.py's `_tree_rows`)."""
    nodes = {n["id"]: n for n in tree["nodes"]}
    out = []
    for t in tree["trajectories"]:
        steps = [nodes[i] for i in t["node_ids"]]
        q = [n["q_soft"] if n["q_soft"] is not None else n["q"] for n in steps]
        q[-1] = t["reward"]  # a terminal's q~ is its reward
        out.append(Scored(tuple(v + t["overlong_penalty"] for v in q), tuple(t["node_ids"]), t["final_score"],
                          t["reward"] > 0))
    return out


def chain_first_wrong(split: str):
    """(the saved tree, a failed trajectory) -> the 1-based step holding its first wrong line, or None."""
    chains = {p.id: p for p in ChainTask().problems(split)}

    def first_wrong(tree: dict, trajectory: dict) -> int | None:
        chain = chains[tree["problem_id"]]
        return line_errors(chain.start, chain.ops, trajectory["response_text"]).first_wrong
    return first_wrong


def mastermind_first_wrong(split: str):
    """(the saved tree, a failed trajectory) -> the turn of its first bad guess, or None."""
    task = MastermindTask()
    secrets = {p.id: p for p in task.problems(split)}

    def first_wrong(tree: dict, trajectory: dict) -> int | None:
        nodes = {n["id"]: n for n in tree["nodes"]}
        return first_mistake(task, secrets[tree["problem_id"]], [nodes[i]["text"] for i in trajectory["node_ids"]])
    return first_wrong


FIRST_WRONG = {"chain": chain_first_wrong, "mastermind": mastermind_first_wrong}
"""--task -> (split -> the function that finds a failed trajectory's first wrong step)."""


def measure(run: Path, rules: list[str], first_wrong) -> dict[str, dict[str, float]]:
    try:
        files = sorted(trees_folder(run).glob("epoch_*.jsonl"))  # as `flywheel tree` finds them
    except PreflightError as err:
        raise SystemExit(str(err)) from None
    mistakes = {rule: [] for rule in rules}
    before = {rule: [] for rule in rules}
    for path in files:
        for line in path.read_text().splitlines():
            tree = json.loads(line)
            if not tree.get("trajectories"):
                continue
            group = scored(tree)
            credits = {rule: RULES[rule](group, Credit(advantage=rule)) for rule in rules}
            for k, t in enumerate(tree["trajectories"]):
                if t["reward"] > 0:
                    continue
                wrong = first_wrong(tree, t)
                if wrong is None or wrong > len(t["node_ids"]):
                    continue  # no wrong step (e.g. a missing answer) or one past the last step
                for rule in rules:
                    mistakes[rule].append(credits[rule][k][wrong - 1])
                    before[rule].extend(credits[rule][k][: wrong - 1])
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
    return {rule: {"mistakes": len(mistakes[rule]), "mistake_mean": mean(mistakes[rule]),
                   "mistake_positive": mean([float(a > 0) for a in mistakes[rule]]),
                   "before_mean": mean(before[rule])} for rule in rules}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    first_wrong = FIRST_WRONG[args.task](args.split)
    print(f"{'run':28} {'rule':8} {'mistakes':>8} {'A(mistake)':>10} {'A>0 share':>9} {'A(steps before)':>15}")
    result = []
    for run in map(Path, args.runs):
        for rule, m in measure(run, args.rules, first_wrong).items():
            print(f"{run.name:28} {rule:8} {m['mistakes']:8d} {m['mistake_mean']:+10.3f} {m['mistake_positive']:9.3f} "
                  f"{m['before_mean']:+15.3f}", flush=True)
            result.append(f"{run.name}_{rule}_mistake_positive={m['mistake_positive']:.3f}")
    print("RESULT " + " ".join(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
