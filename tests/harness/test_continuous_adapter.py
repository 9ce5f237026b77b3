"""eglr-hf with engine=continuous: the same rollouts as engine=hook (and lm-eval's hf at L=0), the same
accounting and signals, the rollout store, generation-config processors, batch_size=auto, and the
errors that send a user back to engine=hook."""

from __future__ import annotations

import pytest
from helpers.inputs import CONTEXTS, batch_independent, requests_for
from lm_eval.models.huggingface import HFLM
from transformers import AutoTokenizer

from eglr_harness.core.rollout import rollout_meta
from eglr_harness.harness.model import EglrHFLM

GREEDY = {"until": ["\n\n", "."], "max_gen_toks": 12, "do_sample": False}
POOL = {**GREEDY, "eglr_L": "0-4", "eglr_T": 0, "eglr_budget_T": "0.1-1.0:0.1"}


def test_L0_matches_lm_eval_hf(tiny_lm, llama_dir):
    expected = HFLM(pretrained=llama_dir, device="cpu", dtype="float32", batch_size=4).generate_until(
        requests_for(CONTEXTS, GREEDY))
    got = tiny_lm(engine="continuous", batch_size=2, L=0).generate_until(requests_for(CONTEXTS, GREEDY))
    assert [str(g) for g in got] == expected
    assert any(text.strip() for text in expected)


@pytest.mark.parametrize("L", [None, 2])  # the task's L pool at T=0, or L pinned: T = 0.1..1.0 sampled
def test_pool_rollouts_equal_the_hook_engine(tiny_lm, L):
    # tau_kl=0: no KL exit, whose knife-edge cases float noise between batch compositions could flip
    # (the engine tests check the exit against the naive reference, with margins)
    settings = dict(tau_h=0.0, tau_kl=0.0, **({"L": L} if L else {}))
    hf = tiny_lm(engine="hook", batch_size=4, **settings)
    continuous = tiny_lm(engine="continuous", batch_size=3, **settings)
    a = hf.generate_until(requests_for(CONTEXTS[:3], POOL, repeats=10))
    b = continuous.generate_until(requests_for(CONTEXTS[:3], POOL, repeats=10))
    assert [str(x) for x in a] == [str(x) for x in b]
    assert [(x.L, x.T, x.cycle) for x in a] == [(x.L, x.T, x.cycle) for x in b]
    # both engines record each rollout's signals, the same ones (tau_h = 0: every token of an L > 0 cell is gated)
    for x, y in zip(a, b):
        assert rollout_meta(x)["signals"] is x.signals and x.signals["tokens"] >= 1
        assert x.signals["gated_fraction"] == (1.0 if x.L > 0 else 0.0)
        assert x.signals["mean_logprob"] <= 0.0 and x.signals["max_entropy"] >= x.signals["mean_entropy"] > 0.0
        assert x.signals.keys() == y.signals.keys()
        for name, value in x.signals.items():  # None: a mean over no gated token
            assert value == (None if y.signals[name] is None else pytest.approx(y.signals[name], rel=1e-4,
                                                                                abs=1e-6)), name
    hf_cells = hf.get_model_info()["eglr"]["stats"]["cells"]
    ours = continuous.get_model_info()["eglr"]
    assert ours["engine"] == "continuous"
    # a pool prefills each prompt once (issue 56): as many rollouts of each of 3 contexts, 3 prompts prefilled
    prefill = ours["prefill_report"]
    assert prefill["rows"] - prefill["shared_rows"] == 3 and prefill["rows"] in (15, 30)  # greedy cells: 5 each
    assert prefill["prompt_tokens"] == prefill["rows"] // 3 * prefill["prefilled_tokens"]
    for label, stats in ours["stats"]["cells"].items():
        for key in ("tokens", "gated_tokens", "iteration_hist"):
            assert stats[key] == hf_cells[label][key], (label, key)
        assert stats["batched_flop_ratio"] == pytest.approx(stats["flop_ratio"])


