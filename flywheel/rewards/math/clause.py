"""Is a piece of text an answer given as an answer? The grammar of the unboxed fallbacks.

A clause is read as [lead words] VALUE [(, | and | or) VALUE ...] [a few trailing words]:
a value is a math span (`$..$`, `\\[..\\]`, `**..**` holding mathematics), a run of formula
text ("x = 5", "2\\sqrt{3}", "(1, 2)", "$1,200.00", "5cm"), a choice "(C)" and, where the
caller allows it, a number word ("five"). A clause with two values apart ("3 groups of 4"),
with a negation or condition around its value ("not 12", "12 if x > 0", "12, but"), or code
("print(12)", "x = 12;") holds no answer. Everything here is linear in the clause, which the
callers cut to MAX_ANSWER_CHARS.
"""

from __future__ import annotations

import re

from flywheel.rewards.math.spans import MAX_ANSWER_CHARS, math_spans
from flywheel.rewards.math.units import UNITS

__all__ = ["NUMBER_WORDS", "clause_answer", "sentence_end", "final_sentence"]

NUMBER_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split())}
NUMBER_WORDS.update({w: 10 * i for i, w in enumerate("thirty forty fifty sixty seventy eighty ninety".split(), 3)})
NUMBER_WORDS.update({"hundred": 100, "thousand": 1000, "million": 10**6})
_NAMES = {"sin", "cos", "tan", "cot", "sec", "csc", "log", "ln", "lg", "exp", "sqrt", "pi", "lim", "max", "min",
          "gcd", "lcm", "mod", "det", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "inf", "dx", "dy", "dt"}
_NOT_AROUND = {"not", "never", "no", "nor", "neither", "if", "unless", "except", "whether", "until", "without",
               "isn't", "aren't", "cannot", "can't"}
"""A value next to one of these is not asserted."""
TENTATIVE = {"maybe", "perhaps", "possibly", "probably", "try", "trying", "guess", "suppose", "assume", "could",
             "might", "let", "let's", "candidate", "check", "whether"}
"""A sentence with one of these tries a value rather than concluding it."""
_STOP_AFTER = _NOT_AROUND | {"but", "or", "and", "when", "whenever", "because", "since", "assuming", "provided",
                             "wait", "then", "although", "though", "however", "while", "before", "after", "so",
                             "let", "plus", "minus", "times", "maybe", "perhaps", "possibly", "probably"}
"""Words that continue a sentence past its value: the value was part of the reasoning."""
_DANGLING = {"is", "are", "was", "were", "be", "the", "a", "an", "of", "to", "for", "with", "by", "in", "on", "at",
             "from", "as", "that", "which", "we", "it", "this", "these", "its", "their", "our", "into", "than"}
"""A sentence that ends on one of these stopped mid-way."""
MAX_TRAILING_WORDS = 12
"""Words after the value ("12 distinct sequences that meet the conditions"); a last line
allows 3 (a unit)."""
_VERB = re.compile(r"\s(?:is|are|was|were|be|equals|becomes|gives|yields|get|gets|obtain|=)\s|:\s", re.IGNORECASE)
_CONNECTIVE = re.compile(r"(?:so|thus|therefore|hence|finally|overall|altogether|in total|in conclusion|"
                         r"consequently|this gives|we get|we obtain|we find|the result is)\b", re.IGNORECASE)
_SEPARATORS = {",", "and", "or", "either"}
_UNIT_GLUED = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?[a-zA-Z]{1,4}[\u00b2\u00b3]?")
_CURRENCY = re.compile(r"\\?\$(?=\d)")
_UNIT_SPLIT = re.compile(r"(?<![\w\\])(\$?\d[\d,]*(?:\.\d+)?)([a-zA-Z]{1,4}[\u00b2\u00b3]?)(?=[\s.,;:!]|$)")
_TEXT_GROUP = re.compile(r"\\(?:text|mathrm|textbf|mbox|operatorname|begin|end)\s*\{[^{}]*\}")


