"""A run's arguments resolved once (run/run_args.resolve_run_args): given > preset > default, each value read once by
its row of core/model_args.MODEL_ARGS; the preset's keys and eglr-sweep's axes are the table's rows; one key=value
parser."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from eglr_harness.core import config
from eglr_harness.core.model_args import EGLR_ARGS, MODEL_ARGS, PRESET_KEYS, VLLM_ARGS, parse_model_args
from eglr_harness.run import run_args
from eglr_harness.run.presets import load_preset
from eglr_harness.run.run_args import resolve_run_args

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)

PRESET = {"name": "p", "model_args": {"pretrained": "org/model", "dtype": "float32"},
          "eglr": {"alpha": 0.3, "k_max": 2, "L": 2, "T": 0.5, "top_k": 7}, "tau_h": {"default": 1.25}}


def test_given_over_preset_over_default_and_what_lm_evals_model_gets():
    run = resolve_run_args({"alpha": "0.5", "tau_h": "inf", "seeds": 3, "max_length": 512}, preset=PRESET)
    assert (run.config.alpha, run.config.k_max, run.config.tau_kl) == (0.5, 2, config.DEFAULT_TAU_KL)
    assert (run.config.top_k, run.config.seed, run.config.stop) == (7, config.DEFAULT_SEED, config.DEFAULT_STOP)
    assert (run.L, run.T, run.default_L, run.default_T) == (None, None, 2, 0.5)  # the axes: only as given
    assert run.tau_h == float("inf") and run.preset_tau_h == {"default": 1.25}
    assert (run.seeds, run.calib_limit, run.engine, run.compile, run.store) == (3, 64, "auto", "auto", None)
    assert run.load_args == {"pretrained": "org/model", "dtype": "float32", "max_length": 512}
    assert run.model_name == "org/model" and run.given == {"alpha": "0.5", "tau_h": "inf", "seeds": 3}
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.engine = "hook"


def test_each_value_is_read_once_by_its_row(monkeypatch):
    read = Counter()
    original = run_args.read_model_arg

    def counted(name, value):
        read[name] += 1
        return original(name, value)

    monkeypatch.setattr(run_args, "read_model_arg", counted)
    resolve_run_args({"L": "1|4", "T": 0, "alpha": 0.5, "engine": "hook", "pretrained": "org/m"}, preset=PRESET)
    assert set(read.values()) == {1}
    assert set(read) == set(EGLR_ARGS) - {"tau_h"}  # tau_h not given: the preset's table, looked up per task
    read.clear()
    resolve_run_args({"pretrained": "org/m"}, own_names=VLLM_ARGS)
    assert set(read.values()) == {1} and "engine" not in read and "compile" not in read


def test_a_none_given_is_not_given_but_where_the_row_refuses_it():
    assert resolve_run_args({"alpha": None, "L": None}, preset=PRESET).config.alpha == 0.3
    assert resolve_run_args({"compile": None}).compile == MODEL_ARGS["compile"].default
    for name in ("engine", "calib_limit"):
        assert not MODEL_ARGS[name].none_absent
        with pytest.raises(ValueError, match=f"`{name}`=None is not allowed"):
            resolve_run_args({name: None})


def test_the_preset_is_loaded_once_and_named_by_model_config(monkeypatch):
    loads = []
    monkeypatch.setattr(run_args, "load_preset", lambda name: loads.append(name) or load_preset(name))
    run = resolve_run_args({"model_config": "smollm2-135m-instruct", "L": 1})
    assert loads == ["smollm2-135m-instruct"] and run.preset["name"] and "model_config" not in run.load_args
    assert run.model_name and run.model_name.endswith(".gguf")  # the preset's GGUF names the model


def test_seed_and_seeds_together_are_read_as_one_run():
    with pytest.raises(ValueError, match=r"`seed`=9007199254740992 with `seeds`=2 is not allowed"):
        resolve_run_args({"seed": 2**53, "seeds": 2})


def test_a_presets_keys_are_the_rows_a_preset_may_set(tmp_path):
    assert set(PRESET_KEYS) == {"L", "T", "alpha", "k_max", "tau_kl", "top_k", "top_p", "seed", "stop",
                                *config.STOP_THRESHOLD_ARGS}
    good = tmp_path / "good.yaml"
    good.write_text("eglr:\n  stop: latent\n  tau_latent: 0.05\n")
    assert resolve_run_args({"model_config": str(good)}).config.stop_threshold == 0.05
    bad = tmp_path / "bad.yaml"
    bad.write_text("eglr:\n  seeds: 2\n")  # a count of repeats is the run's, not the model's
    with pytest.raises(ValueError, match=r"unknown eglr keys \['seeds'\]; allowed: "):
        resolve_run_args({"model_config": str(bad)})


def test_the_sweeps_axes_and_default_point_come_from_the_table_and_the_resolved_run():
    from eglr_harness.leaderboard.runs import eglr_settings
    from eglr_harness.leaderboard.sweep import AXES, axis_defaults

    assert all(MODEL_ARGS[axis].sweep for axis in AXES)
    assert AXES["k_max"] == ("int", config.DEFAULT_K_MAX) and AXES["stop"][0] == "name" and AXES["tau_h"][1] is None
    defaults = axis_defaults(eglr_settings("model_config=smollm2-135m-instruct,alpha=0.3,L=1|4"))
    assert defaults["alpha"] == 0.3 and defaults["L"] is None  # two L values: no one default
    assert defaults["k_max"] == load_preset("smollm2-135m-instruct")["eglr"].get("k_max", config.DEFAULT_K_MAX)


def test_one_key_value_parser():
    assert parse_model_args("pretrained=a/b, L=1|4,,x=y=z,flag") == {"pretrained": "a/b", "L": "1|4", "x": "y=z",
                                                                     "flag": ""}
    assert parse_model_args({"L": 4}) == {"L": 4} and parse_model_args(None) == parse_model_args(" ") == {}
    assert parse_model_args("k=4,t=true", read=str.upper) == {"k": "4", "t": "TRUE"}


def test_the_resolver_needs_neither_torch_nor_lm_eval():
    import subprocess
    import sys

    code = "import sys, eglr_harness.run.run_args; print(sorted({'torch', 'lm_eval'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"
