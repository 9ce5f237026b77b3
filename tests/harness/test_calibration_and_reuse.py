"""eglr-hf's tau_h calibration against an independent computation, and the reuse of rollouts:
deterministic cells decoded once per prompt, a rollout store that never serves other settings.

Everything is read through public behaviour: ``generate_until`` with Instances, the results'
``config.eglr`` (``get_model_info``), the rows handed to ``model.generate``.
"""

from __future__ import annotations

import pytest
import torch
from helpers.tiny_models import build_tiny_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from helpers.inputs import CONTEXTS, requests_for

from eglr_harness.harness.model import EglrHFLM

# A stop string a random model will not write: the independent run below needs no stop handling.
GREEDY = {"until": ["@@@@@@"], "max_gen_toks": 8, "do_sample": False}
TINY = dict(device="cpu", dtype="float32")
# the tests that count generate's rows run the hf engine (the reuse logic is the same for both engines)
TINY_HF = {**TINY, "engine": "hook"}


@pytest.fixture(scope="module")
def model_dirs(tiny_model_dir, smollm2_tokenizer_dir, tmp_path_factory):
    """Tiny models with SmolLM2's tokenizer: near-uniform ones and a confident ("sharp") Llama."""
    tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    sharp = tmp_path_factory.mktemp("tiny_sharp_llama")
    build_tiny_model("llama", vocab_size=len(tokenizer), sharpen=120.0, pad_token_id=tokenizer.pad_token_id,
                     bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id).save_pretrained(sharp)
    tokenizer.save_pretrained(sharp)
    return {"llama": str(tiny_model_dir("llama")), "qwen2": str(tiny_model_dir("qwen2")), "sharp": str(sharp)}


