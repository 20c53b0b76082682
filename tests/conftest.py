"""Shared fixtures: the character tokenizer, and one torch thread for tiny-tensor tests."""

import pytest
import torch

from flywheel.policies.tiny import build_char_tokenizer


@pytest.fixture(scope="module")
def one_thread():
    # Tiny tensors: one thread is as fast, and much faster when the 2 cores are shared.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()
