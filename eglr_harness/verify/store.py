"""The resumable score store: ``OUT/verifier_scores.sqlite``, one record per (verifier, scored text).

A record's key hashes the verifier spec, its weights' fingerprint, the dtype, the store version and
the texts it scored (question, prompt, solution), so a killed run scores only what is missing when
run again, a rollout text repeated across cells is scored once, and new weights at the same path
score afresh. It is the project's sqlite store (:class:`eglr_harness.run.stores._SqliteTable`: checksums,
several processes, damaged files moved aside) with a check of its own values.
"""

from __future__ import annotations

import math
from pathlib import Path

from eglr_harness.run.stores import _SqliteTable, content_key

__all__ = ["STORE_FILE", "STORE_VERSION", "ScoreStore", "score_key"]

STORE_FILE = "verifier_scores.sqlite"
STORE_VERSION = 1  # bump when a format's input or reading changes: earlier scores stop matching


def _scores_problem(value) -> str | None:
    steps = value.get("steps") if isinstance(value, dict) else None
    if not isinstance(steps, list) or not steps:
        return "not a dict with a non-empty `steps` list"
    if not all(isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) for s in steps):
        return "a step score that is not a finite number"
    return None


def score_key(spec_key: str, fingerprint: str | None, dtype: str, question: str, prompt: str, solution: str) -> str:
    """The record key of one scored text (module docstring)."""
    return content_key(STORE_VERSION, spec_key, fingerprint, dtype, question, prompt, solution)


class ScoreStore(_SqliteTable):
    """``key -> {"steps": [floats]}`` in ``folder/verifier_scores.sqlite``."""

    _label = "verifier score store"
    _noun = "verifier scores"

    def __init__(self, folder: str | Path):
        super().__init__(Path(folder) / STORE_FILE, "scores", validate=_scores_problem)