def _formula(piece: str) -> bool:
    """Mathematics written as text: no English word of two or more letters (commands,
    function names and a unit glued to a number excepted), no code characters."""
    if any(c in piece for c in "`\"@#~?;"):
        return False
    if _UNIT_GLUED.fullmatch(piece):
        return not re.fullmatch(r"\d+(?:st|nd|rd|th)", piece)  # 5cm, 1,000.99m² (not 4th)
    core = _CURRENCY.sub("", _TEXT_GROUP.sub(" ", piece))
    core = re.sub(r"\\[a-zA-Z]+", " ", core)
    if re.search(r"[^\x00-\x7f\u00b2\u00b3\u00b0\u00b1\u00d7\u00f7\u00b7\u0370-\u03ff\u2200-\u22ff\u2212]", core):
        return False
    if re.search(r"[A-Za-z]\d", re.sub(r"_\{?\w+\}?", "", core)):
        return False  # "x0y", "v2": a letter then a digit is a name, not a product
    if re.search(r"[A-Za-z]{1,}\(", core) and not re.search(r"(?<![A-Za-z])[A-Za-z]\(", core):
        return False  # print(12), f00(3): a call, unless a one-letter function f(x)
    return all(w.lower() in _NAMES for w in re.findall(r"[A-Za-z]{2,}", core))


def _words(text: str, start: int, stop: int) -> list[tuple[int, int]]:
    """(start, end) of the whitespace-separated words of text[start:stop]; spacing inside
    braces does not separate ("10\\text{ cm}^2" is one word)."""
    out, depth, begin = [], 0, None
    for i in range(start, stop):
        c = text[i]
        if c.isspace() and depth <= 0:
            if begin is not None:
                out.append((begin, i))
                begin = None
            continue
        if begin is None:
            begin = i
        depth += (c == "{") - (c == "}")
    if begin is not None:
        out.append((begin, stop))
    return out


def _has_value(text: str) -> bool:
    return re.search(r"[0-9A-Za-z\\]", text) is not None


def _pieces(clause: str, number_words: bool) -> list[tuple[str, int, int]]:
    """(kind, start, end) of clause: "value", "join" (operators between values), "sep", "word"."""
    out: list[tuple[str, int, int]] = []
    spans = [(s, e) for s, e, content in math_spans(clause)
             if not (clause[s : s + 2] == "**" and not all(_formula(p) for p in content.split()))]
    i = 0
    for s, e in spans + [(len(clause), len(clause))]:
        for start, end in _words(clause, i, s):
            word = clause[start:end]
            core = word.rstrip(".,:!") or word
            trailing_comma = word.endswith(",")
            end -= len(word) - len(core)
            if core.lower() in _SEPARATORS:
                out.append(("sep", start, end))
            elif number_words and core.lower().replace("-", "") in NUMBER_WORDS or \
                    number_words and all(w in NUMBER_WORDS for w in core.lower().split("-")):
                out.append(("value", start, end))
            elif core in ("a", "I", "A") or re.fullmatch(r"[A-Za-z]{2,3}", core) and core.lower() not in _NAMES:
                out.append(("ambiguous", start, end))  # a word or a product of variables ("ab"): decided below
            elif core in ("%", "\\%", "\u00b0", "^\\circ", "!"):
                out.append(("value", start, end))  # a mark after the value: "28 %"
            elif _formula(core):
                out.append(("value" if _has_value(core) else "join", start, end))
            else:
                out.append(("word", start, end))
            if trailing_comma:
                out.append(("sep", end, end + 1))
        if s < len(clause):
            out.append(("math", s, e))
        i = e
    for k, (kind, start, end) in enumerate(out):  # "a = b", "x = ab" are mathematics, "a total of" is not
        if kind == "ambiguous":
            near = {out[j][0] for j in (k - 1, k + 1) if 0 <= j < len(out)}
            alone = not near and end - start == 1
            out[k] = ("value" if "join" in near or alone else "word", start, end)
    return out


