"""`--device` and `--dtype` of `eval` and `diagnose` (flywheel.policies.device): auto takes CUDA
when present, a GPU this machine lacks is one line naming the flag, and auto's dtype is the
device's own. CUDA is faked by monkeypatching torch.cuda, so these run on any machine."""

from __future__ import annotations

import pytest
import torch

from flywheel.policies.device import placement, resolve_device, resolve_dtype
from flywheel.run.errors import PreflightError


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("LOCAL_RANK", raising=False)


def test_auto_is_the_cpu_without_cuda(no_gpu):
    assert resolve_device("auto") == resolve_device("cpu") == torch.device("cpu")


def test_auto_is_the_gpu_where_there_is_one_and_torchrun_s_local_rank_picks_it(two_gpus, monkeypatch):
    assert resolve_device("auto") == resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setenv("LOCAL_RANK", "1")  # rank 1 of `torchrun --nproc_per_node 2` takes the second GPU
    assert resolve_device("auto") == torch.device("cuda", 1)


@pytest.mark.parametrize("requested", ["cuda", "cuda:0"])
def test_cuda_asked_for_on_a_machine_without_it_is_one_line_with_the_way_out(no_gpu, requested):
    with pytest.raises(PreflightError) as err:
        resolve_device(requested)
    assert str(err.value) == (f"--device={requested}: this machine has no CUDA device (torch.cuda.is_available() is "
                              "False); use --device=cpu, or --device=auto to take a GPU where there is one")


def test_a_gpu_past_the_last_and_a_device_that_is_none_are_refused(two_gpus):
    with pytest.raises(PreflightError, match=r"--device=cuda:2: this machine has 2 CUDA device\(s\) \(cuda:0 .. cuda:1\)"):
        resolve_device("cuda:2")
    with pytest.raises(PreflightError, match="--device=gpu: not a device; use auto"):
        resolve_device("gpu")


def test_auto_dtype_is_bf16_on_a_gpu_with_bf16_and_fp32_elsewhere(two_gpus, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert resolve_dtype("auto", torch.device("cuda", 0)) == "bfloat16"
    # the CPU keeps the commands' fp32 weights (the in-process generator makes its own bf16 copy
    # on a CPU with native bf16, flywheel.generation.precision), whatever the GPU does
    assert resolve_dtype("auto", torch.device("cpu")) == "float32"
    # pre-Ampere: bf16 only emulated; fp32, not fp16 (whose range a bf16- or fp32-trained policy can overflow)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert resolve_dtype("auto", torch.device("cuda", 0)) == "float32"


def test_an_explicit_dtype_is_kept_and_an_unknown_one_refused():
    assert resolve_dtype("bfloat16", torch.device("cpu")) == "bfloat16"
    assert resolve_dtype("float32", torch.device("cuda", 0)) == "float32"
    with pytest.raises(PreflightError, match=r"--dtype=foo: not a parameter dtype; choose auto \(the device's own\) "
                                             "or one of float32, bfloat16"):
        resolve_dtype("foo", torch.device("cpu"))


def test_placement_says_where_in_one_line(no_gpu, caplog):
    with caplog.at_level("INFO", logger="flywheel.policies.device"):
        assert placement("auto", "auto") == (torch.device("cpu"), "float32")
    assert [r.getMessage() for r in caplog.records] == [
        "the policy runs on cpu in float32 (--device=auto, --dtype=auto; auto: CUDA when present, in the device's own "
        "dtype)"]
