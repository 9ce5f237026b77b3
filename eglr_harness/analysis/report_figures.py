"""The report's PNG figures: accuracy and cumulative-oracle heatmaps, disagreement, budget curves."""

from __future__ import annotations

from pathlib import Path

from eglr_harness.analysis import figures
from eglr_harness.analysis.pools import POOL_TITLES
from eglr_harness.analysis.report_data import ReportData, corner_cells, t_label
from eglr_harness.analysis.rollouts import cell_label
from eglr_harness.analysis.tables import num

__all__ = ["write_figures"]


def write_figures(data: ReportData, out: Path) -> dict[str, Path]:
    """Draw every PNG of the report into ``out``; returns figure key -> path (keys used by report.md)."""
    grid, n = data.grid, data.grid.n_docs
    Ls, Ts = grid.L_values, grid.T_values
    if not Ls:
        return {}
    rows, cols = [f"L={L}" for L in Ls], [f"T={t_label(T)}" for T in Ts]
    made = {}
    acc = [[data.accuracy[(L, T)].accuracy * 100 if (L, T) in data.accuracy else None for T in Ts] for L in Ls]
    notes = [
        [
            (
                f"{data.accuracy[(L, T)].correct}\n{data.accuracy[(L, T)].accuracy * 100:.0f}%"
                if (L, T) in data.accuracy
                else "missing"
            )
            for T in Ts
        ]
        for L in Ls
    ]
    made["accuracy"] = figures.heatmap(
        out / "accuracy_heatmap.png",
        acc,
        rows,
        cols,
        annotations=notes,
        vmin=0,
        vmax=100,
        title=f"{grid.task}: accuracy per cell (correct rollouts, %; n={n})",
        xlabel="T",
        ylabel="L",
        colorbar_label="accuracy (%)",
    )
    corners = corner_cells(grid)
    cum = [[data.cumulative[(L, T)] / n * 100 if n else None for T in Ts] for L in Ls]
    cum_notes = [
        [f"{data.cumulative[(L, T)]}" + (f"\n{corners[(L, T)]}" if (L, T) in corners else "") for T in Ts] for L in Ls
    ]
    made["cumulative_oracle"] = figures.heatmap(
        out / "cumulative_oracle.png",
        cum,
        rows,
        cols,
        annotations=cum_notes,
        vmin=0,
        vmax=100,
        cmap="magma",
        title=f"{grid.task}: cumulative oracle over [0..L]×[0..T] (solved of {n})",
        xlabel="T max",
        ylabel="L max",
        colorbar_label="oracle (%)",
    )
    for name, m in data.disagreement.items():
        if m.rows and m.cols:
            made[f"disagreement_{name}"] = figures.heatmap(
                out / f"disagreement_{name.replace('-', '_')}.png",
                m.values,
                [cell_label(c) for c in m.rows],
                [cell_label(c) for c in m.cols],
                annotations=[[str(v) for v in row] for row in m.values],
                cmap="cividis",
                title=f"{grid.task}: disagreement {name} (|solved △ solved|; mean {num(m.mean, 1)}, max {m.max})",
                xlabel="",
                ylabel="",
                colorbar_label="problems",
            )
    for pool, (stated, rand) in data.budgets.items():
        made[f"budget_{pool}"] = figures.budget_plot(
            out / f"budget_{pool}.png",
            [
                ("SC, stated order (L-major)", stated.sc, "-", "C0"),
                ("SC, random orders (mean)", rand.sc, "--", "C0"),
                ("oracle, stated order (L-major)", stated.oracle, "-", "C2"),
                ("oracle, random orders (mean)", rand.oracle, "--", "C2"),
            ],
            title=f"{grid.task}: {POOL_TITLES[pool]} — majority vote and oracle vs budget",
        )
    return made
