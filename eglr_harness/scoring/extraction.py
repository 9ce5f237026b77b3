"""Pull the final answer out of a model's text.

Order of attempts (the first that yields a non-empty answer wins):

1. the last *complete* ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\framebox{...}`` (balanced
   braces; ``\\{`` and ``\\}`` are literal braces and do not count). A truncated last box
   (generation cut off inside it) is skipped, so an earlier complete box is used. ``\\boxed 5``
   (no braces) takes the next token.
2. "final answer is X" / "the answer is X" / "answer: X" (the last such phrase; X is the math
   span ``$...$`` / ``\\(...\\)`` right after it, else the rest of the sentence; in ``number``
   mode, the last number of X).
3. ``number`` mode only (GSM8K, the demo task): the GSM8K reference marker ``#### X``, then the
   last number in the text.

Nothing found -> ``None``: the invalid answer, which never wins a vote and is never correct.
Every step is a linear scan (no backtracking regex over the whole text), so hostile outputs
(10k nested braces, megabytes of text) are handled in linear time.
"""

from __future__ import annotations

import re

ANSWER_MODES = ("math", "number")
MAX_ANSWER_CHARS = 2000  # longer spans are not answers; they are cut off to keep checks cheap

_BOX_COMMANDS = re.compile(r"\\(?:boxed|fbox|framebox)(?![A-Za-z])")
_ANSWER_PHRASE = re.compile(
    r"(?:final\s+answer(?:\s+is)?|the\s+answer\s+is|answer\s*:)\s*:?\s*", re.IGNORECASE
)
_GSM8K_MARKER = re.compile(r"####\s*")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def match_braces(text: str) -> dict[int, int]:
    """Map the index of every ``{`` that opens a closed group to the index of its ``}``.

    Control symbols (``\\{``, ``\\}``, ``\\\\``) are skipped. One pass with a stack: O(len).
    """
    pairs: dict[int, int] = {}
    stack: list[int] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2  # \{ \} \\ \$ ... are single symbols; letters after \ are harmless anyway
            continue
        if ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            pairs[stack.pop()] = i
        i += 1
    return pairs


def last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{}`` (or ``\\fbox``/``\\framebox``), else ``None``."""
    starts = [m.end() for m in _BOX_COMMANDS.finditer(text)]
    if not starts:
        return None
    pairs = match_braces(text)
    for start in reversed(starts):
        j = start
        while j < len(text) and text[j] in " \t":
            j += 1
        if j < len(text) and text[j] == "{":
            end = pairs.get(j)
            if end is None:
                continue  # truncated box: try an earlier one
            content = text[j + 1 : end].strip()
        elif j > start:  # "\boxed 5": the next token
            m = re.match(r"[^\s$]+", text[j : j + MAX_ANSWER_CHARS])
            content = m.group(0).rstrip(".,;") if m else ""
        else:
            continue
        if content:
            return content
    return None


def _strip_math_delimiters(span: str) -> str:
    span = span.strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if span.startswith(left) and span.endswith(right) and len(span) >= len(left) + len(right):
            return span[len(left) : len(span) - len(right)].strip()
    return span


def _find_unescaped(text: str, token: str, start: int) -> int:
    """Index of the first ``token`` at or after ``start`` not preceded by a backslash (``\\$``), else -1."""
    i = text.find(token, start)
    while i > 0 and text[i - 1] == "\\":
        i = text.find(token, i + 1)
    return i


def _phrase_answer(text: str) -> str | None:
    """The answer written after the last "final answer is" / "the answer is" / "answer:"."""
    last = None
    for m in _ANSWER_PHRASE.finditer(text):
        last = m
    if last is None:
        return None
    rest = text[last.end() : last.end() + MAX_ANSWER_CHARS]
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if rest.startswith(left):
            close = _find_unescaped(rest, right, len(left))
            if close > len(left):
                return rest[len(left) : close].strip() or None
            break
    line = rest.split("\n", 1)[0]
    # End of sentence: ". " followed by text, or a final period.
    sentence = re.split(r"\.\s", line, maxsplit=1)[0].strip()
    sentence = _strip_math_delimiters(sentence.rstrip(".").strip())
    return sentence or None


def _last_number(text: str) -> str | None:
    """The last number in ``text``, commas removed (``"$70,000."`` -> ``"70000"``)."""
    last = None
    for m in _NUMBER.finditer(text):
        last = m
    if last is None:
        return None
    return last.group(0).replace(",", "").rstrip(".") or None


def _number_answer(text: str) -> str | None:
    """GSM8K's ``#### X`` marker, else the last number in the text."""
    marker = None
    for m in _GSM8K_MARKER.finditer(text):
        marker = m
    if marker is not None:
        m = _NUMBER.match(text, marker.end())
        if m:
            return m.group(0).replace(",", "").rstrip(".")
    return _last_number(text)


def extract_answer(text: str | None, mode: str = "math") -> str | None:
    """Extract the final answer from ``text`` (see module docstring); ``None`` if there is none.

    Args:
        text: a model output (or a reference solution).
        mode: ``"math"`` (boxed, then answer phrases) or ``"number"`` (also ``####`` and the last
            number; GSM8K and the demo task).
    """
    if mode not in ANSWER_MODES:
        raise ValueError(f"`mode`={mode!r} is not an answer mode; allowed: {', '.join(ANSWER_MODES)}.")
    if not text:
        return None
    answer = last_boxed(text)
    if answer is None:
        answer = _phrase_answer(text)
        if answer is not None and mode == "number":
            # "the answer is 18 dollars" / "answer: 13 + 99 = 140" -> its last number; a phrase
            # without any number ("the answer is below") is no answer in number mode.
            answer = _last_number(answer)
    if answer is None and mode == "number":
        answer = _number_answer(text)
    if answer is None:
        return None
    answer = answer.strip()
    if len(answer) > MAX_ANSWER_CHARS:
        answer = answer[:MAX_ANSWER_CHARS]
    return answer or None
