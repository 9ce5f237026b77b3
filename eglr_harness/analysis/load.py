"""The one loader: lm-eval run files -> runs (:class:`RunInfo`) -> tasks (:class:`TaskSamples`) ->
rollouts (:class:`RolloutRow`), merged into the L×T :class:`Grid` of one task and one model.

**Files.** lm-eval 0.4.13 (``lm_eval/loggers/evaluation_tracker.py``) writes, for an output
*folder* ``OUT``, ``OUT/<model_name_sanitized>/results_<date_id>.json`` and
``samples_<task>_<date_id>.jsonl`` beside it (one per task); for an output *file*
``OUT/name.json``, ``OUT/name_<date_id>.json`` with the samples beside it. ``date_id`` is
``datetime.now().isoformat()`` with ``:`` replaced by ``-``; a run's samples share its results
file's ``date_id``.

**Rollouts.** Each row is one repeat of one document (docs/run-format.md): ``L``/``T``/``cycle``
are None when the run's model was not eglr-hf; ``answer`` is the task's extracted answer (None =
unparseable: never correct, never votes); ``cluster`` is the answer's equivalence cluster within
the document as the task logged it (None in runs made before tasks logged it).

**Merging** (stated in every report):
- one task and one model per grid (models compared by :func:`model_name`, so the same model
  installed elsewhere is the same model); anything else is a ``ValueError`` naming what was found;
- documents are matched by ``doc_id``; the same ``doc_id`` with a different ``doc_hash`` in two
  runs is an error (different data or order);
- a rollout is keyed by ``(doc_id, L, T, cycle)``; when two runs hold the same key, the run given
  first wins and the duplicate is counted; within one run the same key is a deterministic (T = 0)
  cell that the task repeats (eglr-hf decodes it once): kept once and counted apart;
- rollouts without ``(L, T)`` (runs of a model other than eglr-hf) cannot be placed and are counted
  as ``unplaced``;
- **vote labels**: within a document, rollouts with the same label vote together. Two rollouts
  share a label when the task put them in one equivalence cluster (same run) or when their answers
  are the same string (any run). Without cluster ids the labels are the exact answer strings.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from eglr_harness.cell import T_DECIMALS, Cell
from eglr_harness.model_names import model_name, parse_model_args

__all__ = [
    "RunFiles",
    "RunInfo",
    "RolloutRow",
    "TaskSamples",
    "RunPart",
    "Grid",
    "GREEDY",
    "VOTE_CLUSTERS",
    "VOTE_STRINGS",
    "VOTE_MIXED",
    "find_runs",
    "read_results",
    "read_samples",
    "date_id_of",
    "parse_model_args",
    "model_name",
    "model_identity",
    "metric_names",
    "metric_entry",
    "metric_value",
    "run_info",
    "rollouts_of_sample",
    "read_task_samples",
    "vote_labels",
    "build_grid",
    "load_parts",
    "load_grid",
]

logger = logging.getLogger(__name__)

GREEDY = Cell(0, 0.0)

# How a grid's votes were labelled (said in every report).
VOTE_CLUSTERS = "equivalence clusters (logged by the task)"
VOTE_STRINGS = "exact answer strings (the runs log no cluster ids)"
VOTE_MIXED = "equivalence clusters where the runs log them (exact answer strings elsewhere)"

# e.g. 2025-06-01T12-30-05.123456 (isoformat with ':' -> '-'); microseconds may be absent.
_DATE_ID = re.compile(r"(\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}(?:\.\d+)?)$")


# --------------------------------------------------------------------------- files


@dataclass(frozen=True)
class RunFiles:
    """One lm-eval run: its results JSON, its per-task samples files and its name for reports.

    Attributes:
        results: path of the results JSON.
        samples: task name -> path of ``samples_<task>_<date_id>.jsonl`` (empty without
            ``--log_samples``).
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
    suffix = f"_{date_id_of(results_path)}.jsonl"
    found = {}
    for path in sorted(results_path.parent.glob(f"samples_*{suffix}")):
        task = path.name[len("samples_") : -len(suffix)]
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


