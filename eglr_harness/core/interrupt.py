"""Ctrl-C (SIGINT) and SIGTERM end a command with one line: what was stored, and the command that
resumes. No traceback.

Stores note what they keep as it is written (:func:`note_stored`: the rollout store, the tau_h cache,
the verifier score store, finished leaderboard runs), so the line can say it whichever command was
stopped. A command's ``main`` runs its body through :func:`run_interruptible`; the stock ``lm_eval`` CLI
gets the same line from its exception hook (:func:`print_interrupted`, ``harness/output.py``).

A child process whose parent reports for it (the leaderboard's and the sweep's ``lm_eval`` runs) is
started with :data:`QUIET_ENV` set: it prints nothing on an interrupt, so the terminal shows one line.

A leaf: standard library only (and ``core.progress``, which is too).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence

from eglr_harness.core.progress import counted  # standard library only too

__all__ = ["QUIET_ENV", "Terminated", "end_by_signal_at_exit", "exit_by_the_signal", "held_interrupts",
           "interrupted_line", "note_stored", "print_interrupted", "run_interruptible", "sigterm_as_interrupt"]

QUIET_ENV = "EGLR_INTERRUPT_QUIET"  # set in a child whose parent prints the interrupt line
EXIT_SIGINT, EXIT_SIGTERM = 130, 143  # 128 + the signal number, as a shell reports them

# what -> distinct keys stored by this process (a rollout rewritten with its batch's shares counts once)
_stored: dict[str, set] = {}
_lock = threading.Lock()
_exit_signal: list[int] = []  # the signal an uncaught, reported interrupt asks the process to end by


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is, as Ctrl-C raises KeyboardInterrupt."""


def note_stored(what: str, keys: Sequence[str]) -> None:
    """Record that ``keys`` were stored, e.g. ``what`` = ``"rollouts in DIR/rollouts_rank0.sqlite"`` (a plural noun,
    then `` in `` and the place: ``core.progress.counted`` says one of them in the singular)."""
    with _lock:
        _stored.setdefault(what, set()).update(keys)


def stored_summary() -> str:
    """``"12 rollouts in X, 3 scores in Y"``, or ``"nothing"``."""
    with _lock:
        parts = [counted(len(keys), what) for what, keys in _stored.items() if keys]
    return ", ".join(parts) if parts else "nothing"


def _command(prog: str, argv: Sequence[str] | None) -> str:
    args = list(sys.argv[1:] if argv is None else argv)
    return shlex.join([prog, *args])


def interrupted_line(prog: str, err: BaseException, argv: Sequence[str] | None = None, hint: str | None = None) -> str:
    """The one line: ``PROG: interrupted (SIGINT); stored: 12 rollouts in X. Rerun to resume: COMMAND``
    (``Rerun: COMMAND`` when nothing was stored: the command's outputs are whole or absent), then ``hint`` (a
    sentence: how to make the rerun resume) where given."""
    name = "SIGTERM" if isinstance(err, Terminated) else "SIGINT"
    command = _command(prog, argv)
    stored = stored_summary()
    if stored != "nothing":
        line = f"{prog}: interrupted ({name}); stored: {stored}. Rerun to resume: {command}"
    else:
        line = f"{prog}: interrupted ({name}); nothing was stored (no output is left half-written). Rerun: {command}"
    return f"{line}. {hint}" if hint else line


def _close_progress_bars() -> None:
    """End the open tqdm bars' lines, so the interrupt line starts a line of its own."""
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ()) or ()):
        try:
            bar.close()
        except Exception:  # noqa: BLE001 -- a bar that cannot close must not hide the line
            pass


def print_interrupted(prog: str, err: BaseException, argv: Sequence[str] | None = None, hint: str | None = None) -> int:
    """Print :func:`interrupted_line` (unless :data:`QUIET_ENV` is set) and return the exit status."""
    if not os.environ.get(QUIET_ENV):
        _close_progress_bars()
        sys.stderr.write(interrupted_line(prog, err, argv, hint) + "\n")
        sys.stderr.flush()
    return EXIT_SIGTERM if isinstance(err, Terminated) else EXIT_SIGINT


def end_by_signal_at_exit() -> None:
    """Register (once) the exit handler behind :func:`exit_by_the_signal`. Call it early (an exception hook's
    install): exit handlers run last-registered first, so the ones registered later (torch's, the math-verify
    worker's) still run before the process ends."""
    if not getattr(end_by_signal_at_exit, "_registered", False):
        atexit.register(_end_by_noted_signal)
        end_by_signal_at_exit._registered = True


def exit_by_the_signal(err: BaseException) -> None:
    """For an uncaught interrupt already reported by an exception hook: end the process, once the exit handlers
    registered after :func:`end_by_signal_at_exit` have run, as the signal's default action ends it (a shell sees
    128 + the signal: 143 for SIGTERM). Python does so itself for Ctrl-C's KeyboardInterrupt (130); a
    :class:`Terminated` would otherwise end with status 1. No effect off POSIX."""
    if isinstance(err, Terminated) and os.name == "posix":
        end_by_signal_at_exit()
        _exit_signal[:] = [signal.SIGTERM]


def _end_by_noted_signal() -> None:
    if not _exit_signal:
        return
    number = _exit_signal[0]
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 -- a closed stream must not keep the process from ending
            pass
    signal.signal(number, signal.SIG_DFL)
    os.kill(os.getpid(), number)
    os._exit(128 + number)  # only if the signal did not end the process (it is blocked)


def _raise_terminated(signum, frame):
    raise Terminated()


@contextlib.contextmanager
def held_interrupts() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM until the block ends, then raise the first (KeyboardInterrupt, :class:`Terminated`):
    for a few steps that must all happen or none (a report's renames into place). Outside the main thread
    (where no signal arrives) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {s: signal.signal(s, lambda signum, _frame: caught.append(signum))
                for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    if caught:
        raise Terminated() if caught[0] == signal.SIGTERM else KeyboardInterrupt()


def sigterm_as_interrupt() -> None:
    """SIGTERM raises :class:`Terminated` (a KeyboardInterrupt) in the main thread, so that ``finally``
    blocks run and the interrupt line is printed; elsewhere (not the main thread) nothing changes."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_terminated)


def run_interruptible(prog: str, body: Callable[[], int | None], argv: Sequence[str] | None = None) -> int:
    """``body()``'s exit status; on Ctrl-C or SIGTERM the one line and 130 / 143 instead of a traceback."""
    previous = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    sigterm_as_interrupt()
    with _lock:
        _stored.clear()  # what this command stores (one process may run several: the tests)
    try:
        status = body()
        return 0 if status is None else status
    except KeyboardInterrupt as err:
        return print_interrupted(prog, err, argv)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)

