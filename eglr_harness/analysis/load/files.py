"""Finding lm-eval's run files and reading them: results JSON, samples JSONL (layout: the
:mod:`eglr_harness.analysis.load` docstring)."""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from eglr_harness.core.jsonl import iter_jsonl
from eglr_harness.core.run_format import (  # the one checked reader of a results file; samples .jsonl or .jsonl.gz
    SAMPLE_LINE, read_results, samples_files, samples_stem)

__all__ = ["RunFiles", "date_id_of", "find_runs", "distinct_runs", "read_results", "read_samples"]

logger = logging.getLogger(__name__)

# e.g. 2025-06-01T12-30-05.123456 (isoformat with ':' -> '-'); microseconds may be absent.
_DATE_ID = re.compile(r"(\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}(?:\.\d+)?)$")


@dataclass(frozen=True)
class RunFiles:
    """One lm-eval run: its results JSON, its per-task samples files and its name for reports.

    Attributes:
        results: path of the results JSON.
        samples: task name -> path of ``samples_<task>_<date_id>.jsonl`` or of its gzip-compressed
            ``.jsonl.gz`` (empty without ``--log_samples``; a task with both is refused:
            :func:`eglr_harness.core.run_format.samples_files`).
        name: the results file relative to the folder it was found under, led by that folder's
            own name (``eglr_sc/<model>/results_<date>.json``): what reports print, never an
            absolute path.
    """

    results: Path
    samples: dict[str, Path] = field(default_factory=dict)
    name: str = ""


def date_id_of(results_path: Path) -> str:
    """The ``date_id`` suffix of a results file name (``results_<date_id>.json``)."""
    match = _DATE_ID.search(Path(results_path).stem)
    if match is None:
        raise ValueError(
            f"{results_path}: the file name has no lm-eval date suffix; expected "
            "'results_<YYYY-MM-DDTHH-MM-SS.ffffff>.json' as lm-eval writes it."
        )
    return match.group(1)


def _samples_of(results_path: Path) -> dict[str, Path]:
    suffix = f"_{date_id_of(results_path)}"
    found = {}
    for path in samples_files(results_path.parent, f"samples_*{suffix}"):
        task = samples_stem(path)[len("samples_") : -len(suffix)]
        if task:
            found[task] = path
    return found


def find_runs(path: str | Path) -> list[RunFiles]:
    """All lm-eval runs under ``path`` (a folder searched recursively, or one results JSON).

    Raises ``ValueError`` when ``path`` does not exist or holds no results file.
    """
    path = Path(path)
    if path.is_file():
        results_files, root = [path], path.parent
    elif path.is_dir():
        results_files, root = sorted(p for p in path.rglob("results_*.json") if _DATE_ID.search(p.stem)), path
    else:
        raise ValueError(f"run path {str(path)!r} does not exist; pass a folder given to lm_eval --output_path.")
    if not results_files:
        raise ValueError(
            f"no lm-eval results file (results_<date>.json) under {str(path)!r}; pass the folder given "
            "to `lm_eval ... --output_path DIR --log_samples` (or its model subfolder)."
        )
    top = root.resolve().name
    runs = [
        RunFiles(results=p, samples=_samples_of(p), name=str(Path(top, p.relative_to(root)) if top else p.name))
        for p in results_files
    ]
    for run in runs:
        logger.debug("found run %s with samples for %s", run.results, sorted(run.samples))
    return runs


def distinct_runs(runs: Sequence[RunFiles]) -> tuple[list[RunFiles], list[str]]:
    """``runs`` (of :func:`find_runs`, over several folders) each once and each under its own name, with a note per
    file given more than once.

    A results file reached twice (the same path, or a path and a link to it: compared resolved) is read once, where
    it was first given. Runs that :func:`find_runs` named alike (two folders ``a/beam4`` and ``b/beam4``: both
    ``beam4/<model>/results_<date>.json``) are named by their paths as given, made absolute (links kept), cut to the
    fewest trailing folders that tell every name apart (``a/beam4/<model>/results_<date>.json``): still relative, no
    path of the machine unless that is where they differ. Every other run keeps its name.
    """
    kept: dict[Path, RunFiles] = {}
    notes = []
    for run in runs:
        key = run.results.resolve()
        if key in kept:
            notes.append(f"{run.name} is {kept[key].name} given again (the same file): read once.")
            logger.info("%s", notes[-1])
            continue
        kept[key] = run
    unique = list(kept.values())
    names = [run.name for run in unique]
    parts = [Path(os.path.abspath(run.results)).parts[1:] for run in unique]  # without the root (/, C:\\)
    clashing = {i for i, name in enumerate(names) if Counter(names)[name] > 1}
    while clashing:
        for i in clashing:
            names[i] = str(Path(*parts[i][-(len(Path(names[i]).parts) + 1):]))
        clashing = {i for i in clashing if Counter(names)[names[i]] > 1 and len(Path(names[i]).parts) < len(parts[i])}
    return [RunFiles(run.results, run.samples, name) for run, name in zip(unique, names)], notes


def read_samples(path: Path) -> Iterator[dict]:
    """Yield the per-document dicts of one ``samples_*.jsonl`` (or ``.jsonl.gz``) file, in file order (errors name
    ``file:line``: :func:`eglr_harness.core.jsonl.iter_jsonl`)."""
    for _number, sample in iter_jsonl(path, SAMPLE_LINE):
        yield sample
