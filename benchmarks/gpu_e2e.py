"""lm_eval end to end at Qwen2.5-3B-Instruct's shapes (issue 33): ``hf`` against ``eglr-hf`` on the same GSM8K prompts.

Nothing is downloaded. The script builds a checkpoint folder (``build_checkpoint``): the model of
``gpu_check.FAMILIES["qwen2.5-3b"]`` with random weights (bf16; its output embedding sharpened and
untied as ``gpu_check`` does, see there), Qwen2.5-3B-Instruct's published ``generation_config.json``
(``repetition_penalty`` 1.05, ``temperature`` 0.7, ``top_p`` 0.8, ``top_k`` 20, EOS ``<|im_end|>`` and
``<|endoftext|>``), and a tokenizer built on the spot (``build_tokenizer``): a byte-level BPE trained
on the GSM8K file itself with Qwen2's pre-tokenizer pattern, filled up to Qwen's 151,643 regular ids,
its three ChatML special tokens at Qwen's ids and Qwen2.5's chat template (without its tools branch).
The model's vocabulary stays 151,936. tau_h is the 95th percentile of the model's own greedy entropies
on the first GSM8K chat prompts, without the paper's 2.5-nat cap (``gpu_check.calibrate_tau_h``: a
random model's entropies sit above the cap, which would gate most tokens).

Then three lm_eval runs (``RUNS``), each in its own process (its own peak memory, its own compile),
on the same GSM8K prompts (``EGLR_DATA_DIR``, else ``../shared/data``), each with
``--apply_chat_template --batch_size auto``:

- ``hf``: ``--model hf``, ``gsm8k_eglr``, greedy (what lm-eval users run);
- ``eglr_L4``: ``--model eglr-hf``, ``gsm8k_eglr`` at L=4, greedy;
- ``eglr_pool``: ``--model eglr-hf``, ``gsm8k_eglr_sc``: the pool L=1..10 at T=0.

Each run goes through ``python gpu_e2e.py --probe OUT -- <lm_eval args>``, which runs lm_eval's own
CLI in that process (``python -m eglr_harness <args>``: the stock CLI with eglr-harness loaded, as
from a checkout) with timers around its parts: the time to load the model, the time in
``generate_until`` (wall; generated tokens/s), the warm-up (lm-eval's batch-size probe; the
continuous engine's ``warmup_report()`` where it has one; dynamo's counters), the batch that
``auto`` chose, the plan lines eglr-hf logs, and the peak GPU memory (after the batch-size probe and
in all). The JSON is rewritten after every run; a run that outlives ``--budget_s`` is killed and
recorded with what its probe had written.

    python benchmarks/gpu_e2e.py --out e2e.json                          # full shapes, GPU
    python benchmarks/gpu_e2e.py --size tiny --device cpu --out tiny.json  # seconds, CPU
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.util
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

logger = logging.getLogger("gpu_e2e")

ROOT = Path(__file__).resolve().parent.parent
GPU_CHECK = ROOT / "benchmarks" / "gpu_check.py"
EGLR_UTILS = ROOT / "tasks" / "eglr_utils.py"
FAMILY = "qwen2.5-3b"
SIZES = ("full", "tiny")
RUNS = ("hf", "eglr_L0", "eglr_L4", "eglr_pool")
DEFAULT_RUNS = ("hf", "eglr_L4", "eglr_pool")
# a run of ``--runs`` is NAME or NAME@BATCH (``--batch_size`` of that run: a number of rows, or auto)
RUN_SPEC = re.compile(r"(?P<name>[A-Za-z_0-9]+?)(?:@(?P<batch>auto|[1-9][0-9]*))?")


def run_parts(run: str) -> tuple[str, str]:
    """``"hf@32"`` -> ``("hf", "32")``; ``"eglr_L4"`` -> ``("eglr_L4", "auto")``."""
    match = RUN_SPEC.fullmatch(run)
    return match["name"], match["batch"] or "auto"


def hf_anchor(run: str, runs) -> str | None:
    """The hf run that an eglr run is compared with: hf at the same batch where one ran, else plain ``hf``."""
    batch = run.partition("@")[2]
    for candidate in ([f"hf@{batch}"] if batch else []) + ["hf"]:
        if candidate in runs:
            return candidate
    return None

# Qwen/Qwen2.5-3B-Instruct generation_config.json, as published.
QWEN_GENERATION_CONFIG = {
    "bos_token_id": 151643, "pad_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643],
    "repetition_penalty": 1.05, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "transformers_version": "4.37.0",
}
# Qwen2's special tokens follow its 151,643 regular tokens; config.json: bos 151643, eos 151645.
QWEN_REGULAR_TOKENS = 151643
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Qwen2's pre-tokenizer (tokenizer.json of Qwen2.5): single digits, letters with one leading symbol, ...
QWEN2_SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                       r"\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen2.5-Instruct's chat template without its tools branch (no tools are passed here): the same text.
QWEN25_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) "
    "or (message.role == 'assistant') %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Per-size defaults of the flags left unset: full = Qwen2.5-3B's shapes on a GPU within a 10-minute
# call; tiny = the same code on a CPU in about a minute (tests/benchmarks/test_gpu_e2e.py).
SIZE_DEFAULTS = {
    "full": dict(limit=32, max_gen_toks=256, dtype="bfloat16", bpe_vocab=8192, calib_prompts=16,
                 calib_tokens=128, budget_s=530),
    "tiny": dict(limit=2, max_gen_toks=4, dtype="float32", bpe_vocab=1024, calib_prompts=2, calib_tokens=8,
                 budget_s=0),
}
# tiny: 10 layers for the pool's L=1..10, a vocabulary with room for merges, a context that holds a
# GSM8K chat prompt and is short (lm-eval's batch-size probe runs forward passes at the model's max length)
TINY_LAYERS = 10
TINY_OVERRIDES = dict(vocab_size=2048, max_position_embeddings=512)


def _load_by_path(name: str, path: Path):
    """A module of this checkout that is not in a package (benchmarks/, tasks/)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def gpu_check():
    return _load_by_path("gpu_check", GPU_CHECK)


