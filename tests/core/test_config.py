"""Each rule of an EGLR config stated once (``core/config.py``, ``core/model_args.py``): the argument names,
the layer-count rule, "L = 0 means no gate", and the check of tau_h."""

from __future__ import annotations

import dataclasses
import math

import pytest

from eglr_harness.core.config import EglrConfig, check_layer_span, parse_tau_h
from eglr_harness.core.model_args import EGLR_ARGS, SETTINGS_ARGS, VLLM_ARGS
from eglr_harness.run.settings import RunSettings

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)


@pytest.mark.parametrize("name", SETTINGS_ARGS)
def test_every_settings_arg_is_read_by_the_settings(name):
    # a value no setting takes: refused naming the argument, so from_args reads every name of the tuple
    with pytest.raises(ValueError, match=f"`{name}`="):
        RunSettings.from_args({}, **{name: "abc"})


def test_the_settings_take_no_other_name():
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['engine'\\]"):
        RunSettings.from_args({}, engine="hook")


def test_the_config_fields_are_settings_args_and_vllm_takes_all_but_the_engine_choice():
    assert {f.name for f in dataclasses.fields(EglrConfig)} <= set(SETTINGS_ARGS)
    assert set(EGLR_ARGS) - set(VLLM_ARGS) == {"engine", "compile"} and set(SETTINGS_ARGS) < set(VLLM_ARGS)


@pytest.mark.parametrize("L, tau_h, gate, refines", [(0, 0.5, math.inf, False), (0, math.inf, math.inf, False),
                                                     (2, 0.5, 0.5, True), (2, math.inf, math.inf, False)])
def test_L_0_has_no_gate_whatever_tau_h_says(L, tau_h, gate, refines):
    config = EglrConfig(L=L, tau_h=tau_h)
    assert (config.gate_tau_h, config.refines) == (gate, refines)


def test_the_layer_rule_names_the_value_as_written():
    check_layer_span((0, 2, 4), 4)
    check_layer_span((99,), None)  # the layer count not known yet: nothing to check
    with pytest.raises(ValueError, match=r"^`L`='1-9': layer span 9 exceeds the model's 4 decoder layers; "
                                         r"allowed: 0\.\.4\.$"):
        check_layer_span(range(1, 10), 4, given="1-9")
    with pytest.raises(ValueError, match=r"^`L`=5 exceeds the model's 4 decoder layers; allowed: 0\.\.4\.$"):
        EglrConfig(L=5).validate_for_model(4)


@pytest.mark.parametrize("bad", [-1, math.nan, "abc", "-0.5", 1e300])  # 1e300: no reader reads it (issue 55)
def test_tau_h_is_checked_once_the_same_way_as_a_model_arg_and_in_a_config(bad):
    message = r"`tau_h`=.* is not allowed; allowed: a float in \[0, 2\*\*53\] nats, 'inf', or 'auto'\."
    with pytest.raises(ValueError, match=message):
        parse_tau_h(bad)
    if not isinstance(bad, str):
        with pytest.raises(ValueError, match=message):
            EglrConfig(tau_h=bad)
