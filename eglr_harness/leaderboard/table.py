"""Leaderboard numbers from finished runs, and the table in the paper's Table 2/3 shape.

Accuracies are the tasks' own aggregated metrics in the results JSON (``acc``;
``best_cfg_acc``, ``maj@B``, ``oracle@B``). When a metric is missing there, it is recomputed from
the samples' ``rollouts`` with :mod:`eglr_harness.analysis` (votes on the tasks' equivalence
clusters when the samples log them, else on exact answer strings; the source column says which).

FLOP ratio vs greedy (per problem):
- Greedy: 1.0;
- Beam-n: measured where the greedy and beam runs are ``eglr-baseline``'s (docs/baselines.md): the beam answers'
  mean ``search_tokens`` (num_beams × the search's steps) over greedy's (its answers' own tokens), on the same
  problems; else n (:func:`~eglr_harness.analysis.metrics.compute.beam_flop_ratio`), marked *nominal*;
- EGLR (best L): the best cell's ``flop_ratio`` from ``config.eglr.stats.cells`` (one rollout),
  else the run's total ratio;
- EGLR-SC_L and Oracle_L: B × the run's total ``flop_ratio`` (B rollouts; assumes rollouts as long
  as greedy's — the paper's "a pool of M configurations costs M runs").
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from eglr_harness.analysis.load import (
    VOTE_STRINGS,
    RunFiles,
    RunInfo,
    RunPart,
    build_grid,
    metric_entry,
    metric_names,
    metric_value,
    read_results,
    read_task_samples,
    run_info,
)
from eglr_harness.analysis.load.baselines import baseline_refusal
from eglr_harness.analysis.metrics.accuracy import best_in_pool, cell_accuracy, oracle_solved, sc_solved
from eglr_harness.analysis.metrics.compute import beam_flop_ratio, cell_compute, run_compute
from eglr_harness.analysis.metrics.ties import pool_vote
from eglr_harness.analysis.portable import portable
from eglr_harness.analysis.render import markdown_table, num, pct, write_csv
from eglr_harness.core.outputs import atomic_write_text

__all__ = ["METHODS", "LeaderboardCell", "cells_from_run", "measured_compute", "method_label", "render_markdown",
           "write_tables"]

logger = logging.getLogger(__name__)

# Row keys in table order; beam rows are inserted per beam count ("beam4", "beam11").
METHODS = ("greedy", "beam", "eglr_best", "eglr_sc", "oracle")


@dataclass(frozen=True)
class LeaderboardCell:
    """One (method, benchmark) entry of the table."""

    method: str  # greedy, beam4, eglr_best, eglr_sc, oracle
    benchmark: str
    status: str  # done | failed | not run
    accuracy: float | None = None
    n_docs: int | None = None
    budget: int | None = None
    flop_ratio: float | None = None
    wall_time_s: float | None = None
    source: str = ""
    detail: str = ""
    command: str = ""
    run_dir: str = ""
    versions: Mapping[str, str] = field(default_factory=dict)
    ties: str = ""  # EGLR-SC: how many votes were ties and what they can move (a line of the notes); "" otherwise
    search_tokens: float | None = None  # greedy/beam on eglr-baseline: mean search tokens per problem; None: unknown
    compute_basis: str = ""  # beam rows: "measured" (search tokens) or "nominal" (num_beams x greedy)


def method_label(method: str, budget: int | None = None) -> str:
    """Row label of the paper's tables (``beam11`` -> ``Beam-11``; B shown when known)."""
    b = f" (B={budget})" if budget else ""
    if method.startswith("beam"):
        return f"Beam-{method[4:]}"
    return {"greedy": "Greedy", "eglr_best": "EGLR (best L)", "eglr_sc": f"EGLR-SC_L{b}", "oracle": f"Oracle_L{b}"}.get(
        method, method
    )


def _budget(results: Mapping, task: str, grid_budget: int | None) -> int | None:
    for name in metric_names(results, task):
        if name.startswith("maj@") and name[4:].isdigit():
            return int(name[4:])
    return grid_budget


