"""Where a bf16 decode step of SmolLM2-135M-Instruct spends its CPU time: 28 rows of one prompt
sampled for 64 tokens by the in-process generator in bf16 (2 threads), under torch.profiler.

    python results/bf16_cpu/decode_profile.py > results/bf16_cpu/decode_profile_bf16.txt
"""
import torch, time
from flywheel.policies.load import load_policy
from flywheel.generation.hf import HFGenerator
from flywheel.generation.base import GenerationRequest, SamplingParams
torch.set_num_threads(2)
model, tok = load_policy("smollm2-135m-instruct")
gen = HFGenerator(model, tok, seed=0, prefix_cache_mb=256, dtype="bfloat16")
prompt = tuple(tok("What is 17 + 25? Think step by step.")["input_ids"])
reqs = [GenerationRequest(prompt, 28, SamplingParams(max_new_tokens=64, temperature=1.0))]
gen.sample(reqs)  # warm-up
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU]) as prof:
    t = time.perf_counter(); out = gen.sample(reqs); t = time.perf_counter() - t
n = sum(len(c.token_ids) for group in out for c in group)
print(f"{n} tokens in {t:.2f} s = {n/t:.0f} tok/s")
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
