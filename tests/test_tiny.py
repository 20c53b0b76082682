"""The character tokenizer and the tiny model builders (flywheel/policies/tiny.py)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from flywheel.policies.tiny import DEFAULT_ALPHABET, build_char_tokenizer, build_tiny_llama

TRACE = "5 9 8|67\n9*8=72\n72-5=67\n<answer>(9*8)-5</answer>"


pytestmark = pytest.mark.usefixtures("one_thread")  # fixtures one_thread and tok: conftest.py


def test_special_ids_and_vocab(tok):
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert len(tok) == 4 + len(DEFAULT_ALPHABET) == 100
    assert tok.padding_side == "left"


def test_one_token_per_character_with_bos(tok):
    ids = tok(TRACE)["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert len(ids) == 1 + len(TRACE)
    # Newline is the step delimiter: one token, also when repeated.
    nl = tok.convert_tokens_to_ids("\n")
    assert tok.encode("\n\n", add_special_tokens=False) == [nl, nl]
    assert tok.decode(ids, skip_special_tokens=True) == TRACE
    # Alphabet ids follow the specials, in alphabet order.
    assert tok.convert_tokens_to_ids("\n") == 4
    assert tok.convert_tokens_to_ids(" ") == 5
    assert tok.encode("é", add_special_tokens=False) == [tok.unk_token_id]


def test_left_padding(tok):
    encoded = tok(["ab", "abcd"], padding=True)
    assert encoded["input_ids"][0][:2] == [0, 0]
    assert encoded["attention_mask"][0] == [0, 0, 1, 1, 1]


def test_save_load_round_trip(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert len(loaded) == len(tok)
    assert loaded(TRACE)["input_ids"] == tok(TRACE)["input_ids"]
    assert loaded.decode(tok(TRACE)["input_ids"], skip_special_tokens=True) == TRACE
    for name in ("pad_token_id", "bos_token_id", "eos_token_id", "unk_token_id", "padding_side"):
        assert getattr(loaded, name) == getattr(tok, name), name


def test_custom_alphabet_and_validation():
    small = build_char_tokenizer("01+=\n")
    assert len(small) == 9
    assert small("1+1=")["input_ids"] == [1, 5, 6, 5, 7]
    with pytest.raises(ValueError, match="repeated"):
        build_char_tokenizer("aab")


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_model_from_seed(tok, family, tmp_path):
    kw = dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, family=family)
    rng_before = torch.random.get_rng_state()
    a = build_tiny_llama(tok, seed=3, **kw)
    assert torch.equal(torch.random.get_rng_state(), rng_before), "global RNG must be untouched"
    b = build_tiny_llama(tok, seed=3, **kw)
    c = build_tiny_llama(tok, seed=4, **kw)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)

    cfg = a.config
    assert cfg.vocab_size == len(tok)
    assert a.lm_head.weight is a.model.embed_tokens.weight
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id) == (1, 2, 0)
    gen = a.generation_config
    assert (gen.bos_token_id, gen.eos_token_id, gen.pad_token_id) == (1, 2, 0)

    a.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = torch.tensor([tok(TRACE)["input_ids"]])
    with torch.no_grad():
        assert torch.equal(a(ids).logits, loaded(ids).logits)


def test_default_size_matches_the_recipe(tok):
    # tiny-countdown-rl.md: hidden 96, 3 layers, 4 heads, ff 384 -> about 446k params
    # (452,640 with this 100-token vocabulary).
    model = build_tiny_llama(tok)
    assert sum(p.numel() for p in model.parameters()) == 452_640


def test_bad_shape_names_the_flag(tok):
    with pytest.raises(ValueError, match="num_heads"):
        build_tiny_llama(tok, hidden_size=30, num_heads=4)