def _sc_numbers(results: Mapping, task: str, info: RunInfo, files: RunFiles) -> list[dict]:
    """best / sc / oracle entries of one eglr_sc run."""
    grid = None
    if task in files.samples:
        try:
            grid = build_grid(task, [RunPart(info, read_task_samples(files.samples[task]))])
        except ValueError as err:
            logger.warning("%s: samples unreadable for the leaderboard (%s)", files.samples[task], err)
    acc = cell_accuracy(grid) if grid else {}
    best_cell = best_in_pool(acc, list(acc))
    grid_budget = max((len(grid.rollouts_in(grid.cells, d)) for d in grid.docs), default=None) if grid else None
    budget = _budget(results, task, grid_budget)
    total = run_compute(info)
    cells = cell_compute([info])
    per_run = total.flop_ratio if total else None
    pool = ""
    if grid:
        pool = f"pool: {len(grid.cells)} configs, L∈{list(grid.L_values)}, T∈{[f'{t:g}' for t in grid.T_values]}"

    def pick(metric: str, fallback):
        entry = metric_entry(results, task, metric)
        if entry is not None:
            return entry[1], f"results: {entry[0]}"
        if grid and grid.n_docs:
            votes = "exact-string votes" if grid.vote_rule == VOTE_STRINGS else "cluster votes"
            return fallback(), f"samples ({votes})"
        return None, "missing"

    ties = ""
    if grid and grid.n_docs:  # the tied votes and the vote's range: the same whatever order breaks them
        vote, n = pool_vote(grid, grid.cells), grid.n_docs
        ties = (f"{len(vote.tied)} of {n} votes are ties (two answer groups or more share the largest count; the "
                f"group seen first in pool order wins); with every tie against … for the vote it solves "
                f"{len(vote.worst)} … {len(vote.best)} ({pct(len(vote.worst) / n)} … {pct(len(vote.best) / n)} %).")
    best, best_src = pick("best_cfg_acc", lambda: acc[best_cell].accuracy)
    sc, sc_src = pick(r"maj@\d+", lambda: len(sc_solved(grid, grid.cells)) / grid.n_docs)
    oracle, or_src = pick(r"oracle@\d+", lambda: len(oracle_solved(grid, grid.cells)) / grid.n_docs)
    best_flops = cells[best_cell].flop_ratio if best_cell in cells and cells[best_cell].flop_ratio else per_run
    pool_flops = budget * per_run if budget and per_run else None
    best_detail = (
        f"best cell {best_cell.label} ({pct(acc[best_cell].accuracy)} from samples)" if best_cell else ""
    )
    return [
        dict(
            method="eglr_best", accuracy=best, source=best_src, flop_ratio=best_flops, budget=None, detail=best_detail
        ),
        dict(method="eglr_sc", accuracy=sc, source=sc_src, flop_ratio=pool_flops, budget=budget, detail=pool,
             ties=ties),
        dict(method="oracle", accuracy=oracle, source=or_src, flop_ratio=pool_flops, budget=budget, detail=pool),
    ]


def _single_numbers(results: Mapping, task: str, info: RunInfo, files: RunFiles, flop_ratio: float,
                    method: str) -> list[dict]:
    """The entry of a greedy or beam run: its accuracy, its mean search tokens per problem (eglr-baseline's runs) and,
    when it is no baseline (``analysis.load.baselines.baseline_refusal``: cut answers, lm-eval's hf beams at batch
    > 1), status ``refused`` with the reason."""
    value, source = metric_value(results, task, "acc"), "results: acc"
    rows, refusal, search = [], None, None
    if task in files.samples:
        try:
            rows = [r for r in read_task_samples(files.samples[task]).rollouts if r.repeat == 0]
        except ValueError as err:
            logger.warning("%s: %s", files.samples[task], err)
    if value is None:
        value, source = (sum(r.correct for r in rows) / len(rows), "samples: repeat 0") if rows else (None, "missing")
    refusal = baseline_refusal(info, rows)
    if rows and all(r.search_tokens is not None for r in rows):
        search = sum(r.search_tokens for r in rows) / len(rows)
    entry = dict(method=method, accuracy=value, source=source, flop_ratio=flop_ratio, budget=None, detail="",
                 search_tokens=search)
    if refusal:
        logger.warning("leaderboard: %s on %s is no baseline: %s", method, task, refusal)
        entry.update(status="refused", detail=f"refused as a baseline: {refusal}")
    return [entry]


