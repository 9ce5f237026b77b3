"""The GPU checks' command: ``python benchmarks/gpu_check.py --help`` (the checks, their flags, examples).

The code is the package ``benchmarks/gpucheck/``, one module per check. This file loads it as ``gpucheck``
without putting ``benchmarks/`` on ``sys.path`` (tests and other scripts load this file by path), and
re-exports what those scripts use (``benchmarks/gpu_e2e.py``: the families, model building, calibration).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent / "gpucheck"


def load_package():
    """``benchmarks/gpucheck/`` imported as ``gpucheck`` (once per process), its submodules importable."""
    if "gpucheck" not in sys.modules:
        spec = importlib.util.spec_from_file_location("gpucheck", PACKAGE / "__init__.py",
                                                      submodule_search_locations=[str(PACKAGE)])
        module = importlib.util.module_from_spec(spec)
        sys.modules["gpucheck"] = module
        spec.loader.exec_module(module)
    return sys.modules["gpucheck"]


load_package()

from gpucheck.cli import apply_size_defaults, parse_args  # noqa: E402,F401
from gpucheck.common import _free, calibrate_tau_h, greedy_entropies  # noqa: E402,F401
from gpucheck.models import DEFAULT_LOGIT_STD, FAMILIES, build_model, family_config, sharpen_factor  # noqa: E402,F401
from gpucheck.run import environment, main  # noqa: E402,F401

if __name__ == "__main__":
    main(sys.argv[1:])
