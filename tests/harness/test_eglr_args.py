"""``EglrArgs`` (harness/eglr_args.py): one frozen argument object, checked before the weights load, that the
CLI's preflight and the model build alike, so that a mistake reads the same whichever meets it first."""

from __future__ import annotations

import dataclasses
import re

import pytest
from lm_eval.models.huggingface import HFLM

from eglr_harness.core.errors import ModelArgError, UserError
from eglr_harness.harness.eglr_args import EglrArgs
from eglr_harness.harness.model import EglrHFLM
from eglr_harness.harness.preflight import check_run_args

PRESET = "model_config=smollm2-135m-instruct"


@pytest.fixture
def weights_never_load(monkeypatch):
    def loaded(*args, **kwargs):
        raise AssertionError("HFLM.__init__ ran: the model would have been loaded")

    monkeypatch.setattr(HFLM, "__init__", loaded)


def test_built_from_the_preset_and_the_model_args_and_frozen():
    args = check_run_args(PRESET + ",L=1-3,engine=hook,max_length=512", gen_kwargs="max_gen_toks=16")
    assert args.load_args["max_length"] == 512 and "L" not in args.load_args and "engine" not in args.load_args
    assert args.load_args["gguf_file"].endswith(".gguf")  # the preset's model args under the given ones
    assert (args.engine, args.compile, args.declared_layers) == ("hook", "auto", 30)
    assert args.settings.user_L == (1, 2, 3) and args.gen_kwargs == {"max_gen_toks": 16}
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.engine = "continuous"


def test_engine_hf_is_still_taken_for_the_hook_engine_and_max_length_reaches_hflm_as_an_int():
    """Issue 56: ``engine=hf`` is the hook engine's earlier name (a warning, core/model_args.read_engine); a
    ``max_length`` written as a float is HFLM's int (it slices by it)."""
    args = check_run_args({"model_config": "smollm2-135m-instruct", "engine": "hf", "max_length": 512.0})
    assert args.engine == "hook" and args.load_args["max_length"] == 512
    assert isinstance(args.load_args["max_length"], int)


@pytest.mark.parametrize("extra, message", [
    (",l=4", r"unknown eglr-hf model arg `l`\. Did you mean `L`\?"),
    (",engine=fast", r"`engine`='fast' is not allowed; allowed: auto, continuous, hook"),
    (",compile=fast", r"`compile`='fast' is not allowed"),
    (",compile=default,engine=hook", r"`compile`='default' applies to engine=continuous only"),
    (",L=99", r"`L`=99 exceeds the model's 30 decoder layers; allowed: 0\.\.30"),
    (",alpha=abc", r"`alpha`='abc' is not allowed; allowed: a float in \[0, 1\]"),
    (",calib_limit=0", r"`calib_limit`=0 is not allowed; allowed: an int >= 1"),
])
def test_the_cli_and_the_model_refuse_alike_before_loading(weights_never_load, extra, message):
    """One check, two callers: lm-eval's CLI (preflight, before the tasks are indexed) and the constructor."""
    from lm_eval.utils import simple_parse_args_string

    with pytest.raises(ModelArgError, match=message) as from_cli:
        check_run_args(PRESET + extra)
    with pytest.raises(ModelArgError, match=message) as from_model:
        EglrHFLM(**simple_parse_args_string(PRESET + extra))
    assert str(from_cli.value) == str(from_model.value)


@pytest.mark.parametrize("name, message", [("engine", r"`engine`=None is not allowed"),
                                           ("calib_limit", r"`calib_limit`=None is not allowed")])
def test_a_setting_with_a_default_given_as_none_is_refused_not_defaulted(weights_never_load, name, message):
    with pytest.raises(ModelArgError, match=message):
        EglrHFLM(model_config="smollm2-135m-instruct", **{name: None})


def test_pretrained_is_required_before_the_tasks_are_indexed():
    with pytest.raises(ModelArgError, match=r"eglr-hf needs `pretrained` \(a hub id or folder\) or `model_config`"):
        check_run_args("L=1")


def test_task_options_follow_the_engine():
    args = check_run_args(PRESET + ",engine=continuous")
    with pytest.raises(UserError,
                       match=r"engine=continuous does not apply .*typical_p=0\.9 \(generation_kwargs of task t\)"):
        args.check_task_options("t", {"typical_p": 0.9, "eglr_L": "1"})
    dataclasses.replace(args, engine="hook").check_task_options("t", {"typical_p": 0.9, "eglr_L": "1"})
    with pytest.raises(UserError, match=r"`typical_p`=2\.0 \(generation_kwargs of task t\) is not allowed"):
        dataclasses.replace(args, engine="vllm").check_task_options("t", {"typical_p": 2.0})


