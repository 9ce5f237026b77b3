"""``eglr-leaderboard``: the paper's comparison set for one model and several benchmarks.

Runs (see :mod:`eglr_harness.leaderboard.runs`) go through the stock ``lm_eval`` CLI as
subprocesses, one after the other; each finished run leaves lm-eval's results file in its
``--output_path`` plus ``eglr_leaderboard_run.json`` (exact command, package versions, wall time,
exit status). Rerunning skips every run whose results file exists for the same task and
``--limit`` (resume); ``--limit gsm8k=100,math500=50`` sizes each benchmark. The table is
rewritten after every run. The default output is ``out/leaderboard/<model>``; a folder holding files git
tracks (a checkout's committed ``results/``) is refused before anything runs.

    eglr-leaderboard --model_args pretrained=DIR,gguf_file=F.gguf --tasks gsm8k,math500 \\
        --limit 100 --max_gen_toks 256 --batch_size 8 --apply_chat_template
"""

from __future__ import annotations

import json
import logging
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from eglr_harness.analysis.load import RunFiles, find_runs, model_name, read_results
from eglr_harness.analysis.portable import portable
from eglr_harness.core.interrupt import QUIET_ENV, note_stored
from eglr_harness.core.jsonl import dumps
from eglr_harness.core.outputs import atomic_write_text
from eglr_harness.leaderboard.runs import LeaderboardOptions, PlannedRun, build_command, plan_runs, shell_command
from eglr_harness.leaderboard.table import LeaderboardCell, cells_from_run, write_tables

__all__ = [
    "Executor",
    "subprocess_executor",
    "RECORD_NAME",
    "finished_run",
    "tracked_files",
    "check_output_dir",
    "execute_run",
    "failure_reason",
    "package_versions",
    "LeaderboardOutcome",
    "run_leaderboard",
]

logger = logging.getLogger(__name__)

RECORD_NAME = "eglr_leaderboard_run.json"
VERSION_PACKAGES = ("eglr-harness", "lm_eval", "transformers", "torch", "accelerate", "gguf", "math-verify")

# An executor runs one command line and returns its exit status, or (exit status, why it failed) (tests inject a
# fake one).
Executor = Callable[[Sequence[str]], "int | tuple[int, str]"]

_TAIL_BYTES = 64 * 1024  # of the child's stderr, kept to say why it failed
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b.*")


def failure_reason(stderr_tail: str, returncode: int) -> str:
    """Why an lm_eval run failed, in one line, from the end of its stderr: its one-line refusal (``error: ...``,
    how eglr-hf and the CLI print a user error), else the exception line that ends a traceback, else the last line
    it printed; then the exit status."""
    lines = [line.strip() for line in stderr_tail.replace("\r", "\n").splitlines() if line.strip()]
    said = (next((line for line in reversed(lines) if line.startswith("error: ")), None)
            or next((line for line in reversed(lines) if _EXCEPTION_LINE.match(line)), None)
            or (lines[-1] if lines else ""))
    said = said.removeprefix("error: ")
    if len(said) > 400:
        said = said[:397] + "..."
    return f"exit status {returncode}" + (f": {said}" if said else " (nothing on stderr)")


def subprocess_executor(argv: Sequence[str]) -> tuple[int, str]:
    """Run ``argv`` with the terminal's stdout, its stderr passed through as it comes (lm-eval's progress bars stay
    visible) and its end kept: ``(exit status, why it failed)``, the reason ``""`` when it exited 0."""
    # the child is quiet on an interrupt: this process prints the one line for both (core/interrupt.py)
    tail = b""
    with subprocess.Popen(list(argv), stderr=subprocess.PIPE, env={**os.environ, QUIET_ENV: "1"}) as child:
        try:
            while chunk := os.read(child.stderr.fileno(), 65536):
                sys.stderr.buffer.write(chunk)
                sys.stderr.buffer.flush()
                tail = (tail + chunk)[-_TAIL_BYTES:]
            returncode = child.wait()
        except BaseException:  # as subprocess.run: an interrupted child gets a moment to store, then is killed
            try:
                child.wait(timeout=0.25)
            except subprocess.TimeoutExpired:
                child.kill()
            raise
    return returncode, "" if returncode == 0 else failure_reason(tail.decode("utf-8", "replace"), returncode)


