"""Section "Selection": aggregators beside the majority vote (weighted by the model's confidence,
best rollout by one signal, a fitted combination scored on held-out problems), per pool, against
the majority vote (paired bootstrap) and the oracle gap."""

from __future__ import annotations

from eglr_harness.analysis.metrics.accuracy import POOL_TITLES, POOLS, pool_cells
from eglr_harness.analysis.metrics.intervals import sign_test_p
from eglr_harness.analysis.metrics.selection import selection
from eglr_harness.analysis.render import markdown_table, pct
from eglr_harness.analysis.sections.section import ReportContext, Section, Table, register_section
from eglr_harness.core.signals import RECORDED_SIGNALS

_HEADER = ["pool", "aggregator", "solved", "docs", "accuracy", "gap_recovered", "diff_vs_majority", "diff_low",
           "diff_high", "gained", "lost", "sign_test_p", "note"]


def _discordant(a, base) -> tuple[int, int, float]:
    """Problems the aggregator solves and the majority vote misses, the reverse, and the exact sign test."""
    gained = sum(x > y for x, y in zip(a.solved, base.solved))
    lost = sum(x < y for x, y in zip(a.solved, base.solved))
    return gained, lost, sign_test_p(gained, lost)


@register_section("selection")
class SelectionSection(Section):
    DEFINITIONS = """\
- Selection: each aggregator answers a problem with one answer of the pool's rollouts. Gap recovered =
  (acc − greedy) / (oracle − greedy). Difference vs majority vote: paired bootstrap over problems (95 %).
  Halves for fitting: the SHA-256 of lm-eval's doc hash, first byte's parity; fitted on one half, scored on
  the other, both ways. Signals: `eglr_harness/core/signals.py`; `l_agreement` = share of the problem's rollouts
  at the same T and another L in the same answer cluster.
"""

    def compute(self, ctx: ReportContext):
        grid = ctx.grid
        hashes = {}
        for part in grid.parts:
            for d, h in part.samples.doc_hashes.items():
                hashes.setdefault(d, h)
        out = {}
        for pool in POOLS:
            cells = pool_cells(grid.cells, pool)
            if len(cells) >= 2:
                out[pool] = selection(grid, cells, pool, doc_hashes=hashes, seed=ctx.seed)
        return out

    def tables(self, ctx: ReportContext, result) -> list[Table]:
        rows = []
        for pool, sel in result.items():
            for a in sel.aggregators:
                d = sel.vs_majority.get(a.name)
                rows.append([pool, a.name, sum(a.solved), len(a.solved), round(a.accuracy, 6),
                             None if sel.gap_recovered(a) is None else round(sel.gap_recovered(a), 6),
                             *((round(x, 6) for x in d) if d else (None, None, None)),
                             *(_discordant(a, sel.aggregators[0]) if d else (None, None, None)), a.note])  # fmt: skip
        return [Table("selection.csv", _HEADER, rows)]

    def markdown(self, ctx: ReportContext, result, figs) -> list[str]:
        parts = ["\n## Selection\n"]
        if not result:
            return parts + ["No pool of two or more cells: nothing to select from."]
        recorded = {s for sel in result.values() for s in sel.signals}
        if not recorded:
            parts.append(
                "No signals recorded: the runs' rollouts carry no `signals` (docs/run-format.md), so the "
                f"confidence-weighted votes and the recorded signals ({', '.join(RECORDED_SIGNALS)}) are not "
                "available; only the signal derived from the answers, `l_agreement`, is.\n"
            )
        for pool, sel in result.items():
            g = None if sel.greedy is None else sum(sel.greedy)
            head = f"\n### {POOL_TITLES.get(pool, pool)}\n\n{len(sel.docs)} problems; oracle {sum(sel.oracle)}"
            head += "" if g is None else f", greedy {g}"
            head += "; signals: " + (", ".join(sel.signals) if sel.signals else "none recorded") + ".\n"
            rows = []
            for a in sel.aggregators:
                d = sel.vs_majority.get(a.name)
                gap = sel.gap_recovered(a)
                gained, lost, p = _discordant(a, sel.aggregators[0]) if d else (None, None, None)
                rows.append([a.name, sum(a.solved), pct(a.accuracy), None if gap is None else pct(gap, 0),
                             None if d is None else f"{d[0] * len(sel.docs):+.0f} ({d[1] * len(sel.docs):+.1f} … "
                             f"{d[2] * len(sel.docs):+.1f})", None if d is None else f"{gained} / {lost}",
                             None if p is None else f"{p:.3g}", a.note or None])  # fmt: skip
            parts += [head, markdown_table(
                ["aggregator", "solved", "accuracy %", "oracle gap recovered %", "vs majority (problems, 95 % CI)",
                 "gained / lost", "sign test p", "note"], rows)]  # fmt: skip
        parts.append("\nTable: `selection.csv`.")
        return parts
