"""math-verify in a child process, so that every verdict has a hard wall-clock limit.

math-verify's own timeout uses ``signal.alarm``: it works only on the main thread, and it cannot
interrupt long C-level work (a huge ``10^{10^{10}}`` power). Running it in a separate process,
which the parent kills when a verdict is late, gives a limit that holds from any thread and for
any input. The child also caps its address space, so a runaway expression fails with
``MemoryError`` instead of exhausting the machine.

Protocol (one JSON object per line): the child prints ``{"ready": true}`` once; then for each
request ``{"id": n, "gold": str, "pred": str, "timeout": int}`` it prints
``{"id": n, "equal": bool, "error": str | null}``.

Only math-verify's LaTeX path (latex2sympy) is used. Its plain-expression path
(``ExprExtractionConfig``) calls sympy's ``parse_expr``, which evaluates Python code, so it is
never enabled here.
"""

from __future__ import annotations

import json
import logging
import os
import re
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

logger = logging.getLogger(__name__)

WORKER_MEMORY_BYTES = 3 * 1024**3
STARTUP_TIMEOUT_S = 120.0


# --------------------------------------------------------------------------- child side

_COMMAND = re.compile(r"\\[A-Za-z]+")
_TEXT_GROUP = re.compile(
    r"\\(?:text|textbf|textit|mathrm|mbox|operatorname|mathbf|mathit|mathbb|mathcal|begin|end)\s*\{[^{}]*\}"
)
_SUBSCRIPT = re.compile(r"_\{[^{}]*\}|_[A-Za-z0-9]")
_CONSTANTS = {"e", "i"}  # lower-case e and i are constants (sympy E, I), not variables


def answer_letters(answer: str) -> set[str]:
    """Letters naming variables/functions in a LaTeX answer (lower case; no commands, text, subscripts)."""
    text = _SUBSCRIPT.sub("", _COMMAND.sub(" ", _TEXT_GROUP.sub(" ", answer)))
    return {ch.lower() for ch in text if ch.isalpha() and ch not in _CONSTANTS}


def lossy_parse(answer: str, expr) -> bool:
    """Whether the sympy object parsed from ``answer`` is missing variables written in it.

    latex2sympy falls back to parsing a fragment when the whole fails (``\\frac{1}{3} E_{1} +
    \\frac{2}{3} E_{2}`` parses as ``2/3``); two different answers then look equal.
    """
    try:
        names = {str(s) for s in getattr(expr, "free_symbols", set())}
        from sympy.core.function import AppliedUndef

        names |= {type(f).__name__ for f in expr.atoms(AppliedUndef)} if hasattr(expr, "atoms") else set()
    except Exception:
        return False
    parsed_letters = {name[0].lower() for name in names if name}
    return bool(answer_letters(answer) - parsed_letters)



def _limit_memory() -> None:
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))
    except (ImportError, ValueError, OSError):  # not POSIX, or a lower hard limit already
        pass


def _serve() -> None:  # pragma: no cover - exercised through the parent in tests
    """Child main loop: answer verify requests read from stdin."""
    _limit_memory()
    logging.basicConfig(level=logging.CRITICAL)
    from math_verify import LatexExtractionConfig, LatexNormalizationConfig, parse, verify

    # units=False: math-verify's unit stripping turns "\\frac{1}{3} E_{1}" into 1/3 and "2 m" into 2,
    # which makes different answers look equal. Units are handled before we get here (normalize.py).
    normalization = LatexNormalizationConfig(
        basic_latex=True, units=False, malformed_operators=True, nits=True, boxed="all", equations=False
    )
    config = [LatexExtractionConfig(boxed_match_priority=0, normalization_config=normalization)]
    cache: dict[str, list] = {}

    def parsed(answer: str, timeout: int) -> list:
        if answer not in cache:
            if len(cache) > 4096:
                cache.clear()
            result = parse("\\boxed{" + answer + "}", extraction_config=config, parsing_timeout=timeout)
            # A parse that lost some of the answer's variables read only a fragment of it: keep
            # just the string form, so that it can still match an identical string.
            cache[answer] = [r for r in result if isinstance(r, str) or not lossy_parse(answer, r)]
        return cache[answer]

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        error = None
        equal = False
        try:
            timeout = max(1, int(request.get("timeout", 1)))
            gold, pred = parsed(request["gold"], timeout), parsed(request["pred"], timeout)
            quick = numeric_verdict(gold, pred)
            if quick is not None:
                equal = quick
            else:
                equal = bool(gold and pred and verify(gold, pred, timeout_seconds=timeout))
        except BaseException as err:  # MemoryError, RecursionError, sympy errors ...
            error = f"{type(err).__name__}: {err}"[:200]
        print(json.dumps({"id": request.get("id"), "equal": equal, "error": error}), flush=True)


