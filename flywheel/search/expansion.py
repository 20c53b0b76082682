"""What every expansion rule shares: the problem record, seeds, sampling parameters, EOS and
grading of terminals, and the Generator contract check. Used by the tree search
(flywheel.search.live, .driver) and the flat rollouts (flywheel.search.flat).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Sequence

from flywheel.generation.base import Completion, GenerationRequest, Generator, SamplingParams
from flywheel.rewards import Verdict
from flywheel.search.config import SearchConfig
from flywheel.search.terminal import is_terminal_step, terminal_kind, terminal_reward
from flywheel.search.tree import SearchTree
from flywheel.tasks.base import StepSpec
from flywheel.tasks.environment import Turn

Decode = Callable[[Sequence[int]], str]

Respond = Callable[[tuple[str, ...]], tuple[Turn, tuple[int, ...]]]
"""An environment problem's answer to the actions of an episode so far (their texts, in order):
the turn (flywheel.tasks.environment.Turn) and its observation's token ids."""


@dataclass(frozen=True)
class SearchProblem:
    """One problem to search: the prompt as token ids and its grader.

    `score(text, truncated=...)` grades the full response text (every step from the root to a
    terminal, decoded; never the prompt), e.g. `functools.partial(task.score, problem)`;
    `truncated` is True for a trajectory cut at max depth without EOS (the length limit).
    `first_rollouts`: whole responses to the prompt sampled before the tree (the flat samples
    of `--data.batching.flat_first`): a rollout-expansion tree starts from them as its first
    chains, without generating them again (flywheel.search.live.LiveTree.start_from).
    `respond`: set for an environment's episode (flywheel.tasks.environment): each step is an
    action the environment answers, its observation extends the context, and the episode is
    graded by its last turn, not by `score`.
    """

    prompt_ids: tuple[int, ...]
    score: Callable[..., Verdict]
    id: str = ""
    first_rollouts: tuple[Completion, ...] = ()
    respond: Respond | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_ids", tuple(self.prompt_ids))  # a list is accepted
        object.__setattr__(self, "first_rollouts", tuple(self.first_rollouts))
        if not self.prompt_ids:
            raise ValueError(f"problem {self.id!r}: prompt_ids must not be empty")



def derive_seed(*parts: int) -> int:
    """A stable 31-bit seed from integers (same on every machine and Python run).

    >>> derive_seed(0, 1, 2) == derive_seed(0, 1, 2) != derive_seed(0, 2, 1)
    True
    """
    h = hashlib.blake2b(digest_size=8)
    for part in parts:
        h.update(int(part).to_bytes(8, "little", signed=True))
    return int.from_bytes(h.digest(), "little") >> 33


class StepEnds:
    """Does the step whose tokens so far are `piece` end with its last token: does that token
    complete `step`'s delimiter in the step's text? Matched as the generators match a stop string
    (a BPE tokenizer may spell "\n\n" as "\n" "\n", or inside a larger token), on the text of the
    step's last few tokens; tokens that cannot complete it are memoised per id. Fixed chunks (no
    delimiter) never end early. What cuts a whole continuation into steps (rollout.split_steps)."""

    def __init__(self, step: StepSpec, decode: Decode) -> None:
        self.delimiter = step.delimiter
        self.decode = decode
        self._may_end: dict[int, bool] = {}

    def __call__(self, piece: Sequence[int]) -> bool:
        delimiter = self.delimiter
        if delimiter is None or not piece:
            return False
        token = piece[-1]
        may = self._may_end.get(token)
        if may is None:  # its text holds the delimiter's last character, or is empty or a partial character
            text = self.decode([token])
            may = self._may_end[token] = not text or "\ufffd" in text or delimiter[-1] in text
        return may and delimiter in self.decode(piece[-(2 * len(delimiter) + 2):])


def step_sampling_params(step: StepSpec, config: SearchConfig) -> SamplingParams:
    """One step's request (§1): a fixed chunk of max_tokens, or text up to the delimiter capped at max_tokens."""
    return SamplingParams(
        max_new_tokens=step.max_tokens,
        temperature=config.temperature,
        top_p=config.top_p,
        stop_strings=(step.delimiter,) if step.delimiter is not None else (),
        top_logprobs=config.entropy_top_k if config.terminal_choice == "entropy" else 0,
    )


def rollout_sampling_params(step: StepSpec, config: SearchConfig, depth: int, open_tokens: int = 0) -> SamplingParams:
    """A rollout expansion's request: a whole continuation (no stop string), room for every step
    left above max depth (`open_tokens`: tokens already in the step it starts inside). Entropies
    when a rule reads them (`config.needs_entropy`)."""
    return SamplingParams(
        max_new_tokens=step.max_tokens * (config.max_depth - depth) - open_tokens,
        temperature=config.temperature,
        top_p=config.top_p,
        top_logprobs=config.entropy_top_k if config.needs_entropy else 0,
    )


def emitted_eos(completion: Completion, eos_token_ids: frozenset[int]) -> bool:
    """EOS as the generator reports it, or as the last token when the caller names EOS ids."""
    if completion.finish_reason == "eos":
        return True
    return bool(eos_token_ids) and bool(completion.token_ids) and completion.token_ids[-1] in eos_token_ids


