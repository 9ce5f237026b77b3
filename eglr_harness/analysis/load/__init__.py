"""The one loader: lm-eval run files -> runs (:class:`RunInfo`) -> tasks (:class:`TaskSamples`) ->
rollouts (:class:`RolloutRow`), merged into the L×T :class:`Grid` of one task and one model.

**Files.** lm-eval 0.4.13 (``lm_eval/loggers/evaluation_tracker.py``) writes, for an output
*folder* ``OUT``, ``OUT/<model_name_sanitized>/results_<date_id>.json`` and
``samples_<task>_<date_id>.jsonl`` beside it (one per task); for an output *file*
``OUT/name.json``, ``OUT/name_<date_id>.json`` with the samples beside it. ``date_id`` is
``datetime.now().isoformat()`` with ``:`` replaced by ``-``; a run's samples share its results
file's ``date_id``. A samples file may be gzip-compressed, ``samples_<task>_<date_id>.jsonl.gz`` (how results/
commits them), and is read as the plain one (docs/run-format.md).

**Rollouts.** Each row is one repeat of one document (docs/run-format.md): ``L``/``T``/``cycle``
are None when the run's model was not eglr-hf; ``answer`` is the task's extracted answer (None =
unparseable: never correct, never votes); ``cluster`` is the answer's equivalence cluster within
the document as the task logged it (None in runs made before tasks logged it).

**Merging** (stated in every report):
- each results file is read once (given twice, or through a link: once), and each run has its own name (runs named
  alike are named by their paths: :func:`distinct_runs`); a run given that holds no samples of the task (another
  task, another benchmark, no ``--log_samples``) is named in the report, never dropped without a word;
- one task and one model per grid (models compared by :func:`model_name`, so the same model
  installed elsewhere is the same model); anything else is a ``ValueError`` naming what was found;
- documents are matched by ``doc_id``; the same ``doc_id`` with a different ``doc_hash`` in two
  runs is an error (different data or order);
- a rollout is keyed by ``(doc_id, L, T, seed, cycle)`` (``seed``: a sampled rollout's, as labelled by a
  ``seeds=`` run or else its run's base seed; None for a deterministic cell, the same text under any seed,
  so a ``seeds=`` run's pool is never collapsed and never inflated); when two runs hold the same key, the run given
  first wins and the duplicate is counted; within one run the same key is a deterministic (T = 0)
  cell that the task repeats (eglr-hf decodes it once): kept once and counted apart;
- rollouts without ``(L, T)`` (runs of a model other than eglr-hf) cannot be placed and are counted
  as ``unplaced``;
- the grid's problems are the EGLR runs' (runs whose rollouts carry ``(L, T)``): a run of another model (greedy,
  beam search) is restricted to them, with a note of what it left out, and never adds a problem (with no EGLR run,
  every run's problems are the grid's); such a run is refused as a baseline, named with the reason, where it cannot
  be trusted (:mod:`~eglr_harness.analysis.load.baselines`);
- **vote labels**: within a document, rollouts with the same label vote together. Two rollouts
  share a label when the task put them in one equivalence cluster (same run) or when their answers
  are the same string.

**Modules** (one job each): :mod:`~eglr_harness.analysis.load.files` (find and read the files),
:mod:`~eglr_harness.analysis.load.runs` (a run's facts and metrics),
:mod:`~eglr_harness.analysis.load.rollouts` (samples -> rollout rows; every line, rollout and results
file checked by :mod:`eglr_harness.core.run_format`, the one check eglr-export and eglr-score share),
:mod:`~eglr_harness.analysis.load.grid` (merge into the grid), :mod:`~eglr_harness.analysis.load.baselines` (other
models' runs: beam count, first rollouts, why one is refused). Everything is importable from here.
"""

from eglr_harness.analysis.load.baselines import baseline_refusal, beam_count, first_rollouts
from eglr_harness.analysis.load.files import (
    RunFiles, date_id_of, distinct_runs, find_runs, read_results, read_samples,
)
from eglr_harness.analysis.load.grid import (
    GREEDY,
    VOTE_CLUSTERS,
    VOTE_MIXED,
    VOTE_STRINGS,
    Grid,
    RunPart,
    build_grid,
    load_grid,
    load_parts,
    vote_labels,
)
from eglr_harness.analysis.load.rollouts import (
    RolloutRow, TaskSamples, doc_ranges, read_task_samples, rollouts_of_sample,
)
from eglr_harness.analysis.load.runs import RunInfo, metric_entry, metric_names, metric_value, model_identity, run_info
from eglr_harness.run.model_names import model_name, parse_model_args

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
    "distinct_runs",
    "doc_ranges",
    "beam_count",
    "first_rollouts",
    "baseline_refusal",
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