def test_calibration_and_store_work_through_the_engine(tiny_lm, tmp_path, monkeypatch):
    monkeypatch.setenv("EGLR_CACHE_DIR", str(tmp_path / "cache"))
    hf = tiny_lm(engine="hook", batch_size=4, L=3, tau_h="auto", calib_limit=4)
    continuous = tiny_lm(engine="continuous", batch_size=2, L=3, tau_h="auto", calib_limit=4,
                         rollout_cache=str(tmp_path / "store"))
    monkeypatch.setenv("EGLR_CACHE_DIR", str(tmp_path / "cache2"))  # no cached value: both calibrate
    a = hf.generate_until(requests_for(CONTEXTS, GREEDY))
    b = continuous.generate_until(requests_for(CONTEXTS, GREEDY))
    assert continuous.tau_h_by_task == pytest.approx(hf.tau_h_by_task)
    assert [str(x) for x in a] == [str(x) for x in b]
    again = tiny_lm(engine="continuous", batch_size=2, L=3, tau_h=continuous.tau_h_by_task["unit_task"],
                    rollout_cache=str(tmp_path / "store"))
    reused = again.generate_until(requests_for(CONTEXTS, GREEDY))
    assert [str(x) for x in reused] == [str(x) for x in b]
    # stored with their accounting: the rerun reports the figures of the run that decoded them (issue 35)
    first_stats, again_stats = (lm.get_model_info()["eglr"]["stats"] for lm in (continuous, again))
    assert again_stats["reused_rollouts"]["total"] == 0
    assert batch_independent(again_stats) == batch_independent(first_stats) and first_stats["total"]["tokens"] > 0
    assert [x.signals for x in reused] == [x.signals for x in b] and all(x.signals for x in b)  # stored with the text


def test_bad_engine_settings_are_refused(tiny_lm):
    with pytest.raises(ValueError, match="`engine`='vllm' is not allowed; allowed: auto, continuous, hook"):
        tiny_lm(engine="vllm")
    lm = tiny_lm(engine="continuous", batch_size=2, L=0)
    with pytest.raises(ValueError, match=r"num_beams=2.*engine=hook"):
        lm.generate_until(requests_for(CONTEXTS[:1], {**GREEDY, "num_beams": 2}))


def test_batch_size_auto_takes_slots_from_free_memory(tiny_lm, caplog):
    with caplog.at_level("INFO", logger="eglr_harness"):
        auto = tiny_lm(engine="continuous", batch_size="auto", L=2, tau_h=0.0)
        got = auto.generate_until(requests_for(CONTEXTS, GREEDY))
    said = [r.getMessage() for r in caplog.records if "batch_size=auto" in r.getMessage()]
    assert said and "running rows" in said[0] and "GiB free" in said[0] and "MiB per row" in said[0]
    fixed = tiny_lm(engine="continuous", batch_size=2, L=2, tau_h=0.0).generate_until(requests_for(CONTEXTS, GREEDY))
    assert [str(x) for x in got] == [str(x) for x in fixed]
    assert auto.get_model_info()["eglr"]["engine"] == "continuous"


@pytest.mark.parametrize("L", [0, 2, 4])
def test_a_qwen_generation_config_penalty_decodes_continuously_as_the_hook_engine(tiny_lm, tiny_model_dir, tmp_path, L):
    """Qwen2.5-Instruct ships repetition_penalty 1.05: engine=auto keeps the continuous engine, with the
    texts of engine=hook, greedy and sampled, and signals from both."""
    from transformers import AutoModelForCausalLM

    folder = tmp_path / "qwen_penalised"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir("qwen2"))
    model.generation_config.repetition_penalty = 1.05
    model.generation_config.no_repeat_ngram_size = 3  # makes the processors bite on a tiny random model
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_model_dir("qwen2")).save_pretrained(folder)
    settings = dict(L=L, T="0|0.7", tau_h=0.0, tau_kl=0.0)
    requests = requests_for(CONTEXTS[:3], {**GREEDY, "max_gen_toks": 16}, repeats=2)
    auto = tiny_lm(pretrained=str(folder), engine="auto", batch_size=2, **settings)
    hf = tiny_lm(pretrained=str(folder), engine="hook", batch_size=2, **settings)
    plain = tiny_lm(pretrained=str(tiny_model_dir("qwen2")), engine="auto", batch_size=2, **settings)
    assert auto.get_model_info()["eglr"]["engine"] == "continuous"
    a, b, c = (lm.generate_until(requests) for lm in (auto, hf, plain))
    assert [str(x) for x in a] == [str(x) for x in b]
    assert [str(x) for x in a] != [str(x) for x in c], "the generation config's processors changed nothing"
    assert all(x.signals for x in a) and all(x.signals for x in b)


