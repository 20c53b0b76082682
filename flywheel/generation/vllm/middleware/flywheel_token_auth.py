"""An ASGI middleware for a vLLM server: every request must carry the run's secret.

vLLM's own `--api-key` guards only the `/v1`, `/v2` and `/inference` routes; with
VLLM_SERVER_DEV_MODE=1 the control routes (`/collective_rpc`, `/pause`, `/resume`,
`/reset_prefix_cache`, `/sleep`, ...) answer anyone who can reach the port, and they can
reload other weights into a training run. This middleware wraps the whole app, so EVERY
route, inference, control, `/health` and `/metrics` alike, answers 401 unless the request
carries `Authorization: Bearer <secret>`, the secret being $FLYWHEEL_VLLM_TOKEN in the
server's environment (never on its command line, which every local user can read).

Load it with `--middleware flywheel_token_auth.TokenAuth` and this folder on PYTHONPATH. It
runs in the server's interpreter, so it imports nothing but the standard library.
"""

import hmac
import json
import os

TOKEN_ENV = "FLYWHEEL_VLLM_TOKEN"
MIN_TOKEN_CHARS = 16


class TokenAuth:
    """Refuses every HTTP request and websocket without `Authorization: Bearer $FLYWHEEL_VLLM_TOKEN`."""

    def __init__(self, app, token: str | None = None) -> None:
        token = token if token is not None else os.environ.get(TOKEN_ENV, "")
        if len(token) < MIN_TOKEN_CHARS:
            raise RuntimeError(
                f"flywheel_token_auth: ${TOKEN_ENV} must hold a secret of at least {MIN_TOKEN_CHARS} characters "
                f"(e.g. `export {TOKEN_ENV}=$(python -c 'import secrets; print(secrets.token_urlsafe(32))')`), "
                "the same value the trainer sends"
            )
        self.app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket") or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps({"error": "missing or wrong secret (Authorization: Bearer $FLYWHEEL_VLLM_TOKEN)"}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})

    def _authorized(self, scope) -> bool:
        given = [value for name, value in scope.get("headers", ()) if name.lower() == b"authorization"]
        # One header exactly, compared in constant time (no timing oracle on the secret).
        return len(given) == 1 and hmac.compare_digest(given[0], self._expected)
