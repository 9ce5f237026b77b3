"""Small formatting helpers: CSV files and Markdown tables."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

__all__ = ["write_csv", "markdown_table", "pct", "num"]


def write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence]) -> Path:
    """Write ``rows`` under ``header`` to ``path`` (None -> empty field); returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for row in rows:
            writer.writerow(["" if v is None else v for v in row])
    return path


def markdown_table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    """A GitHub Markdown table; None cells print as an em dash."""

    def cell(v) -> str:
        return "—" if v is None else str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def pct(fraction: float | None, digits: int = 1) -> str | None:
    """0.646 -> '64.6' (None stays None)."""
    return None if fraction is None else f"{100 * fraction:.{digits}f}"


def num(value: float | None, digits: int = 3) -> str | None:
    """A float rounded for tables (None stays None)."""
    return None if value is None else f"{value:.{digits}f}"
