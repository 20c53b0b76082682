"""Math: DeepSearch's prompt and steps, graded by the math verifier (flywheel.rewards.math).

Problem files (jsonl / parquet) have `problem` and `answer` columns and optional `id` and
`source`. A gold answer written as a solution is reduced to its answer at load
(`gold_answer`): `\\boxed{5}` -> `5`, a GSM8K rationale ending `#### 72` -> `72`; a gold
answer that reduces to nothing is refused with its `file:line`. Built-in splits "arith_train" / "arith_test" are seeded multi-step integer
arithmetic ("Compute (7 - 3) * 5 + 2.", answer "22"): enough for the math path (prompt,
chunked steps, \\boxed answers, the verifier) to run end to end on CPU with a tiny policy.
"""

from __future__ import annotations

import random
import re
from typing import Any, Literal, Mapping

from flywheel.rewards import Verdict
from flywheel.rewards.math import ANSWER_RULES, verify
from flywheel.rewards.math.extract import extract_answer
from flywheel.tasks.base import Problem, StepSpec, Task

DEEPSEARCH_PROMPT_SUFFIX = " Let's think step by step and output the final answer within \\boxed{}."
"""deepsearch.md §6 (code): appended to the question, the user turn of the chat template."""

BUILTIN_SPLITS = {"arith_train": slice(0, 2000), "arith_test": slice(2000, 2500)}
"""name -> its part of one seeded stream of distinct expressions (so the splits never overlap)."""


class MathTask(Task):
    """Math problems with \\boxed{} answers (DeepSearch recipe, deepsearch.md §1 and §6).

    Args:
        step_tokens: tokens per search step; a fixed chunk (the paper's 256) unless
            `step_delimiter` is set, then the cap of one delimited step.
        step_delimiter: None = fixed chunks (paper); e.g. "\\n\\n" = one paragraph per step.
        max_response_tokens: token budget of a whole response (paper: 16384).
        prompt_suffix: appended to the question (default: DeepSearch's instruction).
        chat_template: when the tokenizer has a chat template, the prompt is its user turn
            (with the generation prompt); tokenizers without one get the plain text.
        system_prompt: the chat's system turn. None (default): whatever the template does
            without one, which is the model's own convention (SmolLM2's and Qwen2.5's templates
            insert their default system turn; the paper's code sends the user turn alone).
            A string: that system turn instead. Ignored without a chat template.
        hedged: an answer like "2 or 3": "wrong" (default), or take the "first" / "last".
        require_box: grade only a \\boxed{} answer (a strict format reward). Default False:
            the verifier also reads an unboxed answer given as an answer ("Final Answer: 12",
            "#### 12", a last line that is just the answer; docs/math.md), because it is the
            more accurate grader (issue 16: a correct answer graded wrong is a false negative
            that RL punishes); the prompt still asks for \\boxed{}. A response cut by the
            length limit, or one that runs on into a new chat turn, is graded on boxes only
            either way (issue 36). Set True when a recipe wants the box itself rewarded.
        gold_format: how the answer column is written (`gold_answer`): "auto" (default: the
            last `\\boxed{}` if any, else what follows the last `####`, else the text),
            "boxed" (a solution whose last `\\boxed{}` is the answer: MATH, NuminaMath),
            "hashes" (a rationale ending `#### 42`: GSM8K) or "plain" (the answer itself:
            DeepMath's `final_answer`). A row without its convention's marker is refused.
    """

    def __init__(
        self,
        step_tokens: int = 256,
        step_delimiter: str | None = None,
        max_response_tokens: int = 16384,
        prompt_suffix: str = DEEPSEARCH_PROMPT_SUFFIX,
        chat_template: bool = True,
        hedged: Literal["wrong", "first", "last"] = "wrong",
        require_box: bool = False,
        system_prompt: str | None = None,
        gold_format: Literal["auto", "boxed", "hashes", "plain"] = "auto",
    ) -> None:
        if max_response_tokens < 1:
            raise ValueError(f"max_response_tokens must be >= 1, got {max_response_tokens}")
        if hedged not in ("wrong", "first", "last"):
            raise ValueError(f"hedged must be 'wrong', 'first' or 'last', got {hedged!r}")
        if gold_format not in GOLD_FORMATS:
            raise ValueError(f"gold_format must be one of {', '.join(GOLD_FORMATS)}, got {gold_format!r}")
        self.step = StepSpec(max_tokens=step_tokens, delimiter=step_delimiter)
        self.max_response_tokens = max_response_tokens
        self.prompt_suffix = prompt_suffix
        self.chat_template = chat_template
        self.hedged = hedged
        self.require_box = require_box
        self.system_prompt = system_prompt
        self.gold_format = gold_format

    def prompt(self, problem: Problem) -> str:
        return problem.question + self.prompt_suffix

    answer_rules = ANSWER_RULES

    def score(self, problem: Problem, completion: str, *, truncated: bool = False) -> Verdict:
        """A response cut by the length limit is graded by the strict rules: boxes only (issue 36)."""
        return verify(problem.answer, completion, hedged=self.hedged, require_box=self.require_box, truncated=truncated)

    def problem_from_row(self, row: Mapping[str, Any], where: str) -> Problem:
        problem = super().problem_from_row(row, where)
        try:
            gold = gold_answer(problem.answer, self.gold_format)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
        if not gold:
            raise ValueError(f"{where}: the gold answer {problem.answer!r:.80} holds no answer (an empty \\boxed{{}} or ####)")
        return Problem(id=problem.id, question=problem.question, answer=gold)

    def problems(self, split: str) -> list[Problem]:
        if split not in BUILTIN_SPLITS:
            raise ValueError(
                f"MathTask has no built-in split {split!r} (built-in: {', '.join(BUILTIN_SPLITS)}); "
                "give problem files with --data.problems.train_files / --data.problems.eval_files"
            )
        part = BUILTIN_SPLITS[split]
        return [Problem(id=f"{split}-{i:05d}", question=q, answer=a)
                for i, (q, a) in enumerate(arithmetic_problems(seed=0, count=2500)[part])]