def read_results(path: Path) -> dict:
    """Parse one results JSON; a clear ``ValueError`` when it is not lm-eval's results file."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err}); is it an lm-eval results file?") from None
    if not isinstance(data, dict) or "results" not in data:
        raise ValueError(f"{path}: no 'results' key; expected an lm-eval results_<date>.json file.")
    return data


def read_samples(path: Path) -> Iterator[dict]:
    """Yield the per-document dicts of one ``samples_*.jsonl`` file, in file order."""
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{line_no}: not valid JSON ({err}).") from None


# --------------------------------------------------------------------------- runs


@dataclass(frozen=True)
class RunInfo:
    """The facts of one lm-eval run that the analysis needs.

    Attributes:
        path: the results JSON.
        name: how reports name the run (:attr:`RunFiles.name`).
        model: :func:`model_identity` of the run; runs merge only when this is equal.
        model_source: lm-eval model type (``eglr-hf``, ``hf``, ...).
        tasks: tasks with aggregated metrics in ``results``.
        eglr: the ``config.eglr`` block written by eglr-hf (None for other models).
        limit: lm-eval ``--limit`` of the run (None = all documents).
        n_samples: task -> number of documents evaluated.
        wall_time_s: lm-eval's ``total_evaluation_time_seconds``.
        versions: ``lm_eval_version`` / ``transformers_version`` recorded by lm-eval.
    """

    path: Path
    model: str
    model_source: str | None
    tasks: tuple[str, ...]
    eglr: Mapping | None = None
    limit: float | None = None
    n_samples: Mapping[str, int] = field(default_factory=dict)
    wall_time_s: float | None = None
    versions: Mapping[str, str] = field(default_factory=dict)
    name: str = ""


def model_identity(results: Mapping) -> str:
    """:func:`model_name` of a run's model args (lm-eval's ``model_name`` when they name none)."""
    config = results.get("config") or {}
    name = model_name(config.get("model_args")) or model_name({"pretrained": results.get("model_name") or ""})
    return name or str(config.get("model") or "<unknown model>")


def metric_names(results: Mapping, task: str) -> dict[str, str]:
    """``{metric: 'metric,filter'}`` for one task's aggregated metrics (first filter wins,
    except that the ``none`` filter is preferred when a metric has several)."""
    found: dict[str, str] = {}
    for key in (results.get("results") or {}).get(task, {}):
        if "," not in key or key.endswith("_stderr") or "_stderr," in key:
            continue
        metric, filt = key.split(",", 1)
        if metric not in found or filt == "none":
            found[metric] = key
    return found


def metric_entry(results: Mapping, task: str, metric: str) -> tuple[str, float] | None:
    """``(name, value)`` of the first numeric aggregated metric of ``task`` whose name matches
    ``metric`` (a regex such as ``maj@\\d+``; filters as in :func:`metric_names`), or None."""
    pattern = re.compile(metric)
    for name, key in metric_names(results, task).items():
        value = results["results"][task][key]
        if pattern.fullmatch(name) and isinstance(value, (int, float)) and not isinstance(value, bool):
            return name, float(value)
    return None


def metric_value(results: Mapping, task: str, metric: str) -> float | None:
    """The value of :func:`metric_entry`, or None when the run has no such metric."""
    entry = metric_entry(results, task, metric)
    return None if entry is None else entry[1]


def _as_float(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def run_info(results: Mapping, path: Path, name: str = "") -> RunInfo:
    """Build a :class:`RunInfo` from a parsed results JSON (``name``: default the file name)."""
    config = results.get("config") or {}
    n_samples = {
        task: int(counts.get("effective", counts.get("original", 0)))
        for task, counts in (results.get("n-samples") or {}).items()
        if isinstance(counts, Mapping)
    }
    versions = {key: str(results[key]) for key in ("lm_eval_version", "transformers_version") if results.get(key)}
    return RunInfo(
        path=Path(path),
        name=name or Path(path).name,
        model=model_identity(results),
        model_source=results.get("model_source") or config.get("model"),
        tasks=tuple((results.get("results") or {}).keys()),
        eglr=config.get("eglr"),
        limit=_as_float(config.get("limit")),
        n_samples=n_samples,
        wall_time_s=_as_float(results.get("total_evaluation_time_seconds")),
        versions=versions,
    )


# --------------------------------------------------------------------------- rollouts


@dataclass(frozen=True)
class RolloutRow:
    """One repeat of one document, as the analysis reads it (not :class:`eglr_harness.rollout.Rollout`,
    the generated text). ``vote`` is the label it votes with: its answer until :func:`build_grid`
    labels the document's votes (:func:`vote_labels`); None never votes."""

    doc_id: int
    repeat: int
    L: int | None
    T: float | None
    cycle: int | None
    answer: str | None
    correct: int
    cluster: int | None = None
    vote: object = None

    def __post_init__(self) -> None:
        if self.vote is None and self.answer is not None:
            object.__setattr__(self, "vote", self.answer)

    @property
    def cell(self) -> Cell | None:
        """``Cell(L, T)`` or None for a rollout from a model without EGLR metadata."""
        return None if self.L is None or self.T is None else Cell.of(self.L, self.T)


