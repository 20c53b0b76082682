"""Does the self-rewarding value model make the search find correct answers with fewer tokens?

1. Search `--train-problems` training problems with the tiny policy and fit a value model
   (a copy of the policy with a scalar head) to the ReST-MCTS* targets of those trees.
2. Search the same held-out problems twice at the SAME tree budget (expansion width,
   K, cap on expansions): without the value model, and with it in the selection scores
   (`--prm-weight`). Same seeds, same generator.
3. Print per arm: problems solved (a correct trajectory found), mean generated tokens until
   the first correct terminal (solved trees), generated tokens per solved problem, and the
   value model's AUC on the held-out trees' nodes.

    python tools/bench_prm.py                        # 4-number hard problems (test_hard)
    python tools/bench_prm.py --numbers 3 --split test

Last line: RESULT tokens_to_first_correct_plain=... tokens_to_first_correct_prm=...
solved_plain=... solved_prm=... tokens_per_solved_plain=... tokens_per_solved_prm=... auc=...
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flywheel.reporting.problem_view import encode_prompt  # noqa: E402
from flywheel.generation.hf import HFGenerator  # noqa: E402
from flywheel.policies.load import load_policy  # noqa: E402
from flywheel.prm.model import PRMTrainConfig, ValueModel, auc, fit_value_model  # noqa: E402
from flywheel.prm.targets import tree_samples  # noqa: E402
from flywheel.search import SearchConfig, SearchDriver, SearchProblem  # noqa: E402
from flywheel.tasks.countdown import CountdownTask  # noqa: E402
from flywheel.run.flags import StrictParser  # noqa: E402


def main() -> None:
    parser = StrictParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--numbers", type=int, default=4)
    parser.add_argument("--split", default="test_hard")
    parser.add_argument("--train-problems", type=int, default=512)
    parser.add_argument("--eval-problems", type=int, default=300)
    parser.add_argument("--width", type=int, default=4, help="expansion width n")
    parser.add_argument("--k", type=int, default=8, help="trajectories per tree")
    parser.add_argument("--max-expansions", type=int, default=32, help="the tree budget")
    parser.add_argument("--prm-weight", type=float, default=0.5)
    parser.add_argument("--epochs", type=int, default=3, help="value-model fitting epochs")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    policy, tok = load_policy("tiny-countdown")
    policy.eval()
    task = CountdownTask(numbers_count=args.numbers)
    decode = functools.partial(tok.decode, skip_special_tokens=True)
    pad = tok.pad_token_id or 0

    def searches(problems):
        return [SearchProblem(encode_prompt(tok, task, p), functools.partial(task.score, p), p.id) for p in problems]

    def run(problems, value_fn=None, weight=0.0):
        config = SearchConfig(max_depth=8, expansion_width=args.width, trajectories_per_tree=args.k,
                              max_expansions_per_tree=args.max_expansions, prm_weight=weight, seed=args.seed)
        generator = HFGenerator(policy, tok, seed=args.seed, prefix_cache_mb=256)
        driver = SearchDriver(generator, config, step=task.step, decode=decode, max_concurrent_trees=64,
                              eos_token_ids=[tok.eos_token_id], value_fn=value_fn)
        start = time.perf_counter()
        results = driver.run(searches(problems))
        return results, time.perf_counter() - start

    train = task.problems("train")[:: max(1, len(task.problems("train")) // args.train_problems)][: args.train_problems]
    held = task.problems(args.split)[: args.eval_problems]
    trees, seconds = run(train)
    samples = [s for r in trees for s in tree_samples(r.tree)]
    print(f"value-model data: {len(samples)} nodes from {sum(bool(tree_samples(r.tree)) for r in trees)} solved of "
          f"{len(trees)} training trees ({seconds:.0f} s)", flush=True)
    model = ValueModel.from_policy(policy)
    loss, _ = fit_value_model(model, [(s, t) for s, t, _ in samples], PRMTrainConfig(epochs=args.epochs), pad_id=pad)
    print(f"value model fitted: train MSE {loss:.4f}", flush=True)

    arms = {}
    for name, fn, weight in (("plain", None, 0.0), ("prm", lambda prefixes: model.score(prefixes, pad_id=pad), args.prm_weight)):
        results, seconds = run(held, fn, weight)
        solved = [r for r in results if r.stats.tokens_to_first_correct is not None]
        tokens = sum(r.stats.generated_tokens for r in results)
        arms[name] = {
            "solved": len(solved) / len(results),
            "to_first": sum(r.stats.tokens_to_first_correct for r in solved) / max(len(solved), 1),
            "per_solved": tokens / max(len(solved), 1),
            "tokens": tokens,
            "seconds": seconds,
            "results": results,
        }
    nodes = [s for r in arms["plain"]["results"] for s in tree_samples(r.tree)]
    score = auc(model.score([s for s, _, _ in nodes], pad_id=pad), [reach for _, _, reach in nodes]) if nodes else float("nan")

    print(f"\n{len(held)} held-out problems ({args.split}, {args.numbers} numbers), width {args.width}, K {args.k}, "
          f"at most {args.max_expansions} expansions per tree")
    print(f"{'arm':<6} {'solved':>7} {'tokens to 1st correct':>22} {'tokens / solved':>16} {'tokens':>9} {'seconds':>8}")
    for name, a in arms.items():
        print(f"{name:<6} {a['solved']:7.3f} {a['to_first']:22.1f} {a['per_solved']:16.1f} {a['tokens']:9d} {a['seconds']:8.1f}")
    print(f"value model AUC (can this node still reach a correct answer?) on the plain held-out trees: {score:.3f}")
    p, q = arms["plain"], arms["prm"]
    print(f"RESULT tokens_to_first_correct_plain={p['to_first']:.1f} tokens_to_first_correct_prm={q['to_first']:.1f} "
          f"solved_plain={p['solved']:.3f} solved_prm={q['solved']:.3f} tokens_per_solved_plain={p['per_solved']:.1f} "
          f"tokens_per_solved_prm={q['per_solved']:.1f} auc={score:.3f}")


if __name__ == "__main__":
    main()
