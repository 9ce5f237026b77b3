"""Mistakes on the command line are refused before any model is loaded, naming what is allowed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from lm_eval.models.huggingface import HFLM

from eglr_harness.core.model_args import EGLR_ARGS, check_model_args, close_task_names
from eglr_harness.harness.model import EglrHFLM


@pytest.fixture
def no_loading(monkeypatch):
    """Fail the test if eglr-hf gets as far as lm-eval's HFLM (which loads the weights)."""
    def loaded(*args, **kwargs):
        raise AssertionError("HFLM.__init__ ran: the model would have been loaded")

    monkeypatch.setattr(HFLM, "__init__", loaded)


def test_every_eglr_arg_stays_out_of_hflm(no_loading, monkeypatch):
    # the constructor takes eglr's own args apart by EGLR_ARGS: none of them reaches HFLM's load
    seen = {}
    monkeypatch.setattr(HFLM, "__init__", lambda self, **load_args: seen.update(load_args) or _stop())
    with pytest.raises(_Stopped):
        EglrHFLM(model_config="smollm2-135m-instruct", L=1, tau_h=0.5, calib_limit=3, engine="hook", compile="none",
                 stop="kl", seed=3, attn_implementation="sdpa")
    assert seen["attn_implementation"] == "sdpa" and not set(seen) & set(EGLR_ARGS)


class _Stopped(Exception):
    pass


def _stop():
    raise _Stopped


@pytest.mark.parametrize("typo, suggestion", [("l", "`L`"), ("t", "`T`"), ("kmax", "`k_max`"), ("tau_hh", "`tau_h`"),
                                              ("rollout_cach", "`rollout_cache`"), ("batchsize", "`batch_size`")])
def test_misspelt_model_arg_is_refused_before_loading(no_loading, typo, suggestion):
    with pytest.raises(ValueError) as info:
        EglrHFLM(model_config="smollm2-135m-instruct", **{typo: 4})
    message = str(info.value)
    assert f"unknown eglr-hf model arg `{typo}`" in message and f"Did you mean {suggestion}" in message
    assert all(name in message for name in EGLR_ARGS) and "Nothing was loaded" in message


def test_loading_options_and_hflm_args_pass(no_loading):
    # attn_implementation goes to from_pretrained, max_length to HFLM: both get as far as loading
    with pytest.raises(AssertionError, match="HFLM.__init__ ran"):
        EglrHFLM(model_config="smollm2-135m-instruct", attn_implementation="sdpa", max_length=512, L=2)


def test_unknown_arg_without_a_close_name_is_refused_too():
    with pytest.raises(ValueError, match=r"unknown eglr-hf model arg `zzz`\. eglr-hf's own args"):
        check_model_args({"zzz": 1}, ["pretrained"])


def test_use_cache_is_refused_before_the_model_loads(no_loading, tmp_path):
    from lm_eval import evaluator

    with pytest.raises(ValueError, match="rollout_cache=DIR"):
        evaluator.simple_evaluate(model="eglr-hf", model_args="model_config=smollm2-135m-instruct",
                                  tasks=["eglr_demo"], use_cache=str(tmp_path / "lm_cache"))
    assert list(tmp_path.iterdir()) == []  # lm-eval created no cache file


def test_eglr_vllm_refuses_use_cache_before_the_model_loads(tmp_path):
    """Python callers too: simple_evaluate refuses it before lm-eval builds eglr-vllm (vLLM is not even needed)."""
    from lm_eval import evaluator

    with pytest.raises(ValueError, match=r"^eglr-vllm does not support lm-eval's --use_cache.*rollout_cache=DIR"):
        evaluator.simple_evaluate(model="eglr-vllm", model_args=f"pretrained={tmp_path / 'no-model'}",
                                  tasks=["eglr_demo"], use_cache=str(tmp_path / "lm_cache"))
    assert list(tmp_path.iterdir()) == []


def test_close_task_names():
    known = ["aime24_eglr_sc", "aime25_eglr_sc", "aime24_eglr", "gsm8k_eglr_sc", "hellaswag"]
    close = close_task_names(["aime_eglr_sc", "qqq"], known)
    assert close["aime_eglr_sc"][:2] == ["aime24_eglr_sc", "aime25_eglr_sc"] and close["qqq"] == []


