"""eglr-export: rows per rollout, loaded back with datasets, checked against the samples files."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from helpers import lmeval_fakes
from eglr_harness.commands import export
from eglr_harness.analysis.load import find_runs, read_samples

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)

REAL_RUN = (Path(__file__).resolve().parents[2] / "results" / "smollm2-135m-instruct" / "demo_level0_ablation"
            / "default")


def _load(path: Path, tmp_path: Path):
    datasets = pytest.importorskip("datasets")
    kind = "parquet" if path.suffix == ".parquet" else "json"
    return datasets.load_dataset(kind, data_files=str(path), split="train", cache_dir=str(tmp_path / "hf_cache"))


def _expected(run_dir: Path):
    """group -> (rollouts, correct) and every (prompt prefix, completion) from the samples files."""
    groups = defaultdict(lambda: [0, 0])
    for files in find_runs(run_dir):
        for task, path in files.samples.items():
            first = None
            for s in read_samples(path):
                first = s["filter"] if first is None else first
                if s["filter"] != first:
                    continue
                g = groups[f"{task}/{s['doc_hash']}"]
                g[0] += len(s["rollouts"])
                g[1] += sum(r["correct"] for r in s["rollouts"])
    return dict(groups)


def _check(ds, run_dir):
    rows = ds.to_list()
    assert {"prompt", "completion", "reward", "group_id", "deterministic", "L", "T", "signals"} <= set(ds.column_names)
    got = defaultdict(lambda: [0, 0])
    for r in rows:
        got[r["group_id"]][0] += 1
        got[r["group_id"]][1] += int(r["reward"])
        assert r["reward"] == float(r["correct"]) and r["deterministic"] == (r["T"] == 0)
    assert dict(got) == _expected(run_dir)
    for group in {r["group_id"] for r in rows}:  # one prompt per GRPO group
        assert len({r["prompt"] for r in rows if r["group_id"] == group}) == 1
    return rows


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_export_synthetic_run(tmp_path, suffix):
    cells = list(lmeval_fakes.GRID)
    docs = {d: lmeval_fakes.rollouts_for(d, cells) for d in range(4)}
    for d, rs in docs.items():  # signals on doc 0 only: the others export null
        for r in rs:
            r["signals"] = {"mean_logprob": -0.5, "tokens": 7} if d == 0 else None
    lmeval_fakes.write_run(tmp_path / "run", task="toy_eglr_lxt", docs=docs,
                           eglr=lmeval_fakes.eglr_block(task="toy_eglr_lxt"))
    assert export.main([str(tmp_path / "run"), "--out", str(tmp_path / f"pool{suffix}")]) == 0
    rows = _check(_load(tmp_path / f"pool{suffix}", tmp_path), tmp_path / "run")
    assert len(rows) == 4 * len(cells)
    first = next(r for r in rows if r["doc_id"] == 0 and r["repeat"] == 0)
    assert first["prompt"] == "prompt 0" and first["completion"] == "... \\boxed{g0}"
    assert first["gold"] == "g0" and first["alpha"] == 0.2 and first["k_max"] == 3 and first["tau_h"] == 1.87
    assert first["signals"]["mean_logprob"] == -0.5
    assert all(r["signals"] is None for r in rows if r["doc_id"] == 1)


def test_export_committed_real_run(tmp_path):
    assert REAL_RUN.is_dir(), f"the committed run is missing: {REAL_RUN.relative_to(REAL_RUN.parents[3])}"
    out = tmp_path / "real.parquet"
    assert export.main([str(REAL_RUN), "--out", str(out)]) == 0
    rows = _check(_load(out, tmp_path), REAL_RUN)
    assert all(r["L"] == 4 and r["T"] == 0.0 and r["deterministic"] for r in rows)
    assert all("<|im_start|>" in r["prompt"] and r["completion"] for r in rows)
    jsonl = tmp_path / "real.jsonl"
    assert export.main([str(REAL_RUN), "--out", str(jsonl)]) == 0
    assert ([json.loads(line)["completion"] for line in jsonl.read_text().splitlines()]
            == [r["completion"] for r in rows])


def test_bad_output_ending(tmp_path, full_run):
    assert export.main([str(full_run), "--out", str(tmp_path / "x.csv")]) == 2


def test_every_json_the_project_writes_is_strict_and_read_back(tmp_path):
    """Issue 47: export wrote `NaN` and `Infinity` literals, which the project's own reader refused. The
    one JSON writer (core/jsonl.dumps) writes null for a non-finite number and never a literal."""
    import json
    import math

    from eglr_harness.core.jsonl import dumps, iter_jsonl

    row = {"reward": float("nan"), "signals": {"max_entropy": float("inf"), "mean_logprob": -float("inf")},
           "steps": [0.5, float("nan")], "ok": 1.5}
    text = dumps(row)
    assert "NaN" not in text and "Infinity" not in text
    parsed = json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} literal written"))
    assert parsed == {"reward": None, "signals": {"max_entropy": None, "mean_logprob": None}, "steps": [0.5, None],
                      "ok": 1.5}
    (tmp_path / "x.jsonl").write_text(text + "\n")
    assert [r for _, r in iter_jsonl(tmp_path / "x.jsonl")] == [parsed]
    assert not math.isnan(parsed["ok"])
