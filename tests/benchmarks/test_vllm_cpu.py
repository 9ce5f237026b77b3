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
    # one layer's share of an L=10 iteration and the head, as the probe's split gives them (JSON keys)
    layer = {"1": 1.0, "4": 1.1, "8": 1.4, "16": 1.9, "64": 3.8}
    head = {"1": 10.0, "4": 10.0, "8": 10.0, "16": 10.0, "64": 20.0}
    outcomes = [SimpleNamespace(token_iterations=k_stars) for k_stars in ([3, 0, 1], [2, 0], [0, 0, 0, 0])]
    # position 0: k* 3, 2, 0 -> 2 rows in iterations 1 and 2 (10 layers at 1 + 1/30 ms each, the head 10 ms), 1 row
    # in iteration 3 (10 x 1 + 10); position 1: nothing gated; position 2: one row, one iteration; position 3: nothing
    two_rows, one_row = 10 * (1 + 0.1 / 3) + 10, 10 * 1.0 + 10
    assert vllm_cpu._dense_floor_s(outcomes, [10] * 3, layer, head) == pytest.approx(
        (2 * two_rows + one_row + one_row) / 1e3)
    wide = [SimpleNamespace(token_iterations=[1])] * 128  # beyond the probe's rows: its last time per row
    assert vllm_cpu._dense_floor_s(wide, [10] * 128, layer, head) == pytest.approx(2 * (10 * 3.8 + 20) / 1e3)
    assert vllm_cpu._dense_floor_s([SimpleNamespace(token_iterations=[0, 0])], [10], layer, head) == 0.0


def test_a_pools_pass_reads_each_layer_once_for_the_rows_its_spans_cover(vllm_cpu):
    """A pool refines its spans in one pass (models.py ``_refine``): the layer at depth d runs the rows whose L >= d,
    the head all of them; a span no row still refining has costs nothing."""
    layer = {"1": 1.0, "4": 1.3}  # 0.1 ms more per row
    head = {"1": 10.0, "4": 13.0}  # 1 ms more per row
    outcomes = [SimpleNamespace(token_iterations=[2]), SimpleNamespace(token_iterations=[1]),
                SimpleNamespace(token_iterations=[1])]
    # iteration 1: rows at L = 3, 1, 2 -> depth 1: 3 rows, depth 2: 2 rows, depth 3: 1 row; the head on 3 rows;
    # iteration 2: the L=3 row alone -> 3 layers on 1 row, the head on 1 row
    first = (1.2 + 1.1 + 1.0) + 12.0
    second = 3 * 1.0 + 10.0
    assert vllm_cpu._dense_floor_s(outcomes, [3, 1, 2], layer, head) == pytest.approx((first + second) / 1e3)
    # the same rows all at L=3 read every layer for all three in iteration 1
    assert vllm_cpu._dense_floor_s(outcomes, [3, 3, 3], layer, head) == pytest.approx(
        (3 * 1.2 + 12.0 + second) / 1e3)


def test_the_floor_verdict_allows_ten_percent(vllm_cpu):
    assert vllm_cpu._floor_verdict(1.32, 1.2) == "met"
    assert vllm_cpu._floor_verdict(1.33, 1.2) == "not met"
