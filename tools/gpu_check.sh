#!/usr/bin/env bash
# GPU check for a lent machine WITHOUT vllm or the real model (docs/real-model.md, "GPU check"):
# installs the carried wheels (.whl/: jsonargparse[signatures], deepspeed + deps), tries
# tools/gpu_smoke.sh (records what it says is missing), then runs on CUDA what can run:
# (a) conf/deepsearch.yaml fit, tiny policy, in-process generator, bf16; (b) the same on
# DeepSpeed ZeRO-2; (c) flywheel eval of (a)'s checkpoint on CUDA (--device auto: the GPU, bf16
# where native; the task recorded in the checkpoint), in-process; (d) flat-sampling
# tokens/s of the in-process generator on CUDA. Logs go to $OUT (or /tmp/gpu_check).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu_check}"; mkdir -p "$OUT"; W=/tmp/gc; rm -rf $W; mkdir -p $W
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && echo "STEP wheels: ok" || echo "STEP wheels: FAILED"
export PYTHONPATH=/tmp/site:$PWD
alias python=python3; python() { python3 "$@"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python -c 'import torch,lightning,transformers;print("versions torch",torch.__version__,"cuda",torch.version.cuda,"avail",torch.cuda.is_available(),"lightning",lightning.__version__,"transformers",transformers.__version__)'
python -c 'import deepspeed;print("deepspeed",deepspeed.__version__)' 2>&1 | tail -1
t=$(date +%s); timeout 60 bash tools/gpu_smoke.sh > $OUT/smoke.log 2>&1; echo "STEP gpu_smoke rc=$? $(tail -1 $OUT/smoke.log)"
FIT=(--config conf/deepsearch.yaml --trainer.accelerator=gpu --trainer.devices=1 --trainer.precision=bf16-mixed
 --model.policy=tiny-countdown --model.dtype=bfloat16 --data.generator=flywheel.generation.backends.HFBackend
 --data.problems.train_split=arith_train --data.problems.eval_split=arith_test
 --data.problems.max_train_problems=32 --data.problems.max_eval_problems=32
 --trainer.max_epochs=2 --data.epochs_per_round=1 --data.batching.problems_per_epoch=8 --data.batching.mini_batch_problems=4
 --data.batching.max_concurrent_trees=8 --data.task.init_args.step_tokens=16 --data.task.init_args.max_response_tokens=64
 --data.search.max_depth=4 --data.search.expansion_width=4 --data.search.trajectories_per_tree=4
 --data.search.overlong_max_tokens=64 --data.search.overlong_buffer_tokens=16 --data.eval.samples=4 --data.eval.k=4)
t=$(date +%s); timeout 150 python -m flywheel fit "${FIT[@]}" --trainer.strategy=auto \
 --trainer.logger.init_args.save_dir=$W/a --trainer.callbacks.init_args.dirpath=$W/a/ckpt > $OUT/fit_a.log 2>&1
echo "STEP fit_auto rc=$? $(( $(date +%s)-t ))s"; grep -aE "held-out|^ *(base|[0-9]) |wall split|Error|error" $OUT/fit_a.log | tail -8
t=$(date +%s); timeout 150 python -m flywheel fit "${FIT[@]}" \
 --trainer.logger.init_args.save_dir=$W/b --trainer.callbacks.init_args.dirpath=$W/b/ckpt > $OUT/fit_zero2.log 2>&1
echo "STEP fit_zero2 rc=$? $(( $(date +%s)-t ))s"; grep -aE "held-out|^ *(base|[0-9]) |wall split|Error|error" $OUT/fit_zero2.log | tail -8
t=$(date +%s); timeout 90 python -m flywheel eval --checkpoint $W/a/ckpt/last.ckpt --device auto --dtype auto \
 --split arith_test --max_problems 32 --samples 4 --k "[1,4]" --out $W/eval > $OUT/eval.log 2>&1
echo "STEP eval rc=$? $(( $(date +%s)-t ))s"; grep -aE "policy runs on|task recorded" $OUT/eval.log; tail -4 $OUT/eval.log
timeout 90 python - > $OUT/tps.log 2>&1 <<'PY'
import time, torch
from flywheel.policies.load import load_policy
from flywheel.generation.hf import HFGenerator
from flywheel.generation.base import GenerationRequest, SamplingParams
for dev, dt in (("cuda", torch.bfloat16), ("cuda", torch.float32), ("cpu", torch.float32)):
    model, tok = load_policy("tiny-countdown")
    model = model.to(dev, dt).eval()
    g = HFGenerator(model, tok, max_batch_size=512, prefix_cache_mb=0)
    p = SamplingParams(max_new_tokens=96, temperature=1.0)
    reqs = [GenerationRequest(tuple(tok("Numbers: 3 5 7. Target: 22.\n")["input_ids"]) + (60 + i % 7,), 8, p, seed=i) for i in range(64)]
    with torch.no_grad():
        g.sample(reqs[:4]); t = time.perf_counter(); out = g.sample(reqs); s = time.perf_counter() - t
    n = sum(len(c.token_ids) for r in out for c in r)
    print(f"RESULT tps device={dev} dtype={dt} rows=512 tokens={n} seconds={s:.2f} tok_per_s={n/s:.0f}", flush=True)
PY
echo "STEP tps rc=$?"; grep -a RESULT $OUT/tps.log || tail -5 $OUT/tps.log