@pytest.mark.slow  # 22 s here: the lm_eval CLI indexes all of its tasks to name the close ones
def test_cli_names_close_tasks_when_one_is_not_found():
    result = subprocess.run(
        [sys.executable, "-m", "lm_eval", "--model", "eglr-hf", "--model_args", "model_config=smollm2-135m-instruct",
         "--tasks", "aime_eglr_sc", "--limit", "1"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "HF_DATASETS_OFFLINE": "1"},
    )
    assert result.returncode != 0
    assert "Tasks not found: aime_eglr_sc" in result.stderr
    assert "did you mean aime24_eglr_sc, aime25_eglr_sc" in result.stderr


def test_presets_hold_only_keys_that_do_something(tmp_path):
    from eglr_harness.core.resources import model_configs_dir
    from eglr_harness.run.presets import load_preset

    for preset in sorted(model_configs_dir().glob("*.yaml")):
        assert set(load_preset(str(preset))) == {"name", "path", "model_args", "eglr", "tau_h"}
    stale = tmp_path / "stale.yaml"
    stale.write_text("model_args: {pretrained: x}\nchat_template: true\n")
    with pytest.raises(ValueError, match="--apply_chat_template"):
        load_preset(str(stale))


def test_cli_refuses_a_typo_before_indexing_tasks():
    result = subprocess.run(
        [sys.executable, "-m", "lm_eval", "--model", "eglr-hf", "--model_args",
         "model_config=smollm2-135m-instruct,l=4",
         "--tasks", "eglr_demo", "--limit", "1"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "HF_DATASETS_OFFLINE": "1"},
    )
    assert result.returncode != 0 and "unknown eglr-hf model arg `l`. Did you mean `L`?" in result.stderr
    assert "Selected Tasks" not in result.stderr  # refused before lm-eval looked the tasks up


@pytest.mark.parametrize("args, message", [
    ({"k_max": 2.5}, r"`k_max`=2\.5 is not allowed; allowed: an int in \[1, 2\*\*53\]"),
    ({"top_k": 2.7}, r"`top_k`=2\.7 is not allowed; allowed: an int in \[0, 2\*\*53\]"),
    ({"seed": 1.5}, r"`seed`=1\.5 is not allowed; allowed: an int"),
    ({"seed": "abc"}, r"`seed`='abc' is not allowed; allowed: an int"),
    ({"k_max": "2.5"}, r"`k_max`='2\.5' is not allowed"),
    ({"alpha": "abc"}, r"`alpha`='abc' is not allowed; allowed: a float in \[0, 1\]"),
    ({"calib_limit": 3.5}, r"`calib_limit`=3\.5 is not allowed"),
    # the GGUF's config says 30 layers: refused before the weights load, naming the value as written
    ({"L": 99}, r"`L`=99 exceeds the model's 30 decoder layers; allowed: 0\.\.30"),
    ({"L": "1-99"}, r"`L`='1-99': layer span 99 exceeds the model's 30 decoder layers; allowed: 0\.\.30"),
])
def test_bad_values_are_refused_before_loading_never_truncated(no_loading, args, message):
    with pytest.raises(ValueError, match=message):
        EglrHFLM(model_config="smollm2-135m-instruct", **args)


def test_integer_args_written_as_whole_numbers_pass(no_loading):
    # lm-eval parses "k_max=3.0" as a float and "seed=7" as an int: both are whole numbers
    with pytest.raises(AssertionError, match="HFLM.__init__ ran"):
        EglrHFLM(model_config="smollm2-135m-instruct", k_max=3.0, seed="7", top_k="20", L=30)


@pytest.mark.parametrize("args, message", [
    ({"compile": "reduce-overhead", "device": "cpu"}, r"`compile`='reduce-overhead' captures CUDA graphs"),
    ({"compile": "default", "engine": "hook"}, r"`compile`='default' applies to engine=continuous only"),
    ({"compile": "fast"}, r"`compile`='fast' is not allowed; allowed: auto, none, reduce-overhead, default"),
    ({"compile": True}, r"`compile`=true is not allowed"),  # lm-eval parses compile=true as True: echoed as typed
])
def test_a_compile_that_cannot_apply_is_refused_before_loading(no_loading, args, message):
    with pytest.raises(ValueError, match=message):
        EglrHFLM(model_config="smollm2-135m-instruct", **args)


