"""What a report section is and where it registers: :class:`Section`, :func:`register_section`, the
:class:`ReportContext` every section reads, its :class:`Table` and :func:`image`. The section modules import this
module, and ``analysis/report.py`` imports them (through :mod:`eglr_harness.analysis.sections`): the registry
lives apart from the report so that the imports run one way."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from eglr_harness.analysis.load import Grid
from eglr_harness.analysis.metrics.accuracy import CellAccuracy, cell_accuracy, solved_sets
from eglr_harness.analysis.metrics.budget import DEFAULT_ORDERS, DEFAULT_SEED
from eglr_harness.core.cell import Cell

__all__ = ["SECTIONS", "ReportContext", "Section", "Table", "image", "register_section"]


@dataclass(frozen=True)
class Table:
    """One CSV file of a report: ``file`` (name in the report folder), ``header`` and ``rows``."""

    file: str
    header: Sequence[str]
    rows: Sequence[Sequence]


class Section:
    """One part of the report. Subclasses override what they have; each step gets the section's
    own :meth:`compute` result.

    Attributes:
        name: registry key (set by :func:`register_section`).
        DEFINITIONS: the section's lines of the report's Definitions block (Markdown list items).
    """

    name: str = ""
    DEFINITIONS: str = ""

    def compute(self, ctx: "ReportContext") -> Any:
        """The section's numbers (pure: no files)."""
        return None

    def tables(self, ctx: "ReportContext", result: Any) -> list[Table]:
        """The CSV files of the section."""
        return []

    def figures(self, ctx: "ReportContext", result: Any, out: Path) -> dict[str, Path]:
        """Draw the section's PNGs into ``out``; figure key -> path."""
        return {}

    def markdown(self, ctx: "ReportContext", result: Any, figs: dict[str, Path]) -> list[str]:
        """The section's report.md parts (joined with newlines); ``figs`` = every figure of the report."""
        return []

    def definitions(self, ctx: "ReportContext") -> str:
        """The section's lines of the Definitions block (default :attr:`DEFINITIONS`)."""
        return self.DEFINITIONS


SECTIONS: dict[str, Section] = {}


def register_section(name: str):
    """Class decorator: add an instance of the section to :data:`SECTIONS` under ``name``."""

    def decorate(cls: type[Section]) -> type[Section]:
        if name in SECTIONS:
            raise ValueError(f"report section {name!r} is registered twice; section names must be unique.")
        section = cls()
        section.name = name
        SECTIONS[name] = section
        return cls

    return decorate


@dataclass
class ReportContext:
    """What every section reads: the grid, the budget-curve settings and the shared per-cell metrics."""

    grid: Grid
    n_orders: int = DEFAULT_ORDERS
    seed: int = DEFAULT_SEED
    results: dict[str, Any] = field(default_factory=dict)  # section name -> its compute() result
    sections: tuple[str, ...] | None = None  # the sections to run (None: all)

    @cached_property
    def accuracy(self) -> dict[Cell, CellAccuracy]:
        return cell_accuracy(self.grid)

    @cached_property
    def solved(self) -> dict[Cell, frozenset[int]]:
        return solved_sets(self.grid)


def image(figs: dict[str, Path], key: str, alt: str) -> str:
    """The Markdown of figure ``key`` (by file name), or "" when the report has no such figure."""
    return f"![{alt}]({figs[key].name})\n" if key in figs else ""
