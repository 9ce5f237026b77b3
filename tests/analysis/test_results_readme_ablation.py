"""The ablation figures results/README.md quotes agree with the committed report's ablation.csv."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
from helpers.markdown_tables import markdown_table

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "results" / "README.md"
CSV = ROOT / "results" / "smollm2-135m-instruct" / "demo_level0_ablation" / "report" / "ablation.csv"


def _table(first_header: str) -> dict[str, list[str]]:
    rows = markdown_table(README.read_text(encoding="utf-8"), f"| {first_header} | solved of 200")
    return {re.sub(r"\*|\s*\(.*\)", "", cells[0]).strip(): cells[1:] for cells in rows[1:]}


@pytest.mark.parametrize(("axis", "header"), [("alpha", "alpha"), ("k_max", "K_max"), ("L", "L")])
def test_readme_ablation_tables_match_the_csv(axis, header):
    assert CSV.is_file(), f"the committed ablation report is missing: {CSV.relative_to(ROOT)}"
    with open(CSV, encoding="utf-8") as handle:
        points = {f"{float(r['value']):g}": r for r in csv.DictReader(handle) if r["axis"] == axis}
    table = _table(header)
    assert set(table) == set(points)
    for value, cells in table.items():
        row = points[value]
        assert cells[0].split()[0] == row["correct"], (axis, value)
        if axis != "L":  # the L table quotes solved and the paired difference only
            assert cells[1:4] == [f"{float(row[k]):.3f}" if k != "mean_iterations" else f"{float(row[k]):.2f}"
                                  for k in ("rho", "mean_iterations", "flop_ratio")], (axis, value)
        if row["gained"]:
            assert f"{row['gained']} / {row['lost']}" in cells[-1], (axis, value)
