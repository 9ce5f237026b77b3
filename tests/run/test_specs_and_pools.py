"""L/T spec parsing, config validation and the pool rule, as tables of literal inputs."""

from __future__ import annotations

import math
import re

import pytest

from eglr_harness.core.config import EglrConfig, parse_tau_h
from eglr_harness.core.specs import parse_L_spec, parse_T_spec
from eglr_harness.run.pool import resolve_pool, task_axes

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)


@pytest.mark.parametrize("spec, expected", [
    (4, (4,)), ("4", (4,)), ("1,4,7", (1, 4, 7)), ("1|4|7", (1, 4, 7)), ("1;4", (1, 4)),
    ("1-4", (1, 2, 3, 4)), ("0-2,5", (0, 1, 2, 5)), ([1, "3-4"], (1, 3, 4)), ("2,2,1", (2, 1)), (3.0, (3,)),
])
def test_L_specs(spec, expected):
    assert parse_L_spec(spec) == expected


@pytest.mark.parametrize("spec, expected", [
    (0, (0.0,)), ("0.7", (0.7,)), ("0.1,0.5", (0.1, 0.5)), ("0.1-0.3:0.1", (0.1, 0.2, 0.3)),
    ("0.0-1.0:0.1", tuple(round(0.1 * i, 6) for i in range(11))), ("0.5|0.5", (0.5,)),
])
def test_T_specs(spec, expected):
    assert parse_T_spec(spec) == expected


@pytest.mark.parametrize("parser, spec, message", [
    (parse_L_spec, "a", r"`L`='a': 'a' is not a layer span"),
    (parse_L_spec, "5-2", r"runs backwards"),
    (parse_L_spec, -1, r"layer span -1 is negative"),
    (parse_L_spec, True, r"not a layer span"),
    (parse_L_spec, "", r"`L`='' is not a layer span"),
    (parse_L_spec, "\uff12", r"'\uff12' is not a layer span"),  # a full-width 2: int() reads it as 2
    (parse_T_spec, "hot", r"'hot' is not a temperature"),
    (parse_T_spec, -0.1, r"temperature -0.1 is not allowed"),
    (parse_T_spec, "1.0-0.1:0.1", r"needs start <= stop"),
    (parse_T_spec, "0.1-1.0:0", r"positive step"),
    (parse_T_spec, "inf", r"temperature inf is not allowed"),
    # issue 47: (1e308 - 0) / 1e-10 is inf, and int(inf) an OverflowError traceback
    (parse_T_spec, "0-1e308:0.0000000001", r"range '0-1e308:0.0000000001' names more than 10000 values"),
    (parse_T_spec, "0-1e308:1", r"names \d+ values; allowed: at most 10000"),
])
def test_malformed_specs_name_the_value(parser, spec, message):
    with pytest.raises(ValueError, match=message):
        parser(spec)


@pytest.mark.parametrize("parser, spec", [(parse_L_spec, "a"), (parse_L_spec, ""), (parse_L_spec, None),
                                          (parse_T_spec, "hot"), (parse_T_spec, ""), (parse_T_spec, True)])
def test_a_refusal_suggests_a_list_that_model_args_does_not_split(parser, spec):
    """`--model_args` splits at commas: `L=1,4,7` reaches the model as `L=1` and two unknown args."""
    with pytest.raises(ValueError) as refused:
        parser(spec)
    assert "|" in str(refused.value) and not re.search(r"\d,\d", str(refused.value)), refused.value


@pytest.mark.parametrize("kwargs, message", [
    ({"alpha": -0.1}, r"`alpha`=-0.1 .*\[0, 1\]"), ({"k_max": 0}, r"`k_max`=0"), ({"k_max": 2.5}, r"`k_max`=2.5"),
    ({"tau_kl": -1.0}, r"`tau_kl`=-1.0"), ({"tau_h": float("nan")}, r"`tau_h`=nan"), ({"T": -1}, r"`T`=-1"),
    ({"top_p": 0.0}, r"`top_p`=0.0 .*\(0, 1\]"), ({"top_k": -5}, r"`top_k`=-5"), ({"L": -2}, r"`L`=-2"),
])
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EglrConfig(**kwargs)


