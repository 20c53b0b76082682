"""How chain policies fail, line by line: the base policy and trained checkpoints side by side.

For each policy (a built-in name or folder, or a `flywheel fit` checkpoint), samples responses
to the same chains with the same per-problem seeds and reads every failed one against its
chain (flywheel.tasks.chain_data.failure_profile): one wrong line in an otherwise correct,
complete chain (the mistake a fork before it can repair), several wrong lines, or not a
complete chain at all (a line missing or added, no answer). It also prints the mean response
length, so a run that learned to stop early or ramble shows it. Measure on a split you do
not report (val by default):

    python tools/chain_failures.py tiny-chain runs/chain_long/dapo_seed0/checkpoints/last.ckpt \\
        runs/chain_long/step_node_seed0/checkpoints/last.ckpt --lengths 6 7 8

Last line: `RESULT <label>_pass1=... <label>_one_wrong=... <label>_incomplete=... ...`, the
label being the policy name or the checkpoint's run folder.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from flywheel.generation import GenerationRequest, SamplingParams
from flywheel.generation.hf import HFGenerator
from flywheel.policies.load import load_policy
from flywheel.reporting.eval_command import load_checkpoint_policy
from flywheel.tasks.chain import ChainTask
from flywheel.tasks.chain_data import failure_profile
from flywheel.run.flags import StrictParser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = StrictParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("policies", nargs="+", help="built-in policy names, policy folders or .ckpt files")
    parser.add_argument("--split", default="val", help="the built-in chain split (default val: never the one you report)")
    parser.add_argument("--lengths", type=int, nargs="+", default=None, help="keep chains of these operation counts")
    parser.add_argument("--max-problems", type=int, default=128)
    parser.add_argument("--samples", type=int, default=8, help="responses per chain")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def label(source: str) -> str:
    path = Path(source)
    if path.suffix == ".ckpt":  # RUN/checkpoints/last.ckpt -> RUN
        return path.parent.parent.name or path.stem
    return path.name


def load(source: str):
    """(model, tokenizer): a checkpoint's weights on the policy its run started from, or a policy."""
    if source.endswith(".ckpt"):
        model, tokenizer, _ = load_checkpoint_policy(source)
        return model, tokenizer
    return load_policy(source)


def sample_failures(generator: HFGenerator, tokenizer, task: ChainTask, problems: list, samples: int,
                    temperature: float, seeds: list[int]) -> tuple[int, int, list]:
    """(correct responses, generated tokens, the failed ones as (start, ops, text)): `samples`
    responses to each problem at `temperature`, problem i sampled with seeds[i]."""
    params = SamplingParams(max_new_tokens=task.max_response_tokens, temperature=temperature)
    requests = [GenerationRequest(tuple(tokenizer(task.prompt(p))["input_ids"]), samples, params, seed)
                for p, seed in zip(problems, seeds)]
    correct = tokens = 0
    failures = []
    with torch.inference_mode():
        for problem, responses in zip(problems, generator.sample(requests)):
            for c in responses:
                tokens += len(c.token_ids)
                text = tokenizer.decode(c.token_ids, skip_special_tokens=True)
                if task.score(problem, text).correct:
                    correct += 1
                else:
                    failures.append((problem.start, problem.ops, text))
    return correct, tokens, failures


def measure(source: str, args: argparse.Namespace, task: ChainTask, problems: list) -> dict:
    model, tokenizer = load(source)
    seeds = [args.seed * 1_000_003 + i for i in range(len(problems))]
    correct, tokens, failures = sample_failures(HFGenerator(model, tokenizer, max_batch_size=512), tokenizer, task,
                                                problems, args.samples, args.temperature, seeds)
    total = len(problems) * args.samples
    profile = failure_profile(failures)
    share = (lambda n: n / profile.failed) if profile.failed else (lambda n: 0.0)
    return {"pass1": correct / total, "tokens": tokens / total, "failed": profile.failed,
            "one_wrong": share(profile.one_wrong_line), "several_wrong": share(profile.several_wrong_lines),
            "incomplete": share(profile.not_a_complete_chain), "first_wrong_fifth": profile.first_wrong_fifth}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    task = ChainTask(lengths=args.lengths)
    problems = task.problems(args.split)[: args.max_problems]
    print(f"{len(problems)} {args.split} chains (lengths {args.lengths or 'all'}) x {args.samples} samples "
          f"at T={args.temperature}")
    print(f"{'policy':34} {'pass@1':>7} {'tokens':>7} {'failed':>6} {'one wrong':>9} {'several':>8} "
          f"{'incomplete':>10}  first wrong line by fifth")
    result = []
    for source in args.policies:
        m = measure(source, args, task, problems)
        name = label(source)
        print(f"{name:34} {m['pass1']:7.4f} {m['tokens']:7.1f} {m['failed']:6d} {m['one_wrong']:9.3f} "
              f"{m['several_wrong']:8.3f} {m['incomplete']:10.3f}  {list(m['first_wrong_fifth'])}", flush=True)
        result += [f"{name}_pass1={m['pass1']:.4f}", f"{name}_one_wrong={m['one_wrong']:.3f}",
                   f"{name}_incomplete={m['incomplete']:.3f}", f"{name}_tokens={m['tokens']:.1f}"]
    print("RESULT " + " ".join(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