def numeric_verdict(gold: list, pred: list, rel_tol: float = 1e-6) -> bool | None:
    """Decide cheaply when both parses are plain numeric constants (radicals, pi, ...), else ``None``.

    Evaluating ``\\frac{\\sqrt{3}}{3}`` and ``2\\sqrt{3}`` to 15 digits is much cheaper than
    ``verify``'s simplification, and majority voting compares many such pairs.
    """
    from sympy import Expr

    g = next((x for x in gold if not isinstance(x, str)), None)
    p = next((x for x in pred if not isinstance(x, str)), None)
    if not (isinstance(g, Expr) and isinstance(p, Expr) and g.is_number and p.is_number):
        return None
    try:
        a, b = complex(g.evalf(15)), complex(p.evalf(15))
    except (TypeError, ValueError, OverflowError, ZeroDivisionError):
        return None
    if any(v != v or abs(v) == float("inf") for v in (a, b)):  # nan / inf: let verify decide
        return None
    return abs(a - b) <= rel_tol * max(abs(a), abs(b), 1e-300)


# --------------------------------------------------------------------------- parent side


class MathVerifyWorker:
    """A lazily started child process running math-verify; thread-safe, restarts after a kill.

    ``check(gold, pred, timeout_s)`` returns ``True``/``False``, or ``None`` when no verdict came
    in time (the child is then killed and a fresh one starts on the next call).
    """

    def __init__(self, command: list[str] | None = None) -> None:
        # ``command`` replaces the child's command line (tests use a child that never answers).
        self._command = command or [sys.executable, "-m", "eglr_harness.scoring.verify_worker"]
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._buffer = b""
        self._next_id = 0
        self._broken: str | None = None  # set when the child cannot start at all

    def _start(self) -> None:
        env = dict(os.environ, EGLR_AUTOLOAD="0", PYTHONUNBUFFERED="1")
        package_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        self._proc = subprocess.Popen(
            self._command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            close_fds=True,
        )
        self._buffer = b""
        reply = self._read_line(time.monotonic() + STARTUP_TIMEOUT_S)
        if reply is None or not json.loads(reply).get("ready"):
            self._kill()
            raise RuntimeError("the math-verify worker process did not start (is math-verify installed?)")

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                proc.kill()
                proc.wait(timeout=10)
            except Exception:  # already gone
                pass
            for stream in (proc.stdin, proc.stdout):
                try:
                    stream.close()
                except Exception:
                    pass

    def _read_line(self, deadline: float) -> bytes | None:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:  # child died
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def check(self, gold: str, pred: str, timeout_s: float) -> bool | None:
        """math-verify's verdict on ``pred`` against ``gold``; ``None`` if none within ``timeout_s``."""
        with self._lock:
            if self._broken is not None:
                return None
            if self._proc is None or self._proc.poll() is not None:
                try:
                    self._start()
                except (OSError, RuntimeError) as err:
                    self._broken = str(err)
                    logger.error("eglr_harness: %s; symbolic answer checks are disabled.", err)
                    return None
            self._next_id += 1
            request = {"id": self._next_id, "gold": gold, "pred": pred, "timeout": max(1, int(timeout_s / 2))}
            deadline = time.monotonic() + timeout_s
            try:
                assert self._proc is not None and self._proc.stdin is not None
                self._proc.stdin.write((json.dumps(request) + "\n").encode())
                self._proc.stdin.flush()
            except OSError:
                self._kill()
                return None
            while True:
                line = self._read_line(deadline)
                if line is None:
                    logger.warning(
                        "eglr_harness: answer check exceeded %.1fs (gold=%.60r, pred=%.60r); counted as not equal.",
                        timeout_s, gold, pred,
                    )
                    self._kill()
                    return None
                reply = json.loads(line)
                if reply.get("id") == self._next_id:
                    if reply.get("error"):
                        logger.debug("math-verify error on %.60r vs %.60r: %s", gold, pred, reply["error"])
                    return bool(reply.get("equal"))

    def close(self) -> None:
        with self._lock:
            self._kill()


if __name__ == "__main__":  # pragma: no cover
    _serve()
