"""Are two final answers the same? Cheap checks first, math-verify under a hard time limit last.

Steps of :func:`is_equivalent` (the first that decides wins):

1. ``None`` / empty on either side -> not equivalent (an invalid answer is never correct).
2. Equal :func:`~eglr_harness.scoring.normalize.canonical` strings -> equivalent.
3. A numeral with a base subscript on either side (``204_5``) -> same digits and base
   (:func:`~eglr_harness.scoring.normalize.same_base_number`); math-verify drops the subscript.
4. Both sides plain numbers (:func:`~eglr_harness.scoring.normalize.parse_number`) -> numeric
   comparison: exact for two integers (``27`` = ``27.0``, ``70000`` ≠ ``70001``), within 1e-6
   relative otherwise; ``25\\%`` also matches ``0.25``. ``32, 349`` (comma and space) is a
   list, not the number 32349; ``32,349`` is.
5. Too long / too deeply nested / too explosive for a symbolic check (:func:`symbolic_check_allowed`)
   -> not equivalent.
6. math-verify ``parse`` + ``verify`` (LaTeX path only; see :mod:`.verify_worker`) in a worker
   process with a hard wall-clock limit (``timeout_s``, default :data:`DEFAULT_TIMEOUT_S`):
   intervals, tuples, sets, matrices, radicals, ``\\pi``, complex numbers, equations ``x = 5`` ...
   Two numeric constants (``\\frac{\\sqrt3}{3}`` vs ``2\\sqrt3``) are compared by value there,
   without ``verify``. No verdict in time -> not equivalent.

Verdicts are cached per (gold, pred). Nothing here evaluates the text as code.
"""

from __future__ import annotations

import atexit
import re
import threading
from functools import lru_cache

from eglr_harness.scoring.normalize import canonical, numbers_equal, parse_number, same_base_number

DEFAULT_TIMEOUT_S = 5.0
MAX_SYMBOLIC_CHARS = 400  # real answers are short; longer ones are compared as strings only
MAX_SYMBOLIC_DEPTH = 12  # brace / parenthesis nesting
MAX_EXPONENT_DIGITS = 4  # ^{12345} or deeper towers are not expanded symbolically

_EXPONENT = re.compile(r"\^\s*\{?\s*-?\s*(\d+)")
_TOWER = re.compile(r"\^\s*\{[^{}]*\^")
_BIG_FACTORIAL = re.compile(r"\d{4,}\s*\)?\s*!|\([^()]*\^[^()]*\)\s*!|\}\s*!")

_TEXT_SUBSCRIPT = re.compile(r"_\{\s*\\(?:text|mathrm)\s*\{([^{}]*)\}\s*\}")
_PRIME = re.compile(r"([A-Za-z])('+)")

_worker = None
_worker_lock = threading.Lock()


def _get_worker():
    global _worker
    with _worker_lock:
        if _worker is None:
            from eglr_harness.scoring.verify_worker import MathVerifyWorker

            _worker = MathVerifyWorker()
            atexit.register(_worker.close)
        return _worker


def shutdown_worker() -> None:
    """Stop the math-verify worker process (it restarts on the next symbolic check)."""
    if _worker is not None:
        _worker.close()


def _nesting_depth(text: str) -> int:
    depth = best = 0
    for ch in text:
        if ch in "{([":
            depth += 1
            best = max(best, depth)
        elif ch in "})]" and depth:
            depth -= 1
    return best


def symbolic_check_allowed(answer: str) -> bool:
    """Whether ``answer`` is small and tame enough to hand to sympy at all.

    Refused: more than :data:`MAX_SYMBOLIC_CHARS` characters, nesting deeper than
    :data:`MAX_SYMBOLIC_DEPTH`, an exponent of more than :data:`MAX_EXPONENT_DIGITS` digits, an
    exponent tower (``a^{b^{c}}``) or a factorial of a 4+-digit number or a group (``(10^{100})!``).
    """
    if len(answer) > MAX_SYMBOLIC_CHARS or _nesting_depth(answer) > MAX_SYMBOLIC_DEPTH:
        return False
    if _TOWER.search(answer) or _BIG_FACTORIAL.search(answer):
        return False
    return all(len(m.group(1)) <= MAX_EXPONENT_DIGITS for m in _EXPONENT.finditer(answer))


def _for_math_verify(answer: str) -> str:
    """Light clean-up for the LaTeX parser: no currency sign, thin spaces or outer ``$``."""
    text = answer.strip()
    if len(text) >= 2 and text[0] == "$" and text[-1] == "$":
        text = text.strip("$")
    text = text.replace("\\$", "").replace("\\!", "").replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = _TEXT_SUBSCRIPT.sub(r"_{\1}", text)  # \lambda_{\text {red}} -> \lambda_{red}
    text = _PRIME.sub(lambda m: m[1] + "^{" + "\\prime" * len(m[2]) + "}", text)  # y'' -> y^{\prime\prime}
    return text.strip()


@lru_cache(maxsize=1 << 16)
def _cached_verdict(gold: str, pred: str, timeout_s: float) -> bool:
    if canonical(gold) == canonical(pred):
        return True
    based = same_base_number(gold, pred)
    if based is not None:
        return based
    gold_num, pred_num = parse_number(gold), parse_number(pred)
    if gold_num is not None and pred_num is not None:
        return numbers_equal(gold_num, pred_num)
    if not (symbolic_check_allowed(gold) and symbolic_check_allowed(pred)):
        return False
    verdict = _get_worker().check(_for_math_verify(gold), _for_math_verify(pred), timeout_s)
    return bool(verdict)


def is_equivalent(gold: str | None, pred: str | None, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Whether answer ``pred`` is mathematically the same as ``gold`` (see module docstring).

    Both are *extracted* answers (e.g. ``"\\\\frac{1}{2}"``), not whole model outputs. The check is
    not symmetric in edge cases (math-verify treats ``gold`` as the reference). Safe to call from
    any thread; returns within about ``timeout_s`` seconds for any input.
    """
    if timeout_s <= 0:
        raise ValueError(f"`timeout_s`={timeout_s!r} must be > 0 seconds (e.g. {DEFAULT_TIMEOUT_S}).")
    if gold is None or pred is None:
        return False
    gold, pred = str(gold), str(pred)
    if not gold.strip() or not pred.strip():
        return False
    return _cached_verdict(gold, pred, float(timeout_s))
