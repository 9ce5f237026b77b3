"""The one Markdown-table reader of the tests: the tests that check a README's table against the files it quotes."""

from __future__ import annotations

import re

_CELL_BORDER = re.compile(r"(?<!\\)\|")  # a pipe, not an escaped one (``\|`` is a pipe inside a cell)
_SEPARATOR_CELL = re.compile(r":?-+:?")


def table_cells(line: str) -> list[str]:
    """The stripped cells of one table line (``| a | b\\|c |`` -> ``["a", "b|c"]``)."""
    return [cell.strip().replace("\\|", "|") for cell in _CELL_BORDER.split(line.strip())[1:-1]]


def markdown_table(text: str, start: str) -> list[list[str]]:
    """The first table at or after the first line of ``text`` that starts with ``start`` (a heading above the table,
    or the table's own header line): its rows, the header row first, without the ``|---|`` line."""
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith(start)), None)
    assert first is not None, f"no line starts with {start!r}"
    rows: list[list[str]] = []
    for line in lines[first:]:
        if line.startswith("|"):
            rows.append(table_cells(line))
        elif rows:
            break
    assert rows, f"no table after the line {start!r}"
    if len(rows) > 1 and all(_SEPARATOR_CELL.fullmatch(cell) for cell in rows[1]):
        del rows[1]
    return rows
