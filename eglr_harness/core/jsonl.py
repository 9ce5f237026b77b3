"""Reading JSON Lines files (benchmark data, lm-eval samples) with errors that name ``file:line``.

A leaf shared by the data loaders, ``eglr-score`` and the analysis. Lines are numbered from 1;
blank lines are skipped. A line that is not UTF-8, not JSON or not a JSON object raises
``FileFormatError("<file>:<line>: ...")`` (a ``ValueError``) saying what was expected; a last
line cut mid-way (a run stopped while writing) says so.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from eglr_harness.core.errors import FileFormatError

__all__ = ["iter_jsonl"]


def iter_jsonl(path: str | Path, what: str = "one JSON object per line") -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` of every non-blank line of ``path``, in file order.

    ``what`` is the expected content, for the error message (e.g. ``"one lm-eval sample per line"``).
    """
    path = Path(path)
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise FileFormatError(
                    f"{path}:{number}: not UTF-8 (byte 0x{raw[err.start]:02x} at column {err.start + 1}); "
                    f"expected {what}, UTF-8 encoded."
                ) from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                cut = "" if raw.endswith(b"\n") else " (the line ends mid-way: was the file cut while being written?)"
                raise FileFormatError(f"{path}:{number}: not valid JSON ({err.msg}, column {err.colno}){cut}; "
                                 f"expected {what}.") from None
            if not isinstance(row, dict):
                raise FileFormatError(f"{path}:{number}: a JSON {type(row).__name__}, expected {what}.")
            yield number, row
