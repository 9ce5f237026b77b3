"""Entropy-Gated Latent Recursion (EGLR) for Hugging Face causal LMs and lm-evaluation-harness.

This module is imported at interpreter start by the autoload ``.pth`` file, so it must stay
light: no torch, no transformers, no lm_eval here. Public names resolve lazily.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "EglrConfig": "eglr_harness.core.config",
    "parse_L_spec": "eglr_harness.core.specs",
    "parse_T_spec": "eglr_harness.core.specs",
    "resolve_pool": "eglr_harness.run.pool",
    "eglr_generate": "eglr_harness.decoding.hook.generate",
    "EglrStats": "eglr_harness.decoding.stats",
    "EglrHFLM": "eglr_harness.harness.model",
    "Cell": "eglr_harness.core.cell",
    "tasks_dir": "eglr_harness.core.resources",
    "model_configs_dir": "eglr_harness.core.resources",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'eglr_harness' has no attribute {name!r}")
