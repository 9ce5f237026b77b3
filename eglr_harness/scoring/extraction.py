"""Pull the final answer out of a model's text.

Order of attempts (the first that yields a non-empty answer wins):

1. the final *complete* ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\framebox{...}`` (balanced
   braces; ``\\{`` and ``\\}`` are literal braces and do not count), together with the boxes
   just before it that belong to the same answer (:func:`final_boxed`): ``$\\boxed{-2}$ and
   $\\boxed{1}$`` is the list ``-2, 1``. A truncated last box (generation cut off inside it) is
   skipped, so an earlier complete box is used. ``\\boxed 5`` (no braces) takes the next token.
2. "final answer is X" / "the answer is X" / "answer: X" (the last such phrase; see
   :func:`phrase_answer` for how X is narrowed to the math span or the last number; in
   ``number`` mode, the last number of the sentence after the phrase).
3. ``number`` mode only (GSM8K, the demo task): the GSM8K reference marker ``#### X``, then the
   last number in the text.

Box or phrase. A box wins over an answer phrase, with one exception: a "final answer" phrase
("The final answer is $X$", "Final Answer: ...") written *after* the last box is the model's last
word and wins when it yields an answer. This is math-verify's order too (its "final answer is"
patterns outrank or tie with boxes, and among ties the rightmost match wins); "the answer is" /
"answer:" after a box do not override it.

Nothing found -> ``None``: the invalid answer, which never wins a vote and is never correct.
Every step is a linear scan (no backtracking regex over the whole text), so hostile outputs
(10k nested braces, megabytes of text) are handled in linear time.
"""

from __future__ import annotations

import re
from typing import NamedTuple

ANSWER_MODES = ("math", "number")
MAX_ANSWER_CHARS = 2000  # longer spans are not answers; they are cut off to keep checks cheap

_BOX_COMMANDS = re.compile(r"\\(?:boxed|fbox|framebox)(?![A-Za-z])")
_ANSWER_PHRASE = re.compile(
    r"(?P<final>final\s+answer(?:\s+is)?)\s*:?\s*|(?:the\s+answer\s+is|answer\s*:)\s*:?\s*", re.IGNORECASE
)
_GSM8K_MARKER = re.compile(r"####\s*")
# Several boxes are one answer when this close (math-verify's rule, see final_boxed).
_BOX_GAP_ANY = 10
_BOX_GAP_SEPARATED = 70
_BOX_SEPARATOR = re.compile(r"\b(?:and|or)\b|,|;")
_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
_LATEX_COMMAND = re.compile(r"\\(?:[A-Za-z]+|.)")
_PROSE_WORD = re.compile(r"[A-Za-z]{2,}")
_CONNECTIVE = re.compile(r"\s*,?\s*\b(?:and|or)\b\s*")
_DANGLING_GROUP = re.compile(r"\\[A-Za-z]+\s*\{\s*$")
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


class _Box(NamedTuple):
    start: int  # index of the backslash of \boxed
    end: int  # index just after the box
    content: str


def _boxes(text: str) -> list[_Box]:
    """Every complete box of ``text`` in text order (truncated ones left out), content stripped."""
    found: list[_Box] = []
    starts = [(m.start(), m.end()) for m in _BOX_COMMANDS.finditer(text)]
    if not starts:
        return found
    pairs = match_braces(text)
    for command, start in starts:
        j = start
        while j < len(text) and text[j] in " \t":
            j += 1
        if j < len(text) and text[j] == "{":
            end = pairs.get(j)
            if end is None:
                continue  # truncated box (generation cut off inside it)
            found.append(_Box(command, end + 1, text[j + 1 : end].strip()))
        elif j > start:  # "\boxed 5": the next token
            m = re.match(r"[^\s$]+", text[j : j + MAX_ANSWER_CHARS])
            if m:
                found.append(_Box(command, j + m.end(), m.group(0).rstrip(".,;")))
    return found


def last_boxed(text: str) -> str | None:
    """Content of the last complete, non-empty ``\\boxed{}`` (or ``\\fbox``/``\\framebox``), else ``None``."""
    for box in reversed(_boxes(text)):
        if box.content:
            return box.content
    return None


