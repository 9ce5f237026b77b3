"""The figures that the READMEs quote agree with the committed files they cite.

Each check reads a README table and the file its text names as the source, so that a rerun that
changes the file, or a hand edit of the README, shows here.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
from helpers.markdown_tables import markdown_table

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)

ROOT = Path(__file__).resolve().parents[1]


def _table_after(markdown: Path, heading: str) -> dict[str, list[str]]:
    """The body of the first Markdown table after ``heading``: first cell -> the other cells."""
    return {cells[0]: cells[1:] for cells in markdown_table(markdown.read_text(), heading)[1:]}  # after the header


def test_results_readme_gsm8k_pools_table_matches_the_report():
    rows = _table_after(ROOT / "results/README.md", "### L pool vs T pool on GSM8K")
    with open(ROOT / "results/smollm2-135m-instruct/gsm8k_pools/report/pools.csv") as f:
        pools = {row["pool"]: row for row in csv.DictReader(f)}
    columns = ["T", "L", "LuT"]  # the table's T pool, L pool and L ∪ T columns
    assert rows["oracle of the pool alone"][1:] == [pools[p]["oracle_solved"] for p in columns]
    assert rows["majority vote"][1:] == [pools[p]["sc_solved"] for p in columns]
    expected = [float(pools[p]["random_oracle"]) * int(pools[p]["docs"]) for p in columns]
    quoted = [float(re.match(r"[\d.]+", cell).group()) for cell in rows["oracle of as many random cells of these 21 "
                                                                        "(expected)"][1:]]
    assert quoted == pytest.approx(expected, abs=0.05)


def _benchmark_json(name: str) -> dict:
    return json.loads((ROOT / "benchmarks/results" / name).read_text())


def test_benchmarks_history_quotes_the_hf_engine_figures_of_its_json():
    rows = _table_after(ROOT / "benchmarks/HISTORY.md", "### What the committed JSON also holds")
    for label, cells in rows.items():
        source, key, quoted = cells[0].strip("`"), cells[1].strip("`"), float(cells[2])
        value = _benchmark_json(source)
        for part in key.split("."):
            value = value[part]
        assert float(value) == pytest.approx(quoted, abs=0.0051), (label, source, key)
    assert len(rows) >= 2, "the table of figures from the committed JSON is missing"
    assert {"summary.throughput_ratio_L0_vs_hf[hf]", "summary.peak_memory_ratio_L10_vs_L0[hf]"} <= \
        {cells[1].strip("`") for cells in rows.values()}


def test_results_readme_selection_table_matches_the_report():
    rows = _table_after(ROOT / "results/README.md", "### Selection by the recorded signals")
    with open(ROOT / "results/smollm2-135m-instruct/demo_level0_signals/report/selection.csv") as f:
        solved = {(row["pool"], row["aggregator"]): int(row["solved"]) for row in csv.DictReader(f)}
    columns = ["majority vote", "DeepConf weighted vote", "best by mean_logprob", "fitted combination: weighted vote"]
    for label, pool in (("T pool (L=0, T 0.1..1.0)", "T"), ("L pool (L 1..10, T = 0)", "L"), ("L ∪ T", "LuT")):
        quoted = [int(re.match(r"\d+", cell).group()) for cell in rows[label][1:]]
        assert quoted == [solved[(pool, c)] for c in columns], label


def test_vllm_doc_table_quotes_its_json():
    """docs/vllm-verification.md's measured table: each mode's tokens/s, its ratio to stock vLLM and, for the refining
    modes, the cost per token over L=0's, the paper's bound, the dense-product floor, the cost over it and the verdict
    on the 10 % target, as benchmarks/results/vllm_cpu_smollm2_64x256.json has them."""
    rows = _table_after(ROOT / "docs/vllm-verification.md", "## Measured on CPU")
    result = _benchmark_json("vllm_cpu_smollm2_64x256.json")
    modes, summary = result["modes"], result["summary"]
    names = {"stock vLLM": "stock", "EGLR architecture, requests without EGLR settings": "vplain",
             "eglr-vllm, L=0 (signals recorded)": "vL0", "continuous engine (eglr-hf), L=0": "cL0",
             "continuous engine (eglr-hf), L=10": "cL10"}
    names.update({label: "vL10" for label in rows if label.startswith("eglr-vllm, L=10")})
    names.update({label: "vpool" for label in rows if label.startswith("eglr-vllm, pool")})
    assert set(names) == set(rows), f"rows the test does not know: {set(rows) - set(names)}"

    def per_token(mode):
        return modes[mode]["wall_s"] / modes[mode]["tokens"]

    for label, (tokens_per_s, vs_stock, cost, floor, over_floor) in rows.items():
        mode = modes[names[label]]
        assert float(tokens_per_s) == pytest.approx(mode["tokens_per_s"], abs=0.051), label
        assert float(vs_stock.strip("*")) == pytest.approx(mode["tokens_per_s"] / modes["stock"]["tokens_per_s"],
                                                           abs=0.0006), label
        if names[label] in ("vL10", "vpool"):
            quoted = re.fullmatch(r"([\d.]+) \(bound ([\d.]+)\)", cost)
            assert quoted, f"{label}: {cost!r}"
            assert float(quoted[1]) == pytest.approx(per_token(names[label]) / per_token("vL0"), abs=0.0006), label
            assert float(quoted[2]) == pytest.approx(mode["paper_bound_per_row"], abs=0.0006), label
            assert f"rho {100 * mode['rho']:.1f} %, k_bar {mode['k_bar']:.2f}" in label, label
            name = names[label]
            assert float(floor) == pytest.approx(summary[f"{name}_dense_floor_per_row"], abs=0.0006), label
            verdict = summary[f"{name}_within_10pct_of_floor"]
            assert over_floor == f"**{summary[f'{name}_cost_over_floor']:.3f}: {verdict}**", label


def _first_number(cell: str) -> float:
    return float(re.search(r"[\d,]+\.?\d*", cell).group().replace(",", ""))


def test_benchmarks_history_quotes_issue_57s_gpu_runs():
    """The H200 run of issue 57: the fair-hf table and the 8B pool's ms per step are those of the committed JSON."""
    history = ROOT / "benchmarks/HISTORY.md"
    rows = _table_after(history, "**Item 1: a fair `hf`.**")
    e2e = _benchmark_json("gpu_i57_h200/gpu_e2e.json")["summary"]
    runs = ["hf@32", "hf", "eglr_L0@32", "eglr_L4@32"]  # the table's columns
    for label, key, within in [("tokens/s, wall", "tokens_per_s", 0.051),  # quoted to 0.1, after warm-up to 1
                               ("tokens/s after warm-up", "tokens_per_s_after_warmup", 0.51)]:
        assert [_first_number(cell) for cell in rows[label]] == pytest.approx([e2e[r][key] for r in runs], abs=within)
    ratio = e2e["tokens_per_s_ratio[eglr_L0@32/hf@32]"]
    assert f"({ratio:.2f}x hf at 32)" in rows["tokens/s, wall"][2]
    per_token = e2e["per_token_ratio[eglr_L4@32/eglr_L0@32]"]
    text = history.read_text()
    assert f"L=4 costs {per_token['after_warmup']:.2f}x" in text and per_token["within"] is False
    assert f"1 + rho k L/N = {per_token['paper_bound']:.3f}" in text
    pool = _table_after(history, "**Item 2: the 8B pool.**")
    for column, name in enumerate(["gpu_pool_llama8b.json", "gpu_pool_llama8b_warm_all.json"]):
        figures = _benchmark_json(f"gpu_i57_h200/{name}")["families"]["llama-3.1-8b"]["pool"]["figures"]["ms_per_step"]
        quoted = [_first_number(pool[row][column]) for row in ("captured L=0, ms per engine step",
                                                               "the pool L=1..10, ms per engine step")]
        assert quoted == pytest.approx([figures["cL0c"], figures["cpoolc"]], abs=0.006)


