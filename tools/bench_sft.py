"""`flywheel sft`'s step speed, its arms side by side in one process: float32 against bfloat16
autocast, padded rows against trie packing, on the same batches of the same policy.

    python tools/bench_sft.py                                   # SmolLM2 on chain solver traces
    python tools/bench_sft.py --policy tiny-chain --batch_size 128

Each arm starts from the same weights and trains `--steps` steps on the same seeded batches
(the first step of each arm is a warm-up and not timed); the arms alternate step by step, so a
drift in machine load hits every arm alike. Reported: trained tokens per second per arm and
each arm's ratio to float32 padded rows, the loss of the last step (the arms agree up to
rounding), and whether this CPU has native bf16 matmuls (AVX512-BF16 / AMX).

Last line: RESULT fp32_tok_s=... bf16_tok_s=... bf16_speedup=... packed_speedup=... bf16_packed_speedup=...
"""

from __future__ import annotations

import copy
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from flywheel.generation.precision import cpu_has_bf16  # noqa: E402
from flywheel.policies.load import load_policy  # noqa: E402
from flywheel.run.flags import StrictParser  # noqa: E402
from flywheel.sft.loop import SftSettings, batch_picks, collate, loss_function, make_optimizer, sft_step  # noqa: E402
from flywheel.sft.traces import solver_traces  # noqa: E402
from flywheel.tasks.chain import ChainTask  # noqa: E402

ARMS = {"fp32": (False, "float32"), "bf16": (False, "bfloat16"), "packed": (True, "float32"),
        "bf16_packed": (True, "bfloat16")}
"""arm -> (packing, precision)."""


def main(argv: list[str]) -> None:
    parser = StrictParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="smollm2-135m-instruct")
    parser.add_argument("--steps", type=int, default=6, help="steps per arm, the first untimed")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    base, tokenizer = load_policy(args.policy, "float32")
    task = ChainTask(chat_template=getattr(tokenizer, "chat_template", None) is not None, lengths=[2, 3, 4])
    traces = solver_traces(task, tokenizer, task.problems("train")[:400], 1)
    settings = {arm: SftSettings(steps=args.steps, batch_size=args.batch_size, warmup_steps=0, lr=1e-5,
                                 packing=packing, precision=precision) for arm, (packing, precision) in ARMS.items()}
    batches = [collate(batch, tokenizer.pad_token_id) for batch in batch_picks(traces, settings["fp32"])]
    arms = {}
    for arm in ARMS:
        model = copy.deepcopy(base).train()
        arms[arm] = (model, make_optimizer(model, settings[arm]), loss_function(model, traces, settings[arm]))
    seconds: dict[str, list[float]] = {arm: [] for arm in ARMS}
    losses: dict[str, float] = {}
    for step, batch in enumerate(batches):
        for arm, (model, optimizer, loss_of) in arms.items():
            start = time.perf_counter()
            losses[arm] = sft_step(model, optimizer, loss_of, batch, 1e-5, settings[arm], ARMS[arm][1] == "bfloat16")
            if step:
                seconds[arm].append(time.perf_counter() - start)
    tokens = statistics.mean(int((b[2] != -100).sum()) for b in batches[1:])
    rate = {arm: tokens / statistics.median(s) for arm, s in seconds.items()}
    print(f"{args.policy}: {args.batch_size} rows a step, {tokens:.0f} trained tokens a step, "
          f"{'native bf16 (AVX512-BF16/AMX)' if cpu_has_bf16() else 'no native bf16 (AVX2 or older)'}, "
          f"{args.threads} threads")
    for arm in ARMS:
        print(f"  {arm:<12} {rate[arm]:8.0f} trained tok/s  x{rate[arm] / rate['fp32']:.2f}  "
              f"median step {statistics.median(seconds[arm]):.2f} s  last loss {losses[arm]:.4f}")
    print(f"RESULT fp32_tok_s={rate['fp32']:.0f} bf16_tok_s={rate['bf16']:.0f} bf16_speedup={rate['bf16'] / rate['fp32']:.2f} "
          f"packed_speedup={rate['packed'] / rate['fp32']:.2f} bf16_packed_speedup={rate['bf16_packed'] / rate['fp32']:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
