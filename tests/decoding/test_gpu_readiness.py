"""GPU readiness of the continuous engine, checked on a CPU (issue 29).

What a GPU needs of the decoding step, and how each is checked here without one:

1. **No host read inside ``decode_step``.** The step runs on the ``meta`` device, a device with no
   data: every way of reading a value on the host (``.item()``, ``.tolist()``, ``.cpu()``,
   ``.numpy()``, ``if tensor:``, ``int(tensor)``) reaches the dispatcher as ``_local_scalar_dense``
   or as a copy to another device, and every data-dependent op (``nonzero``, ``masked_select``,
   ``unique``, ...) has no meta kernel. ``HostReadCounter`` (a ``TorchDispatchMode``) records all
   of them, whether the op then raises or not. Allowed inside the step: zero.
2. **One small read per engine loop step.** A real CPU run of ``ContinuousEngine``: every loop
   step reads the one tensor ``decode_step`` returned, (rows, len(READ_FIELDS)) fp32, with
   ``.tolist()``; every prefill reads its one ``settle`` result; the host's bookkeeping between
   them (admission, retirement, K/V resizing) reads nothing; no data-dependent op runs anywhere.
   (Stop strings are left out: their check runs on host tensors built from host lists.) Nor may a
   step upload host data with a blocking copy (``torch.tensor(data, device=cuda)`` syncs the
   stream): ``test_a_loop_step_makes_no_blocking_upload`` (the step's indices go up pinned and
   non-blocking).
3. **A bounded number of compilations, none after warm-up** (issue 32). Runs of several batch sizes,
   pools (L and T), K/V widths and prompt lengths (chunked prefills), each run twice, in one process,
   with the decoder layer compiled by dynamo (no code generated): dynamo's own count of compiled
   graphs stays at ``step_graphs.COMPILATION_BOUND`` and the tokens are the eager ones. A compilation
   after warm-up is counted, logged and decoded eagerly.
4. **One capture per (rows, refining rows, K/V width) bucket, replayed across widths and runs.** CUDA
   graphs are recorded through a CPU stand-in with their semantics (what a recording reads as Python
   values and which tensors it uses are fixed at recording): one recording per key met, none for a
   key met before (a second run of the same requests records nothing: the workspace did not move),
   tokens equal eager tokens; a workspace too small for the next run is replaced and its graphs dropped.

Each check has a twin that breaks the step on purpose (a host read injected into ``settle``, or a
step that recompiles) and asserts that the check reports it: a check that cannot fail checks nothing.
"""

from __future__ import annotations

import sys
from collections import Counter
from contextlib import contextmanager

import pytest
import torch
from helpers.host_reads import HostReadCounter
from helpers.inputs import random_prompts
from helpers.region_ops import RegionOps
from helpers.replay_graph import ReplayGraph
from helpers.tiny_models import MORE_ARCHS, TINY_ARCHS, build_tiny_model

from eglr_harness.core.config import EglrConfig
from eglr_harness.decoding.continuous import engine as continuous
from eglr_harness.decoding.continuous import fixed_step, step_graphs
from eglr_harness.decoding.continuous.engine import ContinuousEngine
from eglr_harness.decoding.continuous.fixed_step import decode_step
from eglr_harness.decoding.continuous.kv_slots import SlotCache
from eglr_harness.decoding.continuous.stack import ModelStack
from eglr_harness.decoding.continuous.step_key import row_buckets
from eglr_harness.decoding.continuous.step_state import READ_FIELDS, SlotState, StepInvariants
from eglr_harness.decoding.contract import Request
from eglr_harness.decoding.processors import LogitsOptions

VOCAB, LAYERS, EOS = 96, 4, 2
TAU_KL = 4.4e-4
META = torch.device("meta")

@contextmanager
def injected_read(kind: str):
    """Break the step on purpose: ``settle`` (inside ``decode_step``) reads its result on the host."""
    real = fixed_step.settle
    reads = {
        "item": lambda read: read[0, 0].item(),
        "tolist": lambda read: read.tolist(),
        "cpu": lambda read: read.cpu(),
        "if": lambda read: bool(read[0, 0] > 0),
        "nonzero": lambda read: torch.nonzero(read[:, 1]),
        "masked_select": lambda read: read.masked_select(read > 0),
    }

    def reading_settle(*args, **kwargs):
        read = real(*args, **kwargs)
        try:
            reads[kind](read)
        except (RuntimeError, NotImplementedError):
            pass  # on meta the read itself fails; the counter has recorded it
        return read

    fixed_step.settle = reading_settle
    try:
        yield
    finally:
        fixed_step.settle = real