@pytest.mark.parametrize("load_args, message", [
    ({"gguf_file": "m.gguf"}, r"`gguf_file` is not allowed with eglr-vllm; allowed: a folder of fp32/bf16 safetensors"),
    ({"data_parallel_size": 2}, r"`data_parallel_size`=2 is not allowed with eglr-vllm; allowed: 1"),
    ({}, r"eglr-vllm needs `pretrained`"),
])
def test_eglr_vllm_refusals(load_args, message):
    own = {"pretrained": "some/model"} if load_args else {}
    with pytest.raises(ModelArgError, match=message):
        EglrArgs.for_vllm({**own, **load_args})


def test_eglr_vllm_takes_the_layers_from_the_config(tiny_model_dir):
    folder = str(tiny_model_dir("llama", 4))
    args = EglrArgs.for_vllm({"pretrained": folder, "L": 2, "dtype": "float32"})
    assert (args.engine, args.compile, args.declared_layers, args.load_args["dtype"]) == ("vllm", "none", 4, "float32")
    with pytest.raises(ModelArgError, match=r"`L`=5 exceeds the model's 4 decoder layers"):
        EglrArgs.for_vllm({"pretrained": folder, "L": 5})


def test_eglr_vllm_takes_every_exit_rule(tiny_model_dir):
    """Issue 58, item 4: eglr-vllm passes ``stop`` and its threshold to its cells as eglr-hf does (it refused every
    rule but kl), and checks the threshold by eglr-hf's rule."""
    folder = str(tiny_model_dir("llama", 4))
    args = EglrArgs.for_vllm({"pretrained": folder, "L": 2, "stop": "accel", "tau_accel": 0.07})
    assert (args.settings.base.stop, args.settings.base.stop_threshold) == ("accel", 0.07)
    with pytest.raises(ModelArgError, match=r"`tau_margin`=1\.5 is not allowed; allowed: a float in \[0, 1\]"):
        EglrArgs.for_vllm({"pretrained": folder, "stop": "margin", "tau_margin": 1.5})


@pytest.mark.parametrize("args, message", [
    ({"dtype": "float7"}, "`dtype`='float7' is not allowed; allowed: auto, float32"),
    ({"torch_dtype": 3}, "`torch_dtype`=3 is not allowed"),
    ({"max_length": -5.0}, "`max_length`=-5.0 is not allowed; allowed: an int >= 2"),
    ({"max_length": "abc"}, "`max_length`='abc' is not allowed"),
    ({"batch_size": "-3"}, "`batch_size`='-3' is not allowed; allowed: an int >= 1 or auto, auto:N"),
    ({"max_batch_size": 0}, "`max_batch_size`=0 is not allowed"),
])
def test_loading_values_are_checked_before_the_load(args, message):
    """Issue 47: dtype=float7 failed after 180 s; max_length=-5 said "allowed: 1..-6", max_length=abc passed."""
    from eglr_harness.core.errors import ModelArgError
    from eglr_harness.core.model_args import check_model_args

    with pytest.raises(ModelArgError, match=re.escape(message)):
        check_model_args({"pretrained": "x", **args}, ["pretrained", "dtype", "max_length", "batch_size",
                                                       "max_batch_size"])
    check_model_args({"pretrained": "x", "dtype": "bfloat16", "max_length": 2048, "batch_size": "auto:4"},
                     ["pretrained", "dtype", "max_length", "batch_size"])  # the allowed side


@pytest.mark.parametrize("preset, cuda, expected", [(True, False, "cpu"), (False, False, "cpu"),
                                                     (True, True, "cuda:0")])
def test_lm_evals_default_device_becomes_the_real_one_without_cuda(monkeypatch, tiny_model_dir, preset, cuda,
                                                                   expected):
    """The load line said `device cuda:0` on a CPU-only machine (the preset says cpu): lm-eval's CLI hands its
    default --device to every model, as the model is built here."""
    import torch
    from lm_eval.config.evaluate_config import EvaluatorConfig

    from eglr_harness.harness.eglr_args import LM_EVAL_DEFAULT_DEVICE, intended_device

    assert EvaluatorConfig().device == LM_EVAL_DEFAULT_DEVICE  # the value lm-eval hands when --device is not given
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    model_args = {"model_config": "smollm2-135m-instruct"} if preset else {"pretrained": str(tiny_model_dir("llama"))}
    args = EglrArgs.for_hf({**model_args, "device": LM_EVAL_DEFAULT_DEVICE})
    assert args.load_args["device"] == expected == intended_device(args.load_args)
    given = EglrArgs.for_hf({**model_args, "device": "cuda:1"})  # any other device: left as given
    assert given.load_args["device"] == "cuda:1"
