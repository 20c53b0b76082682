"""One vLLM server: a child process under a watchdog (launched), or a URL (attached).

A launched server runs on a free 127.0.0.1 port, logs into the run folder, and is stopped
with its whole process group when the trainer closes it, or by its watchdog when the trainer
dies without closing. Requests are retried a bounded number of times; a launched server that
died is restarted on its port first, and a server another rank launched is waited for.
Every request carries the run's secret (see `client`).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
from pathlib import Path
from typing import Any, Callable

from flywheel.generation.vllm.client import SidecarError, http_get, http_post, parse_prefix_cache_counters, refused_secret

log = logging.getLogger(__name__)

WATCHDOG = """
import os, signal, subprocess, sys, time
trainer = int(sys.argv[1])
cores = os.environ.get("FLYWHEEL_SERVER_CORES")
if cores:  # the server's share of the CPU (flywheel.generation.vllm.cores): its whole process group runs there
    os.sched_setaffinity(0, {int(c) for c in cores.split(",")})
server = subprocess.Popen(sys.argv[2:])
while server.poll() is None:
    if os.getppid() != trainer:  # orphaned: the trainer died without stopping us
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.killpg(0, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        os.killpg(0, signal.SIGKILL)
    time.sleep(1.0)
sys.exit(server.returncode)
"""
"""Runs the vLLM server as its child (same interpreter) and stops the server's whole process
group once the trainer that launched it is gone."""

UNREACHABLE = (urllib.error.URLError, ConnectionError, TimeoutError, OSError)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """One vLLM server: launched by this process (restartable on its port) or attached to by URL.

    Args:
        url: the server's base URL when attaching; None = launch with `command`.
        command: builds the launch command line for a port.
        env: environment of the launched server (holds the secret: never on the command line).
        log_path: where the launched server's output goes.
        startup_timeout: seconds to wait for /health (also: for a server another process restarts).
        request_timeout: seconds before one request counts as failed.
        max_retries: attempts per request.
        after_start: called with the server once a (re)launch is healthy (e.g. load an adapter).
        token: the secret sent with every request.
    """

    def __init__(self, url: str | None, command: Callable[[int], list[str]] | None = None, env: dict | None = None,
                 log_path: Path | None = None, startup_timeout: float = 300.0, request_timeout: float = 300.0,
                 max_retries: int = 3, after_start: Callable[[Server], None] | None = None, token: str | None = None) -> None:
        self.url = url.rstrip("/") if url else None
        self.command = command
        self.env = env
        self.log_path = log_path
        self.startup_timeout = startup_timeout
        self.request_timeout = request_timeout
        self.max_retries = max_retries
        self.after_start = after_start
        self.token = token
        self.process: subprocess.Popen | None = None
        self.port: int | None = None
        self.restarts = 0
        self.posts = 0
        """Requests sent so far: what moves the server's counters (see `VLLMGenerator.stats`)."""
        self._lock = threading.RLock()  # a restart's after_start posts, and may retry
        self.restart_failure: SidecarError | None = None
        """Why the last restart failed (None: it succeeded, or there was none): the requests that
        failed beside the one that restarted report this cause, not their own connection errors."""

    @property
    def launched(self) -> bool:
        return self.command is not None

    def launch(self) -> None:
        self.port = self.port or free_port()  # a restart keeps the port: other ranks hold the URL
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log.info("starting a vLLM server on %s (log: %s)", self.url, self.log_path)
        command = self.command(self.port)
        # The server runs under a watchdog in a process group of its own: stopping the group
        # stops everything, and a trainer that dies without closing (SIGKILL, OOM) takes it along.
        command = [command[0], "-c", WATCHDOG, str(os.getpid()), *command]
        with open(self.log_path, "ab") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                            start_new_session=True)

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise SidecarError(f"the vLLM server at {self.url} exited with code {self.process.returncode} while "
                                   f"starting; see {self.log_path}")
            try:
                http_get(f"{self.url}/health", timeout=5, token=self.token)
                return
            except urllib.error.HTTPError as err:
                if err.code in (401, 403):  # it is up, and will never take our secret
                    raise refused_secret(self.url, err) from err
                time.sleep(1.0)
            except UNREACHABLE:
                time.sleep(1.0)
        raise SidecarError(f"the vLLM server at {self.url} was not healthy after {self.startup_timeout:.0f} s"
                           + (f"; see {self.log_path}" if self.log_path else ""))

    def stop(self) -> None:
        """Stop a launched server and every process of its group; none may outlive it."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        try:  # the engine and worker processes share the server's group
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if process.poll() is None:
            process.wait(timeout=30)

    def post(self, path: str, payload: dict | None) -> Any:
        """POST with bounded retries. Before a retry a launched server that died is restarted
        (once for all the requests that failed together); a server launched elsewhere is
        waited for. A 4xx answer is the request's fault and is not retried."""
        last: Exception | None = None
        for attempt in range(self.max_retries):
            seen_restarts = self.restarts
            try:
                self.posts += 1
                return http_post(f"{self.url}{path}", payload, timeout=self.request_timeout, token=self.token)
            except urllib.error.HTTPError as err:
                if err.code in (401, 403):
                    raise refused_secret(self.url, err) from err
                if 400 <= err.code < 500:
                    detail = err.read().decode(errors="replace")[:500]
                    raise SidecarError(f"the vLLM server at {self.url} refused {path} ({err.code}): {detail}") from err
                last = err
            except UNREACHABLE as err:
                last = err
            log.warning("vLLM request %s%s failed (attempt %d/%d): %s", self.url, path, attempt + 1, self.max_retries, last)
            if attempt + 1 == self.max_retries:
                break
            with self._lock:
                if self.restarts == seen_restarts:
                    if self.process is not None and self.process.poll() is not None:
                        self._restart()
                    elif not self.launched:
                        self.wait_healthy()
                elif self.restart_failure is not None:  # another request restarted it, and that failed
                    raise SidecarError(f"vLLM request {self.url}{path} failed: {self.restart_failure}") from last
            if self.restarts == seen_restarts:
                time.sleep(min(2.0**attempt, 10.0))
        raise SidecarError(f"vLLM request {self.url}{path} failed {self.max_retries} times: {last}")

    def _restart(self) -> None:
        self.restarts += 1
        log.warning("restarting the vLLM server on %s (restart %d)", self.url, self.restarts)
        self.stop()
        try:
            self.launch()
            self.wait_healthy()
        except SidecarError as err:
            self.restart_failure = err
            raise
        self.restart_failure = None
        if self.after_start is not None:
            self.after_start(self)

    def prefix_cache_counters(self) -> tuple[float, float] | None:
        """(queries, hits) of the server's prefix cache, in tokens, from /metrics."""
        try:
            text = http_get(f"{self.url}/metrics", timeout=10, token=self.token).decode()
        except UNREACHABLE:
            return None
        return parse_prefix_cache_counters(text)
