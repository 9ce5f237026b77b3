"""The analysis's metrics: pure functions of loaded runs (no files, no Markdown), by the paper's
sections. The report's sections (:mod:`eglr_harness.analysis.sections`) call them.

- :mod:`~eglr_harness.analysis.metrics.accuracy` — per-cell accuracy, pools, best cell, majority vote;
- :mod:`~eglr_harness.analysis.metrics.oracle` — cumulative oracle, corners, random-cell yardstick;
- :mod:`~eglr_harness.analysis.metrics.disagreement` — pairwise disagreement, exclusive, marginal;
- :mod:`~eglr_harness.analysis.metrics.budget` — majority vote and oracle against budget;
- :mod:`~eglr_harness.analysis.metrics.compute` — ρ, iterations, FLOP ratios;
- :mod:`~eglr_harness.analysis.metrics.intervals` — Wilson, paired bootstrap, sign test;
- :mod:`~eglr_harness.analysis.metrics.ties` — the vote's ties: tied problems, worst and best case;
- :mod:`~eglr_harness.analysis.metrics.ablation` — one setting at a time (paper Table 4);
- :mod:`~eglr_harness.analysis.metrics.selection` — aggregators by signals (vote, weighted vote,
  best signal, fitted combination) against the oracle gap.
"""