def clause_answer(clause: str, *, lead: str, number_words: bool = False) -> str | None:
    """The answer a clause gives, or None (module docstring).

    lead: "none" (only the value, e.g. a last line), "free" (any lead words but a negation
    or condition, e.g. after "the answer is"), "marked" (as "free", and the value must be
    a math span or follow a concluding word: a final sentence with no answer phrase).
    """
    pieces = _pieces(clause.strip().rstrip("."), number_words)
    values = [k for k, (kind, _, _) in enumerate(pieces) if kind in ("value", "math")]
    if not values:
        return None
    first, last = values[0], values[-1]
    if any(kind == "word" for kind, _, _ in pieces[first:last]):
        return None  # two values apart: "3 groups of 4"
    while first > 0 and pieces[first - 1][0] == "join":
        first -= 1
    if last + 1 < len(pieces) and pieces[last + 1][0] == "join":
        return None  # "x = <words>": the formula runs on into prose
    text = clause.strip().rstrip(".")
    lead_words = [text[s:e].lower().strip(",") for kind, s, e in pieces[:first] if text[s:e] != ","]
    trail = [text[s:e].lower().strip(",") for kind, s, e in pieces[last + 1 :] if text[s:e] != ","]
    if lead == "none" and (lead_words or len(trail) > 3 or (trail and first == last and pieces[first][0] == "word")):
        return None
    if trail and trail[-1] in _DANGLING:
        return None  # "Thus 12 is", "The answer is 12 for the": the sentence never ended
    if set(lead_words[-3:]) & (_NOT_AROUND | TENTATIVE) or set(trail) & _STOP_AFTER or len(trail) > MAX_TRAILING_WORDS:
        return None
    if not all(re.fullmatch(r"[^\W\d_][\w'-]*(?:\^\{?\d\}?|[\u00b2\u00b3])?|[:\u2014-]", w) for w in lead_words + trail):
        return None  # code or symbols around the value: print("Answer:", 12)
    end = pieces[last][2]
    if trail and all(re.sub(r"\^\{?\d\}?|[\u00b2\u00b3]", "", w) in UNITS for w in trail):
        end = pieces[-1][2]  # "10 square units", "2 kg": the unit is part of the answer
    answer = _UNIT_SPLIT.sub(lambda m: m.group(1) + " " + m.group(2) if m.group(2).rstrip("\u00b2\u00b3") in UNITS
                             else m.group(0), text[pieces[first][1] : end])
    if sum(answer.count(c) for c in "([") != sum(answer.count(c) for c in ")]") or answer.count("{") != answer.count("}"):
        return None
    if lead == "marked":
        marked = any(kind == "math" for kind, _, _ in pieces[first : last + 1])
        if not (marked or _CONNECTIVE.match(text.lstrip())):
            return None
    return answer.strip(" ,") or None


def _boundaries(text: str, first_only: bool) -> list[int]:
    """Sentence ends of text in one pass (see `sentence_end`)."""
    spans = {s: e for s, e, _ in math_spans(text)}
    out, i, n = [], 0, len(text)
    while i < n:
        if i in spans:
            i = spans[i]
            continue
        c = text[i]
        if (c == "\n" and _line_ends_sentence(text, i)) or c in "!?" or (
                c == "." and (i + 1 == n or not text[i + 1].isdigit())):
            out.append(i)
            if first_only:
                break
        i += 1
    return out


def _line_ends_sentence(text: str, i: int) -> bool:
    """Does the line break at text[i] end a sentence? Not before display math ("... is\\n\\[
    12 \\]") nor after an unfinished line ("The total is\\n12"); after punctuation, a math
    span or a blank line, and before a list item, a heading or a capital letter, it does."""
    after = text[i + 1 : i + 40]
    if re.match(r"\s*(?:\$\$|\\\[)", after):
        return False
    before = text[max(0, i - 80) : i].rstrip(" \t")
    return (not before or before[-1] in ".!?:;\n" or before.endswith(("$", "\\]", "\\)", "**", "}"))
            or re.match(r"[ \t]*(?:\n|[-*#>|]|\d+[.)]\s|[A-Z])", after) is not None)


def sentence_end(text: str) -> int:
    """The end of text's first sentence: a period that is not a decimal point, "!", "?" or a
    line break, outside math spans; a line break before display math ("... is\n\\[ 12 \\]")
    does not end it."""
    ends = _boundaries(text[:MAX_ANSWER_CHARS * 4], first_only=True)
    return ends[0] if ends else len(text)


def final_sentence(text: str) -> str:
    """The last sentence of text (of its last 4 * MAX_ANSWER_CHARS), trailing punctuation
    left out."""
    text = text[-4 * MAX_ANSWER_CHARS :].rstrip().rstrip(".!").rstrip()
    ends = _boundaries(text, first_only=False)
    return text[ends[-1] + 1 :] if ends else text
