"""Export the policy of a `flywheel fit` checkpoint as a Hugging Face model folder.

    python tools/export_hf.py runs/quickstart/checkpoints/last.ckpt exported/
    python tools/export_hf.py runs/x/checkpoints/last.ckpt/ exported/   # a DeepSpeed checkpoint folder
    python tools/export_hf.py runs/quickstart/checkpoints/last.ckpt shipped/ --dtype bfloat16  # half the size

The folder gets the policy's config, its weights as safetensors and its tokenizer, loadable
with `AutoModelForCausalLM.from_pretrained(folder)` and usable as `--model.policy`,
`flywheel eval --policy` or a vLLM `--model`. A DeepSpeed (ZeRO) checkpoint is a folder; its
shards are first consolidated to one fp32 state dict with Lightning's converter (needs the
`deepspeed` extra). The architecture and tokenizer come from the policy the run started from
(its `hyper_parameters`), or from `--policy`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from flywheel.run.flags import StrictParser

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DTYPES = ("float32", "bfloat16", "float16")


def consolidate_deepspeed(folder: Path, out_file: Path) -> Path:
    """One fp32 Lightning checkpoint file from a DeepSpeed checkpoint folder."""
    try:
        from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict
    except ImportError as err:  # pragma: no cover - depends on the optional extra
        raise SystemExit(f"{folder} is a DeepSpeed checkpoint; install the extra first: pip install -e \".[deepspeed]\" ({err})")
    convert_zero_checkpoint_to_fp32_state_dict(str(folder), str(out_file))
    return out_file


def export(checkpoint: Path, out: Path, policy: str | None = None, dtype: str = "float32") -> Path:
    """Write `checkpoint`'s policy to the folder `out`, its weights in `dtype` (float32, bfloat16
    or float16: the trained fp32 weights rounded; bfloat16 halves the folder)."""
    import torch

    from flywheel.reporting.eval_command import load_checkpoint_policy

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")

    with tempfile.TemporaryDirectory() as tmp:
        source = checkpoint
        if checkpoint.is_dir():
            source = consolidate_deepspeed(checkpoint, Path(tmp) / "consolidated.ckpt")
        model, tokenizer, step = load_checkpoint_policy(str(source), policy)
    model = model.to(getattr(torch, dtype))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    print(f"exported the policy of {checkpoint} (global step {step}, {dtype}) to {out}")
    return out


def main(argv: list[str] | None = None) -> Path:
    parser = StrictParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path, help="a .ckpt file, or a DeepSpeed checkpoint folder")
    parser.add_argument("out", type=Path, help="the Hugging Face model folder to write")
    parser.add_argument("--policy", default=None, help="architecture + tokenizer source (default: the run's own policy)")
    parser.add_argument("--dtype", default="float32", choices=DTYPES, help="the weights' dtype in the folder")
    args = parser.parse_args(argv)
    if not args.checkpoint.exists():
        raise SystemExit(f"{args.checkpoint} does not exist")
    return export(args.checkpoint, args.out, args.policy, args.dtype)


if __name__ == "__main__":
    main()
