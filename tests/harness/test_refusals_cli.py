"""Issue 38 item 7: mistakes on the ``lm_eval`` command line are refused as one line naming the value and
what is allowed, before the model loads where they can be known then.

Run through the real CLI in a subprocess. The model is one that cannot load: a config file (4 layers,
8192 positions, read without the weights) beside a weights file that is not one, so a check that
came only after the load would end with the load's traceback instead of its own line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

LOADING = "lm_eval/models/huggingface.py"  # in the traceback of the load (its tokenizer or weights fail)


@pytest.fixture(scope="module")
def unloadable(tmp_path_factory) -> Path:
    from transformers import LlamaConfig

    folder = tmp_path_factory.mktemp("unloadable")
    LlamaConfig(num_hidden_layers=4, hidden_size=16, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1,
                vocab_size=64, max_position_embeddings=8192).save_pretrained(folder)
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")  # and no tokenizer files
    return folder


def lm_eval(*args: str, env: dict | None = None, cwd: Path | None = None) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "lm_eval", *args, "--device", "cpu"], capture_output=True, text=True,
                          timeout=600,
                          cwd=cwd, env={**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", **(env or {})})
    return done, time.monotonic() - started


def assert_refused(done: subprocess.CompletedProcess, message: str) -> None:
    """Exit status 2 (as the eglr-* commands refuse; lm-eval's own errors exit 1), no traceback, and the one error
    line."""
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert len(errors) == 1 and message in errors[0], done.stderr[-3000:]


@pytest.mark.slow  # 20 s here: an lm_eval CLI run as far as the model load
def test_the_unloadable_model_fails_at_its_load(unloadable, shared_data_dir):
    """The control: with valid arguments the run gets as far as the load, and ends there."""
    done, _ = lm_eval("--model", "eglr-hf", "--model_args", f"pretrained={unloadable}", "--tasks", "gsm8k_eglr",
                      "--limit", "1")
    assert done.returncode != 0 and "Selected Tasks" in done.stderr and LOADING in done.stderr, done.stderr[-3000:]


# refused before lm-eval indexes its tasks (no "Selected Tasks" line)
@pytest.mark.parametrize("model_args, extra, message", [
    ("", ["--gen_kwargs", "max_gen_toks=1000000000"],
     "`max_gen_toks`=1000000000 (--gen_kwargs) leaves no room for the prompt in the model's max_length=8192; "
     "allowed: 1..8191"),
    ("", ["--gen_kwargs", "eglr_L=abc"], "`eglr_L`='abc': 'abc' is not a layer span; allowed: a non-negative int"),
    (",L=0-100000000", [], "`L`='0-100000000' names 100000001 values; allowed: at most 10000"),
    (",T=0-100000:0.001", [], "`T`='0-100000:0.001' names 100000001 values; allowed: at most 10000"),
    # issue 47: an OverflowError traceback (int() of (1e308 - 0) / 1e-10 = inf)
    (",T=0-1e308:0.0000000001", [], "`T`='0-1e308:0.0000000001': range '0-1e308:0.0000000001' names more than "
     "10000 values; allowed: at most 10000"),
    (",L=9", [], "`L`=9 exceeds the model's 4 decoder layers; allowed: 0..4"),
    ("", ["--limit", "0"], "`--limit`=0 is not allowed; allowed: a number > 0"),
    # issue 47: failed after the load (dtype), or never (max_length=abc was taken as not given)
    (",dtype=float7", [], "`dtype`='float7' is not allowed; allowed: auto, float32, float, float16"),
    (",max_length=-5", [], "`max_length`=-5.0 is not allowed; allowed: an int >= 2"),  # lm-eval reads -5.0
    (",max_length=abc", [], "`max_length`='abc' is not allowed; allowed: an int >= 2"),
    (",zzz=1", [], "unknown eglr-hf model arg `zzz`."),
    (",stop=kld", [], "`stop`='kld' is not allowed; allowed: kl, latent, accel, margin, entropy."),
    (",stop=margin,tau_margin=2", [], "`tau_margin`=2 is not allowed; allowed: a float in [0, 1]."),
    # issue 55: accepted, then written as null (an ablation of "tau_kl 0.0005 vs None"), or refused by every reader
    (",tau_kl=inf", [], "`tau_kl`=inf is not allowed; allowed: a finite float in [0, 2**53]."),
    (",tau_kl=1e309", [], "`tau_kl`=inf is not allowed; allowed: a finite float in [0, 2**53]."),
    (",stop=latent,tau_latent=inf", [], "`tau_latent`=inf is not allowed; allowed: a finite float in [0, 2**53]."),
    (",seed=99999999999999999999999,seeds=10", [], "`seed`=99999999999999999999999 is not allowed; allowed: an int "
     "in [-2**53, 2**53]"),
    (",seed=9007199254740992,seeds=3", [], "`seed`=9007199254740992 with `seeds`=3 is not allowed"),
    ("", ["--use_cache", "lm_cache"], "eglr-hf does not support lm-eval's --use_cache"),
    # lm-eval would call the model with `device` twice (a TypeError after indexing the tasks)
    (",device=cpu", [], "`device=cpu` in --model_args: lm-eval passes its own --device (cpu) to every model; "
     "give it as `--device cpu` instead."),
])
def test_a_bad_argument_is_one_line_before_the_tasks_are_indexed(unloadable, tmp_path, model_args, extra, message):
    args = ["--model", "eglr-hf", "--model_args", f"pretrained={unloadable}{model_args}",
            "--tasks", "gsm8k_eglr", *(["--limit", "1"] if "--limit" not in extra else []), *extra]
    done, seconds = lm_eval(*args, cwd=tmp_path)
    assert_refused(done, message)
    assert "Selected Tasks" not in done.stderr and LOADING not in done.stderr
    assert not (tmp_path / "lm_cache").exists()
    print(f"refused in {seconds:.1f} s: {message}")


def test_a_local_pretrained_that_does_not_exist_is_named(tmp_path):
    done, _ = lm_eval("--model", "eglr-hf", "--model_args", f"pretrained={tmp_path / 'missing'}", "--tasks",
                      "gsm8k_eglr",
                      "--limit", "1")
    assert_refused(done, f"`pretrained`='{tmp_path / 'missing'}' does not exist; allowed: a model folder")
    assert "Repo id" not in done.stderr and "Selected Tasks" not in done.stderr


def test_an_output_path_that_is_a_file_is_named_as_one(unloadable, tmp_path):
    blocker = tmp_path / "results"
    blocker.write_text("a file")
    done, _ = lm_eval("--model", "eglr-hf", "--model_args", f"pretrained={unloadable}", "--tasks", "gsm8k_eglr",
                      "--limit", "1", "--output_path", str(blocker))
    assert_refused(done, f"--output_path='{blocker}' is not a folder ({blocker} is a file); allowed: a folder")
    assert "free space" not in done.stderr


# refused once the task names are resolved, still before the model loads
def test_a_task_name_typo_is_one_line_with_the_close_names(unloadable):
    done, _ = lm_eval("--model", "eglr-hf", "--model_args", f"pretrained={unloadable}", "--tasks", "gsm8k_eglrr",
                      "--limit", "1")
    assert_refused(done, "Tasks not found: gsm8k_eglrr; gsm8k_eglrr -> did you mean gsm8k_eglr")


@pytest.mark.parametrize("model_args, gen_kwargs, message", [
    (",L=0|1|2", None,
     "The pool L=[0, 1, 2] × T=[0.0] has 3 configs but task 'gsm8k_eglr' repeats each problem only 1"),
    ("", "eglr_T=0.1|0.2", "The pool L=[4] × T=[0.1, 0.2] has 2 configs but task 'gsm8k_eglr' repeats"),
    # the task's own pool (L 1..10) on a model of 4 layers
    (",tau_h=1", None, "`L`=5 exceeds the model's 4 decoder layers; allowed: 0..4"),
])
def test_a_pool_the_task_or_model_cannot_run_is_refused_before_the_load(unloadable, shared_data_dir, model_args,
                                                                         gen_kwargs, message):
    task = "gsm8k_eglr_sc" if "tau_h" in model_args else "gsm8k_eglr"
    done, _ = lm_eval("--model", "eglr-hf", "--model_args", f"pretrained={unloadable}{model_args}",
                      "--tasks", task, "--limit", "1", *(["--gen_kwargs", gen_kwargs] if gen_kwargs else []))
    assert_refused(done, message)
    assert LOADING not in done.stderr


def test_a_missing_data_folder_is_named_before_the_load(unloadable, tmp_path):
    done, _ = lm_eval("--model", "eglr-hf", "--model_args", f"pretrained={unloadable}", "--tasks", "gsm8k_eglr",
                      "--limit", "1", env={"EGLR_DATA_DIR": str(tmp_path / "nodata")})
    assert_refused(done, f"{tmp_path / 'nodata' / 'gsm8k' / 'test.jsonl'}: no such file. EGLR_DATA_DIR must point")
    assert LOADING not in done.stderr


@pytest.mark.parametrize("case", ["offline", "unreachable"])
def test_a_benchmark_that_cannot_be_had_is_one_line_naming_both_ways_before_the_load(unloadable, tmp_path, case):
    """The README's first real command on a fresh clone without the hub: no local file (EGLR_DATA_DIR empty; a
    folder without the file: test_a_missing_data_folder_is_named_before_the_load), an empty datasets cache, and
    the hub offline (HF_DATASETS_OFFLINE=1) or unreachable without an offline switch (an endpoint that refuses
    connections: no minute of retries)."""
    env = {"EGLR_DATA_DIR": "", "HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_CACHE": str(tmp_path / "hf")}
    if case == "unreachable":
        env.update(HF_DATASETS_OFFLINE="", HF_HUB_OFFLINE="", TRANSFORMERS_OFFLINE="", HF_ENDPOINT="http://127.0.0.1:9")
    done, _ = lm_eval("--model", "eglr-hf", "--model_args", f"pretrained={unloadable}", "--tasks", "gsm8k_eglr_sc",
                      "--limit", "2", env=env)
    assert_refused(done, "benchmark 'gsm8k' cannot be had: EGLR_DATA_DIR is not set and the hub dataset "
                         "openai/gsm8k (main), split 'test', is neither reachable nor cached")
    assert "reach the Hugging Face hub" in done.stderr and "gsm8k/test.jsonl" in done.stderr
    if case == "unreachable":
        assert "127.0.0.1:9 cannot be reached" in done.stderr and "Retrying in" not in done.stderr
    assert LOADING not in done.stderr


def test_a_task_name_with_a_slash_is_refused_before_the_load_when_samples_are_written(unloadable, tmp_path):
    from eglr_harness.core.resources import tasks_dir

    include = tmp_path / "tasks"
    include.mkdir()
    (include / "slashed.yaml").write_text(f"include: {tasks_dir() / 'demo' / 'eglr_demo.yaml'}\ntask: mine/eglr_demo\n")
    done, _ = lm_eval("--model", "eglr-hf", "--model_args", f"pretrained={unloadable}",
                      "--include_path", str(include), "--tasks", "mine/eglr_demo", "--limit", "1",
                      "--output_path", str(tmp_path / "out"), "--log_samples")
    assert_refused(done, "task 'mine/eglr_demo' holds '/', which cannot be part of its samples file name")
    assert LOADING not in done.stderr


def test_gen_kwargs_length_beyond_the_declared_context_is_refused_in_python_too(unloadable):
    """simple_evaluate called from Python meets the same check (the hook wraps it)."""
    from lm_eval import evaluator

    from eglr_harness.core.errors import GenerationOptionError

    with pytest.raises(GenerationOptionError, match=r"`max_new_tokens`=8192 \(--gen_kwargs\) leaves no room"):
        evaluator.simple_evaluate(model="eglr-hf", model_args=f"pretrained={unloadable}",
                                  tasks=["eglr_demo"], gen_kwargs={"max_new_tokens": 8192})



def test_eglr_vllm_refuses_use_cache_before_the_tasks_are_indexed(tmp_path):
    """lm-eval's cache would answer a pool's repeats of one (context, gen_kwargs) with one rollout: eglr-vllm refuses
    it as eglr-hf does, before vLLM is imported or the model named (here neither exists)."""
    done, seconds = lm_eval("--model", "eglr-vllm", "--model_args", f"pretrained={tmp_path / 'no-model'}", "--tasks",
                            "gsm8k_eglr", "--limit", "1", "--use_cache", "lm_cache", cwd=tmp_path)
    assert_refused(done, "eglr-vllm does not support lm-eval's --use_cache")
    assert "Selected Tasks" not in done.stderr and not (tmp_path / "lm_cache").exists()
    print(f"refused in {seconds:.1f} s")