def test_benchmarks_readme_quotes_the_pool_prefill_json():
    """The numbers table's row of issue 56 (a pool prefills each prompt once) quotes its JSON: prefill seconds and
    prompt tokens before and after, the wall, new tokens per second and their ratios, and the same tokens."""
    data = _benchmark_json("smollm2_cpu_pool_prefill.json")
    before, after, summary = data["best"]["before"], data["best"]["after"], data["summary"]
    row = next(line for line in (ROOT / "benchmarks/README.md").read_text().splitlines()
               if "smollm2_cpu_pool_prefill.json" in line)
    for quoted in (f"{before['seconds']:.1f} s -> {after['seconds']:.1f} s ({summary['prefill_speedup']:.2f}x)",
                   f"{before['prefilled_tokens']:,} prompt tokens run before, {after['prefilled_tokens']:,} after",
                   f"wall {before['wall_s']:.1f} -> {after['wall_s']:.1f} s",
                   f"{before['tokens_per_s']:.2f} -> {after['tokens_per_s']:.2f} new tokens/s",
                   f"{summary['throughput_ratio']:.2f}x", f"the copies {after['copy_seconds']:.2f} s"):
        assert quoted in row, quoted
    assert summary["same_tokens"] and "the same tokens" in row


def test_results_readme_qwen_budget_table_matches_cutoff_md():
    """The cut-off shares and greedy's accuracy that chose the Qwen2.5-Coder budget are cutoff.md's."""
    quoted = _table_after(ROOT / "results/README.md", "### Budget: how many greedy answers are cut off?")
    written = _table_after(ROOT / "results/qwen2.5-coder-1.5b-instruct/budget/cutoff.md", "| run |")
    by_budget = {cells[0]: cells for cells in written.values()}
    assert set(quoted) == set(by_budget) == {"640", "512"}
    for budget, cells in quoted.items():  # problems, cut off, solved, median / max tokens
        assert cells[:4] == by_budget[budget][1:5]
        assert cells[4].replace(",", "") == by_budget[budget][5]


