"""Benchmark problems in one internal schema: local JSONL (``EGLR_DATA_DIR``), the hub, or the demo generator.

Import-light: ``datasets`` is imported only when a hub dataset or a ``datasets.Dataset`` is needed.
"""

from __future__ import annotations

from eglr_harness.data.loading import DATA_DIR_ENV, DEMO, load_dataset_dict, load_problems
from eglr_harness.data.sources import BENCHMARKS, BenchmarkSource

__all__ = ["BENCHMARKS", "BenchmarkSource", "DATA_DIR_ENV", "DEMO", "load_dataset_dict", "load_problems"]