@dataclass(frozen=True)
class TaskSamples:
    """The rollouts of one task in one run, for one lm-eval filter.

    Attributes:
        path: the samples file.
        filter: the lm-eval filter whose lines were read.
        rollouts: all rows, in file order then repeat order.
        doc_hashes: doc_id -> lm-eval's ``doc_hash`` (to check that merged runs share documents).
        other_filters: filters present in the file but not read.
        has_clusters: every rollout with an answer carries the task's cluster id.
    """

    path: Path
    filter: str | None
    rollouts: tuple[RolloutRow, ...]
    doc_hashes: dict[int, str]
    other_filters: tuple[str, ...] = ()
    has_clusters: bool = False

    @property
    def doc_ids(self) -> tuple[int, ...]:
        return tuple(self.doc_hashes)


def _rollout(item, doc_id: int, index: int, where: str) -> RolloutRow:
    if not isinstance(item, dict) or "correct" not in item:
        raise ValueError(
            f"{where}: doc {doc_id} rollout #{index} is {item!r}; expected a dict with keys "
            "repeat, L, T, cycle, answer, correct (docs/run-format.md)."
        )
    L, T, cycle, answer, cluster = (item.get(k) for k in ("L", "T", "cycle", "answer", "cluster"))
    return RolloutRow(
        doc_id=doc_id,
        repeat=int(item.get("repeat", index)),
        L=None if L is None else int(L),
        T=None if T is None else round(float(T), T_DECIMALS),
        cycle=None if cycle is None else int(cycle),
        answer=None if answer is None else str(answer),
        correct=1 if item["correct"] else 0,
        cluster=None if cluster is None or answer is None else int(cluster),
    )


def rollouts_of_sample(sample: dict, *, where: str = "sample") -> list[RolloutRow]:
    """The rollout rows of one ``samples_*.jsonl`` line.

    Reads the ``rollouts`` key (or ``best_cfg_acc``, whose per-document value is the same list).
    Raises ``ValueError`` when neither holds a list: the run did not use an eglr task.
    """
    doc_id = sample.get("doc_id")
    items = sample.get("rollouts")
    if not isinstance(items, list):
        items = sample.get("best_cfg_acc")
    if doc_id is None or not isinstance(items, list):
        raise ValueError(
            f"{where}: doc {doc_id!r} has no `rollouts` list; the analysis needs the samples of an "
            "eglr task (e.g. gsm8k_eglr_lxt) logged with --log_samples (docs/run-format.md)."
        )
    return [_rollout(item, int(doc_id), i, where) for i, item in enumerate(items)]


def read_task_samples(path: Path, filter_name: str | None = None) -> TaskSamples:
    """Read one task's samples file.

    lm-eval writes one line per (document, filter). ``filter_name`` picks the filter; by default
    the first filter in the file is used (logged when the file has several).
    """
    rows: list[RolloutRow] = []
    hashes: dict[int, str] = {}
    filters: list[str] = []
    chosen = filter_name
    for sample in read_samples(path):
        filt = sample.get("filter")
        if filt not in filters:
            filters.append(filt)
        if chosen is None:
            chosen = filt
        if filt != chosen:
            continue
        doc_id = int(sample["doc_id"])
        if doc_id in hashes:
            raise ValueError(f"{path}: doc {doc_id} appears twice for filter {chosen!r}; is the file corrupt?")
        hashes[doc_id] = str(sample.get("doc_hash", ""))
        rows.extend(rollouts_of_sample(sample, where=str(path)))
    if filter_name is not None and filter_name not in filters:
        raise ValueError(f"{path}: filter {filter_name!r} not found; filters in this file: {filters}.")
    others = tuple(f for f in filters if f != chosen)
    if others:
        logger.info("%s: using filter %r (also present: %s)", path, chosen, list(others))
    answered = [r for r in rows if r.answer is not None]
    return TaskSamples(
        path=Path(path),
        filter=chosen,
        rollouts=tuple(rows),
        doc_hashes=hashes,
        other_filters=others,
        has_clusters=bool(answered) and all(r.cluster is not None for r in answered),
    )


# --------------------------------------------------------------------------- grid


