"""The decode loop's block-growing KV cache (flywheel.generation.kv_cache): the same logits
as transformers' DynamicCache, across block boundaries, with left padding, and after
compaction that drops rows and leading all-padding columns."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from flywheel.generation.kv_cache import BlockCache, block_cache, compaction
from flywheel.policies.tiny import build_tiny_llama

pytestmark = pytest.mark.usefixtures("one_thread")  # fixtures one_thread and tok: conftest.py


@pytest.fixture(scope="module")
def model(tok):
    return build_tiny_llama(tok, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=3).eval()


def step(model, cache, ids, mask, positions):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True).logits[:, -1]


def test_block_cache_matches_dynamic_cache(model):
    torch.manual_seed(0)
    rows, width, steps = 4, 7, 13  # 7 + 13 columns cross two block boundaries of 8
    ids = torch.randint(3, 20, (rows, width))
    prompt_mask = torch.ones(rows, width, dtype=torch.long)
    prompt_mask[0, :3] = 0  # rows 0 and 2 are left-padded; 3 columns are padding for both
    prompt_mask[2, :4] = 0
    positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    attention = torch.cat([prompt_mask, torch.ones(rows, steps, dtype=torch.long)], dim=1)
    tokens = torch.randint(3, 20, (rows, steps))
    block, dynamic = block_cache(model.config, block=8), DynamicCache(config=model.config)
    assert isinstance(block, BlockCache)
    got = step(model, block, ids, prompt_mask, positions)
    want = step(model, dynamic, ids, prompt_mask, positions)
    torch.testing.assert_close(got, want)
    slots, start = torch.arange(rows), 0
    for t in range(steps):
        if t == 5:  # keep rows 0 and 2, without the 3 columns that are padding for both
            keep = torch.tensor([0, 2])
            slots = slots[keep]
            drop = int(attention[slots, :width].any(0).int().argmax())
            assert drop == 3
            block.compact(keep, drop)
            dynamic.batch_select_indices(keep)
            start = drop
        next_positions = (positions[slots, -1] + 1 + t)[:, None]
        got = step(model, block, tokens[slots, t : t + 1], attention[slots, start : width + t + 1], next_positions)
        want = step(model, dynamic, tokens[slots, t : t + 1], attention[slots, : width + t + 1], next_positions)
        torch.testing.assert_close(got, want)
        assert block.layers[0].keys.shape[-2] % 8 == 0  # whole blocks, one copy per block
    assert block.get_seq_length() == width + steps - 3


def test_sliding_window_and_flash_attention_models_keep_the_dynamic_cache(model):
    config = model.config.__class__(**{**model.config.to_dict(), "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 4})
    assert isinstance(block_cache(config), DynamicCache)
    flash = model.config.__class__(**model.config.to_dict())
    flash._attn_implementation_internal = "flash_attention_2"
    assert isinstance(block_cache(flash), DynamicCache)
    assert isinstance(block_cache(model.config), BlockCache)  # sdpa


def test_compaction_moves_only_the_rows_it_must():
    active = torch.tensor([True, False, True, False, True, True])
    order, (sources, targets) = compaction(active)
    # 4 rows stay: positions 0 and 2 keep their places, 1 and 3 are filled from 4 and 5.
    assert order.tolist() == [0, 4, 2, 5]
    assert sources.tolist() == [4, 5] and targets.tolist() == [1, 3]
    assert compaction(torch.tensor([True, True, False]))[0].tolist() == [0, 1]  # nothing moves


def test_keep_first_matches_a_reordered_dynamic_cache(model):
    torch.manual_seed(1)
    rows, width = 5, 6
    ids = torch.randint(3, 20, (rows, width))
    mask = torch.ones(rows, width + 4, dtype=torch.long)
    mask[3, :2] = 0
    positions = (mask[:, :width].cumsum(-1) - 1).clamp(min=0)
    block, dynamic = block_cache(model.config, block=4), DynamicCache(config=model.config)
    step(model, block, ids, mask[:, :width], positions)
    step(model, dynamic, ids, mask[:, :width], positions)
    order, moves = compaction(torch.tensor([True, False, True, True, False]))
    block.keep_first(len(order), moves)
    dynamic.batch_select_indices(order)
    token = torch.randint(3, 20, (len(order), 1))
    next_positions = positions[order, -1:] + 1
    got = step(model, block, token, mask[order, : width + 1], next_positions)
    want = step(model, dynamic, token, mask[order, : width + 1], next_positions)
    torch.testing.assert_close(got, want)



def test_tree_attention_decodes_with_the_block_cache():
    from flywheel.generation.kv_cache import MASKED_IMPLEMENTATIONS
    from flywheel.training.tree_attention import TREE_ATTENTION

    assert TREE_ATTENTION in MASKED_IMPLEMENTATIONS  # a packable model's generator keeps the block cache
