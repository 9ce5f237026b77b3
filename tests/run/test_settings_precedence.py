"""Where each eglr-hf setting comes from: model args > gen kwargs > preset > built-in default, and
the preset's tau_h looked up by task, then benchmark, then ``default``.

Read through public behaviour only: each RolloutText's cell, the results' ``config.eglr``
(``get_model_info``), and what the rollouts say (a sampled rollout with top_k = 1 is the greedy one).
"""

from __future__ import annotations

import pytest
import yaml
from lm_eval.api.instance import Instance

from eglr_harness.core import config as defaults
from eglr_harness.harness.model import EglrHFLM

CONTEXTS = ["The capital of France is", "def fibonacci(n):", "1, 1, 2, 3, 5, 8,"]
GREEDY = {"until": ["\n\n"], "max_gen_toks": 6, "do_sample": False}
SAMPLED = {**GREEDY, "do_sample": True, "temperature": 1.0}
TINY = dict(device="cpu", dtype="float32")


def _requests(gen_kwargs, task="unit_task", contexts=CONTEXTS):
    return [Instance("generate_until", doc={"i": i}, arguments=(c, dict(gen_kwargs)), idx=0, metadata=(task, i, 1))
            for i, c in enumerate(contexts)]


@pytest.fixture
def preset(llama_dir, tmp_path):
    """Factory: a preset YAML for the tiny Llama with the given ``eglr`` and ``tau_h`` sections."""
    def make(eglr: dict | None = None, tau_h: dict | None = None) -> str:
        path = tmp_path / "tiny.yaml"
        path.write_text(yaml.safe_dump({"name": "tiny", "model_args": {"pretrained": llama_dir, **TINY},
                                        "eglr": eglr or {}, "tau_h": tau_h or {"default": 0.5}}))
        return str(path)
    return make


@pytest.mark.parametrize("preset_L, task_L, arg_L, expected", [
    (None, None, None, defaults.DEFAULT_L),
    (3, None, None, 3),
    (3, "1", None, 1),
    (3, "1", 2, 2),
    (None, None, 2, 2),
])
def test_L_comes_from_model_args_then_task_then_preset_then_default(preset, preset_L, task_L, arg_L, expected):
    eglr = {"L": preset_L} if preset_L is not None else {}
    lm = EglrHFLM(model_config=preset(eglr), batch_size=3, **({"L": arg_L} if arg_L is not None else {}))
    gen_kwargs = {**GREEDY, **({"eglr_L": task_L} if task_L is not None else {})}
    assert {o.L for o in lm.generate_until(_requests(gen_kwargs))} == {expected}


def _sampled_is_greedy(lm, sampled_gen_kwargs) -> bool:
    """Whether the sampled rollouts equal the greedy ones of the same L (true when the warpers leave one token)."""
    sampled = [str(o) for o in lm.generate_until(_requests(sampled_gen_kwargs))]
    greedy = [str(o) for o in lm.generate_until(_requests(GREEDY))]
    return sampled == greedy


# (setting, value that leaves only the argmax, value that filters nothing)
FILTERS = [("top_k", 1, 0), ("top_p", 1e-6, 1.0)]


@pytest.mark.parametrize("name, narrow, wide", FILTERS, ids=[f[0] for f in FILTERS])
@pytest.mark.parametrize("source", ["default", "preset", "gen_kwargs", "model_args"])
def test_sampling_filters_come_from_model_args_then_gen_kwargs_then_preset(preset, name, narrow, wide, source):
    # each source sets the filter one way and every weaker source the other way; the strongest wins
    preset_value = {"default": None, "preset": narrow, "gen_kwargs": wide, "model_args": narrow}[source]
    gen_value = {"default": None, "preset": None, "gen_kwargs": narrow, "model_args": wide}[source]
    arg_value = narrow if source == "model_args" else None
    eglr = {"L": 2, **({name: preset_value} if preset_value is not None else {})}
    lm = EglrHFLM(model_config=preset(eglr), batch_size=3, **({name: arg_value} if arg_value is not None else {}))
    sampled = {**SAMPLED, **({name: gen_value} if gen_value is not None else {})}
    # the default (top_k 50, top_p 1.0) leaves many tokens of a near-uniform model
    assert _sampled_is_greedy(lm, sampled) == (source != "default")