def package_versions() -> dict[str, str]:
    """Installed versions of the packages a result depends on (no package is imported)."""
    versions = {"python": platform.python_version()}
    for name in VERSION_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def _checkout_of(folder: Path) -> Path | None:
    """The nearest folder at or above ``folder`` holding ``.git`` (a checkout), or None."""
    return next((p for p in (folder, *folder.parents) if (p / ".git").exists()), None)


def tracked_files(folder: Path) -> list[str]:
    """The files under ``folder`` that git tracks (committed results), ``[]`` outside a git checkout.

    The folder is resolved first (a link into a checkout is the checkout). The guard fails closed: a
    folder inside a checkout about which git cannot answer (git missing, a repository git refuses, a
    timeout) raises ``ValueError`` saying why, rather than reading as "nothing tracked".
    """
    resolved = Path(folder).expanduser().resolve()
    anchor = resolved
    while not anchor.is_dir():  # the folder may not exist yet: ask from its nearest existing parent
        anchor = anchor.parent
    checkout = _checkout_of(anchor)
    if checkout is None:  # not in a git checkout: nothing can be tracked
        return []
    undecided = (f"`--output_dir`={folder} lies in the git checkout {checkout}, and git cannot say whether it holds "
                 "committed files ({why}); the leaderboard refuses rather than risk overwriting them. Fix git there, "
                 "give a folder outside the checkout, or --update_committed to rerun the committed leaderboard.")
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--", str(resolved)], cwd=anchor,
                                capture_output=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        why = "git is not installed" if isinstance(err, FileNotFoundError) else f"{type(err).__name__}: {err}"
        raise ValueError(undecided.format(why=why)) from None
    if listed.returncode != 0:
        said = listed.stderr.decode("utf-8", "replace").strip().splitlines()
        raise ValueError(undecided.format(why=f"git ls-files exited {listed.returncode}: "
                                              f"{said[0] if said else 'no message'}"))
    return [name for name in listed.stdout.decode("utf-8", "replace").split("\0") if name]


def check_output_dir(folder: Path, *, update_committed: bool = False) -> None:
    """``ValueError`` when ``folder`` holds files git tracks: a leaderboard there would overwrite committed
    results, and take committed runs for finished ones of its own. ``update_committed``: the maintainer's
    rerun of the committed leaderboard (its ``run_leaderboard.sh``)."""
    if update_committed:
        return
    if tracked := tracked_files(folder):
        raise ValueError(
            f"`--output_dir`={folder} holds {len(tracked)} file(s) tracked by git (committed results, e.g. "
            f"{tracked[0]}): a run there would overwrite them and reuse their runs as its own; allowed: a folder "
            "without committed files (the default is out/leaderboard/<model>), or --update_committed to rerun "
            "the committed leaderboard itself."
        )


def _limit_matches(results: Mapping, limit: float | None) -> bool:
    found = (results.get("config") or {}).get("limit")
    if found is None or limit is None:
        return found is None and limit is None
    return float(found) == float(limit)


def finished_run(run: PlannedRun, limit: float | None) -> RunFiles | None:
    """The latest lm-eval run under ``run.output_path`` with results for ``run.task`` at ``limit``."""
    if not Path(run.output_path).is_dir():
        return None
    try:
        candidates = find_runs(run.output_path)
    except ValueError:
        return None
    done = None
    for files in sorted(candidates, key=lambda f: f.results.name):
        results = read_results(files.results)
        if run.task not in (results.get("results") or {}):
            continue
        if not _limit_matches(results, limit):
            logger.warning(
                "%s was made with limit=%s, not %s; not reused",
                files.results,
                (results.get("config") or {}).get("limit"),
                limit,
            )
            continue
        done = files
    return done


