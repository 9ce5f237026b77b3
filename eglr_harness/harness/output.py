"""lm-eval's run outputs, written so that a run that cannot save them fails.

lm-eval 0.4.13's ``EvaluationTracker`` writes ``results_<date>.json`` and the samples JSONL inside a
``try/except Exception`` that only logs: on a read-only or full disk the run exits 0 and a samples
file can be cut mid-line. For a run of the project's models (``harness/lm_eval_patches.py``; every other
run is saved by lm-eval's own code):

- ``--output_path`` is checked for writing (a probe file, flushed) by :func:`check_output_path` before
  lm-eval indexes tasks or loads a model;
- the results and samples files are written whole or not at all by :func:`whole_or_failing` (a temporary
  file beside them, then a rename), with the same names and content as lm-eval's;
- a file that cannot be written raises :class:`~eglr_harness.core.errors.OutputError` naming the path
  and the OS error, which the CLI prints as one line and exits non-zero.

Runs that push to the Hugging Face hub keep lm-eval's own saving (it uploads what it wrote).
"""

from __future__ import annotations

import functools
import logging
import sys
from dataclasses import asdict
from datetime import datetime
from pathlib import Path

from eglr_harness.core.errors import OutputError, UserError
from eglr_harness.core.interrupt import (
    end_by_signal_at_exit, exit_by_the_signal, print_interrupted, sigterm_as_interrupt,
)
from eglr_harness.core.jsonl import dumps
from eglr_harness.core.outputs import atomic_write_text, check_writable

__all__ = ["check_output_path", "install_user_error_hook", "whole_or_failing"]

logger = logging.getLogger(__name__)


def _pushes(tracker) -> bool:
    return bool(tracker.api and (tracker.push_results_to_hub or tracker.push_samples_to_hub))


def _run_folder(tracker) -> Path:
    """Where lm-eval puts the files of a run: ``<output_path>/<model>/``, or beside ``output_path`` when it
    names a ``.json`` file."""
    path = Path(tracker.output_path)
    if path.suffix == ".json":
        return path.parent
    return path / str(tracker.general_config_tracker.model_name_sanitized)


def save_results_aggregated(tracker, results: dict, samples: dict | None = None) -> Path:
    """lm-eval's ``save_results_aggregated`` without the hub, written atomically; returns the file."""
    from lm_eval.utils import handle_non_serializable, hash_string

    tracker.general_config_tracker.log_end_time()
    task_hashes = {}
    for task_name, task_samples in (samples or {}).items():
        task_hashes[task_name] = hash_string("".join(s["doc_hash"] + s["prompt_hash"] + s["target_hash"]
                                                     for s in task_samples))
    results.update({"task_hashes": task_hashes})
    results.update(asdict(tracker.general_config_tracker))
    dumped = dumps(results, indent=2, default=handle_non_serializable)  # strict JSON: NaN -> null
    tracker.date_id = datetime.now().isoformat().replace(":", "-")
    path = Path(tracker.output_path)
    folder = _run_folder(tracker)
    _make_folder(folder)
    target = (path.with_name(f"{path.stem}_{tracker.date_id}.json") if path.suffix == ".json"
              else folder / f"results_{tracker.date_id}.json")
    atomic_write_text(target, dumped)
    logger.info("Saved results to %s", target)
    return target


def samples_lines(samples: list[dict]) -> str:
    """The samples JSONL of one task, line for line as lm-eval 0.4.13 writes it."""
    from lm_eval.utils import handle_non_serializable, sanitize_list

    lines = []
    for sample in samples:
        # as lm-eval: flatten the arguments and stringify what the datasets library cannot load
        arguments = {f"gen_args_{i}": {f"arg_{j}": tmp for j, tmp in enumerate(arg)}
                     for i, arg in enumerate(sample["arguments"])}
        sample["resps"] = sanitize_list(sample["resps"])
        sample["filtered_resps"] = sanitize_list(sample["filtered_resps"])
        sample["arguments"] = arguments
        sample["target"] = str(sample["target"])
        lines.append(dumps(sample, default=handle_non_serializable) + "\n")
    return "".join(lines)


