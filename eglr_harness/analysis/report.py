"""``build_report``: saved lm-eval runs in, a folder with report.md, CSV tables and PNGs out.

Pipeline: :func:`load_grid` (files) -> :func:`compute_report` (pure metrics) ->
:func:`write_report` (CSV, PNG, Markdown). Nothing here loads a model or imports torch.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from eglr_harness.analysis.budget import DEFAULT_ORDERS, DEFAULT_SEED
from eglr_harness.analysis.grid import load_grid
from eglr_harness.analysis.report_data import ReportData, compute_report
from eglr_harness.analysis.report_figures import write_figures
from eglr_harness.analysis.report_markdown import render_markdown
from eglr_harness.analysis.report_tables import write_tables

__all__ = ["ReportData", "compute_report", "write_report", "build_report", "default_out_dir"]

logger = logging.getLogger(__name__)


def write_report(data: ReportData, out_dir: Path) -> Path:
    """Write tables, figures and report.md of ``data`` into ``out_dir``; returns ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_tables(data, out)
    figs = write_figures(data, out)
    (out / "report.md").write_text(render_markdown(data, figs), encoding="utf-8")
    logger.info("report written to %s", out)
    return out


def default_out_dir(run_dirs: Sequence[str | Path]) -> Path:
    """``<first run dir>/report`` (the folder beside a results file given directly)."""
    first = Path(run_dirs[0])
    return (first.parent if first.is_file() else first) / "report"


def build_report(
    run_dirs: Sequence[str | Path],
    out_dir: str | Path | None = None,
    *,
    task: str | None = None,
    filter_name: str | None = None,
    n_orders: int = DEFAULT_ORDERS,
    seed: int = DEFAULT_SEED,
) -> Path:
    """Read the runs under ``run_dirs`` (one task, one model), write the report folder, return it.

    Args:
        run_dirs: folders given to ``lm_eval --output_path`` (or results JSON files); merged.
        out_dir: report folder; default ``<run_dirs[0]>/report``.
        task: the task to analyse when the runs hold several.
        filter_name: lm-eval filter whose samples lines to read (default: the first in each file).
        n_orders, seed: random orders of the budget curves.
    """
    if isinstance(run_dirs, (str, Path)):
        run_dirs = [run_dirs]
    grid = load_grid(run_dirs, task=task, filter_name=filter_name)
    data = compute_report(grid, n_orders=n_orders, seed=seed)
    return write_report(data, Path(out_dir) if out_dir is not None else default_out_dir(run_dirs))