def test_auto_is_the_default_and_falls_back_to_hook_saying_why(tiny_lm, llama_dir, tiny_model_dir, caplog):
    default = EglrHFLM(pretrained=llama_dir, device="cpu", dtype="float32", batch_size=2, L=0)
    info = default.get_model_info()["eglr"]
    assert (info["engine"], info["engine_requested"]) == ("continuous", "auto")

    # a request with an option the continuous engine does not apply goes through generate, the others not
    lm = tiny_lm(engine="auto", batch_size=2, L=0)
    hf = tiny_lm(engine="hook", batch_size=2, L=0)
    beams = {**GREEDY, "num_beams": 2}
    caplog.clear()
    with caplog.at_level("INFO", logger="eglr_harness"):
        mixed = lm.generate_until(requests_for(CONTEXTS[:2], beams, task="a") +
                                  requests_for(CONTEXTS[2:4], GREEDY, task="b"))
    expected = hf.generate_until(requests_for(CONTEXTS[:2], beams, task="a") +
                                 requests_for(CONTEXTS[2:4], GREEDY, task="b"))
    assert [str(x) for x in mixed] == [str(x) for x in expected]
    assert all(x.signals for x in mixed)  # both engines record signals
    said = [r.getMessage() for r in caplog.records if "decode with engine=hook" in r.getMessage()]
    assert len(said) == 1 and "num_beams=2" in said[0]
    # which engine decoded is said per rollout, cell and task (issue 35), and in the plan line
    assert [x.engine for x in mixed] == ["hook", "hook", "continuous", "continuous"]
    info = lm.get_model_info()["eglr"]
    assert info["engine"] == "mixed"
    assert info["engines"] == {"a": {"L=0,T=0.0": "hook"}, "b": {"L=0,T=0.0": "continuous"}}
    plans = {r.getMessage().split("task ")[1].split(":")[0]: r.getMessage() for r in caplog.records
             if "eglr-hf plan" in r.getMessage()}
    assert "engine hook;" in plans["a"] and "engine continuous;" in plans["b"]