def save_results_samples(tracker, task_name: str, samples: list[dict]) -> Path:
    """lm-eval's ``save_results_samples`` without the hub, written atomically; returns the file."""
    folder = _run_folder(tracker)
    _make_folder(folder)
    target = folder / f"samples_{task_name}_{tracker.date_id}.jsonl"
    text = samples_lines(samples)
    if target.is_file():  # lm-eval appends; keep what is there
        text = target.read_text(encoding="utf-8") + text
    atomic_write_text(target, text)
    logger.info("Saved per-task samples to %s", target)
    return target


def _make_folder(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputError(f"{folder}: the output folder cannot be created ({err.strerror or err}); "
                          "give a writable --output_path.") from None


def check_output_path(output_path) -> None:
    """``--output_path`` checked for writing (a probe file, flushed) before the model loads: the folder, or the
    folder of a path that names a ``.json`` file. None or empty: nothing to check."""
    if output_path:
        path = Path(output_path)
        check_writable(path.parent if path.suffix == ".json" else path, "--output_path")


def whole_or_failing(original, save):
    """A tracker method that saves with ``save`` (this module's, atomic and failing) in place of lm-eval's
    ``original``, which it keeps for a run without ``--output_path`` or one that pushes to the hub."""

    @functools.wraps(original)
    def method(self, *args, **kwargs):
        if not self.output_path or _pushes(self):
            return original(self, *args, **kwargs)
        save(self, *args, **kwargs)

    return method


def say_user_error(err: BaseException) -> None:
    """A :class:`~eglr_harness.core.errors.UserError` as the ``lm_eval`` command prints it: one line."""
    print(f"error: {err}", file=sys.stderr)


def install_user_error_hook(*, interrupts: bool = True, hint=None) -> None:
    """Print a :class:`~eglr_harness.core.errors.UserError` (an output that cannot be written, a bad data
    line) that reaches the top of a program as one line (exit status 1; 2 where it passes through the ``lm_eval``
    command, ``lm_eval_patches.patch_cli_exit_status``), not as a traceback; every other exception is printed as
    before.

    ``interrupts`` (a run of the project's models; idempotent, and a later call can add it): Ctrl-C or SIGTERM end
    the program with one line saying what was stored and the command that resumes (core/interrupt.py), and with the
    signal's status, as without the project (130, 143 in a shell). Without it, signals are left as they were: a run
    of another model on the project's tasks is stopped by them as lm-eval's own run is. ``hint(argv)``: a sentence
    after the interrupt line (how to make the rerun resume), or None; the first given is kept."""
    state = getattr(sys.excepthook, "_eglr_user_errors", None)
    if state is None:
        state = _install_hook(sys.excepthook)
    if hint is not None and state["hint"] is None:
        state["hint"] = hint
    if interrupts and not state["interrupts"]:
        state["interrupts"] = True
        end_by_signal_at_exit()  # first: the exit handlers registered later (torch's) run before the signal's end
        sigterm_as_interrupt()


def _install_hook(previous) -> dict:
    state = {"interrupts": False, "hint": None}  # whether the hook took the signals; the hint (install_user_error_hook)

    def hook(kind, value, traceback):
        if isinstance(value, UserError):
            say_user_error(value)
            return
        if isinstance(value, KeyboardInterrupt) and state["interrupts"]:  # Ctrl-C, or SIGTERM: one line
            print_interrupted("lm_eval", value, hint=state["hint"](sys.argv[1:]) if state["hint"] else None)
            exit_by_the_signal(value)
            return
        previous(kind, value, traceback)

    hook._eglr_user_errors = state
    sys.excepthook = hook
    return state

