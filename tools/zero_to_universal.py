"""Convert a DeepSpeed (ZeRO) checkpoint folder into a universal checkpoint, which resumes on
any number of processes (a 2-node run resumed on one node, or on more nodes).

    python tools/zero_to_universal.py runs/x/checkpoints/last.ckpt runs/x/checkpoints/last-universal.ckpt
    python -m flywheel fit --config ... --trainer.num_nodes=1 --ckpt_path runs/x/checkpoints/last-universal.ckpt

DeepSpeed loads a ZeRO checkpoint only on as many processes as wrote it; the universal one holds
every parameter's fp32 weights and optimizer moments whole (DeepSpeed's own
`deepspeed.checkpoint.ds_to_universal`, needs the `deepspeed` extra). `flywheel fit` sees the
converted folder and has DeepSpeed load it as universal (flywheel/run/zero_checkpoint.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flywheel.run.flags import StrictParser  # noqa: E402
from flywheel.run.zero_checkpoint import to_universal  # noqa: E402


def main(argv: list[str] | None = None) -> Path:
    parser = StrictParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path, help="a DeepSpeed checkpoint folder a fit wrote (e.g. .../last.ckpt)")
    parser.add_argument("out", type=Path, help="the universal checkpoint folder to write (must not exist)")
    args = parser.parse_args(argv)
    out = to_universal(args.checkpoint, args.out)
    print(f"universal checkpoint: {out}; resume with --ckpt_path {out} on any number of processes")
    return out


if __name__ == "__main__":
    main()
