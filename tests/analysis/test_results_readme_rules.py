"""The figures results/README.md quotes for issue 49's run agree with the committed reports they cite."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from helpers.markdown_tables import markdown_table

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "results" / "README.md"
RUN = ROOT / "results" / "smollm2-135m-instruct" / "rules_and_seeds"


def _csv(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_readme_rules_table_matches_rules_csv():
    rows = {cells[0]: cells[1:] for cells in markdown_table(README.read_text(encoding="utf-8"),
                                                            "| rule | threshold: k̄, FLOP ratio")[1:]}
    points = _csv(RUN / "rules_report" / "rules.csv")
    assert set(rows) == {p["rule"] for p in points}
    for p in points:
        assert rows[p["rule"]][1] == f"{p['correct']} each"
        threshold = float(p["threshold"])
        quoted = f"{float(p['mean_iterations']):.2f}, {float(p['flop_ratio_with_head']):.3f}"
        if p["rule"] != "accel":  # accel's three thresholds share one cell
            cell = next(part for part in rows[p["rule"]][0].split(" · ")
                        if float(part.split(":")[0].rstrip("*")) == threshold)
            assert cell.split(": ", 1)[1].startswith(quoted), (p["rule"], threshold, cell, quoted)


@pytest.mark.parametrize("report", ["demo_report"])
def test_readme_resampling_table_matches_resampling_csv(report):
    rows = {cells[0]: cells[1:] for cells in markdown_table(README.read_text(encoding="utf-8"),
                                                            "| 40 problems, B = 10 |")[1:]}
    found = {(r["pool_a"], r["pool_b"], r["measure"]): r for r in _csv(RUN / report / "resampling.csv")}
    for label, pool in (("L pool (L 1..10, T 0)", "L"), ("seed pool (L 0, T 0.7, seeds 1333..1342)", "seed")):
        side = "a" if pool == "L" else "b"
        assert rows[label][:2] == [found[("L", "seed", m)][side] for m in ("oracle", "vote")]
    assert rows["T pool (L 0, T 0.1..1.0)"][:2] == [found[("T", "seed", m)]["a"] for m in ("oracle", "vote")]