_GSM8K_ANSWER = re.compile(r"####[ \t]*([^\n]*)")


GOLD_FORMATS = ("auto", "boxed", "hashes", "plain")
"""How a gold answer column is written (MathTask's `gold_format`)."""


def gold_answer(answer: str, gold_format: str = "auto") -> str:
    r"""The answer a gold column means, when it is written as a solution: the content of its
    last `\boxed{}` (MATH-style, `gold_format="boxed"`), or what follows its last `####` (a
    GSM8K rationale, "hashes"); the text itself ("plain", stripped). "auto" takes the first
    of these that the text has. The verifier compares a completion's answer with this, so a
    boxed gold answer would otherwise grade every completion wrong. A "boxed" or "hashes"
    answer without its marker raises ValueError.

    >>> gold_answer("\\boxed{5}"), gold_answer("3 + 4 = 7 apples.\n#### 72"), gold_answer(" 1/2 ")
    ('5', '72', '1/2')
    >>> gold_answer("x = \\boxed{5}", "plain")
    'x = \\boxed{5}'
    """
    text = answer.strip()
    boxed = "\\boxed" in text or "\\fbox" in text
    hashes = _GSM8K_ANSWER.findall(text)
    if gold_format == "boxed" or (gold_format == "auto" and boxed):
        if not boxed:
            raise ValueError(f"the gold answer {answer!r:.80} has no \\boxed{{}} (--data.task.init_args.gold_format=boxed "
                             "reads the last one; set another gold_format if the column is not a boxed solution)")
        return (extract_answer(text, require_box=True) or "").strip()
    if gold_format == "hashes" or (gold_format == "auto" and hashes):
        if not hashes:
            raise ValueError(f"the gold answer {answer!r:.80} has no '#### ANSWER' line (--data.task.init_args.gold_format="
                             "hashes reads it; set another gold_format if the column is not a GSM8K rationale)")
        return hashes[-1].strip()
    return text


def arithmetic_problems(seed: int, count: int) -> list[tuple[str, str]]:
    """`count` distinct (question, answer) pairs: integer expressions of 2-3 operations over
    1..12 with values in -999..999, in a seeded order."""
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    while len(out) < count:
        expression, value = _expression(rng, rng.randint(2, 3))
        if expression in seen or not -999 <= value <= 999:
            continue
        seen.add(expression)
        out.append((f"Compute {expression}.", str(value)))
    return out


def _expression(rng: random.Random, operations: int) -> tuple[str, int]:
    value = rng.randint(1, 12)
    text = str(value)
    for _ in range(operations):
        n = rng.randint(1, 12)
        op = rng.choice("+-*")
        if op == "*" and ("+" in text or "-" in text):
            text = f"({text})"
        text, value = f"{text} {op} {n}", {"+": value + n, "-": value - n, "*": value * n}[op]
    return text, value
