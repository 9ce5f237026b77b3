"""The report's Markdown text (report.md)."""

from __future__ import annotations

from pathlib import Path

from eglr_harness.analysis.grid import GREEDY, Grid
from eglr_harness.analysis.pools import POOL_TITLES, POOLS
from eglr_harness.analysis.report_data import ReportData, t_label
from eglr_harness.analysis.rollouts import cell_label
from eglr_harness.analysis.tables import markdown_table, num, pct

__all__ = ["render_markdown", "DEFINITIONS"]

DEFINITIONS = """\
- Cell accuracy = correct rollouts / rollouts of the cell. A cell *solves* a problem when any of its rollouts on it
  is correct. Oracle, SC and disagreement use every problem of the grid as denominator; a problem missing from a
  cell counts as unsolved there.
- Pools: T = {L=0, T>0}; L = {T=0, L>0}; L ∪ T = both of them; L×T = all cells. Pool order is L-major (L, then
  T, then cycle).
- Oracle of B random grid cells: the expected oracle of B cells drawn uniformly without replacement from every
  cell of the grid, B = the pool's size (exact, not sampled). A pool's oracle above it is what its axis adds beyond
  the budget; at or below it, the pool's gain is the budget.
- Majority vote: answers (the tasks' canonical strings) cluster by exact string equality; a null answer never
  votes; ties go to the answer whose first occurrence is earliest in pool order. The vote is correct when the
  winning answer's first rollout is correct. (The tasks' own `maj@B` clusters by mathematical equivalence and can
  differ slightly.)
- Best single config: highest cell accuracy in the pool (first in pool order on ties), chosen on the same problems.
- Disagreement slices: L-vs-L over the L pool, T-vs-T over the T pool (mean/max over unordered pairs of distinct
  cells), T-vs-L = T pool rows × L pool columns (mean/max over all entries).
- Exclusive = problems solved by that cell and no other cell of the grid; marginal = problems it solves that
  greedy misses.
- Budget curves: after adding the first b configurations of the pool; stated order = pool order; random = mean
  over seeded random orders.
- FLOP ratio = (N·tokens + Σ L·k) / (N·tokens) from the run's accounting; merged runs are token-weighted.
"""


def _md_runs(grid: Grid) -> str:
    rows = [
        [
            str(p.info.path),
            p.info.model_source,
            p.samples.filter,
            len(p.samples.doc_hashes),
            len(p.samples.rollouts),
            None if p.info.limit is None else f"{p.info.limit:g}",
        ]
        for p in grid.parts
    ]
    return markdown_table(["results file", "model type", "filter", "docs", "rollouts", "limit"], rows)


def _md_coverage(grid: Grid) -> str:
    Ls, Ts = grid.L_values, grid.T_values
    lines = [
        f"- Documents: **{grid.n_docs}** (union over runs; the denominator of oracle and SC).",
        f"- L values: {list(Ls)}; T values: {[t_label(T) for T in Ts]}; cells with rollouts: "
        f"**{len(grid.cells)} of {len(Ls) * len(Ts)}** in the {len(Ls)}×{len(Ts)} rectangle.",
    ]
    missing, incomplete = grid.missing_cells(), grid.incomplete_cells()
    if missing:
        lines.append(f"- **Missing cells** (no rollout): {', '.join(cell_label(c) for c in missing)}.")
    if incomplete:
        lines.append(
            "- **Incomplete cells** (documents missing; counted unsolved there): "
            + ", ".join(f"{cell_label(c)} ({k})" for c, k in incomplete.items())
            + "."
        )
    if not missing and not incomplete:
        lines.append("- The grid is complete: every cell has every document.")
    if GREEDY not in grid.by_cell:
        lines.append(
            "- No greedy cell (L=0, T=0): greedy, marginal-over-greedy and the greedy corner are not available."
        )
    lines += [f"- {note}" for note in grid.notes]
    return "\n".join(lines)


def _md_accuracy(data: ReportData) -> str:
    Ts = data.grid.T_values
    rows = [
        [f"L={L}"]
        + [(f"{a.correct}/{a.rollouts} ({pct(a.accuracy)})" if (a := data.accuracy.get((L, T))) else None) for T in Ts]
        for L in data.grid.L_values
    ]
    return markdown_table(["L \\ T"] + [t_label(T) for T in Ts], rows)


def _md_pools(data: ReportData) -> str:
    p = data.pools

    def solved(frac):
        return None if frac is None else f"{pct(frac)}"

    rows = [
        ["Greedy (L=0, T=0)"] + [solved(p[k].greedy) for k in POOLS],
        ["Best single config"]
        + [(f"{pct(p[k].best)} ({cell_label(p[k].best_cell)})" if p[k].best_cell else None) for k in POOLS],
        ["SC (majority vote)"]
        + [(f"{pct(p[k].sc)} ({p[k].sc_solved})" if p[k].sc is not None else None) for k in POOLS],
        ["Oracle"]
        + [(f"{pct(p[k].oracle)} ({p[k].oracle_solved})" if p[k].oracle is not None else None) for k in POOLS],
        ["Oracle of B random grid cells (expected)"]
        + [(pct(p[k].random_oracle) if p[k].random_oracle is not None else None) for k in POOLS],
        ["configs in pool (B)"] + [p[k].configs for k in POOLS],
    ]
    return markdown_table(["method", *(POOL_TITLES[k] for k in POOLS)], rows)


def _md_disagreement(data: ReportData) -> str:
    rows = [
        [name, f"{len(m.rows)}×{len(m.cols)}", m.pairs, num(m.mean, 1), m.max] for name, m in data.disagreement.items()
    ]
    return markdown_table(["slice", "matrix", "pairs", "mean", "max"], rows)


