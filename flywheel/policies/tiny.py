"""Building blocks of the embedded tiny policy: a character tokenizer and a small
Llama/Qwen2-style causal LM built from config (no downloads).

The quickstart policy and most tests use these. Recipe and measurements:
shared/notes/lightning-cpu.md §5 and shared/notes/tiny-countdown-rl.md (446k params at
hidden 96, 3 layers, 4 heads, ff 384).

    tok = build_char_tokenizer()
    model = build_tiny_llama(tok)          # 450k params, deterministic given `seed`
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerFast
from transformers import LlamaConfig, Qwen2Config

logger = logging.getLogger(__name__)

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK)
"""Ids 0..3, in this order; the alphabet follows from id 4."""

DEFAULT_ALPHABET: str = "\n" + "".join(chr(c) for c in range(32, 127))
"""Newline plus printable ASCII (space to "~"): 96 characters, 100 tokens with the specials.
Covers Countdown prompts and traces ("5 9 8|67\\n9*8=72\\n<answer>(9*8)-5</answer>")."""


def build_char_tokenizer(alphabet: str | None = None) -> PreTrainedTokenizerFast:
    """A character-level tokenizer: one token per character, `<bos>` prepended, left padding.

    Ids: `<pad>`=0, `<bos>`=1, `<eos>`=2, `<unk>`=3, then `alphabet` in order (default
    `DEFAULT_ALPHABET`). Characters outside the alphabet map to `<unk>`. `len(tokenizer)`
    is the vocabulary size a model must use. Round-trips through `save_pretrained` /
    `AutoTokenizer.from_pretrained` (transformers v5 reloads it as `TokenizersBackend`).
    """
    alphabet = DEFAULT_ALPHABET if alphabet is None else alphabet
    if not alphabet:
        raise ValueError("alphabet must hold at least one character")
    if len(set(alphabet)) != len(alphabet):
        dupes = sorted({c for c in alphabet if alphabet.count(c) > 1})
        raise ValueError(f"alphabet has repeated characters {dupes!r}; list each character once")
    vocab = {tok: i for i, tok in enumerate((*SPECIAL_TOKENS, *alphabet))}
    core = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    # "[\s\S]" rather than ".": Oniguruma's "." does not match "\n", which would leave a run
    # of newlines as one (unknown) piece; the step delimiter must be its own token.
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A $B",
        special_tokens=[(BOS, vocab[BOS])],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


def build_tiny_llama(
    tokenizer: PreTrainedTokenizerFast,
    hidden_size: int = 96,
    num_layers: int = 3,
    num_heads: int = 4,
    intermediate_size: int = 384,
    max_position_embeddings: int = 512,
    seed: int = 0,
    family: Literal["llama", "qwen2"] = "llama",
    initializer_range: float = 0.02,
    **config: Any,
) -> PreTrainedModel:
    """A randomly initialised causal LM sized for CPU, fp32, in eval mode.

    Tied input/output embeddings; `vocab_size == len(tokenizer)` (so no id can be sampled
    that the tokenizer cannot decode, see shared/notes/vllm-cpu.md §2); bos/eos/pad ids
    copied from the tokenizer into the config and the generation config. The weights depend
    only on the arguments: initialisation runs under a forked, seeded RNG, so the caller's
    global torch RNG is left untouched.

    Args:
        tokenizer: gives the vocabulary size and the special-token ids.
        hidden_size: model width; must be divisible by `num_heads`.
        num_layers: decoder layers.
        num_heads: attention heads (as many KV heads unless `num_key_value_heads` is given).
        intermediate_size: MLP width.
        max_position_embeddings: longest sequence (prompt + completion) the model accepts.
        seed: initialisation seed.
        family: "llama" (LlamaForCausalLM) or "qwen2" (Qwen2ForCausalLM, with QKV biases).
        initializer_range: std of the normal init of weight matrices. At the default 0.02 an
            untrained model is near-uniform and greedily repeats its last input token
            (tied embeddings); tests use about 0.4 for a peaked, varied random policy.
        config: further fields of the family's config, e.g. `num_key_value_heads` (grouped-query
            attention) or `rope_parameters`.
    """
    if hidden_size % num_heads:
        raise ValueError(
            f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads}); "
            "change --hidden_size or --num_heads"
        )
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=initializer_range,
    )
    common.update(config)
    if family == "llama":
        config = LlamaConfig(**common)
    elif family == "qwen2":
        config = Qwen2Config(**common, use_sliding_window=False)
    else:
        raise ValueError(f"family must be 'llama' or 'qwen2', got {family!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    gen = model.generation_config
    gen.bos_token_id = tokenizer.bos_token_id
    gen.eos_token_id = tokenizer.eos_token_id
    gen.pad_token_id = tokenizer.pad_token_id
    model.eval()
    logger.debug(
        "built tiny %s: %d params, vocab %d",
        family,
        sum(p.numel() for p in model.parameters()),
        config.vocab_size,
    )
    return model