def test_tau_h_forms():
    assert parse_tau_h("auto") == "auto" and parse_tau_h("inf") == math.inf and parse_tau_h("1.5") == 1.5
    with pytest.raises(ValueError, match=r"`tau_h`='warm'"):
        parse_tau_h("warm")
    assert not EglrConfig(L=4, tau_h=math.inf).refines and EglrConfig(L=4, tau_h=1.0).refines


SC = task_axes({"eglr_L": "1-10", "eglr_T": 0, "eglr_budget_T": "0.1-1.0:0.1"})
LXT = task_axes({"eglr_L": "0-10", "eglr_T": "0.0-1.0:0.1"})
SINGLE = task_axes({"do_sample": False})
TENTHS = [round(0.1 * i, 6) for i in range(1, 11)]


@pytest.mark.parametrize("user_L, user_T, task, repeats, expected", [
    (None, None, SC, 10, [(L, 0.0) for L in range(1, 11)]),             # EGLR-SC_L
    ((4,), None, SC, 10, [(4, T) for T in TENTHS]),                      # L pinned: budget moves to T
    (None, (0.7,), SC, 10, [(L, 0.7) for L in range(1, 11)]),            # T pinned > 0: budget stays on L
    (None, (0.0,), SC, 10, [(L, 0.0) for L in range(1, 11)]),
    ((4,), (0.5,), SC, 10, [(4, 0.5)]),                                  # both pinned: product
    ((1, 4, 7), None, SC, 10, [(1, 0.0), (4, 0.0), (7, 0.0)]),
    (None, None, LXT, 121, [(L, round(0.1 * t, 6)) for L in range(11) for t in range(11)]),
    ((4,), None, LXT, 121, [(4, round(0.1 * t, 6)) for t in range(11)]),  # no budget axis named: T stays
    (None, None, SINGLE, 1, [(6, 0.0)]),                                 # default L (preset)
    ((2,), None, SINGLE, 1, [(2, 0.0)]),
])
def test_pool_rule(user_L, user_T, task, repeats, expected):
    plan = resolve_pool(user_L=user_L, user_T=user_T, task=task, default_L=6, default_T=0.0, repeats=repeats)
    assert list(plan.cells) == expected


def test_repeat_mapping_cycles_and_pools_larger_than_budget():
    plan = resolve_pool(user_L=(1, 2, 3), user_T=None, task=SC, default_L=4, default_T=0.0, repeats=10)
    assert [plan.cell_for_repeat(i) for i in (0, 1, 2, 3, 9)] == [
        ((1, 0.0), 0), ((2, 0.0), 0), ((3, 0.0), 0), ((1, 0.0), 1), ((1, 0.0), 3)]
    with pytest.raises(ValueError, match=r"has 20 configs but task 'gsm8k_eglr_sc' repeats each problem only 10"):
        resolve_pool(user_L=None, user_T=(0.1, 0.5), task=SC, default_L=4, default_T=0.0, repeats=10,
                     task_name="gsm8k_eglr_sc")
    with pytest.raises(ValueError, match=r"_eglr_sc"):
        resolve_pool(user_L=(1, 2), user_T=None, task=SINGLE, default_L=4, default_T=0.0, repeats=1)


def test_task_temperature_is_the_T_axis_when_no_pool_is_named():
    axes = task_axes({"do_sample": True, "temperature": 0.6})
    plan = resolve_pool(user_L=None, user_T=None, task=axes, default_L=3, default_T=0.0, repeats=1)
    assert plan.cells == ((3, 0.6),)


@pytest.mark.parametrize("task, benchmark", [
    ("math500_eglr_sc", "math500"), ("gsm8k_eglr", "gsm8k"), ("aime25_eglr_lxt", "aime25"),
    ("eglr_demo", "eglr_demo"), ("eglr_demo_lxt", "eglr_demo"), ("eglr_demo_sc", "eglr_demo"), (None, None),
])
def test_tasks_share_their_benchmark_tau_h(task, benchmark):
    from eglr_harness.run.presets import benchmark_of

    assert benchmark_of(task) == benchmark