@pytest.mark.parametrize("n", [5, 10])
def test_results_readme_qwen_sc_table_matches_the_report(n):
    row = _table_after(ROOT / "results/README.md", "| problems solved | greedy |")[f"of {n} problems"]
    with open(ROOT / f"results/qwen2.5-coder-1.5b-instruct/gsm8k_sc/report_{n}/intervals.csv") as f:
        wilson = {r["quantity"]: r["estimate"] for r in csv.DictReader(f) if r["method"] == "Wilson"}
    assert row[:3] == [wilson["greedy (L=0, T=0)"], wilson["SC L pool (B=10)"], wilson["oracle L pool (B=10)"]]


def test_benchmarks_readme_quotes_the_loop_step_json():
    """The numbers table's row of a loop step's cost quotes its JSON: host reads and blocking uploads per
    steady step and per refill, ops per step, and the compiled step's kernels."""
    data = _benchmark_json("step_cost_cpu_loop.json")["this"]
    reads, ops, kernels = data["host_reads"], data["ops_per_step"], data["kernels"]
    row = next(line for line in (ROOT / "benchmarks/README.md").read_text().splitlines()
               if "step_cost_cpu_loop.json" in line)
    l0, l4 = reads["L0"], reads["L4_every_token_gated"]
    assert l0["per_step"] == l0["per_step_max"] == 0 and l4["per_step"] == l4["per_step_max"] == 1
    assert l0["blocking_uploads_per_step"] == l4["blocking_uploads_per_step"] == 0
    assert l0["blocking_uploads_per_refill"] == l4["blocking_uploads_per_refill"] == 0
    assert l0["uploads_per_refill"] == l4["uploads_per_refill"] == 1
    by_kind = kernels["kernels_per_layer_call_by_kind"]
    assert kernels["kernels_per_step"] <= 240 and kernels["late_compiles"] == 0
    for quoted in ("host reads per steady step **0** at L=0 (the step before's result read one step late: "
                   f"{l0['deferred_per_step']:g} deferred reads a step, {l0['drains']} drain at the end) and **1** "
                   "at L=4", "0 blocking uploads, 1 non-blocking upload a step",
                   f"per refill {l0['per_refill']:g} read and **0** blocking uploads (were 28 / 29), its host values "
                   "in **1** non-blocking upload",
                   f"ops per steady step {ops['L0']['ops_per_step']:g} at L=0 ({ops['L0']['layer_ops_per_step']:g} of "
                   f"them in the decoder layers), {ops['L4_every_token_gated']['ops_per_step']:g} at L=4",
                   f"**{kernels['kernels_per_step']:g} kernels** (was 262; goal <= 240: met): "
                   f"{kernels['kernels_per_layer_call']} per layer call ({by_kind['cpp_fused']} fused, "
                   f"{by_kind['extern']} matrix products, {by_kind['aten']} attention; the rotary angles computed "
                   f"inside the layer) x {kernels['layer_calls_per_step']}, the unembedding compiled "
                   f"({kernels['kernels_per_region_call']['unembedding']}), "
                   f"{kernels['ops_outside_regions_per_step']:g} eager ops outside the compiled regions",
                   f"{data['compilations']} compilations (were 1; cold {kernels['compile_seconds']:g} s",
                   f"{kernels['late_compiles']} late"):
        assert quoted in row, quoted
