"""eglr-hf with engine=continuous: the same rollouts as engine=hf (and lm-eval's hf at L=0), the same
accounting, the rollout store, and the errors that send a user back to engine=hf."""

from __future__ import annotations

import pytest
from lm_eval.models.huggingface import HFLM

from inputs import CONTEXTS, requests_for

from eglr_harness.harness.model import EglrHFLM
from eglr_harness.rollout import rollout_meta

GREEDY = {"until": ["\n\n", "."], "max_gen_toks": 12, "do_sample": False}
POOL = {**GREEDY, "eglr_L": "0-4", "eglr_T": 0, "eglr_budget_T": "0.1-1.0:0.1"}


@pytest.fixture(scope="module")
def llama_dir(tiny_model_dir):
    return str(tiny_model_dir("llama"))


def _lm(path, engine, **kwargs):
    return EglrHFLM(pretrained=path, device="cpu", dtype="float32", engine=engine, **kwargs)


def test_L0_matches_lm_eval_hf(llama_dir):
    expected = HFLM(pretrained=llama_dir, device="cpu", dtype="float32", batch_size=4).generate_until(
        requests_for(CONTEXTS, GREEDY))
    got = _lm(llama_dir, "continuous", batch_size=2, L=0).generate_until(requests_for(CONTEXTS, GREEDY))
    assert [str(g) for g in got] == expected
    assert any(text.strip() for text in expected)


@pytest.mark.parametrize("L", [None, 2])  # the task's L pool at T=0, or L pinned: T = 0.1..1.0 sampled
def test_pool_rollouts_equal_the_hf_engine(llama_dir, L):
    # tau_kl=0: no KL exit, whose knife-edge cases float noise between batch compositions could flip
    # (the engine tests check the exit against the naive reference, with margins)
    settings = dict(tau_h=0.0, tau_kl=0.0, **({"L": L} if L else {}))
    hf = _lm(llama_dir, "hf", batch_size=4, **settings)
    continuous = _lm(llama_dir, "continuous", batch_size=3, **settings)
    a = hf.generate_until(requests_for(CONTEXTS[:3], POOL, repeats=10))
    b = continuous.generate_until(requests_for(CONTEXTS[:3], POOL, repeats=10))
    assert [str(x) for x in a] == [str(x) for x in b]
    assert [(x.L, x.T, x.cycle) for x in a] == [(x.L, x.T, x.cycle) for x in b]
    # the continuous engine records each rollout's signals (tau_h = 0: every token of an L > 0 cell is gated)
    assert all(x.signals is None for x in a)
    for x in b:
        assert rollout_meta(x)["signals"] is x.signals and x.signals["tokens"] >= 1
        assert x.signals["gated_fraction"] == (1.0 if x.L > 0 else 0.0)
        assert x.signals["mean_logprob"] <= 0.0 and x.signals["max_entropy"] >= x.signals["mean_entropy"] > 0.0
    hf_cells = hf.get_model_info()["eglr"]["stats"]["cells"]
    ours = continuous.get_model_info()["eglr"]
    assert ours["engine"] == "continuous"
    for label, stats in ours["stats"]["cells"].items():
        for key in ("tokens", "gated_tokens", "iteration_hist"):
            assert stats[key] == hf_cells[label][key], (label, key)
        assert stats["batched_flop_ratio"] == pytest.approx(stats["flop_ratio"])


def test_calibration_and_store_work_through_the_engine(llama_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("EGLR_CACHE_DIR", str(tmp_path / "cache"))
    hf = _lm(llama_dir, "hf", batch_size=4, L=3, tau_h="auto", calib_limit=4)
    continuous = _lm(llama_dir, "continuous", batch_size=2, L=3, tau_h="auto", calib_limit=4,
                     rollout_cache=str(tmp_path / "store"))
    monkeypatch.setenv("EGLR_CACHE_DIR", str(tmp_path / "cache2"))  # no cached value: both calibrate
    a = hf.generate_until(requests_for(CONTEXTS, GREEDY))
    b = continuous.generate_until(requests_for(CONTEXTS, GREEDY))
    assert continuous.tau_h_by_task == pytest.approx(hf.tau_h_by_task)
    assert [str(x) for x in a] == [str(x) for x in b]
    again = _lm(llama_dir, "continuous", batch_size=2, L=3, tau_h=continuous.tau_h_by_task["unit_task"],
                rollout_cache=str(tmp_path / "store"))
    reused = again.generate_until(requests_for(CONTEXTS, GREEDY))
    assert [str(x) for x in reused] == [str(x) for x in b]
    assert again.get_model_info()["eglr"]["stats"]["reused_rollouts"]["total"] == len(CONTEXTS)
    assert [x.signals for x in reused] == [x.signals for x in b] and all(x.signals for x in b)  # stored with the text


def test_bad_engine_settings_are_refused(llama_dir):
    with pytest.raises(ValueError, match="`engine`='vllm' is not allowed; allowed: auto, continuous, hf"):
        _lm(llama_dir, "vllm")
    with pytest.raises(ValueError, match="fixed batch_size"):
        _lm(llama_dir, "continuous", batch_size="auto")
    lm = _lm(llama_dir, "continuous", batch_size=2, L=0)
    with pytest.raises(ValueError, match=r"\['repetition_penalty'\] need generate: use engine=hf"):
        lm.generate_until(requests_for(CONTEXTS[:1], {**GREEDY, "repetition_penalty": 1.3}))


def test_auto_is_the_default_and_falls_back_to_hf_saying_why(llama_dir, tiny_model_dir, caplog):
    default = EglrHFLM(pretrained=llama_dir, device="cpu", dtype="float32", batch_size=2, L=0)
    info = default.get_model_info()["eglr"]
    assert (info["engine"], info["engine_requested"]) == ("continuous", "auto")

    with caplog.at_level("INFO", logger="eglr_harness"):
        auto_batch = _lm(llama_dir, "auto", batch_size="auto", L=0)  # the continuous engine needs a fixed batch
    assert auto_batch.get_model_info()["eglr"]["engine"] == "hf"
    assert any("decoding with engine=hf: engine=continuous needs a fixed batch_size" in r.getMessage()
               for r in caplog.records)

    # a request with an option the continuous engine does not apply goes through generate, the others not
    lm = _lm(llama_dir, "auto", batch_size=2, L=0)
    hf = _lm(llama_dir, "hf", batch_size=2, L=0)
    penalised = {**GREEDY, "repetition_penalty": 1.3}
    caplog.clear()
    with caplog.at_level("INFO", logger="eglr_harness"):
        mixed = lm.generate_until(requests_for(CONTEXTS[:2], penalised, task="a") +
                                  requests_for(CONTEXTS[2:4], GREEDY, task="b"))
    expected = hf.generate_until(requests_for(CONTEXTS[:2], penalised, task="a") +
                                 requests_for(CONTEXTS[2:4], GREEDY, task="b"))
    assert [str(x) for x in mixed] == [str(x) for x in expected]
    assert [x.signals is None for x in mixed] == [True, True, False, False]  # generate records no signals
    assert [r.getMessage() for r in caplog.records].count(
        "eglr-hf: requests with generation options ['repetition_penalty'] decode with engine=hf (the continuous "
        "engine applies temperature, top_k and top_p only)") == 1
