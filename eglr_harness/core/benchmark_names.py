"""Task names and the benchmark they belong to (a leaf module: standard library only).

Every benchmark ``<b>`` has the tasks ``<b>_eglr`` (one rollout), ``<b>_eglr_sc`` (the pool of
10) and ``<b>_eglr_lxt`` (the 11×11 grid); the offline demo's tasks are ``eglr_demo``,
``eglr_demo_sc`` and ``eglr_demo_lxt``. Tasks of one benchmark share its prompts, its tau_h and
its column of the leaderboard.
"""

from __future__ import annotations

import re

__all__ = ["TASK_SUFFIXES", "benchmark_of"]

TASK_SUFFIXES = ("_eglr", "_sc", "_lxt")  # <b>[_eglr][_sc|_lxt]
_SUFFIX = re.compile(r"(_eglr)?(_sc|_lxt)?$")
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


def benchmark_of(task: str | None) -> str | None:
    """``math500_eglr_sc`` -> ``math500``, ``gsm8k`` -> ``gsm8k``, ``eglr_demo_lxt`` -> ``eglr_demo``;
    None or "" -> None. ``ValueError`` for a name that is not a task name."""
    if not task:
        return None
    name = str(task).strip()
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"task {task!r} is not a task name; allowed: letters, digits, '_', '.' and '-' (e.g. gsm8k or gsm8k_eglr)."
        )
    return _SUFFIX.sub("", name) or name
