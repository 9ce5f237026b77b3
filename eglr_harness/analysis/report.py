"""``build_report``: saved lm-eval runs in, a folder with report.md, CSV tables and PNGs out.

Pipeline: :func:`~eglr_harness.analysis.load.load_grid` (files) -> every registered
:class:`Section` (compute, CSV rows, figures, Markdown) -> the report folder. A report part is a
small class registered with :func:`register_section` (``sections/section.py``), like lm-eval's
``@register_filter``; the
report runs the sections in the order they were registered (the imports of
:mod:`eglr_harness.analysis.sections`). A new analysis is one section module plus its import line.
Nothing here loads a model or imports torch.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from eglr_harness.analysis.load import Grid, load_grid
from eglr_harness.analysis.metrics.budget import DEFAULT_ORDERS, DEFAULT_SEED
from eglr_harness.analysis.render import write_csv
from eglr_harness.analysis.sections.section import (  # the registry (sections/section.py), named here as before
    SECTIONS,
    ReportContext,
    Section,
    Table,
    image,
    register_section,
)
from eglr_harness.core.errors import OutputError
from eglr_harness.core.interrupt import held_interrupts
from eglr_harness.core.outputs import atomic_write_text, remedy

__all__ = [
    "Section",
    "SECTIONS",
    "register_section",
    "ReportContext",
    "Table",
    "image",
    "compute_report",
    "render_markdown",
    "write_report",
    "build_report",
    "default_out_dir",
]

logger = logging.getLogger(__name__)


def _sections(only: Sequence[str] | None = None) -> dict[str, Section]:
    """The registered sections in report order (``only``: those names, still in report order)."""
    import eglr_harness.analysis.sections  # noqa: F401, PLC0415 -- registers the built-in sections

    if only is None:
        return SECTIONS
    if not only:
        raise ValueError(f"no report section named; allowed: {', '.join(SECTIONS)}.")
    if unknown := sorted(set(only) - set(SECTIONS)):
        raise ValueError(f"report sections {unknown} do not exist; allowed: {', '.join(SECTIONS)}.")
    return {name: s for name, s in SECTIONS.items() if name in only}


def compute_report(
    grid: Grid, *, n_orders: int = DEFAULT_ORDERS, seed: int = DEFAULT_SEED, sections: Sequence[str] | None = None
) -> ReportContext:
    """Every section's numbers for ``grid`` (pure; no files written); ``ctx.results[name]``.
    ``sections``: only these (report order kept); default all."""
    ctx = ReportContext(grid, n_orders, seed, sections=None if sections is None else tuple(sections))
    for name, section in _sections(ctx.sections).items():
        ctx.results[name] = section.compute(ctx)
    return ctx


def render_markdown(ctx: ReportContext, figs: dict[str, Path]) -> str:
    """The report.md text (figures referenced by file name)."""
    parts = [
        f"# EGLR report: `{ctx.grid.task}` · `{ctx.grid.model}`\n",
        "Made by `eglr-report` from saved lm-eval runs only (no model loaded). Definitions at the end.\n",
    ]
    for name, section in _sections(ctx.sections).items():
        parts += section.markdown(ctx, ctx.results[name], figs)
    definitions = "".join(s.definitions(ctx) for s in _sections(ctx.sections).values())
    return "\n".join([*parts, "\n\n## Definitions\n", definitions])


def write_report(ctx: ReportContext, out_dir: Path) -> Path:
    """Write tables, figures and report.md of ``ctx`` into ``out_dir``; returns ``out_dir``.

    The report is whole or absent as a set: every file is written (and flushed) into a hidden folder inside
    ``out_dir`` first, so that a full disk or an error stops it there with ``out_dir`` as it was; only then is
    each moved into place by a rename (which needs no space), replacing a link there rather than writing
    through it. Other files in ``out_dir`` are left alone."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        staging = Path(tempfile.mkdtemp(dir=out, prefix=".eglr-report.tmp-"))
    except OSError as err:
        raise OutputError(f"{out}: cannot be written ({err.strerror or err}); {remedy(err)}.") from None
    try:
        figs: dict[str, Path] = {}
        for name, section in _sections(ctx.sections).items():
            for table in section.tables(ctx, ctx.results[name]):
                write_csv(staging / table.file, table.header, table.rows)
            figs.update(section.figures(ctx, ctx.results[name], staging))
        atomic_write_text(staging / "report.md", render_markdown(ctx, figs))
        with held_interrupts():  # a signal between two renames left 3 new files beside 23 old ones
            for made in sorted(staging.iterdir(), key=lambda p: p.name == "report.md"):  # report.md last
                os.replace(made, out / made.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
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
    sections: Sequence[str] | None = None,
) -> Path:
    """Read the runs under ``run_dirs`` (one task, one model), write the report folder, return it.

    Args:
        run_dirs: folders given to ``lm_eval --output_path`` (or results JSON files); merged.
        out_dir: report folder; default ``<run_dirs[0]>/report``.
        task: the task to analyse when the runs hold several.
        filter_name: lm-eval filter whose samples lines to read (default: the first in each file).
        n_orders, seed: random orders of the budget curves.
        sections: the report sections to write (default all), e.g. ``("runs", "ablation")``.

    Raises ``ValueError`` (one line) for a section that does not exist, before any run is read, and for
    runs that cannot be read or merged (:func:`~eglr_harness.analysis.load.load_grid`).
    """
    if isinstance(run_dirs, (str, Path)):
        run_dirs = [run_dirs]
    _sections(sections)  # a misspelt section is refused before any run is read
    grid = load_grid(run_dirs, task=task, filter_name=filter_name)
    ctx = compute_report(grid, n_orders=n_orders, seed=seed, sections=sections)
    return write_report(ctx, Path(out_dir) if out_dir is not None else default_out_dir(run_dirs))
