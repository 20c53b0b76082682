"""Stage 1: the final answer of a completion, and the rule that read it (issue 36).

Only answers given as answers are read; the first rule that finds one wins:

- "box": the last `\\boxed{}` / `\\fbox{}`; boxes side by side, or joined by "and" / commas /
  spacing, are one list ("\\boxed{2} and \\boxed{3}" -> "2, 3"), boxes that each follow a
  short label keep it ("y_1 = \\boxed{a}, y_2 = \\boxed{b}"), boxes joined by "or" are a
  hedge. A "final answer" phrase after the last box wins over the box.
- "phrase": "The final answer is X", "Final Answer: X", "the answer is X", "Answer: X",
  where X is the whole rest of its sentence (clause.py: mathematics, not code, not prose;
  or what follows the sentence's last "is": "Final Answer: The largest $n$ is 34");
- "hashes": a GSM8K-style `#### X` line;
- "last_line": a last line that is itself just the answer ("\\[ 12 \\]", "$x = 5$",
  "10 square units", a bare "-5"), after a finished line, in a response that does not list
  candidates (three or more bare-number lines);
- "conclusion": a final sentence that states one value, marked as mathematics or after a
  concluding word ("Adding the counts, the total is $41$.", "So she needs **58** tiles.",
  "Therefore (D).", "The correct option is B.").
Never the last number of unfinished prose, of a word ("AZYUK2A") or of degenerate text.

Strict rules (`strict=True`, `require_box`, a response cut by the length limit or one that
ran on into a new chat turn): boxes only. Degenerate text (response.py) is read by boxes
only, and code (fenced or inline) by no rule but the box. A box that never closes (or
closes past MAX_ANSWER_CHARS) is a malformed answer: no fallback reads that completion.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from flywheel.rewards.math.clause import TENTATIVE, clause_answer, final_sentence, sentence_end
from flywheel.rewards.math.response import TAIL_CHARS, cut_at_new_turn, degenerate, without_code
from flywheel.rewards.math.spans import BOX, MAX_ANSWER_CHARS, braced, last_boxes, math_spans

__all__ = ["ANSWER_RULES", "MAX_ANSWER_CHARS", "Extraction", "braced", "extract_answer", "read_answer"]

ANSWER_RULES = ("box", "phrase", "hashes", "last_line", "conclusion")
"""The rules' names, as a verdict's reason gives them ("correct:box")."""
LISTING_LINES = 3
"""A response with this many lines that are each a bare number lists candidates."""

_FINAL = re.compile(r"(?:\bfinal answer|\banswer)\**\s*(?:is\b\s*:?|:)\s*\**[ \t]*|\bfinal answer\**[ \t]+(?=[-\d$\\(])"
                    r"|\bfinal answer\**[ \t]*(?=\n)", re.IGNORECASE)
"""An answer phrase: "The final answer is", "Answer:", "final answer 10", a
"Final Answer" heading with the answer on the next line."""
_TEXT = re.compile(r"\\(?:text|textrm|mbox|mathrm)\s*\{([^{}]*)\}")
_HASHES = re.compile(r"####[ \t]*([^\n]*)")
_HEDGE_BEFORE = re.compile(r"\b(?:or|otherwise|alternatively)\b", re.IGNORECASE)
_BARE_NUMBER = re.compile(r"[ \t]*(?:[-*\u2022][ \t]+)?(?:\$|\*\*|\\\(|\\\[)?\s*-?\d[\d,]*(?:\.\d+)?\s*(?:\$|\*\*|\\\)|\\\])?[ \t.]*")
BARE_NUMBER_CHARS = 64
"""A listing line longer than this (spacing aside) is not a bare number."""
_FINISHED = re.compile(r"(?:[.!?:]|\$|\\\]|\\\)|\*\*|\})\s*$")
_CONCLUDING = re.compile(
    r"(?:so|thus|therefore|hence|finally|overall|altogether|in total|in conclusion|consequently|"
    r"(?:this gives|we get|we obtain|we find|the result is)|the (?:\w+ ){0,5}(?:is|are|equals))\b", re.IGNORECASE)
_SIGN_OFF = re.compile(r"(?:I hope (?:it|this|that) (?:is|was) (?:correct|right|helpful)|I hope this helps|"
                       r"Hope (?:this|that) helps)[.!]?", re.IGNORECASE)
_INNER_CONNECTIVE = re.compile(r"(?<=[,;])\s*(?:so|thus|therefore|hence)\b", re.IGNORECASE)
_VERB = re.compile(r"\s(?:is|are|was|were|equals|becomes|gives|yields)\s|:\s", re.IGNORECASE)


@dataclass(frozen=True)
class Extraction:
    """The answer text, the rule that read it (one of ANSWER_RULES), and whether it was
    given beside another candidate ("\\boxed{2} or \\boxed{3}", "... or the answer is 3")."""

    answer: str
    rule: str
    hedged: bool = False


def read_answer(completion: str, *, strict: bool = False) -> Extraction | None:
    """The final answer of a completion and its rule, or None (module docstring)."""
    text, ran_on = cut_at_new_turn(completion.replace("\u2212", "-"))
    boxes, joined_by_or, hedged = last_boxes(text)
    joined = (" or " if joined_by_or else ", ").join(_box_content(b[2]) for b in boxes)
    box = Extraction(joined, "box", hedged) if boxes else None
    if strict or ran_on or degenerate(text):
        return box
    after_box = without_code((text[boxes[-1][1] :] if boxes else text)[-TAIL_CHARS:])
    phrase = _phrase(after_box)
    if phrase is not None or box is not None:
        return phrase or box
    if BOX.search(text):
        return None  # a box that never closes: a malformed answer
    if _lists_candidates(after_box):
        return _hashes(after_box)
    return _hashes(after_box) or _last_line(after_box) or _conclusion(after_box)


def extract_answer(completion: str, *, require_box: bool = False) -> str | None:
    """The final answer text of a completion, or None (read_answer without the rule)."""
    found = read_answer(completion, strict=require_box)
    return found.answer if found else None


def _box_content(content: str) -> str:
    """A box's answer: its content, or the value of a sentence written in it
    ("\\boxed{\\text{The answer is } 42}" -> "42")."""
    content = content.strip()
    if not any(len(m.group(1).split()) >= 2 for m in _TEXT.finditer(content)):
        return content
    sentence = _TEXT.sub(lambda m: " " + m.group(1) + " ", content)
    phrase = _FINAL.search(sentence)
    answer = _phrase_clause(sentence[phrase.end() :] if phrase else sentence)
    return answer or content


def _phrase(text: str) -> Extraction | None:
    """The last "final answer" phrase, when the rest of its sentence is the answer and no
    mathematics or #### line follows it (then it was not the final answer). Three or more
    different answers given by phrases are candidates listed: a hedge."""
    phrases = list(_FINAL.finditer(text))[-8:]
    if not phrases:
        return None
    m = phrases[-1]
    rest = text[m.end() : m.end() + MAX_ANSWER_CHARS]
    skipped = len(rest) - len(rest.lstrip()) if not rest.strip(" \t") or rest.lstrip(" \t").startswith("\n") else 0
    end = skipped + sentence_end(rest[skipped:])  # "Answer:\n12" reads the next line
    later = text[m.end() + end :][: MAX_ANSWER_CHARS * 4]
    if any(later[s : s + 2] != "**" for s, _, _ in math_spans(later)) or "####" in later:
        return None
    answer = _phrase_clause(rest[skipped:end])
    if answer is None:
        return None
    start = max(text.rfind(".", 0, m.start()), text.rfind("\n", 0, m.start()))
    hedged = _HEDGE_BEFORE.search(text, start + 1, m.start()) is not None
    if len(phrases) >= LISTING_LINES:
        given = {_phrase_clause(text[p.end() : p.end() + sentence_end(text[p.end() : p.end() + MAX_ANSWER_CHARS])])
                 for p in phrases}
        hedged = hedged or len(given - {None}) >= LISTING_LINES
    return Extraction(answer, "phrase", hedged=hedged)


def _phrase_clause(clause: str) -> str | None:
    """The answer of the clause after a phrase: all of it, or what follows its last "is"."""
    clause = clause.strip().lstrip(":").strip()
    answer = clause_answer(clause, lead="free", number_words=True)
    if answer is None:
        verbs = list(_VERB.finditer(clause))
        if verbs:
            answer = clause_answer(clause[verbs[-1].end() :], lead="free", number_words=True)
    return answer


def _hashes(text: str) -> Extraction | None:
    hashes = list(_HASHES.finditer(text))[-64:]
    if not hashes:
        return None
    answer = clause_answer(hashes[-1].group(1), lead="none", number_words=True)
    return Extraction(answer, "hashes") if answer else None


def _last_line(text: str) -> Extraction | None:
    """The last line when it is just the answer (a display-math block is one line)."""
    text = text.rstrip()
    spans = math_spans(text[-MAX_ANSWER_CHARS * 4 :])
    cut = len(text) - len(text[-MAX_ANSWER_CHARS * 4 :])
    start = text.rfind("\n") + 1
    if spans and cut + spans[-1][1] == len(text.rstrip(". ")) and cut + spans[-1][0] < start:
        start = text.rfind("\n", 0, cut + spans[-1][0]) + 1  # a display block over several lines
    line = text[start:]
    if not line.strip() or len(line) > MAX_ANSWER_CHARS:
        return None
    whole = text.strip()
    if start > 0 and len(whole) <= 200 and "\n\n" not in whole and ("\\begin" in whole or "\\\\" in whole):
        flat = clause_answer(" ".join(whole.split()), lead="none", number_words=True)
        if flat and len(flat) >= len(" ".join(whole.split()).rstrip(".")) - 1:
            return Extraction(flat, "last_line")  # the whole response is one formula over lines
    before = text[:start].rstrip()
    if not before and re.fullmatch(r"[^\W\d_]+", line.strip().rstrip(".")):
        return Extraction(line.strip().rstrip("."), "last_line")  # a one-word response: "odd", "Evelyn"
    answer = clause_answer(line, lead="none", number_words=True)
    if answer is None:
        return None
    if before:
        if not _FINISHED.search(before[-200:]):
            return None  # "... is\n12" reads as one unfinished sentence: the conclusion rule's
    return Extraction(answer, "last_line")


def _lists_candidates(text: str) -> bool:
    """Three or more lines that are each a bare number ("1\\n2\\n3", "- $4$"): candidates, not an answer."""
    lines = (line.strip() for line in text[-MAX_ANSWER_CHARS * 8 :].split("\n"))
    # Stripped and capped first: the pattern's optional spacing around the number backtracks
    # quadratically over a long run of tabs or spaces (100,000 tabs took 14 s).
    return sum(1 for line in lines if len(line) <= BARE_NUMBER_CHARS and _BARE_NUMBER.fullmatch(line)) >= LISTING_LINES


def _conclusion(text: str) -> Extraction | None:
    """A final sentence that states one value (module docstring)."""
    sentence = final_sentence(text).strip()
    if _SIGN_OFF.fullmatch(sentence):
        sentence = final_sentence(text.rstrip()[: -len(sentence) - 1]).strip()
    if not sentence or len(sentence) > MAX_ANSWER_CHARS:
        return None
    inner = list(_INNER_CONNECTIVE.finditer(sentence))
    if inner:  # "where $d = 90/n$, so there are 12 sequences": the conclusion is the last part
        sentence = sentence[inner[-1].start() :].strip()
    prose = {w.lower().strip(",:;") for w in re.sub(r"\$[^$]*\$", " ", sentence).split()}
    if prose & (TENTATIVE | {"not", "never", "if", "unless", "whether"}):
        return None  # "Let me try 4: that gives 12", "Maybe $12$"
    verbs = list(_VERB.finditer(sentence))
    if verbs and (_CONCLUDING.match(sentence) or _marked(sentence[verbs[-1].end() :])):
        answer = clause_answer(sentence[verbs[-1].end() :], lead="free")
        if answer:
            return Extraction(answer, "conclusion")
    answer = clause_answer(sentence, lead="marked")
    return Extraction(answer, "conclusion") if answer else None


def _marked(clause: str) -> bool:
    return re.match(r"\s*(?:\$|\\\[|\\\(|\*\*)", clause) is not None
