"""Reading JSON Lines files (benchmark data, lm-eval samples) with errors that name ``file:line``, and
writing strict JSON (:func:`dumps`: every JSON file the project writes goes through it).

A leaf shared by the data loaders, ``eglr-score`` and the analysis. Lines are numbered from 1;
blank lines are skipped. A line that is not UTF-8, not JSON or not a JSON object raises
``FileFormatError("<file>:<line>: ...")`` (a ``ValueError``) saying what was expected; a last
line cut mid-way (a run stopped while writing) says so.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any
from pathlib import Path

from eglr_harness.core.errors import FileFormatError

__all__ = ["dumps", "iter_jsonl", "strict"]

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


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
            if _SURROGATE_ESCAPE.search(line):  # "\ud800" parses, but is no text: every UTF-8 writer fails on it
                try:
                    json.dumps(row, ensure_ascii=False).encode("utf-8")
                except UnicodeEncodeError as err:
                    lone = err.object[err.start]
                    raise FileFormatError(f"{path}:{number}: a string holds a lone surrogate ({lone!r}, "
                                          f"a \\uD800-\\uDFFF escape without its pair), which is not text; expected "
                                          f"{what}, in UTF-8 text.") from None
            yield number, row


def strict(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, +/-Infinity) inside dicts, lists and tuples replaced by
    None: JSON has no such numbers (Python writes ``NaN`` literals other readers refuse); a figure that
    is not a number is written as null, which every reader of the project takes as "no figure"."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


def dumps(value: Any, **kwargs) -> str:
    """``json.dumps`` of :func:`strict` ``value``, with ``allow_nan=False`` (a non-finite number that a
    ``default`` hook returns raises instead of being written) and ``ensure_ascii=False`` unless given."""
    kwargs.setdefault("ensure_ascii", False)
    return json.dumps(strict(value), allow_nan=False, **kwargs)
