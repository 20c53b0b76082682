"""The vLLM sidecar: generation on vLLM servers beside the trainer, one module per concern.

- `sidecar`: `VLLMSidecar`, the backend `--data.generator` selects (launch or attach, weight
  sync, the log-prob probe).
- `server`: one server process under a watchdog, its health and bounded retries.
- `client`: HTTP with the run's secret on every request; the check for open control routes.
- `middleware`: the server-side half of the secret (runs inside vLLM, standard library only).
- `weights`: the weights to push (the ZeRO-3 gather) and the private staging folder.
- `generator`: `VLLMGenerator`, the Generator seam over the servers.
"""

from flywheel.generation.vllm.client import SidecarError
from flywheel.generation.vllm.generator import VLLMGenerator
from flywheel.generation.vllm.server import Server
from flywheel.generation.vllm.sidecar import VLLMSidecar

__all__ = ["Server", "SidecarError", "VLLMGenerator", "VLLMSidecar"]
