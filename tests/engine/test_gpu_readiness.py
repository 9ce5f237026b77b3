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
3. **No recompilation after warm-up.** The compiled step (dynamo with a counting eager backend,
   on the CUDA path's static-address tensors) over a run whose rows join late, refine, cross K/V
   length buckets both ways and finish: a step compiles exactly when its key (advancing-row bucket,
   refining-row bucket, K/V width; the run's ``StepPlan`` is fixed) is new, one graph each, and a
   second run of the same requests compiles nothing. That run needs 11 graphs, more than dynamo's
   default ``recompile_limit`` (8), which with ``fullgraph=True`` would stop the engine with
   ``FailOnRecompileLimitHit``: the engine sets its own (``test_a_run_beyond_dynamos_default_recompile_limit_completes``).
4. **Compiled tokens equal eager tokens** in the same run (and iteration counts).

Each check has a twin that breaks the step on purpose (a host read injected into ``settle``, or a
step that recompiles) and asserts that the check reports it: a check that cannot fail checks nothing.
"""

from __future__ import annotations

import sys
import traceback
from collections import Counter
from contextlib import contextmanager

import pytest
import torch
from inputs import random_prompts
from tiny_models import build_tiny_model
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from eglr_harness.config import EglrConfig
from eglr_harness.decoding import continuous_engine as continuous, fixed_step, kv_slots as slots, step_state as slot_state
from eglr_harness.decoding.continuous_engine import ContinuousEngine
from eglr_harness.decoding.contract import Request
from eglr_harness.decoding.fixed_step import decode_step
from eglr_harness.decoding.processors import LogitsOptions
from eglr_harness.decoding.step_state import READ_FIELDS, SlotState, StepPlan
from eglr_harness.decoding.kv_slots import SlotCache
from eglr_harness.decoding.stack import ModelStack

VOCAB, LAYERS, EOS = 96, 4, 2
TAU_KL = 4.4e-4
META = torch.device("meta")
DYNAMO_DEFAULT_RECOMPILE_LIMIT = 8  # graphs per code object; the engine sets its own (RECOMPILE_LIMIT)

# ops whose result is a host value or whose output shape depends on the data (overload packets)
DATA_DEPENDENT = frozenset({
    "aten._local_scalar_dense", "aten.item", "aten.is_nonzero", "aten.equal", "aten.allclose",
    "aten.nonzero", "aten.argwhere", "aten.masked_select", "aten.unique", "aten._unique", "aten._unique2",
    "aten.unique_dim", "aten.unique_consecutive", "aten.bincount", "aten.histc",
})
DATA_DEPENDENT_OVERLOADS = frozenset({"aten.repeat_interleave.Tensor", "aten.repeat_interleave.self_Tensor"})


class HostReadCounter(TorchDispatchMode):
    """Records every op that reads a value on the host, depends on the data for its shape, or moves
    a tensor off ``device``; and every op that raised (on ``meta``: a read of data that is not there).

    reads: (what, where) pairs; ``where`` is the innermost frame of ``eglr_harness/decoding`` that called the op.
    """

    def __init__(self, device: torch.device):
        super().__init__()
        self.device = device
        self.reads: list[tuple[str, str]] = []
        self.ops: Counter = Counter()

    def _flag(self, what: str) -> None:
        frames = [f for f in traceback.extract_stack() if "/eglr_harness/decoding/" in f.filename.replace("\\", "/")]
        where = f"{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno} {frames[-1].line}" if frames else "?"
        self.reads.append((what, where))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func.overloadpacket)
        self.ops[name] += 1
        if name in DATA_DEPENDENT or str(func) in DATA_DEPENDENT_OVERLOADS:
            self._flag(str(func))
        on_device = any(isinstance(t, torch.Tensor) and t.device == self.device for t in tree_leaves((args, kwargs)))
        target = kwargs.get("device")
        if on_device and target is not None and torch.device(target) != self.device:
            self._flag(f"{func} to {target}")
        try:
            out = func(*args, **kwargs)
        except Exception as error:  # meta has no data: a read of it raises here
            self._flag(f"{func} raised {type(error).__name__}")
            raise
        if on_device and any(isinstance(t, torch.Tensor) and t.device != self.device for t in tree_leaves(out)):
            self._flag(f"{func} returned a tensor off {self.device}")
        return out


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
    plan = StepPlan.of(configs, LAYERS, VOCAB, stack.parts.logit_softcap, options)
    cache = SlotCache(num_slots + 1, 16)
    state = SlotState.allocate(num_slots, model.config.hidden_size, VOCAB, torch.float32, META,
                               processors=plan.processors, eos_token_ids=[EOS], history_width=cache.width)
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
                read = decode_step(stack, plan, state, cache, index(advancing), index(refining))
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
               EglrConfig(L=4, T=0.7, top_k=20, top_p=0.9, tau_h=0.0, tau_kl=TAU_KL), EglrConfig(L=1, tau_h=0.0, tau_kl=TAU_KL),
               EglrConfig(L=0, T=1.0, top_k=0), EglrConfig(L=2, tau_h=0.0, tau_kl=TAU_KL)]
    prompts = random_prompts(0, lengths=(9, 3, 17, 5, 7, 4), vocab=VOCAB)
    return [Request(tuple(p), c, n, seed=11 + i) for i, (p, c, n) in enumerate(zip(prompts, configs, new))]


def loop_reads(monkeypatch) -> dict:
    """Decode ``loop_requests`` eagerly, recording every host read by where it happened: inside a
    loop step (one list per step), inside a prefill (one list per prefill), or elsewhere; and every
    upload of host data that the engine's host code makes (``torch.tensor(data, device=...)``,
    ``.to(device)`` or ``.cuda()`` without ``non_blocking=True``: on CUDA a copy with
    ``non_blocking=False``, i.e. ``cudaMemcpyAsync`` + ``cudaStreamSynchronize``), as
    ``("upload", "continuous.py:<line>")`` entries of the same lists."""
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
            current[-1].append(("upload", f"continuous.py:{caller.f_lineno}"))
        return make_tensor(data, *args, **kwargs)
    monkeypatch.setattr(torch, "tensor", uploading)
    def moving(name):
        real = getattr(torch.Tensor, name)

        def move(tensor, *args, **kwargs):
            caller = sys._getframe(1)
            to_device = name == "cuda" or "device" in kwargs or any(
                isinstance(a, (str, torch.device, torch.Tensor)) for a in args)
            if to_device and not kwargs.get("non_blocking") and caller.f_code.co_filename == continuous.__file__:
                current[-1].append(("upload", f"continuous.py:{caller.f_lineno}"))
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


# ---------------------------------------------------------------- 3, 4. compiled: recompiles and tokens
COMPILE_LAYERS = 2


def compile_requests() -> list[Request]:
    """Five requests for two slots with a K/V bucket of 4 positions: rows join late, refine (greedy
    and sampled), grow the K/V storage (widths 13 -> 17), shrink it (-> 9) and grow it again (-> 13)
    as rows finish and others go on."""
    configs = [EglrConfig(L=2, tau_h=0.0, tau_kl=TAU_KL), EglrConfig(L=0),
               EglrConfig(L=COMPILE_LAYERS, T=0.7, top_k=20, top_p=0.9, tau_h=0.0, tau_kl=TAU_KL),
               EglrConfig(L=1, tau_h=0.0, tau_kl=TAU_KL), EglrConfig(L=0, T=1.0, top_k=0)]
    prompts = random_prompts(0, lengths=(9, 3, 5, 2, 4), vocab=VOCAB)
    return [Request(tuple(p), c, n, seed=11 + i) for i, (p, c, n) in enumerate(zip(prompts, configs, (3, 12, 6, 9, 10)))]


def static_addresses_everywhere(monkeypatch) -> None:
    """The CUDA path's tensors on a CPU: slot state and K/V storage marked as static addresses (what
    ``compile=True`` does on CUDA, where CUDA graphs replay on them)."""
    allocate = SlotState.allocate.__func__
    monkeypatch.setattr(slot_state.SlotState, "allocate",
                        classmethod(lambda cls, *a, **k: allocate(cls, *a, **{**k, "static_addresses": True})))
    init = SlotCache.__init__
    monkeypatch.setattr(slots.SlotCache, "__init__", lambda self, *a, **k: init(self, *a, **{**k, "static_addresses": True}))


def compiled_engine(model):
    """An engine whose step is compiled by dynamo with a backend that counts graphs and runs them eagerly;
    returns (engine, keys): keys gets (advancing rows, refining rows, K/V width, graphs before the step) per step."""
    graphs = []

    def counting_backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    engine = ContinuousEngine(model, max_batch=2, eos_token_ids=[], kv_bucket=4, compile=True,
                              compile_backend=counting_backend)
    compiled, keys = engine.step_fn, []

    def keyed_step(stack, plan, state, cache, advancing, refining):
        keys.append((advancing.shape[0], refining.shape[0], cache.width, len(graphs)))
        return compiled(stack, plan, state, cache, advancing, refining)
    engine.step_fn = keyed_step
    engine.graphs = graphs
    return engine, keys


def recompile_violations(keys: list[tuple], graphs: int) -> list[str]:
    """What breaks 'a step compiles one graph when its bucket key is new, none otherwise'.

    keys: (advancing rows, refining rows, K/V width, graphs compiled before the step) per step;
    graphs: graphs compiled after the last step."""
    bad, seen = [], set()
    for (a, r, width, before), after in zip(keys, [k[3] for k in keys[1:]] + [graphs]):
        expected = 0 if (a, r, width) in seen else 1
        if after - before != expected:
            bad.append(f"step {(a, r, width)} compiled {after - before} graphs ({'new' if expected else 'seen'} key)")
        seen.add((a, r, width))
    return bad


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()  # entries of decode_step compiled by other tests count towards the limit
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


def test_the_compiled_step_compiles_once_per_bucket_and_then_never(monkeypatch, fresh_dynamo):
    static_addresses_everywhere(monkeypatch)
    model = build_tiny_model("llama", vocab_size=VOCAB, num_layers=COMPILE_LAYERS, seed=1)
    requests = compile_requests()
    eager = ContinuousEngine(model, max_batch=2, eos_token_ids=[], kv_bucket=4).run(requests)
    engine, keys = compiled_engine(model)
    # the run needs more graphs than dynamo's default limit: the engine's own limit holds them
    compiled = engine.run(requests)
    first_run = len(keys)
    again = engine.run(requests)
    assert recompile_violations(keys, len(engine.graphs)) == []
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == len(engine.graphs)  # dynamo's own count
    seen = {(a, r, width) for a, r, width, _ in keys}
    assert all(before == len(engine.graphs) for *_, before in keys[first_run:])  # the second run: no graph
    widths = [width for _, _, width, _ in keys[:first_run]]
    peak = widths.index(max(widths))
    assert widths[0] < widths[peak] > min(widths[peak:]) < widths[-1]  # K/V grew, shrank and grew again
    assert any(r for _, r, _, _ in keys[:first_run]) and any(not r for _, r, _, _ in keys[:first_run])
    assert len(seen) > DYNAMO_DEFAULT_RECOMPILE_LIMIT  # more graphs than dynamo allows by default
    # every shape is one of the engine's buckets: rows by row_buckets, K/V width 1 + a length bucket
    num_slots = 2 + 1  # max_batch + refine headroom
    assert {a for a, *_ in seen} <= set(continuous.row_buckets(num_slots, 2))
    assert {r for _, r, *_ in seen} <= {0, *continuous.row_buckets(num_slots)}
    assert {w - 1 for *_, w in seen} <= {slots.length_bucket(n, 4) for n in range(1, 64)}
    # compiled tokens == eager tokens, in both runs
    for outcomes in (compiled, again):
        assert [o.tokens for o in outcomes] == [o.tokens for o in eager]
        assert [o.token_iterations for o in outcomes] == [o.token_iterations for o in eager]
    assert sum(o.gated for o in eager) > 0


def test_the_counter_sees_a_step_that_recompiles(monkeypatch, fresh_dynamo):
    """A step that reads a Python value that changes from step to step (dynamo guards on it, and the
    shape it gives) compiles again at steps whose bucket key was seen: the check above must say so."""
    real = fixed_step.settle
    calls = []

    def settle_with_a_new_shape(stack, plan, state, rows, num_refining, last_hidden, raw):
        calls.append(1)
        pad = torch.zeros(len(calls) % 3 + 1)  # a new constant shape: the graph specialises on it
        return real(stack, plan, state, rows, num_refining, last_hidden, raw) + pad.sum()

    monkeypatch.setattr(fixed_step, "settle", settle_with_a_new_shape)
    model = build_tiny_model("llama", vocab_size=VOCAB, num_layers=COMPILE_LAYERS, seed=1)
    engine, keys = compiled_engine(model)
    with torch._dynamo.config.patch(recompile_limit=64):
        engine.run(compile_requests()[:1])
    assert recompile_violations(keys, len(engine.graphs))


def test_a_run_beyond_dynamos_default_recompile_limit_completes(fresh_dynamo):
    model = build_tiny_model("llama", vocab_size=VOCAB, num_layers=COMPILE_LAYERS, seed=1)
    requests = compile_requests()
    eager = ContinuousEngine(model, max_batch=2, eos_token_ids=[], kv_bucket=4).run(requests)
    engine, _ = compiled_engine(model)
    compiled = engine.run(requests)
    assert [o.tokens for o in compiled] == [o.tokens for o in eager]