def _md_exclusive(data: ReportData, top: int = 10) -> str:
    cells = sorted(data.solved, key=lambda c: (-data.exclusive[c], -(data.marginal or {}).get(c, 0), c))[:top]
    rows = [
        [cell_label(c), len(data.solved[c]), data.exclusive[c], None if data.marginal is None else data.marginal[c]]
        for c in cells
    ]
    return markdown_table(["cell", "solved", "exclusive", "marginal over greedy"], rows)


def _md_budget(data: ReportData) -> str:
    rows = []
    for pool, (stated, rand) in data.budgets.items():
        for b in sorted({1, min(4, len(stated.sc)), len(stated.sc) // 2 or 1, len(stated.sc)}):
            rows.append(
                [
                    POOL_TITLES[pool],
                    b,
                    pct(stated.sc[b - 1]),
                    pct(rand.sc[b - 1]),
                    pct(stated.oracle[b - 1]),
                    pct(rand.oracle[b - 1]),
                ]
            )
    return markdown_table(["pool", "budget b", "SC stated", "SC random", "oracle stated", "oracle random"], rows)


def _md_compute(data: ReportData) -> str:
    rows = [
        [
            c.label,
            c.tokens,
            num(c.rho),
            num(c.mean_iterations, 2),
            num(c.flop_ratio),
            num(c.batched_flop_ratio),
            num(c.wall_time_s, 1),
        ]
        for c in (
            *data.runs_compute,
            *([data.total_compute] if data.total_compute and len(data.runs_compute) > 1 else []),
        )
    ]
    if not rows:
        return "No run carries EGLR compute accounting (`config.eglr.stats`); were these eglr-hf runs?"
    text = markdown_table(
        ["run", "tokens", "ρ (gated share)", "mean iterations", "FLOP ratio vs greedy", "batched FLOP ratio", "wall s"],
        rows,
    )
    eglr = next((p.info.eglr for p in data.grid.parts if p.info.eglr), None) or {}
    if eglr:
        text += f"\n\nSettings: `{eglr.get('settings')}`; τ_H: `{eglr.get('tau_h')}`; "
        text += f"model layers N = {eglr.get('num_layers')}."
    if data.cells_compute:
        text += "\nPer-cell compute: `compute_cells.csv`."
    text += _md_compute_coverage(data)
    return text


def _md_compute_coverage(data: ReportData) -> str:
    """Say which rollouts the accounting leaves out: reused ones were generated (and counted) elsewhere."""
    notes = []
    if data.reused_rollouts:
        notes.append(
            f"{data.reused_rollouts} of {data.grid.n_rollouts} rollouts were taken from the rollout store, "
            "not generated in these runs: the figures above do not count them."
        )
    unaccounted = [c for c in data.grid.cells if c not in data.cells_compute]
    if data.cells_compute and unaccounted:
        notes.append(
            f"{len(unaccounted)} of {len(data.grid.cells)} cells carry no accounting (every rollout reused, or "
            f"made by a run without EGLR stats): {', '.join(cell_label(c) for c in unaccounted)}."
        )
    return "".join(f"\n\n**Coverage.** {note}" for note in notes)


def render_markdown(data: ReportData, figs: dict[str, Path]) -> str:
    """The report.md text (figures referenced by file name)."""
    grid, n = data.grid, data.grid.n_docs

    def img(key: str, alt: str) -> str:
        return f"![{alt}]({figs[key].name})\n" if key in figs else ""

    corners = data.corners
    corner_rows = [[name, v, pct(v / n) if v is not None and n else None] for name, v in corners.items()]
    parts = [
        f"# EGLR report: `{grid.task}` · `{grid.model}`\n",
        "Made by `eglr-report` from saved lm-eval runs only (no model loaded). Definitions at the end.\n",
        "## Runs\n",
        _md_runs(grid),
        "\n## Grid coverage\n",
        _md_coverage(grid),
        "\n## Accuracy per cell\nRows L, columns T; correct/rollouts (%). Table: `cell_accuracy.csv`.\n",
        img("accuracy", "accuracy heatmap"),
        _md_accuracy(data),
        "\n## Cumulative oracle over [0..L]×[0..T]\nProblems solved by at least one cell of the sub-grid. "
        "Table: `cumulative_oracle.csv`.\n",
        img("cumulative_oracle", "cumulative oracle"),
        markdown_table(["corner", "solved", "%"], corner_rows),
        "\n## Pools (Table 5 layout)\nAccuracy % (problems). Table: `pools.csv`.\n",
        _md_pools(data),
        "\n## Pairwise disagreement\n|solved(a) △ solved(b)| in problems. Tables: `disagreement_*.csv`.\n",
        _md_disagreement(data),
        "",
        *(img(f"disagreement_{k}", f"disagreement {k}") for k in data.disagreement),
        "\n## Exclusive contribution and marginal over greedy\nTop cells by exclusive count; all cells in "
        "`exclusive_marginal.csv`.\n",
        _md_exclusive(data),
        f"\n\nProblems solved by exactly one cell: {sum(data.exclusive.values())}.\n",
        "\n## Majority vote and oracle vs budget\nTables: `budget_<pool>.csv`.\n",
        _md_budget(data),
        "",
        *(img(f"budget_{k}", f"budget {k}") for k in data.budgets),
        "\n## Compute\n",
        _md_compute(data),
        "\n\n## Definitions\n",
        DEFINITIONS,
    ]
    return "\n".join(parts)
