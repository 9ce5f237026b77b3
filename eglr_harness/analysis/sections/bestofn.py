"""Section "Best-of-N with verifiers": accuracy against N for naive best-of-N, the weighted majority and
the plain majority, per pool and against as many random grid cells, from the scores ``eglr-verify``
wrote (:mod:`eglr_harness.analysis.metrics.bestofn`); nothing when the runs carry none (score them with
``eglr-verify RUN --verifier SPEC --out OUT`` and report the copy under OUT)."""

from __future__ import annotations

import hashlib
import re

from eglr_harness.analysis.metrics.accuracy import POOL_TITLES
from eglr_harness.analysis.metrics.bestofn import METHODS, RANDOM, best_of_n
from eglr_harness.analysis.render import _figure, markdown_table, pct, save_png
from eglr_harness.analysis.sections.section import ReportContext, Section, Table, image, register_section

_TITLES = {**POOL_TITLES, RANDOM: "random grid cells (N drawn from the whole grid)"}
_STYLE = {"naive": ("-", "C3"), "weighted": ("-", "C0"), "majority": ("--", "C7")}


def _slug(spec: str, how: str) -> str:
    """A file-name part for ``spec`` and ``how``: ``self_p_true_last``; a spec with a path keeps its kind, the
    path's last part and a hash of the whole spec (two verifiers in folders of one name got one file)."""
    kind, _, where = spec.partition(":")
    parts = [p for p in re.split(r"[/\\]+", where) if p]
    if len(parts) > 1 or where.startswith(("/", "\\")):
        digest = hashlib.sha256(spec.encode("utf-8")).hexdigest()[:8]
        spec = f"{kind}_{parts[-1] if parts else ''}_{digest}"
    return re.sub(r"[^A-Za-z0-9]+", "_", f"{spec}_{how}").strip("_")


@register_section("bestofn")
class BestOfNSection(Section):
    def compute(self, ctx: ReportContext):
        return best_of_n(ctx.grid, n_orders=ctx.n_orders, seed=ctx.seed)

    def tables(self, ctx: ReportContext, result) -> list[Table]:
        if not result.verifiers:
            return []
        curve = [[p.verifier, p.aggregation, p.pool, p.method, p.n, p.docs, round(p.accuracy, 6), round(p.low, 6),
                  round(p.high, 6)] for p in result.points]  # fmt: skip
        tests = [[t.verifier, t.aggregation, t.comparison, round(t.estimate, 6), t.docs, round(t.low, 6),
                  round(t.high, 6), t.only_a, t.only_b, None if t.sign_p is None else round(t.sign_p, 6)]
                 for t in result.tests]  # fmt: skip
        return [Table("bestofn.csv", ["verifier", "aggregation", "pool", "method", "n", "docs", "accuracy", "ci_low",
                                      "ci_high"], curve),
                Table("bestofn_tests.csv", ["verifier", "aggregation", "comparison", "estimate_problems", "docs",
                                            "ci_low", "ci_high", "only_a", "only_b", "sign_p"], tests)]

    def figures(self, ctx: ReportContext, result, out):
        figs = {}
        for spec, (model, shown, docs) in result.verifiers.items():
            for how in shown:
                pts = [p for p in result.points if p.verifier == spec and p.aggregation == how]
                pools = list(dict.fromkeys(p.pool for p in pts))
                fig = _figure(3.2 * len(pools), 3.4)
                first = None
                for i, pool in enumerate(pools):
                    ax = fig.add_subplot(1, len(pools), i + 1, sharey=first)  # one scale: pools compare at a glance
                    first = first or ax
                    for method in METHODS:
                        line = sorted((p for p in pts if p.pool == pool and p.method == method), key=lambda p: p.n)
                        if not line:
                            continue
                        style, color = _STYLE[method]
                        xs = [p.n for p in line]
                        ax.plot(xs, [100 * p.accuracy for p in line], style, color=color, marker=".", label=method)
                        ax.fill_between(xs, [100 * p.low for p in line], [100 * p.high for p in line], color=color,
                                        alpha=0.12)
                    ax.set_xscale("log", base=2)
                    ax.set_xlabel("N (configurations)")
                    ax.set_title(_TITLES.get(pool, pool), fontsize=7)
                    ax.grid(alpha=0.3)
                    if i == 0:
                        ax.set_ylabel("accuracy (%)")
                        ax.legend(fontsize=7)
                fig.suptitle(f"{ctx.grid.task}: best-of-N by {spec} ({how}), {docs} problems", fontsize=9)
                fig.tight_layout()
                path = out / f"bestofn_{_slug(spec, how)}.png"
                save_png(fig, path)
                figs[f"bestofn_{_slug(spec, how)}"] = path
        return figs

    def markdown(self, ctx: ReportContext, result, figs) -> list[str]:
        if not result.verifiers:  # runs without scores (eglr-verify writes them): no section
            return [f"\nNote: {n}" for n in result.notes]
        parts = ["\n## Best-of-N with verifiers\n"]
        parts.append("Accuracy % (95 % CI over problems) at N configurations; the full-budget tests below. "
                     "Tables: `bestofn.csv`, `bestofn_tests.csv`.\n")
        for spec, (model, shown, docs) in result.verifiers.items():
            for how in shown:
                pts = [p for p in result.points if p.verifier == spec and p.aggregation == how]
                rows = []
                for pool in dict.fromkeys(p.pool for p in pts):
                    for n in sorted({p.n for p in pts if p.pool == pool}):
                        cell = {p.method: p for p in pts if p.pool == pool and p.n == n}
                        rows.append([_TITLES.get(pool, pool), n, *(
                            None if m not in cell
                            else f"{pct(cell[m].accuracy)} [{pct(cell[m].low)}, {pct(cell[m].high)}]"
                            for m in METHODS)])  # fmt: skip
                parts += [f"\n### {spec} · {how} · model {model or '—'} · {docs} problems\n",
                          markdown_table(["pool", "N", *METHODS], rows), "",
                          image(figs, f"bestofn_{_slug(spec, how)}", f"best-of-N {spec} {how}")]
                tests = [t for t in result.tests if t.verifier == spec and t.aggregation == how]
                parts.append(markdown_table(
                    ["comparison at full budget", "A − B (problems)", "95 % CI (problems)", "only A / only B",
                     "sign test p"],
                    [[t.comparison, f"{t.estimate:+.2f}", f"{t.low * t.docs:+.1f} … {t.high * t.docs:+.1f}",
                      None if t.only_a is None else f"{t.only_a} / {t.only_b}",
                      None if t.sign_p is None else f"{t.sign_p:.3g}"] for t in tests]))  # fmt: skip
        parts += [f"\nNote: {n}" for n in result.notes]
        return parts

    def definitions(self, ctx: ReportContext) -> str:
        if not ctx.results.get(self.name) or not ctx.results[self.name].verifiers:
            return ""
        return f"""\
- Best-of-N with verifiers: among the rollouts with an answer of N configurations, naive = the highest-scored
  rollout, weighted = the answer whose rollouts' scores sum highest, majority = the plain vote (no scores); ties to
  the earliest. A solution's score from its step scores: last, min or prod. N = 1, 2, 4, ... and the pool's size,
  the first N of {ctx.n_orders} seeded random orders of the pool (seed {ctx.seed}), averaged; "random grid cells" draws N
  from the whole grid (the equal-budget yardstick). Intervals: paired bootstrap over the problems whose every rollout
  is scored; full-budget tests in pool order, with the exact sign test where both sides are 0/1 per problem.
"""  # noqa: E501 -- the report's text, written as it reads
