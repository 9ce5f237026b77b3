"""The time one family of the GPU checks may take (``--budget_s``): ``Budget`` and its alarm."""

from __future__ import annotations

import contextlib
import math
import time


class BudgetExhausted(BaseException):
    """Raised by ``Budget.alarm`` in the main thread when the family's time is spent. A BaseException,
    so that the checks' own ``except Exception`` (``guarded``) let it through."""


class Budget:
    """The time one family may take (``--budget_s``; None: no limit).

    Parts start only while time is left (``allows``); ``alarm`` interrupts the part that is running
    when the time runs out (SIGALRM, main thread only), and the report says what was interrupted
    and what was skipped. A compilation or a CUDA-graph capture cut short leaves the process fit
    only for writing the report: everything after it is skipped.
    """

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self.started = time.perf_counter()
        self.exhausted = False

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def left(self) -> float:
        return math.inf if self.seconds is None else self.seconds - self.elapsed()

    def allows(self, need: float = 0.0) -> bool:
        """Whether a part that needs ``need`` seconds may start."""
        return not self.exhausted and self.left() > need

    def skip_reason(self, need: float = 0.0, why: str = "") -> str:
        left = max(self.left(), 0.0)
        return (f"budget: {left:.0f} s of --budget_s {self.seconds:g} left" + (f", {why}" if why else "")
                + (" (spent)" if self.exhausted or left <= need and not why else ""))

    @contextlib.contextmanager
    def alarm(self):
        """Raise ``BudgetExhausted`` inside the block when the time runs out."""
        import signal
        import threading

        usable = (self.seconds is not None and hasattr(signal, "setitimer")
                  and threading.current_thread() is threading.main_thread())
        if not usable:
            yield
            return

        def ring(signum, frame):
            self.exhausted = True
            raise BudgetExhausted(f"--budget_s {self.seconds:g} spent after {self.elapsed():.0f} s")

        previous = signal.signal(signal.SIGALRM, ring)
        signal.setitimer(signal.ITIMER_REAL, max(self.left(), 1e-3))
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
