"""Answer extraction, equivalence and per-problem metrics for the eglr tasks (no lm-eval here).

Import-light: nothing here imports lm_eval, math-verify or sympy until used. lm-eval
registration lives in :mod:`eglr_harness.harness.registry`.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "extract_answer": "eglr_harness.scoring.extraction",
    "last_boxed": "eglr_harness.scoring.extraction",
    "final_boxed": "eglr_harness.scoring.extraction",
    "canonical": "eglr_harness.scoring.normalize",
    "parse_number": "eglr_harness.scoring.normalize",
    "is_equivalent": "eglr_harness.scoring.equivalence",
    "shutdown_worker": "eglr_harness.scoring.equivalence",
    "score_document": "eglr_harness.scoring.doc_scores",
    "majority_index": "eglr_harness.scoring.doc_scores",
    "cluster_answers": "eglr_harness.scoring.doc_scores",
    "cell_accuracies": "eglr_harness.scoring.doc_scores",
    "pass_at_k": "eglr_harness.scoring.doc_scores",
    "best_cfg_acc": "eglr_harness.scoring.doc_scores",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'eglr_harness.scoring' has no attribute {name!r}")
