"""Launch a vLLM sidecar on the shipped head-size-32 policy, print its process group, then
wait to be killed (tests/test_vllm_sidecar.py SIGKILLs this process: the server must follow)."""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from flywheel.generation.vllm import VLLMSidecar  # noqa: E402
from flywheel.policies.load import load_policy  # noqa: E402

model, tok = load_policy("tiny-countdown-h3")
sidecar = VLLMSidecar(python=os.environ["FLYWHEEL_VLLM_PYTHON"], log_dir=sys.argv[1], startup_timeout=600)
sidecar.build(model, tok)
print(f"GROUP {sidecar.process.pid}", flush=True)
time.sleep(3600)
