"""Steps over a byte-level BPE vocabulary, worked by hand on a toy one (the real SmolLM2
tokenizer runs the same checks in tests/test_real_model.py): a delimiter spelled over two
tokens or inside a larger token ends a rollout's step where a stop string would have, and a
character split between two steps reads whole in the tree's step texts."""

from __future__ import annotations

from flywheel.generation.base import Completion
from flywheel.search.config import SearchConfig
from flywheel.search.driver import SearchDriver
from flywheel.search.outputs import step_text
from flywheel.search.rollout import split_steps
from flywheel.search.tree import SearchTree
from flywheel.tasks.base import StepSpec

# ids below 256 are single bytes; above, merged tokens as a byte-level BPE has them.
MERGED = {256: b"\n\n", 257: b"\n\n   ", 258: b".\n\n", 259: "🙂".encode()[:2], 260: "🙂".encode()[2:]}
NL, DOT, A, B = 10, 46, 97, 98


def decode(ids) -> str:
    return b"".join(MERGED.get(i, bytes([i]) if i < 256 else b"") for i in ids).decode("utf-8", errors="replace")


def step(*ids: int) -> Completion:
    return Completion(ids, (-0.1,) * len(ids), "length")


def driver(delimiter: str | None = "\n\n") -> SearchDriver:
    return SearchDriver(generator=None, config=SearchConfig(), step=StepSpec(max_tokens=8, delimiter=delimiter),
                        decode=decode)


def test_a_delimiter_spelled_over_two_tokens_or_inside_one_ends_the_step():
    ends = driver().ends_step
    assert ends([A, NL, NL]) and not ends([A, NL]) and not ends([NL, A])  # "\n" "\n" completes "\n\n" at the second
    assert ends([A, 256]) and ends([A, 257]) and ends([A, 258])           # inside / at the end of one token
    assert ends([DOT, NL, A, NL, NL]) and not ends([NL, A, NL])
    assert not driver(None).ends_step([A, NL, NL])                         # fixed chunks: no delimiter
    # The memo per token id does not leak between steps: "\n" ends one step and not another.
    assert ends([A, NL, NL]) and not ends([B, NL])


def test_split_steps_cuts_a_rollout_where_the_step_sampler_would_have_stopped():
    # "a.\n\n" as ".", "\n", "\n" then "b\n\n   b" with the delimiter inside a merged token, then EOS (0).
    whole = Completion((A, DOT, NL, NL, B, 257, B, 0), (-0.5,) * 8, "eos")
    pieces = split_steps(whole, StepSpec(max_tokens=8, delimiter="\n\n"), driver().ends_step, max_steps=8)
    assert [p.token_ids for p in pieces] == [(A, DOT, NL, NL), (B, 257), (B, 0)]
    assert [p.finish_reason for p in pieces] == ["stop", "stop", "eos"]
    assert [decode(p.token_ids) for p in pieces] == ["a.\n\n", "b\n\n   ", "b\x00"]


def test_step_texts_show_a_character_split_between_two_steps_whole_in_the_step_that_completes_it():
    tree = SearchTree((1,))
    first, leaf = tree.add_children(0, [step(A, 259), step(B, 259)], [False, False])  # "a" / "b" + the emoji's first two bytes
    (second,) = tree.add_children(first, [step(260, B)], [False])                     # its last two bytes + "b"
    assert decode(tree.tokens[first]) == "a\ufffd" and decode(tree.tokens[second]).startswith("\ufffd")
    assert step_text(tree, first, decode) == "a"        # the partial character is left to the step completing it
    assert step_text(tree, second, decode) == "🙂b"
    assert step_text(tree, first, decode) + step_text(tree, second, decode) == decode(tree.response_ids(second))
    # A leaf that ends mid-character keeps what it has (nothing completes it).
    assert step_text(tree, leaf, decode) == "b\ufffd"