def _read_record(run: PlannedRun) -> dict | None:
    path = Path(run.output_path) / RECORD_NAME
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def execute_run(run: PlannedRun, argv: list[str], executor: Executor) -> dict:
    """Run one command, write and return its record."""
    Path(run.output_path).mkdir(parents=True, exist_ok=True)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    logger.info("running %s/%s: %s", run.benchmark, run.name, shell_command(argv))
    t0 = time.perf_counter()
    outcome = executor(argv)
    returncode, why = outcome if isinstance(outcome, tuple) else (outcome, "")
    record = {
        "benchmark": run.benchmark,
        "run": run.name,
        "task": run.task,
        "model": run.model,
        "model_args": portable(run.model_args),  # no path of this machine in a record meant to be shared
        "command": [portable(a) for a in argv],
        "command_line": portable(shell_command(argv)),
        "versions": package_versions(),
        "wall_time_s": round(time.perf_counter() - t0, 3),
        "returncode": returncode,
        "failure": portable(why or f"exit status {returncode}") if returncode != 0 else None,
        "started": started,
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    atomic_write_text(Path(run.output_path) / RECORD_NAME, dumps(record, indent=2, ensure_ascii=True) + "\n")
    return record


@dataclass(frozen=True)
class LeaderboardOutcome:
    """What a leaderboard invocation did and wrote."""

    cells: tuple[LeaderboardCell, ...]
    tables: dict[str, Path]
    ran: tuple[str, ...]
    skipped: tuple[str, ...]
    failed: tuple[str, ...]


def _cells(run: PlannedRun, argv: list[str], files: RunFiles | None, record: dict | None, status: str,
           detail: str = ""):
    return cells_from_run(
        kind=run.kind,
        name=run.name,
        benchmark=run.benchmark,
        task=run.task,
        files=files,
        record=record,
        command=shell_command(argv),
        run_dir=run.output_path,
        num_beams=run.num_beams,
        status=status,
        detail=detail,
    )


def run_leaderboard(
    opts: LeaderboardOptions, executor: Executor = subprocess_executor, *, dry_run: bool = False
) -> LeaderboardOutcome:
    """Run every unfinished cell of ``opts`` (or, ``dry_run``, only print a ``#`` header line and the commands) and
    write the tables.

    The tables are rewritten after every executed run (later runs shown as ``pending``), so a
    long leaderboard can be read while it runs.
    """
    runs = plan_runs(opts)
    if dry_run:  # a header, as a shell comment: the output stays a script that runs the rest
        todo = sum(finished_run(run, run.limit) is None for run in runs)
        print(f"# eglr-leaderboard --dry_run: {todo} of {len(runs)} runs to do ({len(runs) - todo} finished); "
              "the lm_eval command of each, one a line (nothing was run)")
    ran, skipped, failed = [], [], []
    cells: list[LeaderboardCell] = []
    for i, run in enumerate(runs):
        argv = build_command(run, opts)
        label = f"{run.benchmark}/{run.name}"
        files = finished_run(run, run.limit)
        record = _read_record(run)
        status, detail = "not run", ""
        if files is not None:
            logger.info("skip %s: finished (%s)", label, files.results)
            skipped.append(label)
            note_stored(f"finished runs in {opts.output_dir}", [label])
        elif dry_run:
            print(shell_command(argv))
        else:
            record = execute_run(run, argv, executor)
            files = finished_run(run, run.limit)
            if files is None:
                detail = record["failure"] or f"exit status 0 but no results file in {portable(str(run.output_path))}"
                logger.error("%s failed: %s", label, detail)
                failed.append(label)
                status = "failed"
            else:
                ran.append(label)
                note_stored(f"finished runs in {opts.output_dir}", [label])
        mine = _cells(run, argv, files, record, status, detail)
        if ran or failed:  # something executed: refresh the table, later runs shown as pending
            pending = [c for later in runs[i + 1 :] for c in _cells(later, [], None, None, "pending")]
            _write(cells + mine + pending, opts)
        cells += mine
    tables = {} if dry_run else _write(cells, opts)
    return LeaderboardOutcome(tuple(cells), tables, tuple(ran), tuple(skipped), tuple(failed))


def _write(cells: list[LeaderboardCell], opts: LeaderboardOptions) -> dict[str, Path]:
    sizes = {b: opts.limit_for(b) for b in opts.benchmarks}
    limit = ", ".join(f"{b}: " + ("all problems" if n is None else f"--limit {n:g}") for b, n in sizes.items())
    notes = [
        f"Model args: `{portable(opts.model_args)}`"
        + (f"; EGLR model args: `{portable(opts.eglr_model_args)}`" if opts.eglr_model_args else "")
        + ".",
        f"Size: {limit}; max_gen_toks: {opts.max_gen_toks or 'task default'}; "
        f"chat template: {opts.apply_chat_template}.",
    ]
    missing = sorted({f"{c.benchmark}/{c.method} ({c.status}{': ' + c.detail if c.detail else ''})"
                      for c in cells if c.status != "done"})
    if missing:
        notes.append("Not finished: " + ", ".join(missing) + ". Rerun the same command to resume.")
    model = model_name(opts.model_args) or portable(opts.model_args)
    return write_tables(cells, list(opts.benchmarks), opts.output_dir, model=model, notes=notes)
