"""The accounting of rollouts reused across tau_h calibration and the pool (``run/accounting.py``,
``harness/decode.py``), as their docstrings promise it:

- calibration (``tau_h=auto``: a greedy run on the task's first prompts) is accounted apart, in
  ``stats.calibration``: in neither the cells nor the total;
- the pool's greedy rollouts that calibration decoded are not decoded again: they count as reused
  (``reused_rollouts``, cell ``L=0,T=0.0``), and the pool's figures cover the rest;
- a rollout of this run's memory counts as reused, one from the rollout store with its accounting
  as decoded; a run resumed from the store reports the figures of an uninterrupted run, calibration
  included.

Every rollout has exactly ``max_gen_toks`` tokens (a stop string a random model never writes), so
the token counts below are exact.
"""

from __future__ import annotations

import pytest

from helpers.inputs import CONTEXTS, requests_for

from eglr_harness.harness.model import EglrHFLM

TOKENS = 8
GREEDY = {"until": ["@@@@@@"], "max_gen_toks": TOKENS, "do_sample": False}
POOL = {**GREEDY, "eglr_L": "0-1", "eglr_T": 0}  # cells L=0 (greedy) and L=1, at T=0
CALIB = 3  # calibration's prompts: the first 3 of the 4 documents


# tiny_lm's model args here (tests/conftest.py)
LM_DEFAULTS = dict(engine="hook", batch_size=2, tau_h="auto", calib_limit=CALIB)


class RowCounter:
    """Counts the rollouts the engines decode (the pool's and calibration's)."""

    def __init__(self, monkeypatch):
        from eglr_harness.harness.decode import RolloutDecoder

        self.rows = 0
        original = RolloutDecoder._run

        def counted(requests, engine, stats_for, on_finish):
            self.rows += len(requests)
            return original(requests, engine, stats_for, on_finish)

        monkeypatch.setattr(RolloutDecoder, "_run", staticmethod(counted))


@pytest.mark.parametrize("engine", ["hook", "continuous"])
def test_greedy_rollouts_decoded_by_calibration_count_as_reused_in_the_pool(tiny_lm, llama_dir, tmp_path, monkeypatch,
                                                                            engine):
    monkeypatch.setenv("EGLR_CACHE_DIR", str(tmp_path / "cache"))
    counter = RowCounter(monkeypatch)
    lm = tiny_lm(engine=engine)
    got = lm.generate_until(requests_for(CONTEXTS[:4], POOL, repeats=2, task="reuse_task"))
    stats = lm.get_model_info()["eglr"]["stats"]
    # decoded: 3 calibration prompts, then the pool without the 3 greedy rollouts calibration made
    assert counter.rows == CALIB + 4 * 2 - CALIB
    assert stats["reused_rollouts"] == {"total": CALIB, "cells": {"L=0,T=0.0": CALIB}}
    assert stats["cells"]["L=0,T=0.0"]["tokens"] == (4 - CALIB) * TOKENS  # the pool's own greedy decode
    assert stats["cells"]["L=1,T=0.0"]["tokens"] == 4 * TOKENS
    assert stats["total"]["tokens"] == sum(c["tokens"] for c in stats["cells"].values()) == (4 - CALIB + 4) * TOKENS
    assert stats["calibration"]["reuse_task"]["compute"]["tokens"] == CALIB * TOKENS  # apart, not in the total
    # the reused texts are calibration's greedy texts: what a plain greedy run writes
    plain = EglrHFLM(pretrained=llama_dir, device="cpu", dtype="float32", engine=engine, batch_size=2, L=0)
    greedy = plain.generate_until(requests_for(CONTEXTS[:4], GREEDY, task="reuse_task"))
    assert [str(x) for x in got if x.L == 0] == [str(x) for x in greedy]


def test_a_rerun_from_the_store_reports_the_calibrated_runs_figures(tiny_lm, tmp_path, monkeypatch):
    """Rerun into the same rollout store (tau_h now cached, so calibration decodes nothing): the greedy
    rollouts calibration stored still count as reused in the pool, as in the run that decoded them."""
    monkeypatch.setenv("EGLR_CACHE_DIR", str(tmp_path / "cache"))
    requests = requests_for(CONTEXTS[:4], POOL, repeats=2, task="reuse_task")
    first = tiny_lm(rollout_cache=str(tmp_path / "store"))
    first.generate_until(requests)
    counter = RowCounter(monkeypatch)
    again = tiny_lm(rollout_cache=str(tmp_path / "store"))
    again.generate_until(requests)
    assert counter.rows == 0  # everything from the store
    ours, theirs = (lm.get_model_info()["eglr"]["stats"] for lm in (again, first))
    assert ours["calibration"]["reuse_task"]["cached"] is True and ours["calibration"]["reuse_task"]["compute"] is None
    assert ours["reused_rollouts"] == theirs["reused_rollouts"] == {"total": CALIB, "cells": {"L=0,T=0.0": CALIB}}
    for part in ("L=0,T=0.0", "L=1,T=0.0"):
        assert ours["cells"][part]["tokens"] == theirs["cells"][part]["tokens"]
    assert ours["total"]["tokens"] == theirs["total"]["tokens"] == (4 - CALIB + 4) * TOKENS


def test_rollouts_repeated_within_the_run_count_as_reused_and_stored_ones_as_decoded(llama_dir, tmp_path):
    """This run's memory: reused (no compute counted twice); the store with accounting: decoded."""
    requests = requests_for(CONTEXTS[:2], POOL, repeats=2)
    lm = EglrHFLM(pretrained=llama_dir, device="cpu", dtype="float32", engine="hook", batch_size=2, tau_h=0.5,
                  rollout_cache=str(tmp_path))
    lm.generate_until(requests)
    lm.generate_until(requests)  # the same requests again in the same run: from its memory
    stats = lm.get_model_info()["eglr"]["stats"]
    assert stats["reused_rollouts"] == {"total": 4, "cells": {"L=0,T=0.0": 2, "L=1,T=0.0": 2}}
    assert stats["total"]["tokens"] == 4 * TOKENS  # counted once
    fresh = EglrHFLM(pretrained=llama_dir, device="cpu", dtype="float32", engine="hook", batch_size=2, tau_h=0.5,
                     rollout_cache=str(tmp_path))
    fresh.generate_until(requests)
    fresh_stats = fresh.get_model_info()["eglr"]["stats"]
    assert fresh_stats["reused_rollouts"]["total"] == 0 and fresh_stats["total"]["tokens"] == 4 * TOKENS
