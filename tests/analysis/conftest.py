"""Fixtures of the analysis tests: synthetic lm-eval run folders (see lmeval_fakes.py)."""

from __future__ import annotations

import pytest

from helpers import lmeval_fakes


@pytest.fixture
def full_run(tmp_path):
    """The 3×3 toy grid (L 0..2 × T 0, 0.5, 1) over 4 documents, one eglr-hf run."""
    out = tmp_path / "lxt"
    lmeval_fakes.write_grid_run(
        out,
        list(lmeval_fakes.GRID),
        eglr=lmeval_fakes.eglr_block(
            cells={
                "L=1,T=0.0": {
                    "tokens": 1000,  # the run's total: the other cells carry no accounting
                    "gated_tokens": 50,
                    "rho": 50 / 1000,
                    "mean_iterations": 3.0,
                    "flop_ratio": 1.04,
                    "batched_flop_ratio": 1.05,
                    "wall_time_s": 4.0,
                }
            }
        ),
    )
    return out