# ------------------------------------------------------------------------------------- checkpoint
def special_base(size: str) -> int:
    """The id of the first special token: Qwen's for full shapes, the top of the tiny vocabulary else."""
    return QWEN_REGULAR_TOKENS if size == "full" else TINY_OVERRIDES["vocab_size"] - len(SPECIAL_TOKENS)


def generation_config(size: str) -> dict:
    """Qwen2.5-3B-Instruct's published generation config, its token ids moved to ``special_base`` when tiny."""
    if size == "full":
        return dict(QWEN_GENERATION_CONFIG)
    base = special_base(size)
    return {**QWEN_GENERATION_CONFIG, "bos_token_id": base, "pad_token_id": base, "eos_token_id": [base + 2, base]}


def build_tokenizer(texts: list[str], *, regular_tokens: int, bpe_vocab: int):
    """A fast tokenizer that loads offline: byte-level BPE trained on ``texts`` with Qwen2's split pattern
    (a vocabulary of ``bpe_vocab`` at most, its 256 bytes included), filled with placeholder tokens
    (``Ġw<hex>``: a space and a word when decoded) up to ``regular_tokens`` ids, then ``SPECIAL_TOKENS`` at
    ``regular_tokens``.. and Qwen2.5's chat template. Every id below ``regular_tokens`` + 3 decodes to text,
    as with Qwen's own. Returns (tokenizer, tokens learned from ``texts``).
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated"),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre
    trainer = trainers.BpeTrainer(vocab_size=min(bpe_vocab, regular_tokens), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    trained.train_from_iterator(texts, trainer)
    state = json.loads(trained.to_str())["model"]
    vocab = dict(state["vocab"])
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in state["merges"]]
    learned = len(vocab)
    filler = 0
    while len(vocab) < regular_tokens:
        token = f"Ġw{filler:x}"
        filler += 1
        if token not in vocab:
            vocab[token] = len(vocab)
    for offset, token in enumerate(SPECIAL_TOKENS):
        vocab[token] = regular_tokens + offset
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=QWEN25_CHAT_TEMPLATE, model_max_length=131072)
    return fast, learned


def gsm8k_problems(data_dir: Path) -> list[dict]:
    from eglr_harness.data import load_problems

    return load_problems("gsm8k", data_dir=data_dir)


def chat_prompts(tokenizer, problems: list[dict]) -> list[list[int]]:
    """The token ids lm-eval gives the model for ``gsm8k_eglr`` with ``--apply_chat_template``."""
    doc_to_text = _load_by_path("eglr_utils", EGLR_UTILS).doc_to_text
    prompts = []
    for doc in problems:
        text = tokenizer.apply_chat_template([{"role": "user", "content": doc_to_text(doc)}], tokenize=False,
                                             add_generation_prompt=True)
        prompts.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return prompts


def build_checkpoint(folder: str, *, size: str, device: str, dtype: str, data_dir: str, seed: int, logit_std: float,
                     bpe_vocab: int, calib_prompts: int, calib_tokens: int) -> dict:
    """Write the checkpoint folder (weights, config, generation config, tokenizer) and return what it holds:
    shapes, parameters, tau_h and how it was found, the machine, the seconds each part took."""
    import torch

    check = gpu_check()
    started = time.perf_counter()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    problems = gsm8k_problems(Path(data_dir))
    base = special_base(size)
    corpus = [f"{p['problem']}\n{p['metadata'].get('solution') or ''}" for p in problems]
    tokenizer, learned = build_tokenizer(corpus, regular_tokens=base, bpe_vocab=bpe_vocab)
    tokenizer_s = time.perf_counter() - started

    config = check.family_config(FAMILY, size, layers=TINY_LAYERS if size == "tiny" else None)
    if size == "tiny":
        for key, value in TINY_OVERRIDES.items():
            setattr(config, key, value)
    gen = generation_config(size)
    config.bos_token_id, config.eos_token_id, config.pad_token_id = base, base + 2, None  # as Qwen's config.json
    model = check.build_model(config, dtype=getattr(torch, dtype), attn="sdpa", device=device, logit_std=logit_std,
                              seed=seed)
    prompts = chat_prompts(tokenizer, problems[:calib_prompts])
    entropies = check.greedy_entropies(model, prompts, calib_tokens, device=device, eos_token_id=None)
    tau_h = check.calibrate_tau_h(entropies)
    calibrated_s = time.perf_counter() - started

    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")  # the published file, verbatim
    info = {
        "build_args": dict(size=size, device=device, dtype=dtype, data_dir=data_dir, seed=seed, logit_std=logit_std,
                           bpe_vocab=bpe_vocab, calib_prompts=calib_prompts, calib_tokens=calib_tokens),
        "family": FAMILY, "size": size, "source": check.FAMILIES[FAMILY].source,
        "random_init": check.FAMILIES[FAMILY].random_init, "dtype": dtype,
        "output_embedding_scale": check.sharpen_factor(config, logit_std),
        "config": {k: v for k, v in config.to_diff_dict().items() if not k.startswith("_")},
        "parameters": sum(p.numel() for p in model.parameters()),
        "generation_config": gen,
        "tokenizer": {"ids": len(tokenizer), "learned_tokens": learned,
                      "special_tokens": {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS},
                      "chat_template": "Qwen2.5-Instruct's, without its tools branch"},
        "gsm8k_prompt_tokens": {"calibration_prompts": len(prompts),
                                "mean": sum(map(len, prompts)) / max(len(prompts), 1)},
        "tau_h": tau_h,
        "tau_h_source": (f"95th percentile of {len(entropies)} greedy entropies (L=0, {calib_tokens} new tokens, the "
                         f"first {len(prompts)} GSM8K chat prompts), no cap"),
        "environment": check.environment(device),
        "seconds": {"tokenizer": tokenizer_s, "model_and_tau_h": calibrated_s - tokenizer_s,
                    "save": time.perf_counter() - started - calibrated_s},
        "folder_bytes": sum(f.stat().st_size for f in folder.iterdir() if f.is_file()),
    }
    del model
    check._free(device)
    (folder / "gpu_e2e_build.json").write_text(json.dumps(info, indent=1, default=str) + "\n")  # written last: complete
    return info


def checkpoint_info(folder: Path, args) -> dict:
    """The checkpoint's build record: the folder's own when it was built with these settings, else that of a
    fresh build in a child process (this process never touches the GPU: each run's memory is its own)."""
    record = folder / "gpu_e2e_build.json"
    kwargs = dict(size=args.size, device=args.device, dtype=args.dtype, data_dir=str(args.data_dir), seed=args.seed,
                  logit_std=args.logit_std, bpe_vocab=args.bpe_vocab, calib_prompts=args.calib_prompts,
                  calib_tokens=args.calib_tokens)
    if record.is_file() and not args.rebuild:
        info = json.loads(record.read_text())
        if info.get("build_args") == kwargs:
            return {**info, "reused": True}
    logger.info("building the checkpoint in %s (%s)", folder, args.size)
    record.unlink(missing_ok=True)
    subprocess.run([sys.executable, str(Path(__file__).resolve()), "--build", str(folder), json.dumps(kwargs)],
                   check=True, cwd=str(ROOT), env=run_env(args))
    return {**json.loads(record.read_text()), "reused": False}


# ------------------------------------------------------------------------------------- commands
def lm_eval_args(run: str, *, checkpoint: Path, tau_h: float | str, args, output_path: Path) -> list[str]:
    """The lm_eval arguments of ``run`` (what follows ``lm_eval`` / ``python -m eglr_harness``)."""
    name, batch = run_parts(run)
    model_args = f"pretrained={checkpoint},dtype={args.dtype}"
    if name == "hf":
        model, task = "hf", "gsm8k_eglr"
        model_args += args.hf_model_args and f",{args.hf_model_args}"
    else:
        model, task = "eglr-hf", "gsm8k_eglr" if name != "eglr_pool" else "gsm8k_eglr_sc"
        model_args += {"eglr_L0": ",L=0", "eglr_L4": ",L=4"}.get(name, "") + f",tau_h={tau_h}"
        model_args += args.eglr_model_args and f",{args.eglr_model_args}"
    argv = ["--model", model, "--model_args", model_args, "--tasks", task, "--apply_chat_template",
            "--batch_size", batch, "--limit", str(args.limit), "--gen_kwargs", f"max_gen_toks={args.max_gen_toks}",
            "--output_path", str(output_path)]
    if args.device:
        argv += ["--device", args.device]
    return argv


def assemble(checkpoint: Path, tau_h, args, work_dir: Path) -> dict[str, list[str]]:
    """Run name -> its lm_eval arguments, for the runs asked."""
    return {run: lm_eval_args(run, checkpoint=checkpoint, tau_h=tau_h, args=args, output_path=work_dir / run)
            for run in args.runs}


def run_env(args) -> dict:
    """The children's environment: this checkout importable, the data folder, no hub, a fresh tau_h cache."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["EGLR_DATA_DIR"] = str(args.data_dir)
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.setdefault("EGLR_CACHE_DIR", str(Path(args.work_dir) / "eglr_cache"))
    return env


def run_one(run: str, argv: list[str], *, work_dir: Path, env: dict, timeout: float | None) -> dict:
    """One lm_eval run in its own process under the probe; its figures, what it printed at the end, and
    the metrics of its results file."""
    probe_out = work_dir / f"{run}.probe.json"
    log_path = work_dir / f"{run}.log"
    probe_out.unlink(missing_ok=True)
    shutil.rmtree(work_dir / run, ignore_errors=True)  # an earlier run's results file must not pass for this one's
    command = [sys.executable, str(Path(__file__).resolve()), "--probe", str(probe_out), "--", *argv]
    started = time.perf_counter()
    timed_out = False
    with open(log_path, "w") as log:
        child = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(ROOT))
        try:
            returncode = child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            child.kill()
            returncode = child.wait()
    record = {"command": "python -m eglr_harness " + shlex.join(argv), "returncode": returncode,
              "timed_out": timed_out, "process_wall_s": time.perf_counter() - started, "log": log_path.name}
    if probe_out.is_file():
        record.update(json.loads(probe_out.read_text()))
    if returncode != 0:
        record["log_tail"] = log_path.read_text(errors="replace")[-3000:]
    record["results"] = read_results(work_dir / run)
    return record


def read_results(output_path: Path) -> dict | None:
    """The task metrics and ``config.eglr`` (engine, compile, tau_h, token totals) of a run's results file."""
    files = sorted(output_path.rglob("results_*.json")) if output_path.is_dir() else []
    if not files:
        return None
    results = json.loads(files[-1].read_text())
    out = {"file": str(files[-1].relative_to(output_path.parent)), "metrics": results.get("results", {})}
    eglr = results.get("config", {}).get("eglr")
    if eglr:
        out["eglr"] = {k: eglr.get(k) for k in ("engine", "engine_requested", "compile", "compile_requested", "tau_h")}
        out["eglr"]["tokens"] = eglr["stats"]["total"].get("tokens")
        out["eglr"]["cells"] = {cell: part.get("tokens") for cell, part in eglr["stats"]["cells"].items()}
        out["eglr"]["stats"] = {k: eglr["stats"]["total"].get(k) for k in (
            "rho", "mean_iterations", "flop_ratio", "batched_flop_ratio", "steps", "p_step_gated")}
    return out


# ------------------------------------------------------------------------------------- probe
PLAN_MARKERS = ("eglr-hf plan", "pool of", "batch_size=auto", "decoding with engine=hook", "tau_h")


def probe(out_path: str, argv: list[str]) -> None:
    """Run lm_eval's CLI in this process (``python -m eglr_harness <argv>``), timing its parts; the record
    is written to ``out_path`` at every milestone, so a run killed on time keeps what it reached."""
    started = time.perf_counter()
    rec: dict = {"load_s": None, "startup_s": None, "generate_s": 0.0, "generate_calls": 0, "generated_tokens": 0,
                 "tokens_per_s": None, "decode_s": None, "tokens_per_s_decoding": None, "requests": 0, "prompts": None,
                 "prompts_sha256": None,
                 "batch": {"requested": argv[argv.index("--batch_size") + 1] if "--batch_size" in argv else None,
                           "chosen": None, "by": None},
                 "warmup": {"batch_detect_s": None, "engine": None, "dynamo": None},
                 "plan_lines": [], "engine_runs": 0, "peak_gpu_mib": None, "peak_gpu_mib_decoding": None,
                 "peak_gpu_reserved_mib": None, "peak_rss_mib": None, "finished": False}
    contexts: set[str] = set()

    def save() -> None:
        tmp = Path(out_path + ".tmp")
        tmp.write_text(json.dumps(rec, indent=1, default=str) + "\n")
        tmp.replace(out_path)

    from eglr_harness.harness import autoload

    os.environ["EGLR_AUTOLOAD"] = "1"
    autoload.install()
    import resource

    import torch
    from lm_eval import evaluator
    from lm_eval.models.huggingface import HFLM

    from eglr_harness.decoding.continuous.engine import ContinuousEngine
    from eglr_harness.decoding.hook.engine import HookEngine

    cuda = torch.cuda.is_available()

    def memory() -> None:
        rec["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        if cuda and torch.cuda.is_initialized():
            peak = torch.cuda.max_memory_allocated() / 2**20
            rec["peak_gpu_mib_decoding"] = peak
            rec["peak_gpu_mib"] = max(peak, rec["peak_gpu_mib"] or 0.0)
            rec["peak_gpu_reserved_mib"] = max(torch.cuda.max_memory_reserved() / 2**20,
                                               rec["peak_gpu_reserved_mib"] or 0.0)

    class PlanLines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if any(marker in message for marker in PLAN_MARKERS):
                rec["plan_lines"].append(message)

    ours = logging.getLogger("eglr_harness")
    ours.addHandler(PlanLines(level=logging.INFO))
    ours.setLevel(logging.INFO)

    hf_init = HFLM.__init__
    depth = [0]

    @functools.wraps(hf_init)  # eglr-hf reads HFLM.__init__'s signature for its model-arg check
    def timed_init(self, *a, **k):  # the outermost HFLM.__init__: weights and tokenizer
        depth[0] += 1
        began = time.perf_counter()
        try:
            return hf_init(self, *a, **k)
        finally:
            depth[0] -= 1
            if depth[0] == 0:
                rec["load_s"] = time.perf_counter() - began
                memory()
                save()

    detect = HFLM._detect_batch_size

    @functools.wraps(detect)
    def timed_detect(self, *a, **k):  # lm-eval's probe of the largest batch (hf, and eglr-hf's hook engine)
        began = time.perf_counter()
        chosen = detect(self, *a, **k)
        rec["warmup"]["batch_detect_s"] = (rec["warmup"]["batch_detect_s"] or 0.0) + time.perf_counter() - began
        rec["batch"].update(chosen=chosen, by="lm-eval HFLM._detect_batch_size (forward passes at max_length)")
        memory()
        if cuda and torch.cuda.is_initialized():  # from here on the peak is the decoding's own
            torch.cuda.reset_peak_memory_stats()
        save()
        return chosen

    model_generate = HFLM._model_generate

    @functools.wraps(model_generate)
    def counted_generate(self, context, *a, **k):
        # lm-eval hf: each row's new tokens up to its first end token (EOS or the padding generate writes after
        # a finished row; a row ended by a stop string counts that first padding too, as eglr-hf counts its stop token)
        out = model_generate(self, context, *a, **k)
        ends = set(_as_list(self.model.generation_config.eos_token_id)) | {self.tokenizer.pad_token_id}
        for row in out[:, context.shape[1]:].tolist():
            rec["generated_tokens"] += next((i + 1 for i, t in enumerate(row) if t in ends), len(row))
        return out

    auto_batch = ContinuousEngine.auto_batch

    @functools.wraps(auto_batch)
    def recorded_auto_batch(self, requests):
        chosen = auto_batch(self, requests)
        rec["batch"].update(chosen=chosen, by="eglr continuous engine auto_batch (free memory / bytes per row)")
        return chosen

    def counted_run(engine_run):
        @functools.wraps(engine_run)
        def run(self, requests, **k):
            outcomes = engine_run(self, requests, **k)
            rec["engine_runs"] += 1
            rec["generated_tokens"] += sum(len(o.tokens) for o in outcomes)
            report = getattr(self, "warmup_report", None)  # the captured engine's (issue 32), where it has one
            if callable(report):
                rec["warmup"]["engine"] = report()
            return outcomes
        return run

    evaluate = evaluator.evaluate

    @functools.wraps(evaluate)
    def timed_evaluate(lm, *a, **k):
        rec["startup_s"] = time.perf_counter() - started
        generate_until = lm.generate_until

        def timed_generate_until(requests, *ga, **gk):
            contexts.update(r.args[0] for r in requests)
            rec["requests"] += len(requests)
            began = time.perf_counter()
            out = generate_until(requests, *ga, **gk)
            if cuda and torch.cuda.is_initialized():
                torch.cuda.synchronize()
            rec["generate_s"] += time.perf_counter() - began
            rec["generate_calls"] += 1
            rec["tokens_per_s"] = rec["generated_tokens"] / rec["generate_s"] if rec["generate_s"] else None
            rec["decode_s"] = rec["generate_s"] - (rec["warmup"]["batch_detect_s"] or 0.0)
            rec["tokens_per_s_decoding"] = rec["generated_tokens"] / rec["decode_s"] if rec["decode_s"] > 0 else None
            rec["prompts"] = len(contexts)
            rec["prompts_sha256"] = hashlib.sha256("\0".join(sorted(contexts)).encode()).hexdigest()
            memory()
            save()
            return out

        lm.generate_until = timed_generate_until
        for key, field in (("engine_used", "engine_used"), ("compile_choice", "compile")):
            if hasattr(lm, key):
                rec[field] = getattr(getattr(lm, key), "recorded", getattr(lm, key))
        save()
        return evaluate(lm, *a, **k)

    HFLM.__init__, HFLM._detect_batch_size, HFLM._model_generate = timed_init, timed_detect, counted_generate
    ContinuousEngine.auto_batch = recorded_auto_batch
    ContinuousEngine.run = counted_run(ContinuousEngine.run)
    HookEngine.run = counted_run(HookEngine.run)
    evaluator.evaluate = timed_evaluate  # simple_evaluate looks it up in its module at call time
    sys.argv = ["lm_eval", *argv]
    try:
        from lm_eval.__main__ import cli_evaluate

        cli_evaluate()
        rec["finished"] = True
    finally:
        rec["warmup"]["dynamo"] = _dynamo_counters()
        rec["imported_distributions"] = imported_distributions()
        memory()
        save()


def _as_list(value) -> list:
    return [] if value is None else [value] if isinstance(value, int) else list(value)


def imported_distributions() -> dict[str, str]:
    """Distribution -> version of every package this process imported (what a GPU machine must have)."""
    import importlib.metadata as metadata

    owners = metadata.packages_distributions()
    names = {dist for module in list(sys.modules) for dist in owners.get(module.partition(".")[0], ())}
    versions = {}
    for name in sorted(names, key=str.lower):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:  # an editable or path install without metadata
            continue
    return versions


def _dynamo_counters() -> dict | None:
    """torch._dynamo's counters of this process (graphs compiled, frames), where torch keeps them."""
    try:
        from torch._dynamo.utils import counters
    except Exception:  # noqa: BLE001 -- a torch without them: nothing to report
        return None
    return {group: dict(counters[group]) for group in ("stats", "frames") if counters.get(group)}


# ------------------------------------------------------------------------------------- main
def after_warmup_s(run: dict) -> float | None:
    """A run's decoding seconds less its warm-up: lm-eval's batch probe (hf) or the engine's compiles and
    captures (eglr-hf, captured); the per-token cost of the decoding itself."""
    decode = run.get("decode_s")
    if decode is None:
        return None
    engine = (run.get("warmup") or {}).get("engine") or {}
    return decode - (engine.get("compile_seconds") or 0.0) - (engine.get("capture_seconds") or 0.0)


def summarise(runs: dict) -> dict:
    """Per run: tokens/s (wall, without lm-eval's probe, after every warm-up), batch chosen, peak memory;
    each eglr run against hf at the same batch; L=4's per-token cost against L=0's and the paper's bound
    (``flop_ratio``: 1 + rho k L/N of its own run) plus 10 %; whether all runs saw the same prompts."""
    out: dict = {}
    for run, r in runs.items():
        out[run] = {k: r.get(k) for k in ("returncode", "timed_out", "generate_s", "generated_tokens", "tokens_per_s",
                                          "tokens_per_s_decoding", "load_s", "peak_gpu_mib", "prompts")}
        seconds = after_warmup_s(r)
        out[run]["tokens_per_s_after_warmup"] = (r["generated_tokens"] / seconds
                                                 if seconds and r.get("generated_tokens") else None)
        out[run]["batch_chosen"] = (r.get("batch") or {}).get("chosen")
        warmup = r.get("warmup") or {}
        out[run]["batch_detect_s"], out[run]["warmup_engine"] = warmup.get("batch_detect_s"), warmup.get("engine")
    for key in ("tokens_per_s", "tokens_per_s_decoding", "tokens_per_s_after_warmup"):
        for run in runs:
            hf = hf_anchor(run, runs)
            if run_parts(run)[0] == "hf" or hf is None:
                continue
            mine, theirs = out[run].get(key), out[hf].get(key)
            out[f"{key}_ratio[{run}/{hf}]"] = mine / theirs if mine and theirs else None
    for l4 in [run for run in runs if run_parts(run)[0] == "eglr_L4"]:
        l0 = "eglr_L0" + l4[len("eglr_L4"):]
        mine, base = out[l4].get("tokens_per_s_after_warmup"), out.get(l0, {}).get("tokens_per_s_after_warmup")
        bound = ((runs[l4].get("results") or {}).get("eglr") or {}).get("stats", {}).get("flop_ratio")
        ratio = base / mine if mine and base else None
        out[f"per_token_ratio[{l4}/{l0}]"] = {
            "after_warmup": ratio, "paper_bound": bound, "allowed": bound * 1.1 if bound else None,
            "within": ratio <= bound * 1.1 if ratio and bound else None}
    shas = {r.get("prompts_sha256") for r in runs.values() if r.get("prompts_sha256")}
    out["same_prompts"] = len(shas) == 1 if len(shas) else None
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="full", choices=SIZES, help="full = Qwen2.5-3B's shapes; tiny = CPU seconds")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--runs", default=",".join(DEFAULT_RUNS), help=f"comma list of {', '.join(RUNS)}, each "
                        "optionally NAME@BATCH (its --batch_size: rows or auto; default auto), e.g. hf@32")
    parser.add_argument("--limit", type=int, help="GSM8K problems (lm_eval --limit; full: 32)")
    parser.add_argument("--max_gen_toks", type=int, help="new tokens at most per rollout (full: 256)")
    parser.add_argument("--dtype", help="weights' dtype (full: bfloat16; tiny: float32)")
    parser.add_argument("--tau_h", default=None, help="eglr-hf's tau_h: a number, or auto (the paper's capped "
                        "calibration inside eglr-hf); default: the checkpoint's own uncapped p95")
    parser.add_argument("--hf_model_args", default="", help="extra --model_args of the hf run, e.g. max_length=4096")
    parser.add_argument("--eglr_model_args", default="",
                        help="extra --model_args of the eglr-hf runs, e.g. compile=none")
    parser.add_argument("--data_dir", default=None, help="benchmark data folder (default: EGLR_DATA_DIR, else "
                        "../shared/data beside the checkout)")
    parser.add_argument("--checkpoint_dir", default=None, help="where the checkpoint is built (default: a folder "
                        "in the temp dir); reused when it was built with the same size and dtype")
    parser.add_argument("--rebuild", action="store_true", help="build the checkpoint even when one is there")
    parser.add_argument("--work_dir", default=None, help="lm_eval outputs and logs (default: <out>_runs)")
    parser.add_argument("--budget_s", type=float, help="seconds for all runs: a run starts only while time is left "
                        "and is killed when it runs out (full: 530, for a 10-minute call; 0 = no limit)")
    parser.add_argument("--bpe_vocab", type=int, help="BPE vocabulary learned from GSM8K, its 256 bytes "
                        "included (full: 8192)")
    parser.add_argument("--calib_prompts", type=int, help="prompts of the tau_h calibration (full: 16)")
    parser.add_argument("--calib_tokens", type=int, help="new tokens per calibration prompt (full: 128)")
    parser.add_argument("--logit_std", type=float, default=None, help="see gpu_check.DEFAULT_LOGIT_STD")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="the JSON report")
    args = parser.parse_args(argv)
    gpu_check().apply_size_defaults(args, SIZE_DEFAULTS)
    runs = [r.strip() for r in args.runs.split(",")]
    bad = [r for r in runs if not RUN_SPEC.fullmatch(r) or run_parts(r)[0] not in RUNS]
    if bad or not args.runs.strip():
        raise ValueError(f"--runs={args.runs!r}: unknown {bad or 'empty list'}; allowed: {', '.join(RUNS)}, each "
                         "optionally @BATCH (a positive number of rows, or auto)")
    if len(set(runs)) < len(runs):
        raise ValueError(f"--runs={args.runs!r}: a run named twice")
    args.runs = runs
    for flag in ("limit", "max_gen_toks", "bpe_vocab", "calib_prompts", "calib_tokens"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag}={getattr(args, flag)}: must be >= 1")
    if args.dtype not in ("bfloat16", "float16", "float32"):
        raise ValueError(f"--dtype={args.dtype!r}: allowed: bfloat16, float16, float32")
    if args.tau_h not in (None, "auto"):
        try:
            float(args.tau_h)
        except ValueError:
            raise ValueError(f"--tau_h={args.tau_h!r}: expected a number of nats or auto") from None
    if args.budget_s < 0:
        raise ValueError(f"--budget_s={args.budget_s}: must be >= 0 (0 = no limit)")
    args.budget_s = args.budget_s or None
    if args.logit_std is None:
        args.logit_std = gpu_check().DEFAULT_LOGIT_STD
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    data = args.data_dir or os.environ.get("EGLR_DATA_DIR") or str(ROOT.parent / "shared" / "data")
    args.data_dir = Path(data).expanduser().resolve()
    if not (args.data_dir / "gsm8k" / "test.jsonl").is_file():
        raise ValueError(f"--data_dir={str(args.data_dir)!r}: no gsm8k/test.jsonl there; point it (or EGLR_DATA_DIR) "
                         "at a folder laid out like ../shared/data")
    out = Path(args.out)
    args.work_dir = Path(args.work_dir or out.with_name(out.stem + "_runs")).resolve()
    args.checkpoint_dir = Path(args.checkpoint_dir or Path(tempfile.gettempdir()) / f"eglr-e2e-{FAMILY}-{args.size}")
    return args


