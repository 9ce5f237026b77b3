"""Analyses of saved EGLR runs: files in (lm-eval results + samples), tables and figures out.

Reads only what ``lm_eval --output_path DIR --log_samples`` writes (docs/run-format.md); never
imports torch, transformers or lm_eval, never loads a model, never runs one (the leaderboard
runner, which does, is :mod:`eglr_harness.leaderboard`). Three layers, one folder each:

- :mod:`~eglr_harness.analysis.load` — the one loader, a module per job: ``files`` (find and read
  run files), ``runs`` (a run's facts), ``rollouts`` (samples -> rollout rows), ``grid`` (merge into
  the L×T grid of one task and one model);
- :mod:`~eglr_harness.analysis.metrics` — the numbers more than one place reads, pure functions of loaded
  runs: ``accuracy`` (per-cell accuracy, pools, best cell, majority vote), ``oracle``, ``budget`` (budget
  curves), ``compute`` (ρ, iterations, FLOP ratio), ``intervals``, ``ties``, ``ablation``, ``bestofn``;
- the report: :mod:`~eglr_harness.analysis.report` (the section registry and ``build_report``),
  :mod:`~eglr_harness.analysis.sections` (one module per report part: calls the metrics, writes CSV
  rows, Markdown, figures; a figure only its own section uses is computed there: ``disagreement``,
  ``rules``, ``resampling``, ``selection``, ``accuracy_vs_compute``), :mod:`~eglr_harness.analysis.render`
  (CSV, Markdown, PNG helpers) and :mod:`~eglr_harness.commands.report` (``eglr-report``).
"""

from __future__ import annotations

from eglr_harness.analysis.metrics.accuracy import (
    POOLS,
    CellAccuracy,
    best_in_pool,
    cell_accuracy,
    oracle_solved,
    pool_cells,
    sc_solved,
    solved_sets,
    vote_is_correct,
)
from eglr_harness.analysis.metrics.ablation import Ablation, AblationPoint, ablation
from eglr_harness.analysis.metrics.budget import BudgetCurve, RunningVote, budget_curve, random_order_curve
from eglr_harness.analysis.metrics.compute import Compute, cell_compute, combine_compute, run_compute
from eglr_harness.analysis.sections.disagreement import (
    DisagreementMatrix,
    disagreement_matrix,
    disagreement_slices,
    exclusive_counts,
    marginal_over_greedy,
)
from eglr_harness.analysis.load import (
    GREEDY,
    Grid,
    RolloutRow,
    RunFiles,
    RunInfo,
    RunPart,
    TaskSamples,
    build_grid,
    find_runs,
    load_grid,
    load_parts,
    metric_entry,
    metric_value,
    model_identity,
    model_name,
    read_results,
    read_samples,
    read_task_samples,
    rollouts_of_sample,
    run_info,
)
from eglr_harness.analysis.metrics.oracle import (
    CORNERS,
    cumulative_oracle,
    expected_random_oracle,
    oracle_corners,
    union_size,
)
from eglr_harness.analysis.sections.selection import Aggregator, Selection, l_agreement, selection
from eglr_harness.analysis.report import (
    SECTIONS,
    ReportContext,
    Section,
    build_report,
    compute_report,
    register_section,
    write_report,
)
from eglr_harness.analysis.sections.pools import PoolSummary, summarize_pool

__all__ = [
    "Ablation",
    "AblationPoint",
    "Aggregator",
    "BudgetCurve",
    "CORNERS",
    "CellAccuracy",
    "Compute",
    "DisagreementMatrix",
    "GREEDY",
    "Grid",
    "POOLS",
    "PoolSummary",
    "ReportContext",
    "RolloutRow",
    "RunFiles",
    "RunInfo",
    "RunPart",
    "RunningVote",
    "SECTIONS",
    "Section",
    "Selection",
    "TaskSamples",
    "ablation",
    "best_in_pool",
    "budget_curve",
    "build_grid",
    "build_report",
    "cell_accuracy",
    "cell_compute",
    "combine_compute",
    "compute_report",
    "cumulative_oracle",
    "disagreement_matrix",
    "disagreement_slices",
    "exclusive_counts",
    "expected_random_oracle",
    "find_runs",
    "l_agreement",
    "load_grid",
    "load_parts",
    "marginal_over_greedy",
    "metric_entry",
    "metric_value",
    "model_identity",
    "model_name",
    "oracle_corners",
    "oracle_solved",
    "pool_cells",
    "random_order_curve",
    "read_results",
    "read_samples",
    "read_task_samples",
    "register_section",
    "rollouts_of_sample",
    "run_compute",
    "run_info",
    "sc_solved",
    "selection",
    "solved_sets",
    "summarize_pool",
    "union_size",
    "vote_is_correct",
    "write_report",
]
