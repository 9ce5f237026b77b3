"""Benchmark names: which benchmark a task belongs to (tasks of one benchmark share prompts and tau_h)."""

from __future__ import annotations

import re


def benchmark_of(task_name: str | None) -> str | None:
    """``math500_eglr_sc`` -> ``math500``, ``eglr_demo_lxt`` -> ``eglr_demo``."""
    if not task_name:
        return None
    return re.sub(r"(_eglr)?(_sc|_lxt)?$", "", task_name)
