"""The analysis's shared numbers: pure functions of loaded runs (no files, no Markdown) that more than one place
reads (several report sections, the leaderboard, a command, eglr-verify). A figure that only its own report section
uses lives in that section's module (:mod:`eglr_harness.analysis.sections`).

- :mod:`~eglr_harness.analysis.metrics.accuracy` — per-cell accuracy, pools, best cell, majority vote;
- :mod:`~eglr_harness.analysis.metrics.oracle` — cumulative oracle, corners, random-cell yardstick;
- :mod:`~eglr_harness.analysis.metrics.budget` — majority vote and oracle against budget;
- :mod:`~eglr_harness.analysis.metrics.compute` — ρ, iterations, FLOP ratios;
- :mod:`~eglr_harness.analysis.metrics.intervals` — Wilson, paired bootstrap, sign test;
- :mod:`~eglr_harness.analysis.metrics.ties` — the vote's ties: tied problems, worst and best case;
- :mod:`~eglr_harness.analysis.metrics.ablation` — one setting at a time (paper Table 4);
- :mod:`~eglr_harness.analysis.metrics.bestofn` — best-of-N with verifier scores (the report and eglr-verify).
"""