def main(argv: list[str] | None = None) -> dict:
    """Build (or reuse) the checkpoint, run the asked runs within the budget; returns (and writes) the report."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    started = time.perf_counter()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    report: dict = {"issue": 33, "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                    "runs": {}}

    def save() -> None:
        report["wall_s"] = time.perf_counter() - started
        report["summary"] = summarise(report["runs"])
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1, default=str) + "\n")

    info = report["checkpoint"] = checkpoint_info(args.checkpoint_dir, args)
    report["checkpoint_s"] = time.perf_counter() - started
    tau_h = args.tau_h if args.tau_h is not None else f"{info['tau_h']:.6g}"
    report["tau_h"] = tau_h
    commands = assemble(args.checkpoint_dir, tau_h, args, args.work_dir)
    report["commands"] = {run: "python -m eglr_harness " + shlex.join(argv) for run, argv in commands.items()}
    save()
    env = run_env(args)
    for run, argv in commands.items():
        left = None if args.budget_s is None else args.budget_s - (time.perf_counter() - started)
        if left is not None and left <= 0:
            report["runs"][run] = {"skipped": f"--budget_s {args.budget_s:g} spent"}
            continue
        logger.info("%s: %s", run, report["commands"][run])
        report["runs"][run] = run_one(run, argv, work_dir=args.work_dir, env=env, timeout=left)
        logger.info("%s: %s", run,
                    {k: report["runs"][run].get(k) for k in ("returncode", "generate_s", "tokens_per_s")})
        save()
    save()
    print(json.dumps(report["summary"], indent=1, default=str))
    return report


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--probe":  # a run's child: python gpu_e2e.py --probe OUT -- <lm_eval args>
        if "--" not in sys.argv:
            raise SystemExit("usage: gpu_e2e.py --probe OUT.json -- <lm_eval args>")
        probe(sys.argv[2], sys.argv[sys.argv.index("--") + 1:])
    elif len(sys.argv) == 4 and sys.argv[1] == "--build":  # the checkpoint's child: --build FOLDER KWARGS_JSON
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
        build_checkpoint(sys.argv[2], **json.loads(sys.argv[3]))
    else:
        main(sys.argv[1:])