def measured_compute(cells: Sequence[LeaderboardCell]) -> list[LeaderboardCell]:
    """``cells`` with each beam row's FLOP ratio measured where it can be: its mean search tokens per problem over
    the same benchmark's greedy row's (both eglr-baseline runs over the same problems); other beam rows keep
    num_beams x greedy, marked nominal."""
    greedy = {c.benchmark: c for c in cells if c.method == "greedy" and c.status == "done"}
    out = []
    for c in cells:
        if c.method.startswith("beam") and c.status == "done":
            g = greedy.get(c.benchmark)
            if g and g.search_tokens and c.search_tokens is not None and g.n_docs == c.n_docs:
                c = replace(c, flop_ratio=c.search_tokens / g.search_tokens, compute_basis="measured")
            else:
                c = replace(c, compute_basis="nominal")
        out.append(c)
    return out


def cells_from_run(
    *,
    kind: str,
    name: str,
    benchmark: str,
    task: str,
    files: RunFiles | None,
    record: Mapping | None,
    command: str,
    run_dir: Path,
    num_beams: int | None = None,
    status: str = "not run",
    detail: str = "",
) -> list[LeaderboardCell]:
    """The table entries that one planned run contributes; ``files=None`` (no results) gives
    entries with ``status`` (``not run`` or ``failed``) and ``detail`` (why it failed)."""
    methods = ["eglr_best", "eglr_sc", "oracle"] if kind == "eglr_sc" else [name]
    record = record or {}
    if files is None:
        return [
            LeaderboardCell(
                m, benchmark, status, command=command, run_dir=str(run_dir), versions=record.get("versions", {}),
                detail=detail,
            )
            for m in methods
        ]
    if record.get("returncode") != 0:
        record = {}  # a record of an earlier failed attempt says nothing about these results
    results = read_results(files.results)
    info = run_info(results, files.results)
    if kind == "eglr_sc":
        entries = _sc_numbers(results, task, info, files)
    else:
        entries = _single_numbers(results, task, info, files, beam_flop_ratio(num_beams), name)
    versions = {**dict(info.versions), **dict(record.get("versions", {}))}
    wall = record.get("wall_time_s", info.wall_time_s)
    return [
        LeaderboardCell(
            benchmark=benchmark,
            status=entry.pop("status", "done"),
            n_docs=info.n_samples.get(task),
            wall_time_s=wall,
            command=record.get("command_line", command),
            run_dir=str(run_dir),
            versions=versions,
            **entry,
        )
        for entry in entries
    ]


def _row_order(cells: Sequence[LeaderboardCell]) -> list[str]:
    beams = sorted({c.method for c in cells if c.method.startswith("beam")}, key=lambda m: int(m[4:]))
    order = ["greedy", *beams, "eglr_best", "eglr_sc", "oracle"]
    return [m for m in order if any(c.method == m for c in cells)]


def _budget_of(cells: Sequence[LeaderboardCell], method: str) -> int | None:
    budgets = {c.budget for c in cells if c.method == method and c.budget}
    return budgets.pop() if len(budgets) == 1 else None