@dataclass(frozen=True)
class RunPart:
    """One task's samples from one run, with that run's facts."""

    info: RunInfo
    samples: TaskSamples


@dataclass(frozen=True)
class Grid:
    """Rollouts of one task arranged by cell and document.

    Attributes:
        task, model: what the grid is of.
        docs: every document id seen in any run (sorted); the denominator of oracle and SC.
        by_cell: cell -> doc_id -> rollouts of that cell on that document, by cycle.
        parts: the merged runs, in the order given.
        unplaced: rollouts without (L, T) metadata (ignored).
        duplicates: rollouts dropped because an earlier run had the same (doc, L, T, cycle).
        repeated: rollouts dropped because their own run already had that (doc, L, T, cycle).
        vote_rule: how votes were labelled (:data:`VOTE_CLUSTERS`, :data:`VOTE_STRINGS`, ...).
    """

    task: str
    model: str
    docs: tuple[int, ...]
    by_cell: dict[Cell, dict[int, tuple[RolloutRow, ...]]]
    parts: tuple[RunPart, ...] = ()
    unplaced: int = 0
    duplicates: int = 0
    repeated: int = 0
    notes: tuple[str, ...] = field(default=())
    vote_rule: str = VOTE_STRINGS

    @property
    def L_values(self) -> tuple[int, ...]:
        return tuple(sorted({c.L for c in self.by_cell}))

    @property
    def T_values(self) -> tuple[float, ...]:
        return tuple(sorted({c.T for c in self.by_cell}))

    @property
    def cells(self) -> tuple[Cell, ...]:
        """Cells that have rollouts, L-major (L ascending, then T ascending)."""
        return tuple(sorted(self.by_cell))

    @property
    def n_docs(self) -> int:
        return len(self.docs)

    @property
    def n_rollouts(self) -> int:
        return sum(len(rs) for docs in self.by_cell.values() for rs in docs.values())

    def missing_cells(self) -> list[Cell]:
        """Cells of the rectangle ``L_values × T_values`` without any rollout."""
        return [Cell(L, T) for L in self.L_values for T in self.T_values if (L, T) not in self.by_cell]

    def incomplete_cells(self) -> dict[Cell, int]:
        """Present cells that lack some documents: cell -> number of documents missing."""
        return {c: self.n_docs - len(d) for c, d in sorted(self.by_cell.items()) if len(d) < self.n_docs}

    def rollouts_in(self, cells: Iterable[Cell], doc_id: int) -> list[RolloutRow]:
        """The rollouts of ``doc_id`` over ``cells``, in the order of ``cells`` then cycle."""
        out: list[RolloutRow] = []
        for cell in cells:
            out.extend(self.by_cell.get(cell, {}).get(doc_id, ()))
        return out


def vote_labels(rows: Sequence[tuple[int, RolloutRow]]) -> list[int | None]:
    """Vote labels of one document's rollouts, given as ``(part index, row)``: rollouts in one cluster
    of one run, or with equal answer strings, get one label (the module docstring); None = no answer."""
    parent: dict[object, object] = {}  # union-find over answer strings and (run, cluster id) pairs

    def root(node):
        while parent.setdefault(node, node) != node:
            node = parent[node]
        return node

    for part, row in rows:
        if row.answer is not None and row.cluster is not None:
            parent[root(("cluster", part, row.cluster))] = root(("answer", row.answer))
    numbers: dict[object, int] = {}
    return [
        None if row.answer is None else numbers.setdefault(root(("answer", row.answer)), len(numbers))
        for _, row in rows
    ]


def _vote_rule(parts: Sequence[RunPart]) -> str:
    flags = {p.samples.has_clusters for p in parts if any(r.answer is not None for r in p.samples.rollouts)}
    if flags == {True}:
        return VOTE_CLUSTERS
    return VOTE_MIXED if True in flags else VOTE_STRINGS


