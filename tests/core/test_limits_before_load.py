"""One limits table for every entry point (issue 71, item 5): a preset's tau_h and a ``--gen_kwargs`` sampling
option beyond 2**53 are refused before the model loads, in one line, by the limits eglr-hf's own model args
have (``core/config.SETTING_RULES``, ``HUGE``), not after the load with a traceback."""

from __future__ import annotations

import pytest

from eglr_harness.core.config import HUGE, SETTING_RULES
from eglr_harness.core.errors import GenerationOptionError
from eglr_harness.core.generation_options import RULES, check_generation_options
from eglr_harness.run.presets import load_preset

PRESET = """\
name: bad
model_args:
  pretrained: x
tau_h:
  default: {value}
"""


def _preset(tmp_path, value) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text(PRESET.format(value=value))
    return str(path)


@pytest.mark.unit
@pytest.mark.parametrize("value, shown", [
    ("1.0e+20", "1e+20"),  # was accepted: refused after the load, ~60 lines of traceback
    ("9007199254740993", "9007199254740993"),
    ("true", "True"),  # was read as 1.0
    ("-1", "-1"),
    (".nan", "nan"),
    ("abc", "'abc'"),
])
def test_a_preset_tau_h_beyond_the_limits_is_refused_when_the_preset_is_read(tmp_path, value, shown):
    with pytest.raises(ValueError) as info:
        load_preset(_preset(tmp_path, value))
    message = str(info.value)
    assert f"`tau_h.default`={shown} is not allowed; allowed: a float in [0, 2**53] nats or .inf" in message, message
    assert "\n" not in message


@pytest.mark.unit
@pytest.mark.parametrize("value, expected", [("2.5", 2.5), ("0", 0.0), (".inf", float("inf")),
                                             ("9007199254740992", float(HUGE))])
def test_a_preset_tau_h_within_the_limits_is_read(tmp_path, value, expected):
    assert load_preset(_preset(tmp_path, value))["tau_h"]["default"] == expected


@pytest.mark.unit
@pytest.mark.parametrize("name, value", [("top_k", 2**53 + 1), ("top_k", 2**60), ("top_p", 1e-400 - 1),
                                         ("top_k", 5.5)])
def test_a_sampling_option_is_checked_by_the_settings_limits(name, value):
    with pytest.raises(GenerationOptionError, match=f"`{name}`=.* \\(--gen_kwargs\\) is not allowed; allowed: "
                       + SETTING_RULES[name].allowed.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]").replace("*", r"\*")):
        check_generation_options({name: value}, "--gen_kwargs")
    check_generation_options({name: 7 if name == "top_k" else 0.5}, "--gen_kwargs")
    check_generation_options({"top_k": float(2**53)}, "--gen_kwargs")  # a whole float, as lm-eval may parse it


@pytest.mark.unit
@pytest.mark.parametrize("name", [name for name in RULES if name not in ("until", "do_sample")])
def test_no_number_option_takes_a_value_beyond_2_53(name):
    one = [1] if name.endswith("suppress_tokens") else [[1]] if name == "bad_words_ids" else 1
    big = [2**60] if name.endswith("suppress_tokens") else [[2**60]] if name == "bad_words_ids" else 2**60
    if name == "num_return_sequences":
        big = 2**60
    with pytest.raises(GenerationOptionError, match="is not allowed"):
        check_generation_options({name: big}, "--gen_kwargs")
    if name not in ("top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff"):
        check_generation_options({name: one}, "--gen_kwargs")


@pytest.fixture
def no_loading(monkeypatch):
    """Fail the test if eglr-hf gets as far as lm-eval's HFLM (which loads the weights)."""
    import functools  # noqa: PLC0415

    from lm_eval.models.huggingface import HFLM  # noqa: PLC0415

    @functools.wraps(HFLM.__init__)  # its signature stays HFLM's: what eglr-hf reads the accepted args from
    def loaded(*args, **kwargs):
        raise AssertionError("HFLM.__init__ ran: the model would have been loaded")

    monkeypatch.setattr(HFLM, "__init__", loaded)


def test_gen_kwargs_top_k_beyond_2_53_is_refused_before_the_load(no_loading):
    from lm_eval import evaluator  # noqa: PLC0415

    with pytest.raises(GenerationOptionError, match=r"`top_k`=9007199254740993 \(--gen_kwargs\) is not allowed"):
        evaluator.simple_evaluate(model="eglr-hf", model_args="model_config=smollm2-135m-instruct",
                                  tasks=["eglr_demo"], gen_kwargs="top_k=9007199254740993")


def test_a_preset_tau_h_beyond_2_53_is_refused_before_the_load(no_loading, tmp_path):
    from lm_eval import evaluator  # noqa: PLC0415

    from eglr_harness.core.resources import model_configs_dir  # noqa: PLC0415

    text = (model_configs_dir() / "smollm2-135m-instruct.yaml").read_text(encoding="utf-8")
    path = tmp_path / "big.yaml"
    path.write_text(text.replace("tau_h:\n", "tau_h:\n  default: 1.0e+20\n", 1), encoding="utf-8")
    with pytest.raises(ValueError, match=r"`tau_h.default`=1e\+20 is not allowed"):
        evaluator.simple_evaluate(model="eglr-hf", model_args=f"model_config={path}", tasks=["eglr_demo"])
