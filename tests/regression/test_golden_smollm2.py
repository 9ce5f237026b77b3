"""Decoding regression on the real SmolLM2-135M GGUF, through the stock lm_eval CLI.

A few GSM8K problems at L=0 and L=4 (tau_h fixed at 1.5 nats, 48 new tokens) must reproduce the
texts, extracted answers, scores and accounting stored in ``golden_smollm2_gsm8k.json``. Any
change to decoding shows up here. When a change is *meant* to alter outputs, regenerate with

    EGLR_REGEN_GOLDEN=1 python -m pytest tests/regression -q

and commit the new golden file with the change (the numbers are CPU fp32, 2 threads).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

GOLDEN = Path(__file__).with_name("golden_smollm2_gsm8k.json")
COMMAND = [
    "--model", "eglr-hf",
    "--model_args", '{"model_config": "smollm2-135m-instruct", "L": "0,4", "tau_h": 1.5}',
    "--tasks", "gsm8k_eglr_sc", "--limit", "3", "--batch_size", "4", "--apply_chat_template",
    "--gen_kwargs", "max_gen_toks=48", "--log_samples",
]


def _run(tmp_path: Path, shared_data_dir: Path) -> dict:
    out = tmp_path / "out"
    env = {**os.environ, "EGLR_DATA_DIR": str(shared_data_dir), "EGLR_CACHE_DIR": str(tmp_path / "cache"),
           "OMP_NUM_THREADS": "2"}
    result = subprocess.run([shutil.which("lm_eval"), *COMMAND, "--output_path", str(out)], capture_output=True,
                            text=True, timeout=1200, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    results = json.loads(next(out.rglob("results_*.json")).read_text())
    samples = [json.loads(line) for line in next(out.rglob("samples_gsm8k_eglr_sc_*.jsonl")).read_text().splitlines()]
    docs = []
    for sample in sorted(samples, key=lambda s: s["doc_id"]):
        texts = {}
        for resp, rollout in zip(sample["resps"][0], sample["rollouts"]):
            texts.setdefault(f"L={rollout['L']}",
                             {"text": resp, "answer": rollout["answer"], "correct": rollout["correct"]})
        docs.append({"doc_id": sample["doc_id"], "target": sample["target"], "by_L": texts,
                     "maj@10": sample["maj@10"], "oracle@10": sample["oracle@10"]})
    stats = results["config"]["eglr"]["stats"]["cells"]
    return {
        "command": "lm_eval " + " ".join(COMMAND),
        "docs": docs,
        "metrics": {k: v for k, v in results["results"]["gsm8k_eglr_sc"].items()
                    if k.split(",")[0] in {"acc", "maj@10", "oracle@10", "pass@1", "pass@10", "best_cfg_acc"}},
        "accounting": {cell: {k: s[k] for k in ("tokens", "gated_tokens",
                                                "iteration_hist")} for cell, s in stats.items()},
    }


def test_decoding_matches_golden(tmp_path, shared_data_dir):
    observed = _run(tmp_path, shared_data_dir)
    if os.environ.get("EGLR_REGEN_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps(observed, indent=1, sort_keys=True) + "\n")
        pytest.skip(f"golden file regenerated: {GOLDEN}")
    golden = json.loads(GOLDEN.read_text())
    assert observed["command"] == golden["command"], "the regression command changed: regenerate the golden file"
    for got, want in zip(observed["docs"], golden["docs"], strict=True):
        assert got == want, f"doc {want['doc_id']} decoded differently from the golden file"
    assert observed["metrics"] == golden["metrics"]
    assert observed["accounting"] == golden["accounting"]
    # the golden file must exercise refinement: L=4 differs from L=0 somewhere
    assert any(d["by_L"]["L=0"]["text"] != d["by_L"]["L=4"]["text"] for d in golden["docs"])