def _greedy_entropies(folder: str, contexts: list[str], max_new_tokens: int) -> torch.Tensor:
    """Per-token entropies (nats) of a plain transformers greedy run, one prompt at a time."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    values = []
    for context in contexts:
        ids = tokenizer(context, return_tensors="pt", add_special_tokens=False).input_ids
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id)
        for logits in out.logits:  # (1, V) raw logits per step
            logp = torch.log_softmax(logits[0].double(), -1)
            values.append(float(-(logp.exp() * logp).sum()))
    return torch.tensor(values)


@pytest.mark.parametrize("which, capped", [("sharp", False), ("llama", True)])
def test_tau_h_auto_is_the_capped_95th_percentile_of_greedy_entropies(model_dirs, tmp_path, monkeypatch, which, capped):
    monkeypatch.setenv("EGLR_CACHE_DIR", str(tmp_path))
    calib_limit = 3  # the first three prompts of the task
    lm = EglrHFLM(pretrained=model_dirs[which], batch_size=2, L=2, tau_h="auto", calib_limit=calib_limit, **TINY)
    lm.generate_until(requests_for(CONTEXTS, GREEDY, task="calib_task"))
    tau = lm.get_model_info()["eglr"]["tau_h"]["calib_task"]

    entropies = _greedy_entropies(model_dirs[which], CONTEXTS[:calib_limit], GREEDY["max_gen_toks"])
    assert entropies.numel() == calib_limit * GREEDY["max_gen_toks"]
    quantile = float(torch.quantile(entropies, 0.95))
    assert (quantile > 2.5) == capped, (f"the 95th percentile {quantile:.3f} should {'' if capped else 'not '}exceed "
                                        "the cap")
    assert tau == pytest.approx(min(quantile, 2.5), abs=1e-4)
    # another prompt set would give another threshold: the calibration used exactly the first three
    if not capped:
        others = float(torch.quantile(_greedy_entropies(model_dirs[which], CONTEXTS[2:], GREEDY["max_gen_toks"]), 0.95))
        assert abs(others - quantile) > 1e-3


class _RowCounter:
    """Wraps a loaded model's ``generate`` and counts the prompt rows it decodes."""

    def __init__(self, lm, monkeypatch):
        self.rows = 0
        original = lm.model.generate

        def generate(*args, **kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            self.rows += ids.shape[0]
            return original(*args, **kwargs)

        monkeypatch.setattr(lm.model, "generate", generate)


def test_deterministic_cells_are_decoded_once_per_prompt(model_dirs, tmp_path, monkeypatch):
    # pool L = 0..2 at T = 0 over 6 repeats: three greedy cells, each decoded once per prompt; the
    # L=0 cell is the calibration run itself
    monkeypatch.setenv("EGLR_CACHE_DIR", str(tmp_path))
    lm = EglrHFLM(pretrained=model_dirs["llama"], batch_size=4, tau_h="auto", **TINY_HF)
    counter = _RowCounter(lm, monkeypatch)
    pool = {**GREEDY, "eglr_L": "0-2", "eglr_T": 0}
    out = lm.generate_until(requests_for(CONTEXTS[:3], pool, repeats=6))
    assert [o.L for o in out[:6]] == [0, 1, 2, 0, 1, 2]
    assert out[0] == out[3] and out[1] == out[4]
    assert counter.rows == 3 * 3  # 3 prompts x 3 cells (calibration = the L=0 cell)


def test_sampled_cells_are_decoded_once_per_cycle(model_dirs, monkeypatch):
    lm = EglrHFLM(pretrained=model_dirs["llama"], batch_size=4, tau_h=0.5, L=1, T=0.8, **TINY_HF)
    counter = _RowCounter(lm, monkeypatch)
    out = lm.generate_until(requests_for(CONTEXTS[:2], GREEDY, repeats=3))
    assert [o.cycle for o in out[:3]] == [0, 1, 2]
    assert counter.rows == 2 * 3
    assert len({str(o) for o in out[:3]}) == 3  # each cycle draws with its own seed


SAMPLED = {**GREEDY, "do_sample": True, "temperature": 0.8}


@pytest.mark.parametrize("changed, gen_kwargs, reused", [
    ({}, GREEDY, True),  # positive control: the same settings are served from the store
    ({"tau_h": 0.25}, GREEDY, False),
    ({"alpha": 0.5}, GREEDY, False),
    ({"seed": 7}, SAMPLED, False),
    ({"model": "qwen2"}, GREEDY, False),
], ids=["same", "tau_h", "alpha", "seed", "model"])
def test_rollout_store_never_serves_other_settings(model_dirs, tmp_path, monkeypatch, changed, gen_kwargs, reused):
    base = dict(L=2, tau_h=0.0, alpha=0.2, seed=1333)
    first = EglrHFLM(pretrained=model_dirs["llama"], batch_size=2, rollout_cache=str(tmp_path), **base, **TINY_HF)
    stored = first.generate_until(requests_for(CONTEXTS[:2], gen_kwargs))
    assert list(tmp_path.glob("rollouts_rank0.sqlite"))

    settings = {**base, **{k: v for k, v in changed.items() if k != "model"}}
    second = EglrHFLM(pretrained=model_dirs[changed.get("model", "llama")], batch_size=2,
                      rollout_cache=str(tmp_path), **settings, **TINY_HF)
    counter = _RowCounter(second, monkeypatch)
    again = second.generate_until(requests_for(CONTEXTS[:2], gen_kwargs))
    totals = [lm.get_model_info()["eglr"]["stats"]["total"]["tokens"] for lm in (first, second)]
    if reused:  # served from the store with its accounting: counted as the first run counted it
        assert counter.rows == 0 and again == stored and totals[1] == totals[0] > 0
    else:
        assert counter.rows == 2 and totals[1] > 0


@pytest.mark.parametrize("engine", ["hook", "continuous"])
def test_calibration_is_accounted_apart_from_the_pool(model_dirs, tmp_path, monkeypatch, caplog, capsys, engine):
    # pool L = 1..2 at T = 0 (no L=0 cell): calibration decodes 3 greedy prompts that are not in the pool
    monkeypatch.setenv("EGLR_CACHE_DIR", str(tmp_path))
    lm = EglrHFLM(pretrained=model_dirs["llama"], batch_size=2, tau_h="auto", calib_limit=3, engine=engine, **TINY)
    pool = {**GREEDY, "eglr_L": "1-2", "eglr_T": 0}
    with caplog.at_level("INFO", logger="eglr_harness"):
        lm.generate_until(requests_for(CONTEXTS[:4], pool, repeats=2, task="acct_task"))
    stats = lm.get_model_info()["eglr"]["stats"]
    assert set(stats["cells"]) == {"L=1,T=0.0", "L=2,T=0.0"}  # no L=0 cell from the calibration
    assert (stats["total"]["tokens"] == sum(c["tokens"] for c in stats["cells"].values())
            == 4 * 2 * GREEDY["max_gen_toks"])
    calibration = stats["calibration"]["acct_task"]
    assert calibration["prompts"] == 3 and calibration["cached"] is False
    assert calibration["entropy_tokens"] == calibration["compute"]["tokens"] == 3 * GREEDY["max_gen_toks"]
    assert calibration["tau_h"] == lm.get_model_info()["eglr"]["tau_h"]["acct_task"]
    messages = [r.getMessage() for r in caplog.records]
    assert any("too few to trust" in m and "24 token entropies of 3 prompts" in m for m in messages)
    plan = next(m for m in messages if m.startswith("eglr-hf plan, task acct_task"))
    assert "4 problems x 2 cells" in plan and "8 rollouts" in plan
    assert f"at most {GREEDY['max_gen_toks']} new tokens" in plan
    assert "greedy calibration on the first 3 prompts" in plan
    assert "eglr-hf tau_h calibration (3 greedy prompts)" in capsys.readouterr().err  # its own progress bar

    # the next run reads the cached value and says where it came from, without decoding it again
    again = EglrHFLM(pretrained=model_dirs["llama"], batch_size=2, tau_h="auto", calib_limit=3, engine=engine, **TINY)
    again.generate_until(requests_for(CONTEXTS[:4], pool, repeats=2, task="acct_task"))
    cached = again.get_model_info()["eglr"]["stats"]["calibration"]["acct_task"]
    assert cached["cached"] is True and cached["entropy_tokens"] == 24 and cached["compute"] is None
