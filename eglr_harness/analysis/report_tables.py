"""The report's CSV tables (one file per analysis)."""

from __future__ import annotations

from pathlib import Path

from eglr_harness.analysis.report_data import ReportData, corner_cells
from eglr_harness.analysis.rollouts import cell_label
from eglr_harness.analysis.tables import write_csv

__all__ = ["write_tables"]


def write_tables(data: ReportData, out: Path) -> list[Path]:
    """Write every CSV of the report into ``out``; returns the paths written."""
    grid, n = data.grid, data.grid.n_docs
    files = [
        write_csv(
            out / "cell_accuracy.csv",
            ["L", "T", "correct", "rollouts", "accuracy", "solved_docs", "docs"],
            [
                [a.cell[0], a.cell[1], a.correct, a.rollouts, round(a.accuracy, 6), a.solved, a.docs]
                for a in data.accuracy.values()
            ],
        ),
        write_csv(
            out / "cumulative_oracle.csv",
            ["L_max", "T_max", "solved", "docs", "oracle", "corner"],
            [
                [L, T, v, n, round(v / n, 6) if n else None, corner_cells(grid).get((L, T))]
                for (L, T), v in data.cumulative.items()
            ],
        ),
        write_csv(
            out / "pools.csv",
            [
                "pool",
                "configs",
                "docs",
                "greedy",
                "best_config",
                "best",
                "sc",
                "sc_solved",
                "oracle",
                "oracle_solved",
                "random_oracle",
            ],
            [
                [
                    p.pool,
                    p.configs,
                    p.docs,
                    p.greedy,
                    p.best_cell and cell_label(p.best_cell),
                    p.best,
                    p.sc,
                    p.sc_solved,
                    p.oracle,
                    p.oracle_solved,
                    p.random_oracle,
                ]
                for p in data.pools.values()
            ],
        ),
        write_csv(
            out / "exclusive_marginal.csv",
            ["L", "T", "solved", "exclusive", "marginal_over_greedy"],
            [
                [
                    c[0],
                    c[1],
                    len(data.solved[c]),
                    data.exclusive[c],
                    None if data.marginal is None else data.marginal[c],
                ]
                for c in data.solved
            ],
        ),
        write_csv(
            out / "missing_cells.csv",
            ["L", "T", "docs_missing"],
            (
                [[c[0], c[1], n] for c in grid.missing_cells()]
                + [[c[0], c[1], k] for c, k in grid.incomplete_cells().items()]
            ),
        ),
    ]
    for name, m in data.disagreement.items():
        files.append(
            write_csv(
                out / f"disagreement_{name.replace('-', '_')}.csv",
                ["row \\ col"] + [cell_label(c) for c in m.cols],
                [[cell_label(r)] + list(vals) for r, vals in zip(m.rows, m.values)],
            )
        )
    for pool, (stated, rand) in data.budgets.items():
        files.append(
            write_csv(
                out / f"budget_{pool}.csv",
                [
                    "budget",
                    "added_config_stated_order",
                    "sc_stated",
                    "oracle_stated",
                    "sc_random_mean",
                    "oracle_random_mean",
                ],
                [
                    [
                        b,
                        cell_label(stated.cells[b - 1]),
                        round(stated.sc[b - 1], 6),
                        round(stated.oracle[b - 1], 6),
                        round(rand.sc[b - 1], 6),
                        round(rand.oracle[b - 1], 6),
                    ]
                    for b in stated.budgets
                ],
            )
        )
    compute_rows = [
        [c.label, c.tokens, c.gated_tokens, c.rho, c.mean_iterations, c.flop_ratio, c.batched_flop_ratio, c.wall_time_s]
        for c in (*data.runs_compute, *([data.total_compute] if data.total_compute else []))
    ]
    header = [
        "run_or_cell",
        "tokens",
        "gated_tokens",
        "rho",
        "mean_iterations",
        "flop_ratio",
        "batched_flop_ratio",
        "wall_time_s",
    ]
    files.append(write_csv(out / "compute_runs.csv", header, compute_rows))
    files.append(
        write_csv(
            out / "compute_cells.csv",
            header,
            [
                [
                    c.label,
                    c.tokens,
                    c.gated_tokens,
                    c.rho,
                    c.mean_iterations,
                    c.flop_ratio,
                    c.batched_flop_ratio,
                    c.wall_time_s,
                ]
                for c in data.cells_compute.values()
            ],
        )
    )
    return files
