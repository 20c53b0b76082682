"""Run a command in its own process group and kill the whole group on timeout, so a hung
multi-process test (torchrun, DDP) never leaves orphan workers behind."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def run_group(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"timed out after {timeout} s: {' '.join(cmd)}\n{err[-3000:]}") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def run_groups(cmds: list[list[str]], timeout: float, logs: list[Path], envs: list[dict[str, str]], **kwargs) -> list[int]:
    """Run `cmds` at once (the nodes of one multi-node launch), each with its environment
    `envs[i]` in its own process group, its stdout and stderr in `logs[i]`.out / .err (files,
    not pipes: a node blocked on a full pipe would stall the collective its peers wait in).
    Returns their exit statuses; on timeout every group is killed and the error holds each
    node's last output."""
    procs = []
    try:
        for cmd, log, env in zip(cmds, logs, envs, strict=True):
            with open(f"{log}.out", "w") as out, open(f"{log}.err", "w") as err:
                procs.append(subprocess.Popen(cmd, stdout=out, stderr=err, text=True, start_new_session=True, env=env,
                                              **kwargs))
        deadline = time.monotonic() + timeout
        for proc in procs:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        tails = "\n".join(f"--- {log}.err\n{Path(f'{log}.err').read_text()[-2000:]}" for log in logs)
        raise AssertionError(f"timed out after {timeout} s: {' '.join(cmds[0])}\n{tails}") from None
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return [proc.returncode for proc in procs]