def build_grid(task: str, parts: Sequence[RunPart]) -> Grid:
    """Merge the runs' rollouts of ``task`` into one grid (rules in the module docstring)."""
    if not parts:
        raise ValueError(f"no run holds samples of task {task!r}; nothing to analyse.")
    models: dict[str, list[str]] = {}
    for part in parts:
        models.setdefault(part.info.model, []).append(part.info.name or part.info.path.name)
    if len(models) > 1:
        listing = "; ".join(f"{m!r} in {names}" for m, names in models.items())
        raise ValueError(f"runs of different models cannot share one grid: {listing}. Pass runs of one model.")

    doc_hashes: dict[int, tuple[str, Path]] = {}
    seen: dict[tuple[int, int, float, int], int] = {}  # key -> index of the part it was first read from
    kept: dict[int, list[tuple[int, RolloutRow]]] = {}  # doc -> (part index, row), to label the votes
    unplaced = duplicates = repeated = 0
    for index, part in enumerate(parts):
        for doc_id, doc_hash in part.samples.doc_hashes.items():
            first = doc_hashes.setdefault(doc_id, (doc_hash, part.samples.path))
            if doc_hash and first[0] and first[0] != doc_hash:
                raise ValueError(
                    f"doc {doc_id} differs between {first[1]} and {part.samples.path} (doc_hash "
                    f"{first[0]} vs {doc_hash}); merge only runs over the same data."
                )
        for row in part.samples.rollouts:
            if row.cell is None:
                unplaced += 1
                continue
            key = (row.doc_id, row.L, row.T, row.cycle if row.cycle is not None else row.repeat)
            if key in seen:
                if seen[key] == index:
                    repeated += 1
                else:
                    duplicates += 1
                continue
            seen[key] = index
            kept.setdefault(row.doc_id, []).append((index, row))

    cells: dict[Cell, dict[int, list[RolloutRow]]] = {}
    for doc_id, rows in kept.items():
        for (_, row), label in zip(rows, vote_labels(rows)):
            cells.setdefault(row.cell, {}).setdefault(doc_id, []).append(replace(row, vote=label))

    notes = []
    if unplaced:
        notes.append(f"{unplaced} rollouts carry no (L, T) (a model other than eglr-hf) and are ignored.")
        logger.warning("%s: %s", task, notes[-1])
    if duplicates:
        notes.append(
            f"{duplicates} rollouts repeat a (doc, L, T, cycle) of an earlier run; the earlier run's are kept."
        )
        logger.warning("%s: %s", task, notes[-1])
    if repeated:
        notes.append(
            f"{repeated} rollouts repeat a deterministic (doc, L, T) within their own run (the task repeats "
            "the cell, eglr-hf decodes it once); each is counted once."
        )
        logger.info("%s: %s", task, notes[-1])
    by_cell = {
        cell: {d: tuple(sorted(rs, key=lambda r: (r.cycle or 0, r.repeat))) for d, rs in sorted(docs.items())}
        for cell, docs in sorted(cells.items())
    }
    return Grid(
        task=task,
        model=parts[0].info.model,
        docs=tuple(sorted(doc_hashes)),
        by_cell=by_cell,
        parts=tuple(parts),
        unplaced=unplaced,
        duplicates=duplicates,
        repeated=repeated,
        notes=tuple(notes),
        vote_rule=_vote_rule(parts),
    )


def load_parts(
    run_paths: Sequence[str | Path], task: str | None = None, filter_name: str | None = None
) -> tuple[str, list[RunPart]]:
    """Find the runs under ``run_paths`` and read the samples of one task.

    Returns ``(task, parts)``. With ``task=None`` the runs must hold exactly one task with samples;
    several tasks is a ``ValueError`` naming them.
    """
    if not run_paths:
        raise ValueError("no run folder given; pass at least one folder written by lm_eval --output_path.")
    runs = [run for path in run_paths for run in find_runs(path)]
    infos = [(run, run_info(read_results(run.results), run.results, run.name)) for run in runs]
    with_samples = sorted({t for run, _ in infos for t in run.samples})
    if not with_samples:
        raise ValueError(
            f"the runs under {[str(p) for p in run_paths]} have no samples files; rerun lm_eval with --log_samples."
        )
    if task is None:
        if len(with_samples) > 1:
            raise ValueError(
                f"the runs hold several tasks {with_samples}; one grid is one task: pass --task NAME "
                "(or task=...) with one of them."
            )
        task = with_samples[0]
    elif task not in with_samples:
        raise ValueError(f"task {task!r} has no samples in these runs; tasks with samples: {with_samples}.")
    parts = []
    for run, info in infos:
        if task in run.samples:
            parts.append(RunPart(info=info, samples=read_task_samples(run.samples[task], filter_name)))
        elif task in info.tasks:
            logger.warning("%s has results for %s but no samples file (run without --log_samples?)", run.name, task)
    return task, parts


def load_grid(run_paths: Sequence[str | Path], task: str | None = None, filter_name: str | None = None) -> Grid:
    """Read and merge the runs under ``run_paths`` into the grid of one task."""
    task, parts = load_parts(run_paths, task, filter_name)
    return build_grid(task, parts)
