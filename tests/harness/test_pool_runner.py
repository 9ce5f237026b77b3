"""``PoolRunner`` (harness/pool_runner.py): what one model remembers across lm-eval's ``generate_until`` calls."""

from __future__ import annotations

import pytest
from helpers.inputs import CONTEXTS, requests_for

from eglr_harness.harness import pool_runner
from eglr_harness.harness.model import EglrHFLM

GREEDY = {"until": ["\n\n"], "max_gen_toks": 6, "do_sample": False}


def test_a_task_is_calibrated_once_per_run(tiny_model_dir, tmp_path, monkeypatch):
    """The second call of a task takes its tau_h from the run, not from the tau_h cache or a new calibration
    (lm-eval calls generate_until once per task, but eglr-calibrate and Python callers call it again)."""
    monkeypatch.setenv("EGLR_CACHE_DIR", str(tmp_path))
    lm = EglrHFLM(pretrained=str(tiny_model_dir("llama")), device="cpu", dtype="float32", batch_size=4, L=2,
                  tau_h="auto", calib_limit=2)
    lm.generate_until(requests_for(CONTEXTS[:2], GREEDY, task="once"))
    tau, source = lm.tau_h_by_task["once"], dict(lm.accounts.calibration_source["once"])
    monkeypatch.setattr(pool_runner, "calibration_prompts", lambda *a, **k: pytest.fail("calibrated twice in one run"))
    lm.generate_until(requests_for(CONTEXTS[2:4], GREEDY, task="once"))
    assert lm.tau_h_by_task["once"] == tau and lm.accounts.calibration_source["once"] == source
    assert lm.get_model_info()["eglr"]["tau_h"] == {"once": tau}