# ---------------------------------------------------------------- 1. inside the step, on meta
GREEDY = [EglrConfig(L=2, tau_h=0.0, tau_kl=TAU_KL), EglrConfig(L=0), EglrConfig(L=4, tau_h=0.0, tau_kl=TAU_KL),
          EglrConfig(L=1, tau_h=0.0, tau_kl=TAU_KL)]
SAMPLED = [EglrConfig(L=2, T=0.7, top_k=20, top_p=0.9, tau_h=0.0, tau_kl=TAU_KL), EglrConfig(L=0),
           EglrConfig(L=4, tau_h=0.0, tau_kl=TAU_KL), EglrConfig(L=0, T=1.0, top_k=0)]
# generate's logits processors, every one the step applies (one option set per row)
PROCESSED = [LogitsOptions(repetition_penalty=1.05, no_repeat_ngram_size=3, min_new_tokens=2),
             LogitsOptions(suppress_tokens=(5, 7), begin_suppress_tokens=(9,), min_length=12),
             LogitsOptions(min_p=0.1, repetition_penalty=1.3), LogitsOptions(no_repeat_ngram_size=3, min_p=0.05)]
# (advancing, refining) slots of successive steps over 4 slots; slot 4 is the trash slot that
# padding rows of a compiled step name
STEPS = [([0, 1, 2, 3], []), ([0, 1], [2, 3]), ([1, 4], [0, 2]), ([3], [0, 1, 2, 4]), ([0, 1, 2, 3], [4])]


def host_reads_of_meta_steps(arch: str, configs: list[EglrConfig], options=None) -> tuple[list, Counter]:
    """Run ``STEPS`` through ``decode_step`` with the model and every tensor on ``meta``."""
    model = build_tiny_model(arch, vocab_size=VOCAB, num_layers=LAYERS, seed=1).to(META)
    stack = ModelStack.of(model)
    num_slots = len(configs)
    options = options or [LogitsOptions()] * num_slots
    invariants = StepInvariants.of(configs, LAYERS, VOCAB, stack.parts.logit_softcap, options)
    cache = SlotCache(num_slots + 1, 16)
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    like = torch.empty(1, config.num_key_value_heads, 1, head_dim, device=META)
    for layer in range(LAYERS):
        cache.storage(layer, like)  # what the first prefill allocates
    state = SlotState.allocate(num_slots, model.config.hidden_size, VOCAB, torch.float32, META,
                               processors=invariants.processors, eos_token_ids=[EOS], history_width=cache.width)
    prompts = [tuple(range(3, 3 + n)) for n in (6, 10, 4, 8)[:num_slots]]
    admit = lambda: state.admit(list(range(num_slots)), configs, list(range(1, num_slots + 1)), prompts, options)
    with torch.device("cpu"):
        try:
            admit()
        except (NotImplementedError, RuntimeError):  # per-slot token lists written on meta: admission is host work
            pass
    index = lambda slots: torch.tensor(slots, dtype=torch.long, device=META)
    with torch.no_grad(), stack.slot_attention(), HostReadCounter(META) as counter:
        for advancing, refining in STEPS:
            try:
                read = decode_step(stack, invariants, state, cache, index(advancing), index(refining))
            except (RuntimeError, NotImplementedError):
                break  # recorded by the counter
            assert read.shape == (len(advancing) + len(refining), len(READ_FIELDS)) and read.device == META
    return counter.reads, counter.ops