def grade_terminal(
    tree: SearchTree,
    node: int,
    problem: SearchProblem,
    decode: Decode,
    eos: bool,
    config: SearchConfig,
    graded: dict[tuple[tuple[int, ...], bool], tuple[str, Verdict]] | None = None,
    ids: tuple[int, ...] | None = None,
) -> None:
    """Grade the trajectory ending at `node`: store its text, verdict, kind and reward (§2).

    A trajectory without EOS was cut by the length limit: it is graded as `truncated`.
    `graded` memoises (text, verdict) by response token ids and EOS within one tree: siblings
    often repeat a response exactly, and decoding and grading are pure. `ids`: the response
    token ids when the caller already has them (siblings share their parent's). An episode's
    terminal is graded by its environment's last turn (`grade_episode`)."""
    if problem.respond is not None:
        grade_episode(tree, node, decode, eos, config)
        return
    if ids is None:
        ids = tuple(tree.response_ids(node))
    key = (ids, eos)
    if graded is not None and key in graded:
        text, verdict = graded[key]
    else:
        text = decode(ids)
        try:
            verdict = problem.score(text, truncated=not eos)
        except Exception as err:  # a verifier must never raise; say which problem broke it
            raise RuntimeError(f"the verifier of problem {problem.id!r} raised on a completion: {err!r}") from err
        if graded is not None:
            graded[key] = (text, verdict)
    kind = terminal_kind(verdict, emitted_eos=eos)
    tree.texts[node] = text
    tree.verdicts[node] = verdict
    tree.kind[node] = kind
    tree.reward[node] = terminal_reward(kind, verdict, config.incomplete_reward)


def environment_turns(tree: SearchTree, node: int, completions: Sequence[Completion], problem: SearchProblem,
                      decode: Decode) -> list[tuple[Turn, tuple[int, ...]]]:
    """The environment's answer to each completion as the next action after `node`'s episode
    (`problem.respond`); siblings that wrote the same action text share one answer."""
    assert problem.respond is not None
    actions = tuple(decode(tree.tokens[v]) for v in tree.path(node)[1:])
    answers: dict[str, tuple[Turn, tuple[int, ...]]] = {}
    out = []
    for completion in completions:
        action = decode(completion.token_ids)
        if action not in answers:
            answers[action] = problem.respond(actions + (action,))
        out.append(answers[action])
    return out


def child_ends(tree: SearchTree, node: int, completions: Sequence[Completion], problem: SearchProblem, decode: Decode,
               max_depth: int, eos_token_ids: frozenset[int]
               ) -> tuple[list[tuple[bool, bool]], list[tuple[Turn, tuple[int, ...]]] | None]:
    """(terminal, emitted EOS) of each completion as a new child of `node` (§1: EOS, or max
    depth), and for an environment's episode the environment's answers to them (`environment_turns`),
    a child whose answer is done being terminal too."""
    depth = tree.depth[node] + 1
    ends = [step_end(c, depth, max_depth, eos_token_ids) for c in completions]
    if problem.respond is None:
        return ends, None
    turns = environment_turns(tree, node, completions, problem, decode)
    return [(terminal or turn.done, eos) for (terminal, eos), (turn, _) in zip(ends, turns)], turns


def grade_episode(tree: SearchTree, node: int, decode: Decode, eos: bool, config: SearchConfig) -> None:
    """Grade the episode ending at `node` by its last turn: the environment's verdict when it
    said done; else lost, "ended_by_policy" (EOS) or "turn_limit" (cut at max depth: incomplete).
    Its text is the whole episode, observations included."""
    turn = tree.turns[node]
    if turn.done:
        verdict = turn.verdict(decode(tree.tokens[node]))
    else:
        verdict = Verdict(correct=False, reward=-1.0, answer=None, reason="ended_by_policy" if eos else "turn_limit")
    kind = terminal_kind(verdict, emitted_eos=eos or turn.done)
    tree.texts[node] = decode(tree.context_ids(node))
    tree.verdicts[node] = verdict
    tree.kind[node] = kind
    tree.reward[node] = terminal_reward(kind, verdict, config.incomplete_reward)


def distinct_steps(completions: Sequence[Completion]) -> list[Completion]:
    """The first completion of each distinct token sequence, in sampling order."""
    seen: set[tuple[int, ...]] = set()
    out = []
    for completion in completions:
        key = tuple(completion.token_ids)
        if key not in seen:
            seen.add(key)
            out.append(completion)
    return out


def step_end(completion: Completion, depth: int, max_depth: int, eos_token_ids: frozenset[int]) -> tuple[bool, bool]:
    """(terminal, emitted EOS) of a new child at `depth` (§1)."""
    eos = emitted_eos(completion, eos_token_ids)
    return is_terminal_step("eos" if eos else completion.finish_reason, depth, max_depth), eos


def check_outputs(
    generator: Generator, requests: Sequence[GenerationRequest], outputs: Sequence[Sequence[Completion]]
) -> None:
    """The Generator contract: one list per request, `n` completions each."""
    name = type(generator).__name__
    if len(outputs) != len(requests):
        raise RuntimeError(f"{name}.sample returned {len(outputs)} results for {len(requests)} requests")
    for i, (request, comps) in enumerate(zip(requests, outputs)):
        if len(comps) != request.n:
            raise RuntimeError(
                f"{name}.sample returned {len(comps)} completions for request {i} with n={request.n}"
            )

