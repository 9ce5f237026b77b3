"""The `compile` model argument: allowed values, what each resolves to per device and engine, refusals."""

from __future__ import annotations

import pytest
import torch

from eglr_harness.decoding.compile_setting import (

    COMPILE_SETTINGS, CompileChoice, check_compile_for_engine, check_compile_setting, compile_refusal,

    resolve_compile,

)


def test_the_allowed_values():
    assert COMPILE_SETTINGS == ("auto", "none", "reduce-overhead", "default")
    assert check_compile_setting(None) == "auto"  # not given
    assert check_compile_setting(" Reduce-Overhead ") == "reduce-overhead"


@pytest.mark.parametrize("setting, device, compile, mode, recorded", [
    ("auto", "cuda", True, "reduce-overhead", "reduce-overhead"),
    ("auto", "cuda:1", True, "reduce-overhead", "reduce-overhead"),
    ("auto", torch.device("cuda", 0), True, "reduce-overhead", "reduce-overhead"),
    ("auto", "cpu", False, None, "none"),
    ("auto", "mps", False, None, "none"),
    (None, "cpu", False, None, "none"),
    ("none", "cuda", False, None, "none"),
    ("none", "cpu", False, None, "none"),
    ("reduce-overhead", "cuda:0", True, "reduce-overhead", "reduce-overhead"),
    ("default", "cuda", True, "default", "default"),
    ("default", "cpu", True, "default", "default"),
])
def test_what_each_setting_runs_per_device(setting, device, compile, mode, recorded):
    plan = resolve_compile(setting, device)
    assert (plan.compile, plan.mode, plan.recorded) == (compile, mode, recorded)
    assert plan.requested == (setting or "auto")
    assert plan.engine_kwargs() == {"compile": compile, "compile_mode": mode}


@pytest.mark.parametrize("value", ["cuda-graphs", "", "eager", 1, True, False, 0.5, ["auto"]])
def test_bad_values_name_the_argument_the_value_and_the_allowed_ones(value):
    with pytest.raises(ValueError, match=r"`compile`=.*not allowed; allowed: auto, none, reduce-overhead, default"):
        check_compile_setting(value)
    with pytest.raises(ValueError, match=r"`compile`="):
        resolve_compile(value, "cuda")


def test_a_bool_from_lm_eval_says_which_value_to_write():
    with pytest.raises(ValueError, match="compile=reduce-overhead"):
        check_compile_setting(True)
    with pytest.raises(ValueError, match="compile=none"):
        check_compile_setting(False)


@pytest.mark.parametrize("device", ["cpu", "mps", torch.device("cpu")])
def test_cuda_graphs_off_cuda_are_refused(device):
    with pytest.raises(ValueError,
                       match=r"`compile`='reduce-overhead'.*needs a CUDA device.*'(cpu|mps)'.*auto.*none.*default"):
        resolve_compile("reduce-overhead", device)


def test_a_device_that_is_not_one_is_refused():
    with pytest.raises(ValueError, match=r"`device`='gpu'"):
        resolve_compile("auto", "gpu")


@pytest.mark.parametrize("setting", ["reduce-overhead", "default"])
def test_an_explicit_compile_is_refused_with_the_hook_engine(setting):
    message = compile_refusal(setting, "hook")
    assert message and f"`compile`={setting!r}" in message and "engine=continuous" in message
    assert "engine=hook" in message
    with pytest.raises(ValueError, match=r"applies to engine=continuous only"):
        check_compile_for_engine(setting, "hook")
    with pytest.raises(ValueError, match=r"applies to engine=continuous only"):
        resolve_compile(setting, "cuda", engine="hook")


@pytest.mark.parametrize("setting", ["auto", "none", None])
def test_auto_and_none_mean_eager_with_the_hook_engine(setting):
    assert compile_refusal(setting, "hook") is None
    check_compile_for_engine(setting, "hook")
    plan = resolve_compile(setting, "cuda", engine="hook")
    assert plan == CompileChoice(requested=setting or "auto", compile=False, mode=None)
    assert plan.recorded == "none"


@pytest.mark.parametrize("setting", COMPILE_SETTINGS)
def test_the_continuous_engine_takes_every_setting(setting):
    assert compile_refusal(setting, "continuous") is None


@pytest.mark.parametrize("setting", COMPILE_SETTINGS)
def test_engine_auto_before_it_chooses_resolves_as_the_continuous_engine(setting):
    """Nothing is refused before engine=auto has chosen; if it falls back to hf, the adapter resolves again."""
    assert compile_refusal(setting, "auto") is None
    assert resolve_compile(setting, "cuda", engine="auto") == resolve_compile(setting, "cuda")
    if setting in ("reduce-overhead", "default"):
        with pytest.raises(ValueError, match="applies to engine=continuous only"):
            resolve_compile(setting, "cuda", engine="hook")


def test_the_plan_is_what_the_engine_takes():
    """The kwargs build an engine (eager or compiled) without error: the names match ContinuousEngine's."""
    from helpers.tiny_models import build_tiny_model

    from eglr_harness.decoding.continuous.engine import ContinuousEngine

    model = build_tiny_model("llama", vocab_size=96, num_layers=2, seed=1)
    for setting in ("auto", "default"):
        engine = ContinuousEngine(model, max_batch=1, **resolve_compile(setting, "cpu").engine_kwargs())
        assert engine.compile is (setting == "default")