@pytest.mark.parametrize("engine", ["auto", "hook"])
def test_results_say_hook_when_every_request_went_through_generate(tiny_lm, engine, caplog):
    """Issue 35: typical_p under engine=auto decodes every rollout with generate; the results said continuous."""
    lm = tiny_lm(engine=engine, batch_size=2, L=2, tau_h=0.0)
    with caplog.at_level("INFO", logger="eglr_harness"):
        got = lm.generate_until(requests_for(CONTEXTS[:2], {**GREEDY, "typical_p": 0.9}))
    info = lm.get_model_info()["eglr"]
    assert (info["engine"], info["engines"], info["engine_requested"]) == (
        "hook", {"unit_task": {"L=2,T=0.0": "hook"}}, engine)
    assert [x.engine for x in got] == ["hook", "hook"] and all(rollout_meta(x)["engine"] == "hook" for x in got)
    assert any("eglr-hf plan" in r.getMessage() and "engine hook;" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("options, message", [
    ({"repetition_penalty": 0},
     r"`repetition_penalty`=0 \(generation_kwargs of task unit_task\) is not allowed; allowed: a float > 0"),
    ({"repetition_penalty": -1}, r"`repetition_penalty`=-1 "),
    ({"no_repeat_ngram_size": -2}, r"`no_repeat_ngram_size`=-2 .*allowed: an int >= 0"),
    ({"min_p": 1.5}, r"`min_p`=1\.5 .*allowed: a float in \[0, 1\]"),
    ({"max_gen_toks": 0}, r"`max_gen_toks`=0 .*allowed: an int >= 1"),
    ({"top_k": -3}, r"`top_k`=-3 .*allowed: an int in \[0, 2\*\*53\]"),  # at T=0 too, where it is not used
    ({"typical_p": 1.5}, r"`typical_p`=1\.5 "),
])
@pytest.mark.parametrize("engine", ["auto", "continuous", "hook"])
def test_an_invalid_generation_option_is_an_error_before_anything_decodes(tiny_lm, monkeypatch, engine, options,
                                                                          message):
    """Issue 35: never a fallback to engine=hook (where transformers raised, or ignored the value)."""
    from eglr_harness.core.errors import GenerationOptionError
    from eglr_harness.decoding.continuous.engine import ContinuousEngine
    from eglr_harness.decoding.hook.engine import HookEngine

    lm = tiny_lm(engine=engine, batch_size=2, L=2, tau_h=0.0)
    for cls in (ContinuousEngine, HookEngine):
        monkeypatch.setattr(cls, "run", lambda *a, **k: pytest.fail("decoding started"))
    with pytest.raises(GenerationOptionError, match=message):
        lm.generate_until(requests_for(CONTEXTS[:1], {**GREEDY, **options}))


@pytest.mark.parametrize("options, named", [({"typical_p": 0.9}, "typical_p=0.9"), ({"num_beams": 2}, "num_beams=2")])
def test_engine_continuous_refuses_an_option_it_does_not_apply_before_decoding(tiny_lm, monkeypatch, options, named):
    from eglr_harness.core.errors import GenerationOptionError
    from eglr_harness.decoding.continuous.engine import ContinuousEngine

    lm = tiny_lm(engine="continuous", batch_size=2, L=0)
    monkeypatch.setattr(ContinuousEngine, "run", lambda *a, **k: pytest.fail("decoding started"))
    with pytest.raises(GenerationOptionError, match=rf"engine=continuous does not apply .*{named}.*engine=hook"):
        lm.generate_until(requests_for(CONTEXTS[:1], {**GREEDY, **options}))


def _with_generation_config(tiny_model_dir, folder, **settings):
    """The tiny llama with ``settings`` written into its generation_config.json (as a hub model ships it)."""
    import json
    import shutil

    shutil.copytree(tiny_model_dir("llama"), folder)
    path = folder / "generation_config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, **settings}))
    return str(folder)


@pytest.mark.parametrize("engine", ["auto", "continuous", "hook"])
def test_an_invalid_value_in_the_models_generation_config_is_refused_right_after_the_load(tiny_lm, tiny_model_dir,
                                                                                          tmp_path, engine):
    from eglr_harness.core.errors import GenerationOptionError

    folder = _with_generation_config(tiny_model_dir, tmp_path / "bad", repetition_penalty=0.0)
    with pytest.raises(GenerationOptionError, match=r"`repetition_penalty`=0\.0 \(the model's generation_config\)"):
        tiny_lm(pretrained=folder, engine=engine, batch_size=2, L=0)


def test_an_option_of_the_models_generation_config_the_continuous_engine_does_not_apply(tiny_lm, tiny_model_dir,
                                                                                        tmp_path):
    from eglr_harness.core.errors import GenerationOptionError

    folder = _with_generation_config(tiny_model_dir, tmp_path / "typical", typical_p=0.9, do_sample=True)
    refused = r"engine=continuous does not apply .*typical_p=0\.9 \(the model's generation_config\)"
    with pytest.raises(GenerationOptionError, match=refused):
        tiny_lm(pretrained=folder, engine="continuous", batch_size=2, L=0)
    auto = tiny_lm(pretrained=folder, engine="auto", batch_size=2, L=0, T=0.7)
    got = auto.generate_until(requests_for(CONTEXTS[:2], GREEDY))
    assert [x.engine for x in got] == ["hook", "hook"] and auto.get_model_info()["eglr"]["engine"] == "hook"


def test_a_compiled_run_records_what_compiling_cost_in_its_results(tiny_lm):
    """compile=default (inductor) on a CPU: the results carry the engine's compile report, late compilations
    included, and the texts are the eager engine's."""
    import torch

    torch._dynamo.reset()
    eager = tiny_lm(engine="continuous", batch_size=2, L=2, tau_h=0.0).generate_until(requests_for(CONTEXTS, GREEDY))
    lm = tiny_lm(engine="continuous", batch_size=2, L=2, tau_h=0.0, compile="default")
    got = lm.generate_until(requests_for(CONTEXTS, GREEDY))
    info = lm.get_model_info()["eglr"]
    report = info["compile_report"]
    assert info["compile"] == "default" and report["compiles"] >= 1 and report["steps"] > 0
    assert report["late_compiles"] == report["eager_steps"] == 0
    assert [str(g) for g in got] == [str(e) for e in eager]
    assert tiny_lm(engine="hook", batch_size=2, L=0).get_model_info()["eglr"]["compile_report"] is None
    torch._dynamo.reset()


def test_the_compile_arg_is_resolved_recorded_and_refused_where_it_cannot_apply(tiny_lm):
    lm = tiny_lm(engine="auto", batch_size=2, L=0)  # compile=auto: eager on a CPU
    info = lm.get_model_info()["eglr"]
    assert (info["compile"], info["compile_requested"]) == ("none", "auto") and not lm.engines[0].compile
    with pytest.raises(ValueError, match=r"`compile`='reduce-overhead' captures CUDA graphs and needs a CUDA device"):
        tiny_lm(engine="continuous", batch_size=2, compile="reduce-overhead")
    with pytest.raises(ValueError, match=r"`compile`='default' applies to engine=continuous only"):
        tiny_lm(engine="hook", batch_size=2, compile="default")
    with pytest.raises(ValueError, match=r"`compile`=true is not allowed.*compile=reduce-overhead"):
        tiny_lm(engine="auto", batch_size=2, compile=True)


def test_a_run_interrupted_and_resumed_reports_an_uninterrupted_runs_figures(tiny_lm, tmp_path, monkeypatch):
    """Issue 35: killed mid-run (here after its 6th stored rollout), then rerun into the same store: the
    texts, signals, engines and every compute figure but the batch-dependent ones equal an uninterrupted run's."""
    from eglr_harness.run.stores import RolloutStore

    settings = dict(batch_size=2, tau_h=0.0, tau_kl=0.0)
    requests = requests_for(CONTEXTS, {**GREEDY, "eglr_L": "0-3", "eglr_T": 0}, repeats=4)
    whole = tiny_lm(engine="auto", rollout_cache=str(tmp_path / "whole"), **settings)
    expected = whole.generate_until(requests)

    original, stored = RolloutStore.put, []

    def killed_after_six(self, key, record):
        original(self, key, record)
        stored.append(key)
        if len(stored) == 6:
            raise KeyboardInterrupt

    monkeypatch.setattr(RolloutStore, "put", killed_after_six)
    with pytest.raises(KeyboardInterrupt):
        tiny_lm(engine="auto", rollout_cache=str(tmp_path / "resumed"), **settings).generate_until(requests)
    monkeypatch.setattr(RolloutStore, "put", original)
    resumed = tiny_lm(engine="auto", rollout_cache=str(tmp_path / "resumed"), **settings)
    got = resumed.generate_until(requests)
    assert [str(x) for x in got] == [str(x) for x in expected]
    assert [x.engine for x in got] == [x.engine for x in expected]
    for x, y in zip(got, expected):  # other batch compositions: float noise in the signals only
        assert x.signals.keys() == y.signals.keys()
        assert all(v == (None if y.signals[k] is None else pytest.approx(y.signals[k], rel=1e-4, abs=1e-6))
                   for k, v in x.signals.items())
    ours, theirs = (lm.get_model_info()["eglr"] for lm in (resumed, whole))
    assert ours["stats"]["reused_rollouts"] == theirs["stats"]["reused_rollouts"] == {"total": 0, "cells": {}}
    assert batch_independent(ours["stats"]) == batch_independent(theirs["stats"])
    assert theirs["stats"]["total"]["gated_tokens"] > 0
    assert (ours["engine"], ours["engines"]) == (theirs["engine"], theirs["engines"])


@pytest.mark.parametrize("engine, stop", [("continuous", "latent"), ("hook", "latent"), ("continuous", "accel")])
def test_a_run_served_whole_from_the_store_reports_a_fresh_runs_figures_under_every_exit_rule(tiny_lm, tmp_path,
                                                                                               engine, stop):
    """Issue 56, item 1: a run whose every rollout comes from the store (rerun into the store a fresh run filled)
    counts each rollout as decoded, with its full record: tokens, gates, k*, layer evaluations and the exit
    rule's LM-head projections (one per gated token for latent and accel, not k*), so config.eglr.stats equals the
    fresh run's but for the batch-dependent figures."""
    settings = dict(engine=engine, batch_size=2, tau_h=0.0, k_max=4, stop=stop, rollout_cache=str(tmp_path))
    requests = requests_for(CONTEXTS[:3], {**GREEDY, "eglr_L": "1-3", "eglr_T": 0}, repeats=3)
    fresh = tiny_lm(**settings)
    expected = fresh.generate_until(requests)
    resumed = tiny_lm(**settings)
    got = resumed.generate_until(requests)
    assert [str(x) for x in got] == [str(x) for x in expected]
    ours, theirs = (lm.get_model_info()["eglr"]["stats"] for lm in (resumed, fresh))
    assert ours["reused_rollouts"] == {"total": 0, "cells": {}}  # every rollout restored with its record
    assert batch_independent(ours) == batch_independent(theirs)
    # the batch figures too: each stored record's shares of its engine run add up to that run's (rounded counts)
    assert ({part: (f["steps"], f["p_step_gated"]) for part, f in [("total", ours["total"]), *ours["cells"].items()]}
            == {part: (f["steps"], f["p_step_gated"])
                for part, f in [("total", theirs["total"]), *theirs["cells"].items()]})
    total = theirs["total"]
    assert 0 < total["head_projections"] == total["gated_tokens"] < sum(
        int(k) * n for k, n in total["iteration_hist"].items())