def render_markdown(
    cells: Sequence[LeaderboardCell], benchmarks: Sequence[str], *, model: str, notes: Sequence[str] = ()
) -> str:
    """Accuracy table (rows methods, columns benchmarks) and a compute table of the same shape."""
    by_key = {(c.method, c.benchmark): c for c in cells}
    rows = _row_order(cells)

    def n_of(bench: str) -> str:
        ns = {c.n_docs for c in cells if c.benchmark == bench and c.n_docs}
        return f"{bench} (n={ns.pop()})" if len(ns) == 1 else (f"{bench} (n varies)" if ns else bench)

    def acc_text(c: LeaderboardCell | None) -> str | None:
        if c is None or c.status != "done":
            return None if c is None else c.status
        return pct(c.accuracy)

    header = ["method", *(n_of(b) for b in benchmarks)]
    acc_rows = [
        [method_label(m, _budget_of(cells, m))] + [acc_text(by_key.get((m, b))) for b in benchmarks] for m in rows
    ]
    flop_rows = [
        [method_label(m, _budget_of(cells, m))]
        + [
            (f"{num(c.flop_ratio, 2)}×" + (" (nominal)" if c.compute_basis == "nominal" else "")
             if (c := by_key.get((m, b))) and c.flop_ratio is not None else None)
            for b in benchmarks
        ]
        for m in rows
    ]
    wall_rows = [
        [method_label(m, _budget_of(cells, m))]
        + [
            (num(c.wall_time_s, 0) if (c := by_key.get((m, b))) and c.wall_time_s is not None else None)
            for b in benchmarks
        ]
        for m in rows
    ]
    parts = [
        f"# Leaderboard: `{model}`\n",
        "Accuracy (%) per benchmark; n = problems evaluated (`--limit`). Made by `eglr-leaderboard` "
        "with the stock lm_eval CLI; commands and versions per cell in `leaderboard_cells.csv`.\n",
        markdown_table(header, acc_rows),
        "\n## FLOP ratio vs greedy (per problem)\n",
        markdown_table(header, flop_rows),
        "\nGreedy = 1×; Beam-n = its search tokens per problem (n beams × its steps) over greedy's tokens, measured by "
        "`eglr-baseline` (docs/baselines.md), or n× marked nominal where a run records none; EGLR (best L) = that "
        "configuration's accounted ratio; EGLR-SC and Oracle = B × the run's per-token ratio (B rollouts).\n",
        "## Wall time (s)\n",
        markdown_table(header, wall_rows),
        "\nEGLR (best L), EGLR-SC and Oracle come from one `_eglr_sc` run, so they share its wall time. "
        "Best L is chosen on the evaluated problems (as in the paper).\n",
    ]
    tie_notes = [f"{method_label(c.method, c.budget)}, {c.benchmark}: {c.ties}" for c in cells
                 if c.ties and c.status == "done"]  # fmt: skip
    if notes or tie_notes:
        parts += ["## Notes\n", *(f"- {n}" for n in [*notes, *tie_notes]), ""]
    return "\n".join(parts)


def _round(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


def _long_row(c: LeaderboardCell) -> list:
    versions = "; ".join(f"{k}={v}" for k, v in sorted(c.versions.items()))
    return [c.method, c.benchmark, c.status, _round(c.accuracy), c.n_docs, c.budget, _round(c.flop_ratio),
            c.compute_basis,
            _round(c.wall_time_s, 3), c.source, c.detail, portable(c.command), portable(c.run_dir),
            versions]  # fmt: skip


def write_tables(
    cells: Sequence[LeaderboardCell], benchmarks: Sequence[str], out_dir: Path, *, model: str, notes: Sequence[str] = ()
) -> dict[str, Path]:
    """Write ``leaderboard.md``, ``leaderboard.csv`` (wide) and ``leaderboard_cells.csv`` (long)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cells = measured_compute(cells)
    by_key = {(c.method, c.benchmark): c for c in cells}
    rows = _row_order(cells)
    md = out / "leaderboard.md"
    atomic_write_text(md, render_markdown(cells, benchmarks, model=model, notes=notes))
    wide = write_csv(
        out / "leaderboard.csv",
        ["method", *benchmarks],
        [
            [method_label(m, _budget_of(cells, m))]
            + [
                (round(100 * c.accuracy, 4) if (c := by_key.get((m, b))) and c.accuracy is not None else None)
                for b in benchmarks
            ]
            for m in rows
        ],
    )
    header = ["method", "benchmark", "status", "accuracy", "n_docs", "budget", "flop_ratio_vs_greedy", "compute_basis"]
    header += ["wall_time_s", "source", "detail", "command", "run_dir", "versions"]
    ordered = sorted(cells, key=lambda c: (c.benchmark, rows.index(c.method) if c.method in rows else len(rows)))
    long = write_csv(out / "leaderboard_cells.csv", header, [_long_row(c) for c in ordered])
    return {"markdown": md, "csv": wide, "cells_csv": long}
