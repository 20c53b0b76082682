"""Tree packing: log-probs, loss and gradients equal the one-row-per-trajectory form (fp32,
1e-5) on random trees, for the Llama and Qwen2 families, with the dense mask and with the
block-sparse tree attention; the trie, the mask, the block layout and the auto rule by hand."""

import random

import pytest
import torch

from flywheel.objectives import policy_loss
from flywheel.training.packing import ancestor_mask, pack_rows, packable, packed_logprobs, packing_pays, right_pad
from flywheel.policies.tiny import build_tiny_llama
from flywheel.training.tree_attention import enable_tree_attention, tree_layout, uses_tree_attention


def test_trie_and_mask_by_hand():
    # Two rows of group 0 share "1 5 6"; row 2 is alone in group 1.
    ids = torch.tensor([[1, 5, 6, 7, 8], [1, 5, 6, 9, 0], [1, 4, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 0, 0, 0]])
    packed = pack_rows(ids, mask, torch.tensor([3, 3, 7]))
    assert packed.input_ids.tolist() == [[1, 5, 6, 7, 8, 9], [1, 4, 0, 0, 0, 0]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 3], [0, 1, -1, -1, -1, -1]]
    assert packed.parent.tolist() == [[-1, 0, 1, 2, 3, 2], [-1, 0, -1, -1, -1, -1]]
    assert packed.index.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 5, -1], [0, 1, -1, -1, -1]]
    assert packed.row_group.tolist() == [0, 0, 1] and packed.tokens == 8
    m = ancestor_mask(packed.parent)[0, 0].int()
    assert m[5].tolist() == [1, 1, 1, 0, 0, 1]  # "9" sees 1 5 6 and itself, not 7 8
    assert m[4].tolist() == [1, 1, 1, 1, 1, 0]
    assert ancestor_mask(packed.parent)[1, 0, 3].tolist() == [0, 0, 0, 1, 0, 0]  # padding: itself only


def random_tree_batch(rng: random.Random, vocab: int, groups: int = 3, k: int = 5):
    """Rows that branch off each other at random depths, like a search tree's K trajectories."""
    rows, group_ids = [], []
    for g in range(groups):
        prompt = [1] + [rng.randrange(3, vocab) for _ in range(rng.randrange(2, 6))]
        paths = [prompt + [rng.randrange(3, vocab) for _ in range(rng.randrange(4, 12))]]
        for _ in range(k - 1):
            base = rng.choice(paths)
            cut = rng.randrange(len(prompt), len(base))
            paths.append(base[:cut] + [rng.randrange(3, vocab) for _ in range(rng.randrange(1, 10))])
        rows += paths
        group_ids += [g] * len(paths)
    ids, mask = right_pad(rows, pad_id=0)
    return ids, mask, torch.tensor(group_ids)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("attention", ["dense", "tree"])
def test_packed_equals_flat_logprobs_loss_and_gradients(one_thread, tok, family, seed, attention):
    torch.manual_seed(seed)
    rng = random.Random(seed)
    vocab = len(tok)
    model = build_tiny_llama(tok, family=family, seed=seed, initializer_range=0.2).float().train()
    assert packable(model)
    if attention == "tree":
        assert enable_tree_attention(model)
    ids, mask, groups = random_tree_batch(rng, vocab)
    packed = pack_rows(ids, mask, groups)
    if attention == "tree":  # blocks of 4 queries: several blocks per group, several buckets
        packed.layout = tree_layout(packed.position_ids, packed.origin, packed.index, block=4, pad_to=4)
        assert len(packed.layout.buckets) > 1
    assert packed.tokens < int(mask.sum())  # shared prefixes are computed once

    loss_mask = mask[:, 1:].bool() & (torch.arange(ids.shape[1] - 1) >= 3)
    advantages = torch.randn(loss_mask.shape)
    old = None

    def loss_of(logprobs):
        nonlocal old
        if old is None:
            old = logprobs.detach() + 0.05 * torch.randn_like(logprobs)
        return policy_loss(logprobs, old, advantages, loss_mask)[0]

    flat_lp = model(input_ids=ids, attention_mask=mask).logits[:, :-1].log_softmax(-1).gather(2, ids[:, 1:, None])[..., 0]
    flat_lp = torch.where(mask[:, 1:].bool(), flat_lp, torch.zeros_like(flat_lp))
    flat_loss = loss_of(flat_lp)
    flat_grads = torch.autograd.grad(flat_loss, list(model.parameters()))

    packed_lp = packed_logprobs(model, packed, ids.shape)
    assert torch.allclose(packed_lp, flat_lp, atol=1e-5), (packed_lp - flat_lp).abs().max()
    packed_loss = loss_of(packed_lp)
    packed_grads = torch.autograd.grad(packed_loss, list(model.parameters()))
    assert any(g.abs().sum() > 0 for g in flat_grads)
    assert torch.allclose(packed_loss, flat_loss, atol=1e-5)
    for a, b in zip(flat_grads, packed_grads):
        assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()


