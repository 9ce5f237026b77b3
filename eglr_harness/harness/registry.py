"""Register eglr-harness's filters, metric and aggregations with lm-eval (import = register).

Names (usable in any task YAML once this module is imported):

- filters: ``eglr_extract_answer``, ``eglr_select_cells``, ``eglr_majority_vote``, ``eglr_oracle``
  (see :mod:`eglr_harness.harness.filters`);
- aggregations: ``eglr_best_cfg_acc`` (accuracy of the best (L, T) cell) and ``eglr_rollout_count``
  (the number of rollouts scored; logs the per-cell accuracies), both over per-document
  ``rollouts`` lists and both numbers, so that lm-eval's console table stays narrow;
- metric: ``eglr_exact_match`` (``references``/``predictions`` -> 1.0 if the extracted prediction
  is equivalent to the reference; aggregation ``mean``), for tasks without our process_results.

Imported by ``tasks/eglr_utils.py`` (so every eglr task YAML has them) and, for other YAMLs, by the
package's lm-eval autoload. Light: no torch, no math-verify, no sympy at import time.
Registration is idempotent (re-importing, or importing under another module name, is a no-op).
It also works when triggered from inside lm-eval's own import of ``lm_eval.api.metrics`` (an
import hook on ``lm_eval.api.registry``): nothing here needs lm-eval's built-ins to exist yet.
"""

from __future__ import annotations

import sys

from lm_eval.api import registry as _registry

# lm-eval fills its own aggregation/metric registries lazily, only when they are still *empty*
# at the first lookup. Registering ours into an empty registry would hide lm-eval's built-ins
# ("mean", "acc", ...), so make sure they are loaded first. When this module is imported while
# lm_eval.api.metrics is itself being imported, it is already in sys.modules: leave it alone.
if "lm_eval.api.metrics" not in sys.modules:
    import lm_eval.api.metrics  # noqa: F401

from eglr_harness.harness import filters as _filters
from eglr_harness.scoring import doc_scores as _metrics

FILTERS = {
    "eglr_extract_answer": _filters.ExtractAnswerFilter,
    "eglr_select_cells": _filters.SelectCellsFilter,
    "eglr_majority_vote": _filters.MajorityVoteFilter,
    "eglr_oracle": _filters.OracleFilter,
}
AGGREGATIONS = {
    "eglr_best_cfg_acc": _metrics.best_cfg_acc,
    "eglr_rollout_count": _metrics.rollout_count,
}
METRIC_NAME = "eglr_exact_match"


def eglr_exact_match(references=None, predictions=None, **kwargs) -> float:
    """1.0 if the first prediction (an extracted answer) is equivalent to the first reference."""
    from eglr_harness.scoring.doc_scores import answer_or_none
    from eglr_harness.scoring.equivalence import is_equivalent

    gold = answer_or_none(references[0]) if references else None
    pred = answer_or_none(predictions[0]) if predictions else None
    return float(gold is not None and pred is not None and is_equivalent(gold, pred))


def _register_once(registry, name: str, target) -> None:
    if name not in registry:
        registry.register(name)(target)


def register_all() -> None:
    """Register every name above (idempotent)."""
    for name, cls in FILTERS.items():
        _register_once(_registry.filter_registry, name, cls)
    for name, fn in AGGREGATIONS.items():
        _register_once(_registry.aggregation_registry, name, fn)
    if METRIC_NAME not in _registry.metric_registry:
        _registry.metric_registry.register(METRIC_NAME)(eglr_exact_match)
        _registry.higher_is_better_registry.register(METRIC_NAME, target=True)
        # A lazy placeholder: lm-eval's "mean" may not exist yet (module docstring, last note).
        _registry.metric_agg_registry.register(METRIC_NAME, target="lm_eval.api.metrics:mean")


register_all()