@pytest.mark.parametrize("model_args, gen_kwargs, message", [
    ("", "repetition_penalty=0", r"`repetition_penalty`=0 \(--gen_kwargs\) is not allowed; allowed: a float > 0"),
    ("", "repetition_penalty=-1", r"`repetition_penalty`=-1 \(--gen_kwargs\)"),
    ("", "no_repeat_ngram_size=-2", r"`no_repeat_ngram_size`=-2 \(--gen_kwargs\) is not allowed; allowed: an int >= 0"),
    ("", "min_p=1.5", r"`min_p`=1\.5 \(--gen_kwargs\) is not allowed; allowed: a float in \[0, 1\]"),
    ("", "max_gen_toks=0", r"`max_gen_toks`=0 \(--gen_kwargs\) is not allowed; allowed: an int >= 1"),
    ("", "top_k=-3", r"`top_k`=-3 \(--gen_kwargs\) is not allowed; allowed: an int in \[0, 2\*\*53\]"),
    ("", "repetiton_penalty=1.1",
     r"`repetiton_penalty`=1\.1 \(--gen_kwargs\) is not a generation option.*`repetition_penalty`"),
    (",engine=hook", "repetition_penalty=0", r"`repetition_penalty`=0 \(--gen_kwargs\)"),  # whatever the engine
    (",engine=continuous", "typical_p=0.9",
     r"engine=continuous does not apply .*typical_p=0\.9 \(--gen_kwargs\).*engine=hook"),
    (",engine=continuous", "num_beams=2", r"engine=continuous does not apply .*num_beams=2 \(--gen_kwargs\)"),
])
def test_gen_kwargs_are_checked_before_the_model_loads(no_loading, model_args, gen_kwargs, message):
    """Issue 35: an invalid value is one error naming it, never a fallback to engine=hook after the load."""
    from lm_eval import evaluator

    from eglr_harness.core.errors import GenerationOptionError

    with pytest.raises(GenerationOptionError, match=message):
        evaluator.simple_evaluate(model="eglr-hf", model_args="model_config=smollm2-135m-instruct" + model_args,
                                  tasks=["eglr_demo"], gen_kwargs=gen_kwargs)


def test_valid_gen_kwargs_get_as_far_as_loading(no_loading):
    from lm_eval import evaluator

    with pytest.raises(AssertionError, match="HFLM.__init__ ran"):  # typical_p: engine=auto hands it to hf
        evaluator.simple_evaluate(model="eglr-hf", model_args="model_config=smollm2-135m-instruct", tasks=["eglr_demo"],
                                  gen_kwargs="typical_p=0.9,repetition_penalty=1.1,max_gen_toks=16")


def test_cli_prints_an_invalid_gen_kwarg_as_one_line():
    result = subprocess.run(
        [sys.executable, "-m", "lm_eval", "--model", "eglr-hf", "--model_args", "model_config=smollm2-135m-instruct",
         "--tasks", "eglr_demo", "--limit", "1", "--gen_kwargs", "repetition_penalty=0"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "HF_DATASETS_OFFLINE": "1"},
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert ("error: `repetition_penalty`=0 (--gen_kwargs) is not allowed; allowed: a float > 0 (1.0 = off), "
            "at most 2**53."
            in result.stderr)


def test_the_first_line_comes_before_lm_evals_imports_and_missing_data_before_torch(tmp_path):
    """Under load every lm_eval command sat silent for 90-220 s, and missing data was refused at 370 s (after
    torch's import): the start is said at once, and an eglr task's local data is read before torch is imported."""
    empty = tmp_path / "data"
    empty.mkdir()
    argv = ["--model", "eglr-hf", "--model_args", "model_config=smollm2-135m-instruct", "--tasks", "gsm8k_eglr",
            "--limit", "1"]
    code = ("import os, sys\nsys.argv = [os.path.join(os.path.dirname(sys.executable), 'lm_eval'), *sys.argv[1:]]\n"
            "from lm_eval.__main__ import cli_evaluate\ntry:\n    cli_evaluate()\n"
            "except SystemExit as stop:\n    print('torch' in sys.modules, stop.code)\n")
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "EGLR_DATA_DIR": str(empty), "HF_DATASETS_OFFLINE": "1"})
    lines = done.stderr.splitlines()
    assert lines[0].startswith("INFO eglr-hf: lm_eval is starting;"), done.stderr
    assert done.stdout.split() == ["False", "2"], done.stderr  # refused, and torch never imported
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and "gsm8k" in errors[0] and str(empty) in errors[0], done.stderr
