"""Cheap, pure-Python answer normalisation: the fast path before math-verify.

Two things, both safe on hostile text (regexes are linear, no evaluation of any kind):

- :func:`canonical` — a spacing/markup-insensitive string (``\\dfrac``→``\\frac``, ``\\left(``→``(``,
  ``\\text{x}``→``x``, no ``$``/spaces/thin spaces). Equal canonical strings are equivalent answers.
- :func:`parse_number` — the exact value of a plain number written in any usual way:
  ``-12``, ``27.0``, ``1,000``, ``10,\\!080``, ``\\$18.90``, ``.35``, ``4.5e33``, ``3\\times 10^{8}``,
  ``\\frac{3}{4}``, ``\\dfrac34``, ``3/4``, ``1\\frac{4}{5}`` (mixed number), ``30^\\circ``, ``25\\%``,
  ``5 \\text{ cm}``, ``x = 5``. Returns a :class:`NumberValue` or ``None`` when the text is not
  (only) a number — then the caller falls back to math-verify.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

MAX_DIGITS = 60  # longer digit strings are not compared numerically (no giant integers)
MAX_EXPONENT = 400  # |e| bound for scientific notation handled here

_SPACES = re.compile(r"\\[,;:! ]|\\quad|\\qquad|~|\s+")
_TEXT_WORDS = r"text|textbf|textit|textnormal|textrm|textup|mathrm|mbox|operatorname"
_TEXT_CMD = re.compile(rf"\\(?:{_TEXT_WORDS})\s*\{{([^{{}}]*)\}}")
# A comma followed by a space between digits separates list items ("32, 349" is two numbers, as
# math-verify reads it); without a space ("32,349") or with "\!" ("10,\!080") it groups thousands.
_LIST_COMMA = re.compile(r"(?<=\d),(?:\s|~|\\[ ;:]|\\q?quad(?![A-Za-z]))+(?=\d)")
_LIST_MARK = "\x01"
_CMD_THEN_LETTER = re.compile(r"(\\[A-Za-z]+)\s+(?=[A-Za-z])")
_DELIMS = re.compile(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big|displaystyle)(?![A-Za-z])")
_FRAC_SHORT = re.compile(r"\\frac(\d)(\d)")  # \frac34 -> \frac{3}{4}
_FRAC_HALF = re.compile(r"\\frac\{([^{}]*)\}(\d)")  # \frac{270}7 -> \frac{270}{7}

# Number patterns (applied to a canonical string: no spaces, no \text, no $).
_INT = r"\d+"
_DEC = r"(?:\d+\.\d*|\.\d+|\d+)"
_THOUSANDS = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?"
_REAL = rf"(?:{_THOUSANDS}|{_DEC})"
_SCI = re.compile(rf"^(?P<m>{_REAL})(?:[eE](?P<e1>[-+]?\d+)|(?:\\times|\\cdot|\*)10\^\{{?(?P<e2>[-+]?\d+)\}}?)?$")
_FRAC = re.compile(rf"^\\frac\{{(?P<n>-?{_REAL})\}}\{{(?P<d>-?{_REAL})\}}$")
_SLASH = re.compile(rf"^(?P<n>{_REAL})/(?P<d>{_REAL})$")
_MIXED = re.compile(rf"^(?P<w>{_INT})\\frac\{{(?P<n>{_INT})\}}\{{(?P<d>{_INT})\}}$")
_DEGREES = re.compile(r"(?:\^\{?\\circ\}?|°|\\degree|\^\{\\circ\}|degrees?)$")
_PERCENT = re.compile(r"(?:\\%|%|percent)$")
_CURRENCY = re.compile(r"^(?:\\\$|\$|dollars?)|(?:dollars?|cents?)$")
_ASSIGN = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?=")  # "x=" / "n_1=" prefix
# Trailing units, matched on the raw answer: "\text{ cm}^2", "\mbox{ inches}", or a word of two or
# more letters after a space ("18 dollars"). "2ab" or "5x" are not numbers with units.
_UNIT_POWER = r"(?:\^\{?-?\d+\}?)?"
_UNIT_SUFFIX = re.compile(
    rf"(?:\s*\\(?:{_TEXT_WORDS})\s*\{{[^{{}}]*\}}{_UNIT_POWER}"
    rf"|\s+[A-Za-z]{{2,}}{_UNIT_POWER}(?:/[A-Za-z]+{_UNIT_POWER})?)\s*\.?$"
)


@dataclass(frozen=True)
class NumberValue:
    """An exact number; ``percent`` marks a value written as ``N%`` (also equal to N/100)."""

    value: Fraction
    percent: bool = False
    integer_literal: bool = False  # written without a decimal point or fraction


def _unwrap_text(s: str) -> str:
    # \text{(C)} -> (C); repeated for nested use such as \text{\textbf{x}}.
    for _ in range(4):
        new = _TEXT_CMD.sub(r"\1", s)
        if new == s:
            break
        s = new
    return s


def canonical(answer: str) -> str:
    """Spacing- and markup-insensitive form of an answer (see module docstring)."""
    s = answer.strip()
    if len(s) >= 2 and s[0] == "$" and s[-1] == "$":
        s = s.strip("$")
    s = s.replace("\\\\", "\x00")  # protect the row separator "\\" from the control-space rule
    s = _LIST_COMMA.sub(_LIST_MARK, s)  # keep "32, 349" apart from "32,349"
    s = _DELIMS.sub("", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _unwrap_text(s)
    s = _CMD_THEN_LETTER.sub(r"\1{}", s)  # "\cot x" -> "\cot{}x": dropping the space must not merge tokens
    s = _SPACES.sub("", s).replace("\x00", "\\\\").replace(_LIST_MARK, ", ")
    s = _FRAC_SHORT.sub(r"\\frac{\1}{\2}", s)
    s = _FRAC_HALF.sub(r"\\frac{\1}{\2}", s)
    s = s.rstrip(".")
    return s


def _real(text: str) -> Fraction | None:
    text = text.replace(",", "")
    if len(text) > MAX_DIGITS:
        return None
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def _plain_number(s: str) -> tuple[Fraction, bool] | None:
    """Value and "written as an integer" for a canonical string that is only a number."""
    sign = 1
    if s.startswith("-"):
        sign, s = -1, s[1:]
    elif s.startswith("+"):
        s = s[1:]
    if not s:
        return None
    if m := _SCI.match(s):
        mant = _real(m["m"])
        exp_text = m["e1"] or m["e2"]
        if mant is None:
            return None
        if exp_text is None:
            return sign * mant, "." not in m["m"]
        exp = int(exp_text)
        if abs(exp) > MAX_EXPONENT:
            return None
        return sign * mant * Fraction(10) ** exp, False
    for pattern in (_FRAC, _SLASH):
        if m := pattern.match(s):
            num, den = _real(m["n"].lstrip("-")), _real(m["d"].lstrip("-"))
            if num is None or den is None or den == 0:
                return None
            negs = m["n"].startswith("-") + m["d"].startswith("-")
            return sign * (-1) ** negs * num / den, False
    if m := _MIXED.match(s):
        whole, num, den = int(m["w"]), int(m["n"]), int(m["d"])
        if den == 0 or len(s) > MAX_DIGITS:
            return None
        return sign * (whole + Fraction(num, den)), False
    return None


def parse_number(answer: str) -> NumberValue | None:
    """Exact value of ``answer`` if it is just a number (with usual decorations), else ``None``."""
    if len(answer) > 4 * MAX_DIGITS:
        return None
    raw = answer.strip()
    for _ in range(4):  # "10 \mathrm{kcal} \mathrm{m}^{-2}" has several unit parts
        stripped = _UNIT_SUFFIX.sub("", raw, count=1)
        if stripped == raw or not re.search(r"\d", stripped):
            break
        raw = stripped
    s = canonical(raw)
    s = _ASSIGN.sub("", s, count=1)
    s = _CURRENCY.sub("", s).strip()
    percent = False
    if _PERCENT.search(s):
        percent, s = True, _PERCENT.sub("", s)
    s = _DEGREES.sub("", s)
    s = s.rstrip(".") if not s.endswith("..") else s
    parsed = _plain_number(s)
    if parsed is None:
        return None
    value, integer_literal = parsed
    return NumberValue(value=value, percent=percent, integer_literal=integer_literal)


# One greedy run of digits and capitals, then the subscript: linear (``[0-9A-Z]*\d[0-9A-Z]*`` was
# quadratic on a long digit string); "holds a digit" is checked apart. Longer numerals are no answers.
_BASE_NUMBER = re.compile(r"^(?P<digits>[0-9A-Z]+)_\{?(?P<base>\d{1,2})\}?$")
MAX_BASE_NUMERAL_CHARS = 2 * MAX_DIGITS


def base_number(answer: str) -> tuple[str, int] | None:
    """``("204", 5)`` for a numeral with its base as subscript (``204_5``, ``204_{5}``), else ``None``.

    The digits must be valid in that base (2..36); upper-case letters are digits above 9.
    """
    if len(answer) > 4 * MAX_BASE_NUMERAL_CHARS:
        return None
    m = _BASE_NUMBER.match(canonical(answer))
    if m is None or len(m["digits"]) > MAX_BASE_NUMERAL_CHARS or not any(c.isdigit() for c in m["digits"]):
        return None
    digits, base = m["digits"].lstrip("0") or "0", int(m["base"])
    if not 2 <= base <= 36:
        return None
    try:
        int(digits, base)
    except ValueError:
        return None
    return digits, base


def same_base_number(gold: str, pred: str) -> bool | None:
    """Verdict when either side is a numeral with a base subscript, else ``None``.

    ``204_5`` = ``204_{5}`` = ``204`` (the question names the base), ``204_5`` != ``204_6``
    (another base) and != ``54`` (its decimal value: the question asks for the base-5 numeral).
    """
    gold_base, pred_base = base_number(gold), base_number(pred)
    if gold_base is None and pred_base is None:
        return None
    if gold_base is not None and pred_base is not None:
        return gold_base == pred_base
    digits = (gold_base or pred_base)[0]
    bare = canonical(pred if gold_base is not None else gold)
    return bare.isdigit() and (bare.lstrip("0") or "0") == digits


def numbers_equal(gold: NumberValue, pred: NumberValue, rel_tol: float = 1e-6) -> bool:
    """Numeric equality: exact for two integers; else within a relative tolerance ``rel_tol``.

    The tolerance is relative only, so tiny magnitudes (``1e-8`` vs ``2e-8``, common in Minerva)
    stay distinct; ``0.333333`` still matches ``1/3``.

    A percentage also matches its fraction (``25%`` ~ ``0.25``), in both directions.
    """
    candidates_gold = [gold.value] + ([gold.value / 100] if gold.percent else [])
    candidates_pred = [pred.value] + ([pred.value / 100] if pred.percent else [])
    for a in candidates_gold:
        for b in candidates_pred:
            if a == b:
                return True
            if a.denominator == 1 and b.denominator == 1:
                continue  # two integers: exact only (70000 != 70001)
            diff = abs(a - b)
            if diff <= Fraction(str(rel_tol)) * max(abs(a), abs(b)):
                return True
    return False
