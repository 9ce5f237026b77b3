"""Analyses of saved EGLR runs: files in (lm-eval results + samples), tables and figures out.

Reads only what ``lm_eval --output_path DIR --log_samples`` writes (docs/run-format.md); never
imports torch, transformers or lm_eval, never loads a model. Modules, one job each:

- :mod:`~eglr_harness.analysis.files` — find and parse lm-eval's results/samples files;
- :mod:`~eglr_harness.analysis.runinfo` — model identity, metrics and ``config.eglr`` of a run;
- :mod:`~eglr_harness.analysis.rollouts` — per-document ``rollouts`` -> rows;
- :mod:`~eglr_harness.analysis.grid` — merge runs into the L×T grid of one task and model;
- :mod:`~eglr_harness.analysis.votes` — majority vote (exact-string clusters, documented ties);
- :mod:`~eglr_harness.analysis.accuracy` — per-cell accuracy, solved sets, cumulative oracle;
- :mod:`~eglr_harness.analysis.pools` — Table 5: greedy / best / SC / oracle per pool;
- :mod:`~eglr_harness.analysis.disagreement` — disagreement, exclusive, marginal over greedy;
- :mod:`~eglr_harness.analysis.budget` — SC and oracle against the budget;
- :mod:`~eglr_harness.analysis.compute` — ρ, iterations, FLOP ratio;
- :mod:`~eglr_harness.analysis.report` / :mod:`~eglr_harness.analysis.cli` — ``eglr-report``;
- :mod:`~eglr_harness.analysis.leaderboard` (+ ``_plan``, ``_table``) — ``eglr-leaderboard``.
"""

from __future__ import annotations

from eglr_harness.analysis.accuracy import (
    CORNERS,
    CellAccuracy,
    cell_accuracy,
    cumulative_oracle,
    expected_random_oracle,
    oracle_corners,
    solved_sets,
    union_size,
)
from eglr_harness.analysis.budget import BudgetCurve, budget_curve, random_order_curve
from eglr_harness.analysis.compute import Compute, cell_compute, combine_compute, parse_cell_key, run_compute
from eglr_harness.analysis.disagreement import (
    DisagreementMatrix,
    disagreement_matrix,
    disagreement_slices,
    exclusive_counts,
    marginal_over_greedy,
)
from eglr_harness.analysis.files import RunFiles, find_runs, read_results, read_samples
from eglr_harness.analysis.grid import GREEDY, Grid, RunPart, build_grid, load_grid, load_parts
from eglr_harness.analysis.pools import POOLS, PoolSummary, oracle_solved, pool_cells, sc_solved, summarize_pool
from eglr_harness.analysis.report import ReportData, build_report, compute_report, write_report
from eglr_harness.analysis.rollouts import Cell, Rollout, TaskSamples, cell_label, read_task_samples, rollouts_of_sample
from eglr_harness.analysis.runinfo import RunInfo, metric_entry, metric_value, model_identity, run_info
from eglr_harness.analysis.votes import RunningVote, majority_answer, vote_is_correct

__all__ = [
    "BudgetCurve",
    "CORNERS",
    "Cell",
    "CellAccuracy",
    "Compute",
    "DisagreementMatrix",
    "GREEDY",
    "Grid",
    "POOLS",
    "PoolSummary",
    "ReportData",
    "Rollout",
    "RunFiles",
    "RunInfo",
    "RunPart",
    "RunningVote",
    "TaskSamples",
    "budget_curve",
    "build_grid",
    "build_report",
    "cell_accuracy",
    "cell_compute",
    "cell_label",
    "combine_compute",
    "compute_report",
    "cumulative_oracle",
    "disagreement_matrix",
    "disagreement_slices",
    "exclusive_counts",
    "expected_random_oracle",
    "find_runs",
    "load_grid",
    "load_parts",
    "majority_answer",
    "marginal_over_greedy",
    "metric_entry",
    "metric_value",
    "model_identity",
    "oracle_corners",
    "oracle_solved",
    "parse_cell_key",
    "pool_cells",
    "random_order_curve",
    "read_results",
    "read_samples",
    "read_task_samples",
    "rollouts_of_sample",
    "run_compute",
    "run_info",
    "sc_solved",
    "solved_sets",
    "summarize_pool",
    "union_size",
    "vote_is_correct",
    "write_report",
]