def test_tree_layout_by_hand_and_its_cost_follows_the_ancestors():
    # One trie: row 0 = 1 5 6 7 8, row 1 = 1 5 6 9 (branches after "1 5 6").
    ids = torch.tensor([[1, 5, 6, 7, 8], [1, 5, 6, 9, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    packed = pack_rows(ids, mask, torch.tensor([0, 0]))
    assert packed.origin.tolist() == [[0, 0, 0, 0, 0, 1]]  # "9" first held by row 1
    # Blocks of 2 queries: {1,5} needs keys 0-1; {6,7} keys 0-3; {8,9} keys 0-5 (8 needs 1 5 6 7,
    # 9 needs 1 5 6). The padding ladder with step 1 is 1, 2, 3, 4, 6: no padding here.
    layout = tree_layout(packed.position_ids, packed.origin, packed.index, block=2, pad_to=1)
    shapes = sorted(tuple(b.mask.shape) for b in layout.buckets)
    assert shapes == [(1, 1, 2, 2), (1, 1, 2, 4), (1, 1, 2, 6)]
    last = next(b for b in layout.buckets if b.mask.shape[-1] == 6)
    assert last.queries.tolist() == [4, 5] and last.keys.tolist() == [0, 1, 2, 3, 4, 5]
    assert last.mask[0, 0].int().tolist() == [[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 1]]  # "9" skips 7 8
    assert layout.gather.tolist() == [0, 1, 2, 3, 4, 5]  # buckets in key-length order hold 0-1, 2-3, 4-5
    # Two 200-token branches off a 40-token prompt: the dense mask would cost P^2 = 440^2 pairs,
    # the blocks of 64 about their ancestors (<= 240 keys each, padded to <= 320).
    prompt = list(range(3, 43))
    rows = [prompt + [50 + (t % 40) for t in range(200)], prompt + [7 + (t % 30) for t in range(200)]]
    ids, mask = right_pad(rows, 0)
    packed = pack_rows(ids, mask, torch.zeros(2, dtype=torch.long))
    assert packed.tokens == 440
    layout = tree_layout(packed.position_ids, packed.origin, packed.index)
    assert layout.pairs <= 7 * 64 * 320 < 440 * 440


def test_tree_attention_without_a_layout_is_sdpa(one_thread, tok):
    # The generator shares the policy: switched to tree attention, unpacked left-padded rows
    # (generation's layout) give bit-identical logits.
    model = build_tiny_llama(tok, seed=3, initializer_range=0.2).eval()
    ids = torch.tensor([[0, 0, 5, 6, 7], [4, 5, 6, 7, 8]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    with torch.no_grad():
        before = model(input_ids=ids, attention_mask=mask).logits
        assert enable_tree_attention(model) and uses_tree_attention(model)
        after = model(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(before, after)
    eager = build_tiny_llama(tok, seed=3)
    eager.config._attn_implementation = "eager"
    assert not enable_tree_attention(eager) and not uses_tree_attention(eager)  # keeps the dense mask


def test_auto_packing_rule_by_hand():
    # 3 rows of 4 tokens sharing "1 5": flat 12 tokens, packed 2 + 3 * 2 = 8: ratio 1.5 >= 1.2.
    ids = torch.tensor([[1, 5, 6, 7], [1, 5, 8, 9], [1, 5, 3, 4]])
    mask = torch.ones_like(ids)
    shared = pack_rows(ids, mask, torch.zeros(3, dtype=torch.long))
    assert shared.tokens == 8
    assert packing_pays(shared, mask, tree_attention=True)
    # Dense mask: G * P^2 = 64 <= B * L^2 = 48? No: the one 8-token sequence costs more pairs.
    assert not packing_pays(shared, mask, tree_attention=False)
    # Nothing shared: ratio 1.0 -> flat.
    distinct = torch.arange(12).view(3, 4)
    assert not packing_pays(pack_rows(distinct, mask, torch.zeros(3, dtype=torch.long)), mask, tree_attention=True)
