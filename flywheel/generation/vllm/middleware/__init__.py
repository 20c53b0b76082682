"""Code that runs inside a vLLM server, not in the trainer: `flywheel_token_auth.TokenAuth`.

The server's interpreter may not have flywheel installed, so this folder is put on the
server's PYTHONPATH (`PATH` below; `python -m flywheel.generation.vllm.middleware` prints it)
and the middleware is loaded as `--middleware flywheel_token_auth.TokenAuth`. The module
imports nothing but the standard library."""

from pathlib import Path

PATH = Path(__file__).resolve().parent
"""The folder to put on a vLLM server's PYTHONPATH."""

MIDDLEWARE = "flywheel_token_auth.TokenAuth"
"""The value of vLLM's `--middleware` flag."""
