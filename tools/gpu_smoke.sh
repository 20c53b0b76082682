#!/usr/bin/env bash
# GPU smoke test of the DeepSearch recipe (conf/deepsearch.yaml): DeepSpeed ZeRO-2 and the CUDA
# vLLM sidecar, 2 epochs of a few training steps each on a small Llama built from config and
# built-in arithmetic problems written as problem files. Sized for one GPU in under 5 minutes.
#   bash tools/gpu_smoke.sh            # needs torch with CUDA, deepspeed and vllm importable
# Prints the run's summary and ends with a RESULT line; exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
work="${FLYWHEEL_SMOKE_DIR:-/tmp/flywheel-gpu-smoke}"
rm -rf "$work" && mkdir -p "$work"
start=$(date +%s)

python - "$work" <<'PY'
import json, sys
from pathlib import Path
import torch
missing = [m for m in ("deepspeed", "vllm") if __import__("importlib").util.find_spec(m) is None]
if not torch.cuda.is_available() or missing:
    sys.exit(f"gpu_smoke: needs a CUDA GPU and {', '.join(missing) or 'nothing else'} installed")
from flywheel.tasks.math import MathTask
from flywheel.tiny import build_char_tokenizer, build_tiny_llama
work = Path(sys.argv[1])
tok = build_char_tokenizer()
# ~20M parameters, head_dim 64 (vLLM's kernels), character tokenizer (no download).
build_tiny_llama(tok, hidden_size=512, num_layers=6, num_heads=8, intermediate_size=1536, seed=0,
                 max_position_embeddings=1024).save_pretrained(work / "policy")
tok.save_pretrained(work / "policy")
task = MathTask()
for split, name in (("arith_train", "train.jsonl"), ("arith_test", "test.jsonl")):
    rows = [{"id": p.id, "problem": p.question, "answer": p.answer} for p in task.problems(split)[:64]]
    (work / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
PY

python -m flywheel fit --config conf/deepsearch.yaml \
  --model.policy="$work/policy" \
  --data.train_files="[$work/train.jsonl]" --data.eval_files="[$work/test.jsonl]" \
  --trainer.devices=1 --trainer.max_epochs=2 --data.epochs_per_round=1 \
  --data.problems_per_epoch=16 --data.mini_batch_problems=8 --data.max_concurrent_trees=16 \
  --data.task.init_args.step_tokens=32 --data.task.init_args.max_response_tokens=128 \
  --data.search.max_depth=4 --data.search.overlong_max_tokens=128 --data.search.overlong_buffer_tokens=32 \
  --data.generator.init_args.max_model_len=1024 --data.generator.init_args.logprob_tolerance=0.05 \
  --data.generator.init_args.log_dir="$work/vllm" \
  --data.max_eval_problems=32 --data.eval.samples=2 --data.eval.k=2 \
  --trainer.logger.init_args.save_dir="$work/runs" --trainer.callbacks.init_args.dirpath="$work/checkpoints"

summary=$(ls "$work"/runs/deepsearch/version_*/summary.json | tail -1)
cat "$summary"
python - "$summary" "$start" <<'PY'
import json, sys, time
s = json.load(open(sys.argv[1]))
rounds = s["rounds"]
assert [r["round"] for r in rounds] == [1, 2], rounds
print(f"RESULT gpu_smoke=ok rounds={len(rounds)} tokens={rounds[-1]['generated_tokens']} "
      f"seconds={time.time() - float(sys.argv[2]):.0f}")
PY
