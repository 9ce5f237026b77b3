"""Section "Compute": ρ, iterations and FLOP ratios of the runs and of each cell, and what the
accounting leaves out."""

from __future__ import annotations

from eglr_harness.analysis.metrics.compute import Compute, grid_compute
from eglr_harness.analysis.render import markdown_table, num
from eglr_harness.analysis.sections.section import ReportContext, Section, Table, register_section

_HEADER = ["run_or_cell", "tokens", "gated_tokens", "rho", "mean_iterations", "flop_ratio", "batched_flop_ratio"]
_HEADER += ["wall_time_s"]


def _row(c: Compute) -> list:
    return [c.label, c.tokens, c.gated_tokens, c.rho, c.mean_iterations, c.flop_ratio, c.batched_flop_ratio,
            c.wall_time_s]  # fmt: skip


@register_section("compute")
class ComputeSection(Section):
    DEFINITIONS = """\
- FLOP ratio = (N·tokens + Σ L·k) / (N·tokens) from the run's accounting; merged runs are token-weighted.
"""

    def compute(self, ctx: ReportContext) -> dict:
        counted = grid_compute(ctx.grid)  # each rollout once, as the grid counts it
        return {"runs": counted.runs, "total": counted.total, "cells": counted.cells, "reused": counted.reused,
                "notes": counted.notes}

    def tables(self, ctx: ReportContext, result) -> list[Table]:
        total = [result["total"]] if result["total"] else []
        return [
            Table("compute_runs.csv", _HEADER, [_row(c) for c in (*result["runs"], *total)]),
            Table("compute_cells.csv", _HEADER, [_row(c) for c in result["cells"].values()]),
        ]

    def markdown(self, ctx: ReportContext, result, figs) -> list[str]:
        runs, total = result["runs"], result["total"]
        rows = [
            [c.label, c.tokens, num(c.rho), num(c.mean_iterations, 2), num(c.flop_ratio), num(c.batched_flop_ratio),
             num(c.wall_time_s, 1)]  # fmt: skip
            for c in (*runs, *([total] if total and len(runs) > 1 else []))
        ]
        if not rows:
            return [
                "\n## Compute\n",
                "No run carries EGLR compute accounting (`config.eglr.stats`); were these eglr-hf runs?",
            ]
        header = ["run", "tokens", "ρ (gated share)", "mean iterations", "FLOP ratio vs greedy", "batched FLOP ratio"]
        text = markdown_table([*header, "wall s"], rows)
        eglr = next((p.info.eglr for p in ctx.grid.parts if p.info.eglr), None) or {}
        if eglr:
            text += f"\n\nSettings: `{eglr.get('settings')}`; τ_H: `{eglr.get('tau_h')}`; "
            text += f"model layers N = {eglr.get('num_layers')}."
        if result["cells"]:
            text += "\nPer-cell compute: `compute_cells.csv`."
        return ["\n## Compute\n", text + _coverage(ctx, result)]


def _coverage(ctx: ReportContext, result) -> str:
    """Say which rollouts the accounting leaves out: reused ones were generated (and counted) elsewhere."""
    notes = list(result.get("notes", ()))
    if result["reused"]:
        notes.append(
            f"{result['reused']} of {ctx.grid.n_rollouts} rollouts were taken from the rollout store, "
            "not generated in these runs: the figures above do not count them."
        )
    unaccounted = [c for c in ctx.grid.cells if c not in result["cells"]]
    if result["cells"] and unaccounted:
        notes.append(
            f"{len(unaccounted)} of {len(ctx.grid.cells)} cells carry no accounting (every rollout reused, or "
            f"made by a run without EGLR stats): {', '.join(c.label for c in unaccounted)}."
        )
    return "".join(f"\n\n**Coverage.** {note}" for note in notes)
