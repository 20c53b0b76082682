"""HTTP to a vLLM server with the run's secret on every request, and the checks around it.

Every request carries `Authorization: Bearer <token>`: the secret the servers' middleware
(`middleware/flywheel_token_auth.py`) demands on every route. A launched server gets a fresh
random secret per run; an attached one (`url:`) the secret both sides read from
$FLYWHEEL_VLLM_TOKEN (or the sidecar's `token` setting).
"""

from __future__ import annotations

import json
import logging
import secrets
import urllib.error
import urllib.request
from typing import Any

log = logging.getLogger(__name__)

TOKEN_ENV = "FLYWHEEL_VLLM_TOKEN"
"""The environment variable holding the secret, read by the trainer and by the servers' middleware."""
TOKEN_SETTING = "--data.generator.init_args.token"
MIN_TOKEN_CHARS = 16
"""The shortest secret the servers' middleware accepts."""
OPEN_PROBE = "/is_paused"
"""A control route (VLLM_SERVER_DEV_MODE) that only reads: asked without the secret to tell
whether an attached server guards its control routes."""


class SidecarError(RuntimeError):
    """A vLLM server could not be started, reached, or kept in step with the trainer."""


def new_token() -> str:
    """A fresh per-run secret (256 random bits)."""
    return secrets.token_urlsafe(32)


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def http_post(url: str, payload: dict | None, timeout: float, token: str | None) -> Any:
    """POST JSON; the answer parsed as JSON (text when it is not JSON, None when empty).
    Raises urllib's errors (HTTPError for an error status)."""
    data = json.dumps(payload).encode() if payload is not None else b""
    request = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Type": "application/json", **_headers(token)})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body = response.read()
    if not body.strip():
        return None
    try:
        return json.loads(body)
    except ValueError:  # some endpoints answer plain text (e.g. load_lora_adapter)
        return body.decode(errors="replace")


def http_get(url: str, timeout: float, token: str | None) -> bytes:
    with urllib.request.urlopen(urllib.request.Request(url, headers=_headers(token)), timeout=timeout) as response:
        return response.read()


def refused_secret(url: str, err: urllib.error.HTTPError) -> SidecarError:
    """The error for a server that refused the trainer's secret (401/403), saying the fix."""
    return SidecarError(
        f"the vLLM server at {url} refused the trainer's secret ({err.code}): set the same secret on both sides, "
        f"${TOKEN_ENV} in the server's environment (it must load `--middleware flywheel_token_auth.TokenAuth`, "
        f"see `python -m flywheel.generation.vllm.middleware`) and {TOKEN_SETTING} or ${TOKEN_ENV} for the trainer"
    )


def answers_without_secret(url: str, timeout: float = 10.0) -> bool:
    """Whether the server at `url` answers a control route to a request without any secret."""
    try:
        http_get(f"{url}{OPEN_PROBE}", timeout=timeout, token=None)
        return True
    except urllib.error.HTTPError:  # 401/403: guarded; 404: no control routes at all
        return False
    except (urllib.error.URLError, OSError):
        return False


def warn_if_open(url: str) -> bool:
    """Log a loud warning when an attached server's control routes answer without the secret."""
    if not answers_without_secret(url):
        return False
    log.warning(
        "\n%s\nSECURITY: the vLLM server at %s answers its control routes (%s, /pause, /collective_rpc, ...) "
        "WITHOUT a secret: anyone who can reach it can pause it or load other weights into this training run.\n"
        "Start it with `--middleware flywheel_token_auth.TokenAuth`, the folder printed by "
        "`python -m flywheel.generation.vllm.middleware` on its PYTHONPATH and a secret in $%s, and give the "
        "trainer the same secret (%s or $%s).\n%s",
        "!" * 78, url, OPEN_PROBE, TOKEN_ENV, TOKEN_SETTING, TOKEN_ENV, "!" * 78,
    )
    return True


def parse_prefix_cache_counters(text: str) -> tuple[float, float] | None:
    """(queries, hits) of a server's prefix cache, in tokens, from its /metrics page."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
            if line.startswith(name):
                values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    if len(values) < 2:
        return None
    return values["vllm:prefix_cache_queries_total"], values["vllm:prefix_cache_hits_total"]
