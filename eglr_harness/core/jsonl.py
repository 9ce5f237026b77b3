"""Reading JSON Lines files (benchmark data, lm-eval samples) with errors that name ``file:line``, and
writing strict JSON (:func:`dumps`: every JSON file the project writes goes through it).

A file whose name ends in ``.gz`` is gzip-compressed JSON Lines (the committed samples, ``results/README.md``):
:func:`open_lines` is the one place a JSON Lines file is opened, plain or compressed, so every reader takes both;
:func:`encode_lines` is its writing side, and :func:`gzip_bytes` compresses deterministically (gzip level 9,
``mtime`` 0, no file name in the header: the same text gives the same bytes, on every rewrite).

A leaf shared by the data loaders, ``eglr-score`` and the analysis. Lines are numbered from 1;
blank lines are skipped. A line that is not UTF-8, not JSON or not a JSON object raises
``FileFormatError("<file>:<line>: ...")`` (a ``ValueError``) saying what was expected; a last
line cut mid-way (a run stopped while writing) says so.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import zlib
from collections.abc import Iterator
from typing import IO, Any
from pathlib import Path

from eglr_harness.core.errors import FileFormatError

__all__ = ["GZIP_SUFFIX", "dumps", "encode_lines", "gzip_bytes", "is_gzipped", "iter_jsonl", "open_lines", "strict"]

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")

GZIP_SUFFIX = ".gz"


def is_gzipped(path: str | Path) -> bool:
    """Whether ``path`` names a gzip-compressed file (its name ends in ``.gz``)."""
    return Path(path).name.endswith(GZIP_SUFFIX)


def open_lines(path: str | Path) -> IO[bytes]:
    """``path`` opened for reading its bytes line by line, decompressed when its name ends in ``.gz``."""
    path = Path(path)
    return gzip.open(path, "rb") if is_gzipped(path) else path.open("rb")


def gzip_bytes(data: bytes) -> bytes:
    """``data`` gzip-compressed, the same bytes for the same data: level 9, ``mtime`` 0, no file name."""
    return gzip.compress(data, compresslevel=9, mtime=0)


def encode_lines(path: str | Path, text: str) -> bytes:
    """The bytes to write ``text`` (JSON Lines) to ``path`` with: UTF-8, through :func:`gzip_bytes` when the name
    ends in ``.gz`` (so a file is rewritten in the form it was read in)."""
    data = text.encode("utf-8")
    return gzip_bytes(data) if is_gzipped(path) else data


def iter_jsonl(path: str | Path, what: str = "one JSON object per line") -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` of every non-blank line of ``path``, in file order.

    ``what`` is the expected content, for the error message (e.g. ``"one lm-eval sample per line"``). A ``.gz``
    file is read decompressed (:func:`open_lines`); one that is not sound gzip raises ``FileFormatError``.
    """
    path = Path(path)
    with open_lines(path) as handle:
        for number, raw in _numbered(handle, path, what):
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


def _numbered(handle: IO[bytes], path: Path, what: str) -> Iterator[tuple[int, bytes]]:
    """``(line number, raw line)`` of ``handle``; a damaged or cut gzip stream is a ``FileFormatError``."""
    number = 0
    try:
        for number, raw in enumerate(handle, start=1):  # noqa: B007 -- the last number names a damaged stream
            yield number, raw
    except (OSError, EOFError, zlib.error) as err:
        raise FileFormatError(f"{path}: not sound gzip after line {number} ({err}); expected {what}, "
                              "gzip-compressed (a file named .gz), or rename it without .gz if it is plain.") from None


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