def _joins(between: str, earlier: str, later: str) -> bool:
    """Whether two boxes separated by ``between`` hold parts of one answer (math-verify's rule)."""
    if len(between) < _BOX_GAP_ANY:
        return True
    return earlier != later and len(between) < _BOX_GAP_SEPARATED and bool(_BOX_SEPARATOR.search(between))


def _final_box_group(text: str) -> list[_Box]:
    """The last complete non-empty box and the boxes just before it that belong to the same answer."""
    boxes = [box for box in _boxes(text) if box.content]
    if not boxes:
        return []
    group = [boxes[-1]]
    for earlier in reversed(boxes[:-1]):
        later = group[-1]
        if earlier.end > later.start:  # nested (\boxed{\boxed{5}}): the inner box alone is the answer
            break
        if not _joins(text[earlier.end : later.start], earlier.content, later.content):
            break
        group.append(earlier)
    group.reverse()
    return group


def final_boxed(text: str) -> str | None:
    """The final boxed answer: one box, or the list of several boxes that together give it.

    Boxes are read as one answer when they are less than 10 characters apart, or less than 70
    apart with ``and`` / ``or`` / ``,`` / ``;`` between them and different contents -- the rule of
    math-verify's box extraction (``latex2sympy2_extended``'s ``extract_boxed_content``), so
    ``$\\boxed{-2}$ \\quad\\text{and}\\quad $\\boxed{1}$`` is ``-2, 1``. Repeated equal boxes count
    once. Parts are joined with ``", "`` (not ``","``): ``\\boxed{32}, \\boxed{349}`` is the list
    ``32, 349``, never the number 32,349. ``None`` when there is no complete non-empty box.
    """
    return _join_boxes(_final_box_group(text))


def _join_boxes(group: list[_Box]) -> str | None:
    contents: list[str] = []
    for box in group:
        if not contents or contents[-1] != box.content:
            contents.append(box.content)
    return ", ".join(contents) if contents else None


def _find_unescaped(text: str, token: str, start: int) -> int:
    """Index of the first ``token`` at or after ``start`` not preceded by a backslash (``\\$``), else -1."""
    i = text.find(token, start)
    while i > 0 and text[i - 1] == "\\":
        i = text.find(token, i + 1)
    return i


def _math_spans(text: str) -> list[tuple[int, int, str]]:
    """``(start, end, content)`` of the closed ``$..$`` / ``$$..$$`` / ``\\(..\\)`` / ``\\[..\\]`` spans."""
    spans = []
    i = 0
    while i < len(text):
        for left, right in _DELIMITERS:
            if text.startswith(left, i) and not (i > 0 and text[i - 1] == "\\" and left[0] == "$"):
                close = _find_unescaped(text, right, i + len(left))
                if close < 0:
                    return spans  # unclosed: nothing after it is a span
                spans.append((i, close + len(right), text[i + len(left) : close].strip()))
                i = close + len(right)
                break
        else:
            i += 1
    return spans


def _unwrap_spans(text: str) -> str:
    """``text`` with every math span replaced by its content (``"$-2$ and $1$"`` -> ``"-2 and 1"``)."""
    out, last = [], 0
    for start, end, content in _math_spans(text):
        out += [text[last:start], content]
        last = end
    return ("".join(out) + text[last:]).strip()


def _clean_piece(piece: str) -> str:
    piece = _DANGLING_GROUP.sub("", piece.strip())  # "5 \text{" left before the unit word "cm}"
    piece = _CONNECTIVE.sub(", ", piece.strip(" \t,;:"))  # "-2 and 1" -> "-2, 1"
    piece = _unwrap_spans(piece).strip(" \t,;:")
    return "" if not piece.strip("$") else piece  # an empty span "$$" is no answer


def _mathy(piece: str) -> bool:
    """Holds a digit, a math span or a command, and balanced braces ("}^2" of "\text{ cm}^2" is not)."""
    braces = sum(1 if c == "{" else -1 if c == "}" else 0 for c in re.sub(r"\\[{}]", "", piece))
    return braces == 0 and bool(re.search(r"\d|\$|\\[A-Za-z(\[]", piece))


