"""The samples file of a test's copy of a committed run, as a test edits it: results/ commits samples compressed
(``.jsonl.gz``); a copy that a test rewrites by hand gets it back as the plain ``.jsonl`` a user's lm-eval writes
(the readers take both: tests/analysis/test_compressed_runs.py)."""

from __future__ import annotations

import gzip
from pathlib import Path

from eglr_harness.core.run_format import samples_files


def plain_samples(folder: Path) -> Path:
    """The one samples file under ``folder`` (a copy, never results/ itself), decompressed in place when it is a
    ``.jsonl.gz``: the returned path ends in ``.jsonl``."""
    (path,) = samples_files(folder, recursive=True)
    if path.name.endswith(".gz"):
        plain = path.with_name(path.name.removesuffix(".gz"))
        plain.write_bytes(gzip.decompress(path.read_bytes()))
        path.unlink()
        path = plain
    return path