@pytest.mark.parametrize("configs", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("arch", ["llama", "gemma2", "gemma3"])
def test_the_step_reads_nothing_on_the_host(arch, configs):
    """Advancing and refining rows (several L), padding rows, greedy and sampled plans, soft-caps
    (Gemma-2), sliding and full layers (Gemma-3): zero host reads, zero data-dependent ops."""
    reads, ops = host_reads_of_meta_steps(arch, configs)
    assert reads == []
    assert ops["aten.mm"] + ops["aten.addmm"] > 0 and ops["aten.index_copy_"] > 0  # the step did run
    if configs is SAMPLED:
        assert ops["aten.topk"] > 0  # the draw ran


@pytest.mark.parametrize("configs", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_the_logits_processors_read_nothing_on_the_host(configs):
    """Repetition penalty, n-gram bans, EOS bans, suppressed tokens and min-p: masks and scatters only."""
    reads, ops = host_reads_of_meta_steps("llama", configs, PROCESSED)
    assert reads == []
    assert ops["aten.unfold"] > 0 and ops["aten.index_put_"] > 0  # the n-gram ban and the seen/history updates ran


@pytest.mark.parametrize("kind", ["item", "tolist", "cpu", "if", "nonzero", "masked_select"])
def test_a_host_read_injected_into_the_step_is_caught(kind):
    with injected_read(kind):
        reads, _ = host_reads_of_meta_steps("llama", SAMPLED)
    assert reads, f"an injected {kind} read went unnoticed"
    assert "fixed_step.py" in reads[0][1]  # located: the decode_step line that called settle


# ---------------------------------------------------------------- 2. the engine loop, on CPU
def loop_requests(new=(4, 9, 6, 3, 8, 5)) -> list[Request]:
    """Six requests for three slots (rows join late, finish at different lengths): refining greedy
    and sampled rows beside plain ones, no stop strings."""
    configs = [EglrConfig(L=2, tau_h=0.0, tau_kl=TAU_KL), EglrConfig(L=0),
               EglrConfig(L=4, T=0.7, top_k=20, top_p=0.9, tau_h=0.0, tau_kl=TAU_KL), EglrConfig(L=1, tau_h=0.0,
                                                                                                 tau_kl=TAU_KL),
               EglrConfig(L=0, T=1.0, top_k=0), EglrConfig(L=2, tau_h=0.0, tau_kl=TAU_KL)]
    prompts = random_prompts(0, lengths=(9, 3, 17, 5, 7, 4), vocab=VOCAB)
    return [Request(tuple(p), c, n, seed=11 + i) for i, (p, c, n) in enumerate(zip(prompts, configs, new))]


def loop_reads(monkeypatch) -> dict:
    """Decode ``loop_requests`` eagerly, recording every host read by where it happened: inside a
    loop step (one list per step), inside a prefill (one list per prefill), or elsewhere; and every
    upload of host data that the engine's host code makes (``torch.tensor(data, device=...)``,
    ``.to(device)`` or ``.cuda()`` without ``non_blocking=True``: on CUDA a copy with
    ``non_blocking=False``, i.e. ``cudaMemcpyAsync`` + ``cudaStreamSynchronize``), as
    ``("upload", "engine.py:<line>")`` entries (the continuous engine's file) of the same lists."""
    requests = loop_requests()
    windows = {"step": [], "prefill": [], "elsewhere": []}
    current = [windows["elsewhere"]]
    returned = []  # the tensors decode_step returned

    def window(kind, method):
        def wrapped(run, *args, **kwargs):
            reads = []
            windows[kind].append(reads)
            current.append(reads)
            try:
                return method(run, *args, **kwargs)
            finally:
                current.pop()
        return wrapped

    for kind in ("step", "prefill"):
        monkeypatch.setattr(continuous._Run, kind, window(kind, getattr(continuous._Run, kind)))
    for method in ("tolist", "numpy"):
        real = getattr(torch.Tensor, method)

        def reading(tensor, *args, _real=real, _method=method, **kwargs):
            current[-1].append((_method, tuple(tensor.shape), any(tensor is r for r in returned)))
            return _real(tensor, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, method, reading)
    make_tensor = torch.tensor

    def uploading(data, *args, **kwargs):
        caller = sys._getframe(1)
        if kwargs.get("device") is not None and caller.f_code.co_filename == continuous.__file__:
            current[-1].append(("upload", f"engine.py:{caller.f_lineno}"))
        return make_tensor(data, *args, **kwargs)
    monkeypatch.setattr(torch, "tensor", uploading)
    def moving(name):
        real = getattr(torch.Tensor, name)

        def move(tensor, *args, **kwargs):
            caller = sys._getframe(1)
            to_device = name == "cuda" or "device" in kwargs or any(
                isinstance(a, (str, torch.device, torch.Tensor)) for a in args)
            if to_device and not kwargs.get("non_blocking") and caller.f_code.co_filename == continuous.__file__:
                current[-1].append(("upload", f"engine.py:{caller.f_lineno}"))
            return real(tensor, *args, **kwargs)
        return move
    for name in ("to", "cuda"):
        monkeypatch.setattr(torch.Tensor, name, moving(name))

    model = build_tiny_model("llama", vocab_size=VOCAB, num_layers=LAYERS, seed=1)
    engine = ContinuousEngine(model, max_batch=2, eos_token_ids=[EOS])
    step = engine.step_fn

    def recording_step(*args):
        returned.append(step(*args))
        return returned[-1]
    engine.step_fn = recording_step
    start = continuous.StepRead.start.__func__

    def copying(cls, read, *args):  # the host reads the step's result through its copy (StepRead)
        launched = start(cls, read, *args)
        if any(read is r for r in returned):
            returned.append(launched.host)
        return launched
    monkeypatch.setattr(continuous.StepRead, "start", classmethod(copying))
    with HostReadCounter(torch.device("cpu")) as counter:
        outcomes = engine.run(requests)
    windows["data_dependent"] = counter.reads
    windows["outcomes"] = outcomes
    return windows


def reads_of(window: list) -> list:
    return [entry for entry in window if entry[0] != "upload"]


def loop_violations(windows: dict) -> list[str]:
    """What breaks 'one small read per loop step' (empty when it holds)."""
    windows = {kind: [reads_of(w) for w in windows[kind]] if kind in ("step", "prefill") else
               reads_of(windows[kind]) if kind == "elsewhere" else windows[kind] for kind in windows}
    bad = [f"{len(reads)} reads in a step: {reads}" for reads in windows["step"] if len(reads) != 1]
    fields = len(READ_FIELDS)
    bad += [f"a step read something other than what decode_step returned: {reads[0]}" for reads in windows["step"]
            if len(reads) == 1 and not (reads[0][0] == "tolist" and reads[0][2] and reads[0][1][1:] == (fields,))]
    bad += [f"{len(reads)} reads in a prefill: {reads}" for reads in windows["prefill"] if len(reads) != 1]
    bad += [f"a read outside steps and prefills: {read}" for read in windows["elsewhere"]]
    bad += [f"a data-dependent op: {what} at {where}" for what, where in windows["data_dependent"]]
    return bad


def test_the_engine_loop_reads_one_small_tensor_per_step(monkeypatch):
    windows = loop_reads(monkeypatch)
    assert loop_violations(windows) == []
    outcomes = windows["outcomes"]
    # the run covered what it should: late joins, refinement, rows of every length finishing
    assert len(windows["prefill"]) >= 3 and len(windows["step"]) >= 20
    assert sum(o.gated for o in outcomes) > 0
    assert [len(o.tokens) for o in outcomes] == [4, 9, 6, 3, 8, 5]
    largest = max(reads_of(window)[0][1][0] for window in windows["step"])
    assert largest <= 3 + 2  # rows of a step: max_batch + refine headroom (+ padding): a small read


def test_a_loop_step_makes_no_blocking_upload(monkeypatch):
    """With the read, the step's one host sync: no upload of host data that waits for the device."""
    windows = loop_reads(monkeypatch)
    uploads = [[entry for entry in window if entry[0] == "upload"] for window in windows["step"]]
    assert len(uploads) >= 20
    assert [u for u in uploads if u] == []


@pytest.mark.parametrize("kind", ["item", "tolist"])
def test_an_extra_read_in_the_loop_step_is_caught(monkeypatch, kind):
    with injected_read(kind):
        windows = loop_reads(monkeypatch)
    assert loop_violations(windows)


# ---------------------------------------------------------------- 3, 4. compiled once, captured per bucket
COMPILE_LAYERS = 2
COMPILE_BOUND = step_graphs.COMPILATION_BOUND


def pool_requests(seed: int, lengths, new, configs) -> list[Request]:
    prompts = random_prompts(seed, lengths=lengths, vocab=VOCAB)
    return [Request(tuple(p), configs[i % len(configs)], new[i % len(new)], seed=11 + i) for i, p in enumerate(prompts)]


def process_sequence() -> list[tuple[int, list[Request]]]:
    """(max_batch, requests) of the runs of one process: rows join late, refine (none, one, many at
    once), cross K/V widths up and down and finish; then another batch size, another pool (several L
    and T, sampled), longer prompts (prefilled in chunks) and more new tokens."""
    always = dict(tau_h=0.0, tau_kl=TAU_KL)
    first = [EglrConfig(L=2, **always), EglrConfig(L=0),
             EglrConfig(L=COMPILE_LAYERS, T=0.7, top_k=20, top_p=0.9, **always),
             EglrConfig(L=1, **always), EglrConfig(L=0, T=1.0, top_k=0)]
    pool = [EglrConfig(L=L, T=T, top_k=20, tau_h=0.5, tau_kl=TAU_KL) for L in (1, 2) for T in (0.0, 0.6)]
    return [(2, pool_requests(0, (9, 3, 5, 2, 4), (3, 12, 6, 9, 10), first)),
            (3, pool_requests(1, (30, 2, 11, 6, 17, 8), (12, 3, 20), pool)),
            (1, pool_requests(2, (61, 8), (26, 5), [EglrConfig(L=1, **always)]))]


def compile_violations(compiles: int, late: int) -> list[str]:
    """What breaks 'a bounded number of compilations whatever the run, none after warm-up'."""
    bad = [f"{compiles} compilations, more than the bound ({COMPILE_BOUND})"] if compiles > COMPILE_BOUND else []
    return bad + ([f"{late} compilations after warm-up"] if late else [])


def run_sequence(compile: bool, backend="eager") -> tuple[list[list], list[ContinuousEngine]]:
    """Decode ``process_sequence`` (one engine per batch size, all in this process); returns the
    outcomes of each run and the engines."""
    model = build_tiny_model("llama", vocab_size=VOCAB, num_layers=COMPILE_LAYERS, seed=1)
    engines, results = {}, []
    for max_batch, requests in process_sequence():
        if max_batch not in engines:
            engines[max_batch] = ContinuousEngine(model, max_batch=max_batch, eos_token_ids=[], kv_bucket=4,
                                                  prefill_tokens=24, compile=compile, compile_backend=backend)
        results.append(engines[max_batch].run(requests))
        results.append(engines[max_batch].run(requests))  # and once more: nothing new
    return results, list(engines.values())


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()  # compilations made by other tests would count here
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


def test_a_process_compiles_the_step_a_bounded_number_of_times(fresh_dynamo):
    """Dynamo's own count over runs of several batch sizes, pools, K/V widths and prompt lengths
    (traced by dynamo, no code generated): at most the bound, none after warm-up; tokens as eager."""
    compiled, engines = run_sequence(compile=True)
    compiles = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    reports = [engine.warmup_report() for engine in engines]
    assert compile_violations(compiles, sum(r["late_compiles"] for r in reports)) == []
    assert compiles == sum(r["compiles"] for r in reports) >= 1  # the engines' own count agrees
    eager, _ = run_sequence(compile=False)
    assert [[o.tokens for o in run] for run in compiled] == [[o.tokens for o in run] for run in eager]
    assert ([[o.token_iterations for o in run] for run in compiled]
            == [[o.token_iterations for o in run] for run in eager])
    assert sum(o.gated for run in eager for o in run) > 0


def issue39_sequence() -> list[tuple[int, list[Request]]]:
    """Six runs of one process (batch 2, 5, 1, 3, 8, 2; prompts of 1-300 tokens, prefilled in chunks): the
    K/V width a step reads crosses the storage's capacity in the first run and stays below it in later ones."""
    always = dict(tau_h=0.0, tau_kl=TAU_KL)
    configs = [EglrConfig(L=1, **always), EglrConfig(L=0), EglrConfig(L=COMPILE_LAYERS, T=0.7, top_k=20, **always)]
    lengths = [(3, 9, 2), (40, 1, 17, 6, 300, 12), (5,), (120, 2, 33, 8), tuple(range(1, 80, 9)), (250, 4, 1)]
    new = [(6, 3, 8), (4, 9, 5), (7,), (3, 10, 6), (2, 5, 8), (9, 4, 6)]
    return [(batch, pool_requests(10 + i, lengths[i], new[i], configs)) for i, batch in enumerate((2, 5, 1, 3, 8, 2))]


@pytest.mark.parametrize("capture", [False, True], ids=["compiled", "captured"])
def test_the_real_compiler_compiles_once_and_never_after_warm_up(monkeypatch, fresh_dynamo, capture):
    """inductor (what compile=default runs, and what reduce-overhead runs inside its CUDA graphs) over the
    six runs of ``issue39_sequence``, one engine per batch size: a bounded number of compilations, none
    late (a late one would have run eagerly and been counted), every step after warm-up compiled, the
    eager tokens. Captured: the CPU stand-in for CUDA graphs, a short run first (as calibration is)."""
    if capture:
        monkeypatch.setattr(step_graphs, "CudaGraph", ReplayGraph)
    model = build_tiny_model("llama", vocab_size=VOCAB, num_layers=COMPILE_LAYERS, seed=1)
    runs = issue39_sequence()
    engines, compiled, eager = {}, [], []
    for max_batch, requests in runs:
        if max_batch not in engines:
            engines[max_batch] = ContinuousEngine(model, max_batch=max_batch, eos_token_ids=[], kv_bucket=4,
                                                  prefill_tokens=64, compile=True, compile_backend="inductor")
            engines[max_batch].runner.capture = capture
        compiled.append(engines[max_batch].run(requests))
        eager.append(ContinuousEngine(model, max_batch=max_batch, eos_token_ids=[], kv_bucket=4,
                                      prefill_tokens=64).run(requests))
    reports = [engine.warmup_report() for engine in engines.values()]
    compiles = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert compile_violations(compiles, sum(r["late_compiles"] for r in reports)) == []
    assert sum(r["eager_steps"] for r in reports) == 0 and sum(r["steps"] for r in reports) > 50
    if capture:
        assert sum(r["captures"] for r in reports) > 5
    assert [[o.tokens for o in run] for run in compiled] == [[o.tokens for o in run] for run in eager]
    assert ([[o.token_iterations for o in run] for run in compiled]
            == [[o.token_iterations for o in run] for run in eager])
    assert sum(o.gated for run in eager for o in run) > 0


def test_the_bound_check_sees_a_step_compiled_per_shape(monkeypatch, fresh_dynamo):
    """Broken on purpose: without the sizes marked dynamic (and without dynamo's automatic dynamic
    shapes), every new row count or K/V width compiles again, and the check must say so."""
    monkeypatch.setattr(torch._dynamo, "maybe_mark_dynamic", lambda tensor, dim: None)
    with torch._dynamo.config.patch(automatic_dynamic_shapes=False):
        run_sequence(compile=True)
    assert compile_violations(torch._dynamo.utils.counters["stats"]["unique_graphs"], 0)


GLUE_OPS = {"aten.cos", "aten.sin", "aten.pow", "aten.rsqrt", "aten.mm"}  # rotary angles, final norm, unembedding


def test_a_compiled_step_computes_its_angles_and_logits_inside_compiled_regions(fresh_dynamo):
    """The kernels of a compiled step: the rotary angles are computed inside the compiled decoder layer (from the
    positions the step hands it) and the final norm and unembedding are a compiled region of their own, so none
    of their ops runs on its own between the regions; each step calls the layer once per layer and the
    unembedding once, refining steps too; the tokens are the eager ones."""
    model = build_tiny_model("llama", vocab_size=VOCAB, num_layers=COMPILE_LAYERS, seed=1)
    requests = process_sequence()[0][1]  # rows that join, refine and sample
    with RegionOps() as counter:
        outcomes = ContinuousEngine(model, max_batch=2, eos_token_ids=[], kv_bucket=4, compile=True,
                                    compile_backend="eager").run(requests)
    eager = ContinuousEngine(model, max_batch=2, eos_token_ids=[], kv_bucket=4).run(requests)
    assert len(counter.steps) > 10
    for ops, regions in counter.steps:
        assert regions == {"decoder layer": COMPILE_LAYERS, "unembedding": 1}
        assert GLUE_OPS & set(ops) == set()
    assert [o.tokens for o in outcomes] == [o.tokens for o in eager]
    assert sum(o.gated for o in eager) > 0


def test_a_compilation_after_warm_up_is_counted_logged_and_decoded_eagerly(fresh_dynamo, caplog):
    """After warm-up, a call that would compile (here: a layer attribute dynamo guards on changes)
    runs eagerly, counted in late_compiles and said in the log, and the run finishes."""
    model = build_tiny_model("llama", vocab_size=VOCAB, num_layers=COMPILE_LAYERS, seed=1)
    requests = process_sequence()[0][1]
    engine = ContinuousEngine(model, max_batch=2, eos_token_ids=[], kv_bucket=4, compile=True, compile_backend="eager")
    engine.run(requests)
    assert engine.warmup_report()["late_compiles"] == 0
    for layer in model.model.layers:
        layer.self_attn.scaling = layer.self_attn.scaling * 1.0001
    eager = ContinuousEngine(model, max_batch=2, eos_token_ids=[], kv_bucket=4).run(requests)
    with caplog.at_level("WARNING"):
        late = engine.run(requests)
    report = engine.warmup_report()
    assert report["late_compiles"] > 0 and report["eager_steps"] > 0
    assert caplog.text.count("needed a compilation after warm-up") == 1  # at once, with dynamo's reason
    # and again at the end of the run: every step of this run ran its layers eagerly
    steps = sum(1 for r in caplog.records if "decoding steps of this run" in r.getMessage())
    assert steps == 1 and f"{report['eager_steps']} of " in caplog.text and "(100 %)" in caplog.text
    assert [o.tokens for o in late] == [o.tokens for o in eager]


def capture_requests() -> list[Request]:
    """Rows that join late, refine and finish so that the K/V width the steps read goes up, down and up."""
    always = dict(tau_h=0.0, tau_kl=TAU_KL)
    configs = [EglrConfig(L=2, **always), EglrConfig(L=0), EglrConfig(L=COMPILE_LAYERS, T=0.7, top_k=20, **always),
               EglrConfig(L=1, **always), EglrConfig(L=0, T=1.0, top_k=0)]
    return pool_requests(3, (14, 2, 3, 2, 10), (30, 4, 60, 3, 6), configs)


def capturing_engine(model, monkeypatch, max_batch=2, **kwargs) -> ContinuousEngine:
    monkeypatch.setattr(step_graphs, "CudaGraph", ReplayGraph)
    engine = ContinuousEngine(model, max_batch=max_batch, eos_token_ids=[], kv_bucket=2, prefill_tokens=24,
                              compile=True, compile_backend="eager", **kwargs)
    engine.runner.capture = True  # what compile_mode="reduce-overhead" turns on, on CUDA
    return engine


def step_keys(engine: ContinuousEngine) -> list[tuple]:
    """Wrap the engine's step: the (advancing rows, refining rows, K/V width) of every step it takes;
    ``engine.addresses`` gets where its storage and state live at each step."""
    keys, step = [], engine.step_fn
    engine.addresses = set()

    def keyed(stack, key, state, cache, advancing, refining):
        keys.append((advancing.shape[0], refining.shape[0], cache.width))
        engine.addresses.add((cache.keys[0].data_ptr(), state.position.data_ptr(), state.history.data_ptr()))
        return step(stack, key, state, cache, advancing, refining)
    engine.step_fn = keyed
    return keys


def eager_and_capturing(monkeypatch) -> tuple:
    """``capture_requests``, their eager outcomes, and a capturing engine over the same model whose steps' keys are
    recorded."""
    model = build_tiny_model("llama", vocab_size=VOCAB, num_layers=COMPILE_LAYERS, seed=1)
    requests = capture_requests()
    eager = ContinuousEngine(model, max_batch=2, eos_token_ids=[], kv_bucket=2).run(requests)
    engine = capturing_engine(model, monkeypatch)
    return requests, eager, engine, step_keys(engine)


def capture_violations(keys: list[tuple], report: dict) -> list[str]:
    """What breaks 'one recording per (rows, refining rows, width) key met, none for a key seen before'."""
    met = sorted(set(keys))
    recorded = sorted(tuple(k) for k in report["capture_keys"])
    bad = [] if recorded == met else [f"recorded {recorded}, met {met}"]
    return bad + ([f"{report['compiles']} compilations while recording"] if report["compiles"] > COMPILE_BOUND else [])


def test_captures_one_graph_per_bucket_and_width_and_replays_it_across_runs(monkeypatch, fresh_dynamo):
    requests, eager, engine, keys = eager_and_capturing(monkeypatch)
    first = engine.run(requests)
    recorded = engine.warmup_report()["captures"]
    again = engine.run(requests)  # the same workspace: every graph replays, none is recorded again
    report = engine.warmup_report()
    assert capture_violations(keys, report) == []
    assert report["captures"] == recorded == len(set(keys))
    assert len(engine.addresses) == 1  # storage and state never moved, across widths and runs
    widths = [width for _, _, width in keys[:len(keys) // 2]]
    drop = next(i for i in range(1, len(widths)) if widths[i] < widths[i - 1])  # StopIteration: never down
    assert len(set(widths)) >= 4 and widths[0] < widths[drop - 1] and max(widths[drop:]) > widths[drop]  # up, down, up
    assert any(r for _, r, _ in keys) and any(not r for _, r, _ in keys)
    num_slots = 2 + 1  # max_batch + refine headroom
    assert {a for a, *_ in keys} <= {0, *row_buckets(num_slots, 2)}  # 0: a step of refining rows only
    assert {r for _, r, _ in keys} <= {0, *row_buckets(num_slots)}
    for outcomes in (first, again):
        assert [o.tokens for o in outcomes] == [o.tokens for o in eager]
        assert [o.token_iterations for o in outcomes] == [o.token_iterations for o in eager]
    assert sum(o.gated for o in eager) > 0


@pytest.mark.parametrize("arch", [*TINY_ARCHS, "gemma3", *MORE_ARCHS])
def test_compiled_and_captured_steps_give_the_eager_tokens_on_every_family(monkeypatch, fresh_dynamo, arch):
    """Every family the engine drives: the decoder layer compiles whole (fullgraph) within the bound, and
    the captured step (CPU stand-in) gives the eager tokens and refinement counts."""
    model = build_tiny_model(arch, vocab_size=VOCAB, num_layers=LAYERS, seed=1)
    requests = pool_requests(4, (9, 3, 17, 5, 7), (6,), [
        EglrConfig(L=2, tau_h=0.0, tau_kl=TAU_KL), EglrConfig(L=0),
        EglrConfig(L=LAYERS, T=0.7, top_k=20, tau_h=0.0, tau_kl=TAU_KL), EglrConfig(L=1, tau_h=0.0, tau_kl=TAU_KL)])
    eager = ContinuousEngine(model, max_batch=2, eos_token_ids=[], kv_bucket=2).run(requests)
    engine = capturing_engine(model, monkeypatch)
    captured = engine.run(requests)
    report = engine.warmup_report()
    assert not engine.runner.layers.failed and 1 <= report["compiles"] <= COMPILE_BOUND and report["captures"] > 1
    assert [o.tokens for o in captured] == [o.tokens for o in eager]
    assert [o.token_iterations for o in captured] == [o.token_iterations for o in eager]


def test_a_layer_that_cannot_compile_whole_runs_eagerly_with_one_log_line(monkeypatch, fresh_dynamo, caplog):
    """Broken on purpose: a layer that reads a value on the host (a graph break under fullgraph)."""
    model = build_tiny_model("llama", vocab_size=VOCAB, num_layers=COMPILE_LAYERS, seed=1)
    requests = process_sequence()[0][1]
    eager = ContinuousEngine(model, max_batch=2, eos_token_ids=[], kv_bucket=4).run(requests)
    for layer in model.model.layers:
        forward = layer.mlp.forward
        layer.mlp.forward = lambda x, _forward=forward: _forward(x) * (1.0 if float(x.abs().max()) >= 0 else 0.0)
    engine = ContinuousEngine(model, max_batch=2, eos_token_ids=[], kv_bucket=4, compile=True, compile_backend="eager")
    with caplog.at_level("WARNING"):
        outcomes = engine.run(requests)
    assert engine.runner.layers.failed and "every decoder layer call runs eagerly" in caplog.text
    assert [o.tokens for o in outcomes] == [o.tokens for o in eager]


def test_the_capture_check_sees_a_graph_replayed_at_another_width(monkeypatch, fresh_dynamo):
    """Broken on purpose: graphs keyed without the K/V width replay a recording made at another
    width. The stand-in replays what was recorded, as a CUDA graph would: the counts and the tokens say so."""
    from eglr_harness.decoding.continuous.step_key import StepKey

    def rows_only(key):
        return key.invariants, key.advancing, key.refining
    monkeypatch.setattr(StepKey, "__hash__", lambda key: hash(rows_only(key)))
    monkeypatch.setattr(StepKey, "__eq__", lambda key, other: rows_only(key) == rows_only(other))
    requests, eager, engine, keys = eager_and_capturing(monkeypatch)
    broken = engine.run(requests)
    assert capture_violations(keys, engine.warmup_report())
    assert [o.tokens for o in broken] != [o.tokens for o in eager]


def test_a_workspace_too_small_for_the_next_run_is_replaced_and_its_graphs_forgotten(monkeypatch, fresh_dynamo):
    model = build_tiny_model("llama", vocab_size=VOCAB, num_layers=COMPILE_LAYERS, seed=1)
    short, long = process_sequence()[0][1], process_sequence()[2][1]
    engine = capturing_engine(model, monkeypatch)
    engine.run(short)
    workspace = engine.workspace
    outcomes = engine.run(long)  # longer requests: a larger workspace, graphs recorded afresh on it
    assert engine.workspace is not workspace and engine.workspace.cache.capacity > workspace.cache.capacity
    eager = ContinuousEngine(model, max_batch=2, eos_token_ids=[], kv_bucket=4).run(long)
    assert [o.tokens for o in outcomes] == [o.tokens for o in eager]
    assert engine.warmup_report()["compiles"] <= COMPILE_BOUND