def narrow_answer(sentence: str) -> str | None:
    """The answer inside the sentence that follows an answer phrase, or ``None`` (see below).

    Prose words (two or more letters, outside math spans and LaTeX commands; ``and``/``or`` are
    list separators, not prose) cut the sentence into pieces:

    - text before the first prose word is the answer (``$5$ apples`` -> ``5``, ``$-2$ and $1$``
      -> ``-2, 1``, ``5 \\text{ cm}^2`` -> ``5``, ``x \\in [-2,7]`` whole);
    - a single word and nothing else is a text answer (``Evelyn``);
    - otherwise the last piece holding math (a digit, a span, a command):
      ``The largest $n$ is 34`` -> ``34``, ``therefore \\frac{1}{2}`` -> ``\\frac{1}{2}``;
    - no such piece (``boxed above``) -> ``None``.
    """
    text = sentence.strip().rstrip(".").strip()
    if not text:
        return None
    masked = list(text)
    for start, end, _ in _math_spans(text):
        masked[start:end] = " " * (end - start)
    masked_text = _LATEX_COMMAND.sub(lambda m: " " * len(m.group(0)), "".join(masked))
    words = [m for m in _PROSE_WORD.finditer(masked_text) if m.group(0).lower() not in ("and", "or")]
    if not words:
        return _clean_piece(text) or None
    head = _clean_piece(text[: words[0].start()])
    if head:
        return head
    if len(words) == 1 and not re.search(r"\d|\$", text):
        return text  # a one-word answer: "Evelyn", "\text{east}"
    bounds = [0] + [b for w in words for b in (w.start(), w.end())] + [len(text)]
    pieces = [text[bounds[k] : bounds[k + 1]] for k in range(0, len(bounds), 2)]
    for piece in reversed(pieces):
        if _mathy(piece) and (answer := _clean_piece(piece)):
            return answer
    return None


def _last_phrase(text: str) -> re.Match | None:
    last = None
    for m in _ANSWER_PHRASE.finditer(text):
        last = m
    return last


def phrase_answer(text: str) -> str | None:
    """The answer written after the last "final answer is" / "the answer is" / "answer:".

    A math span right after the phrase is the answer; else the sentence after it (to ``". "``
    or the end of the line) narrowed by :func:`narrow_answer`.
    """
    last = _last_phrase(text)
    return None if last is None else _answer_after(text, last)


def _sentence_after(text: str, phrase: re.Match) -> str:
    """The sentence after an answer phrase: a math span right after it (plus the rest of its
    sentence), else the text up to ``". "`` or the end of the line."""
    rest = text[phrase.end() : phrase.end() + MAX_ANSWER_CHARS]
    line = rest.split("\n", 1)[0]
    spans = _math_spans(line)
    if spans and spans[0][0] == 0:
        return line[: spans[0][1]] + line[spans[0][1] :].split(". ", 1)[0]
    return re.split(r"\.\s", line, maxsplit=1)[0]


def _answer_after(text: str, phrase: re.Match) -> str | None:
    return narrow_answer(_sentence_after(text, phrase))


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
    group = _final_box_group(text)
    answer = _join_boxes(group)
    phrase = _last_phrase(text)
    if phrase is not None and (answer is None or (phrase["final"] and phrase.start() >= group[-1].end)):
        # No box, or a "final answer" phrase after the last box (module docstring).
        if mode == "number":
            # "the answer is 18 dollars" / "answer: 13 + 99 = 140" -> the sentence's last number
            # (a computation ends in its result); a phrase without any number ("the answer is
            # below") is no answer in number mode.
            said = _last_number(_sentence_after(text, phrase))
        else:
            said = _answer_after(text, phrase)
        answer = said or answer
    if answer is None and mode == "number":
        answer = _number_answer(text)
    if answer is None:
        return None
    answer = answer.strip()
    if len(answer) > MAX_ANSWER_CHARS:
        answer = answer[:MAX_ANSWER_CHARS]
    return answer or None