@pytest.mark.parametrize("name, preset_value, arg_value", [
    ("alpha", 0.5, 0.7), ("k_max", 2, 1), ("tau_kl", 1e-3, 2e-3), ("seed", 11, 12), ("top_k", 5, 7), ("top_p", 0.9,
                                                                                                      0.8),
])
def test_scalar_settings_come_from_model_args_then_preset_then_default(preset, name, preset_value, arg_value):
    settings = lambda lm: lm.get_model_info()["eglr"]["settings"][name]
    default = getattr(defaults, f"DEFAULT_{name.upper()}")
    assert settings(EglrHFLM(model_config=preset())) == default
    assert settings(EglrHFLM(model_config=preset({name: preset_value}))) == preset_value
    assert settings(EglrHFLM(model_config=preset({name: preset_value}), **{name: arg_value})) == arg_value


def test_preset_alpha_reaches_the_decoding(preset):
    # the preset's alpha decodes as the same alpha given as a model arg, and unlike the default
    texts = lambda lm: [str(o) for o in lm.generate_until(_requests({**GREEDY, "eglr_L": "4"}))]
    from_preset = texts(EglrHFLM(model_config=preset({"alpha": 1.0}), tau_h=0.0))
    assert from_preset == texts(EglrHFLM(model_config=preset(), tau_h=0.0, alpha=1.0))
    assert from_preset != texts(EglrHFLM(model_config=preset(), tau_h=0.0))


TAU_TABLE = {"gsm8k_eglr_sc": 0.6, "gsm8k": 0.7, "default": 0.9}


@pytest.mark.parametrize("task, table, arg, expected", [
    ("gsm8k_eglr_sc", TAU_TABLE, None, 0.6),  # the task's own entry beats its benchmark's
    ("gsm8k_eglr", TAU_TABLE, None, 0.7),  # the benchmark's entry
    ("math500_eglr", TAU_TABLE, None, 0.9),  # the default entry
    ("gsm8k_eglr_sc", TAU_TABLE, 0.3, 0.3),  # a model arg beats the preset
    ("math500_eglr", {"gsm8k": 0.7}, None, "auto"),  # nothing applies: calibrated
])
def test_preset_tau_h_is_looked_up_by_task_then_benchmark_then_default(preset, tmp_path, monkeypatch, task, table,
                                                                        arg, expected):
    monkeypatch.setenv("EGLR_CACHE_DIR", str(tmp_path / "cache"))
    lm = EglrHFLM(model_config=preset({"L": 2}, table), batch_size=3, **({"tau_h": arg} if arg is not None else {}))
    lm.generate_until(_requests({**GREEDY, "max_gen_toks": 2}, task=task))
    got = lm.get_model_info()["eglr"]["tau_h"][task]
    if expected == "auto":
        assert (tmp_path / "cache" / "tau_h.sqlite").is_file() and 0 < got <= defaults.TAU_H_CAP
        assert got not in table.values()
    else:
        assert got == expected


@pytest.mark.parametrize("name", defaults.STOP_THRESHOLD_ARGS)
def test_an_exit_rules_threshold_comes_from_model_args_then_preset_then_default(name):
    """Issue 55 (a surviving mutant): the preset's threshold won over the model arg, and no test saw it."""
    from eglr_harness.run.settings import RunSettings

    rule = next(r for r in defaults.STOP_RULES.values() if r.threshold_arg == name)
    preset = {"eglr": {name: 0.25}}
    assert getattr(RunSettings.from_args({}).base, name) == rule.default
    assert getattr(RunSettings.from_args(preset).base, name) == 0.25
    assert getattr(RunSettings.from_args(preset, **{name: "0.125"}).base, name) == 0.125
