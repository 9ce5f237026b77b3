"""``eglr-leaderboard``: runs the paper's comparison set (greedy, beams, EGLR, EGLR-SC_L, Oracle_L)
for one model on several benchmarks through the stock ``lm_eval`` CLI, then tabulates it.

This package runs things (lm-eval in a subprocess); it reads the finished runs with
:mod:`eglr_harness.analysis`, which never runs anything. Modules:

- :mod:`~eglr_harness.leaderboard.runs` — the runs and their command lines (pure functions);
- :mod:`~eglr_harness.leaderboard.table` — numbers from finished runs, the Markdown/CSV tables;
- :mod:`~eglr_harness.leaderboard.runner` — execution, resume and records (the command line:
:mod:`eglr_harness.commands.leaderboard`).
"""

from __future__ import annotations

from eglr_harness.leaderboard.runner import LeaderboardOutcome, run_leaderboard
from eglr_harness.leaderboard.runs import LeaderboardOptions, PlannedRun, build_command, plan_runs
from eglr_harness.leaderboard.table import LeaderboardCell, cells_from_run, write_tables

__all__ = [
    "LeaderboardCell",
    "LeaderboardOptions",
    "LeaderboardOutcome",
    "PlannedRun",
    "build_command",
    "cells_from_run",
    "plan_runs",
    "run_leaderboard",
    "write_tables",
]
