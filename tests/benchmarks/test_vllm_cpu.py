"""benchmarks/vllm_cpu.py's arithmetic that needs no vLLM: the dense-product floor of a refining mode from the
per-token k* of its outcomes and the probe's iteration times (the speed run itself needs vLLM: docs/vllm.md)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.unit
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "vllm_cpu.py"


@pytest.fixture(scope="module")
def vllm_cpu():
    spec = importlib.util.spec_from_file_location("vllm_cpu_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dense_floor_counts_each_iteration_of_each_position(vllm_cpu):
    probe = {"1": 20.0, "4": 21.0, "8": 24.0, "16": 29.0, "64": 58.0}  # as collective_rpc's JSON keys
    outcomes = [SimpleNamespace(token_iterations=k_stars) for k_stars in ([3, 0, 1], [2, 0], [0, 0, 0, 0])]
    # position 0: k* 3, 2, 0 -> 2 rows in iterations 1 and 2 (20 + 1/3 ms each), 1 row in iteration 3 (20 ms);
    # position 1: nothing gated; position 2: one row, one iteration; position 3: nothing
    assert vllm_cpu._dense_floor_s(outcomes, probe) == pytest.approx((2 * (20 + 1 / 3) + 20 + 20) / 1e3)
    wide = [SimpleNamespace(token_iterations=[1])] * 128  # beyond the probe's rows: its last time per row
    assert vllm_cpu._dense_floor_s(wide, probe) == pytest.approx(2 * 58.0 / 1e3)
    assert vllm_cpu._dense_floor_s([SimpleNamespace(token_iterations=[0, 0])], probe) == 0.0
