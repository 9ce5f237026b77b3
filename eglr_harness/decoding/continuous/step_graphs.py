"""How the continuous engine runs its decoding step: eagerly, compiled once, or captured per bucket.

The design, and why (how vLLM, SGLang and PyTorch do it: ``benchmarks/HISTORY.md``):

- **What is compiled: one decoder layer, and the unembedding, once each.** ``torch.compile`` is applied to
  ``stack.call_layer_at``, the one function every decoder layer runs through (the layer module is an
  argument, so its weights are graph inputs: dynamo's ``inline_inbuilt_nn_modules``), with the sizes that
  vary marked dynamic: the rows of the call, the slots, the K/V storage and the columns the step reads. The
  layer computes its rows' rotary angles itself, from the positions the step hands it (``RowAngles``), so
  that they fuse into its rotary kernels, as vLLM applies rotary inside its attention; the final norm,
  unembedding and logit scale (``stack.unembed``) are a second region, rows dynamic (``CompiledStack``:
  the stack a compiled step runs on). One compilation of each then serves every layer, every row count,
  every K/V width, every pool (L and T only change which rows enter where, outside the layers), every run
  and every task of the process; families whose layers differ by kind (sliding and full attention) may
  make one more. That is PyTorch's regional compilation, with vLLM's symbolic batch size. Compiling the
  whole step instead specialises the graph on the run's invariants (the pool's layer spans, exit rule,
  processors) and inlines every layer: about half the kernels again, but compilations many times longer,
  several per run (measured: ``benchmarks/HISTORY.md``). The rest of the glue (embedding, masks, the
  refining rows' join, ``settle``: gate, KL exit, processors, draw) stays eager: on CUDA it is captured
  with the rest. inductor runs with ``INDUCTOR_OPTIONS`` (the rotary's concatenation computed where it is
  read). The kernels of a compiled step: ``benchmarks/step_cost.py`` (``kernels``).
- **What is captured: one CUDA graph per step key** (``step_key.StepKey``: advancing-row bucket,
  refining-row bucket, K/V width, the run's step invariants), recorded lazily the first time the key is met, in one
  memory pool shared by all the engine's graphs, as SGLang and vLLM record one graph per padded batch size. The
  engine computes the key once per step and the runner trusts it (vLLM's dispatcher hands its
  ``BatchDescriptor`` to its ``CUDAGraphWrapper`` so): it asserts only that the index tensors have its sizes.
  A capture costs one eager warm-up of the step on the trash slot (outside the graph: lazy initialisations and, once per
  process, the compilation) and one recording: no compilation. The index tensors are copied into the
  graph's static inputs before each replay; every other input (the slot state, the K/V storage) is
  allocated once per engine and never moves (``continuous_engine.Workspace``), so a graph stays valid
  across K/V widths and across runs. A graph whose recording fails (a model whose layers synchronise
  with the host, e.g. routing that reads expert counts) turns capturing off for the engine, with one
  log line, and the step runs as compiled without graphs.
- **After warm-up nothing compiles.** The first step of the engine's first run compiles; every later
  call of a compiled region runs under ``torch.compiler.set_stance("fail_on_recompile")``. Should a
  later call need a compilation anyway (a bug), that call runs eagerly, ``late_compiles`` counts it and
  the log says so at once, with dynamo's reason; ``eager_steps`` counts the steps that ran a layer so,
  and a run in which more than ``EAGER_STEP_SHARE`` of the steps did says so again at its end
  (``ContinuousEngine.run``): a run never stalls on a silent compilation, nor passes for compiled when
  it mostly ran eagerly.
- **No guard that a later step breaks.** Every size that varies is marked dynamic, and no step meets a
  size relation that the first step did not: the K/V storage holds a spare column beyond its capacity
  (``kv_slots.SPARE_COLUMNS``), so the W columns a step reads are never the whole storage. Without it a
  first step that read every column (W == C) made inductor guard on that equality (it decides whether
  a slice is contiguous from its sizes), and every later step with W < C compiled again (the counts
  measured before the spare column: ``benchmarks/HISTORY.md``).

``warmup_report()`` says what it cost: compilations and captures, and their seconds.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from eglr_harness.decoding.compile_setting import CUDA_GRAPHS  # the compile mode whose steps are captured
from eglr_harness.decoding.continuous.fixed_step import decode_step
from eglr_harness.decoding.continuous.kv_slots import LayerWrite, SlotView
from eglr_harness.decoding.continuous.stack import call_layer, call_layer_at, unembed
from eglr_harness.decoding.continuous.step_key import StepKey

logger = logging.getLogger(__name__)

LATE_COMPILE = "Detected recompile"  # how torch.compiler's fail_on_recompile stance begins its error
# a run whose steps after warm-up ran a layer eagerly more often than this share says so at its end
EAGER_STEP_SHARE = 0.01
# compilations a process makes at most, whatever its runs: one of the decoder layer, one more where a
# family's layers differ in what dynamo guards on (Gemma-3's rotary angles per layer kind), and one of the
# unembedding
COMPILATION_BOUND = 3
# compilations the layer function may make before dynamo gives up on it: a few variants of the layer
# (layer kinds), never one per shape; past it dynamo would silently run the layer eagerly
RECOMPILE_LIMIT = 8


@dataclass
class WarmupReport:
    """What compiling and capturing cost an engine: counts and seconds (``ContinuousEngine.warmup_report``)."""

    compiles: int = 0
    captures: int = 0
    compile_seconds: float = 0.0
    capture_seconds: float = 0.0
    late_compiles: int = 0  # calls of the compiled layer after warm-up that would have compiled (ran eagerly)
    steps: int = 0  # decoding steps after warm-up
    eager_steps: int = 0  # of them, steps in which a layer ran eagerly for want of a compilation
    capture_keys: list[StepKey] = field(default_factory=list)

    def as_dict(self) -> dict:
        report = asdict(self)
        report["capture_keys"] = [[key.advancing, key.refining, key.width] for key in self.capture_keys]
        return report


class CompiledRegion:
    """``fn`` under ``torch.compile(fullgraph=True)``, the sizes that vary marked dynamic (``dims``).

    One compiled function per (fn, backend, mode) for the whole process (``_compiled``), shared by every
    engine: a second engine, another run or another task reuses its compilation. backend, mode: passed
    to ``torch.compile`` (``mode`` is never CUDA graphs here: the engine records its own; inductor's
    would nest inside them). report: the engine's, where the compilations this engine triggers are counted.
    dims: ``args -> [(tensor, dims)]``, the dimensions of the call's tensors that vary between steps.
    what: the region in the log (``"decoder layer"``, ``"unembedding"``).
    """

    def __init__(self, fn: Callable, dims: Callable, what: str, report: WarmupReport, backend="inductor",
                 mode: str | None = None):
        self.fn, self.dims, self.what, self.report = fn, dims, what, report
        self.warm = False  # set by the ``StepRunner`` after the engine's first step: later compilations are late
        self.failed = False  # compiling failed: the region runs eagerly
        self.fell_back = False  # a call since the last ``StepRunner`` step ran eagerly instead of compiling
        self._warned = False
        self.compiled, self._counter = _compiled(fn, backend, mode)

    def __call__(self, *args) -> torch.Tensor:
        if self.failed:
            return self.fn(*args)
        for tensor, dims in self.dims(*args):
            for dim in dims:
                torch._dynamo.maybe_mark_dynamic(tensor, dim)
        if not self.warm:
            before, started = self._counter[0], time.perf_counter()
            try:
                with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
                    out = self.compiled(*args)
            except torch._dynamo.exc.TorchDynamoException as error:
                # a region dynamo cannot trace whole (a host read, a data-dependent shape): eager, said once
                self.failed = True
                logger.warning("continuous engine: compiling the %s (%s) failed (%s: %s); every %s call runs eagerly",
                               self.what, _module_names(args), type(error).__name__, str(error).splitlines()[0],
                               self.what)
                return self.fn(*args)
            if self._counter[0] > before:
                self.report.compiles += self._counter[0] - before
                self.report.compile_seconds += time.perf_counter() - started
            return out
        try:
            with (torch.compiler.set_stance("fail_on_recompile"),
                  torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT)):
                return self.compiled(*args)
        except RuntimeError as error:
            if not str(error).startswith(LATE_COMPILE):
                raise
            self.report.late_compiles += 1
            self.fell_back = True
            if not self._warned:
                self._warned = True
                logger.error("continuous engine: the compiled %s needed a compilation after warm-up (%s): this call "
                             "and any like it run eagerly instead; please report it. %s", self.what,
                             _sizes(args), error)
            return self.fn(*args)


def _module_names(args) -> str:
    return ", ".join(type(a).__name__ for a in args if isinstance(a, torch.nn.Module))


def _sizes(args) -> str:
    return ", ".join(str(tuple(a.shape)) for a in args if isinstance(a, torch.Tensor))


class RowAngles:
    """What ``CompiledStack.rotary_angles`` hands ``decode_step`` in place of a layer kind's (cos, sin): the
    compiled layer computes the angles of its rows itself, from the positions the step hands every layer
    (``stack.call_layer_at``), so that they fuse into its rotary kernels instead of running as ops of their
    own before the layers. Indexing it by the step's rows (``cos[rows]``) returns it unchanged.

    rotary: the model's rotary module; kind: the layer kind where the module takes it (Gemma-3), else None.
    """

    __slots__ = ("rotary", "kind")

    def __init__(self, rotary: torch.nn.Module, kind: str | None):
        self.rotary, self.kind = rotary, kind

    def __getitem__(self, rows) -> "RowAngles":
        return self


def _layer_dims(layer, rotary, kind, hidden, view: SlotView, positions, write: LayerWrite):
    # rows, slots, storage columns and the columns read vary; heads, sizes and Q = 1 do not
    return ((hidden, (0,)), (view.rows, (0,)), (view.mask, (0, 3)), (view.bias, (0, 3)), (positions, (0,)),
            (write.rows, (0,)), (write.columns, (0,)), (write.keys, (0, 2)), (write.values, (0, 2)))


class CompiledLayer(CompiledRegion):
    """``stack.call_layer_at`` compiled once: a decoder layer with its rotary angles (``RowAngles``), as
    ``decode_step`` calls its ``layers`` argument."""

    def __init__(self, report: WarmupReport, backend="inductor", mode: str | None = None):
        super().__init__(call_layer_at, _layer_dims, "decoder layer", report, backend, mode)

    def __call__(self, layer, hidden, view: SlotView, angles, positions, write: LayerWrite) -> torch.Tensor:
        rows_angles = angles[0]
        assert isinstance(rows_angles, RowAngles), "a compiled layer computes its angles: run it with a CompiledStack"
        return super().__call__(layer, rows_angles.rotary, rows_angles.kind, hidden, view, positions, write)


class CompiledStack:
    """The ``ModelStack`` a compiled step runs on: the same modules, its glue moved into compiled code.

    - ``rotary_angles`` computes nothing: it hands every layer kind a ``RowAngles``, and the compiled decoder
      layer computes its rows' angles from their positions (fused into its rotary kernels);
    - ``logits`` (final norm, unembedding, logit scale) runs as one more compiled region, compiled once
      with its rows dynamic (``stack.unembed``).

    Everything else is the stack's own (attributes are looked up on it).
    """

    def __init__(self, stack, head: CompiledRegion):
        self.stack, self.head = stack, head

    def __getattr__(self, name):
        return getattr(self.stack, name)

    def rotary_angles(self, hidden: torch.Tensor, positions: torch.Tensor) -> dict[str, tuple]:
        stack = self.stack
        return {kind: (RowAngles(stack.rotary, kind if stack.rotary_by_kind else None),) * 2 for kind in stack.windows}

    def logits(self, last_hidden: torch.Tensor) -> torch.Tensor:
        return self.head(self.stack.parts, last_hidden)


def _head_dims(parts, last_hidden):
    return ((last_hidden, (0,)),)


_COMPILED: dict = {}


def _compiled(fn: Callable, backend, mode: str | None) -> tuple[Callable, list[int]]:
    """The process's one compiled ``fn`` for (fn, backend, mode), and its count of compilations."""
    key = (fn, backend if isinstance(backend, str) else id(backend), mode)
    if key not in _COMPILED:
        counter = [0]
        inner = torch._dynamo.lookup_backend(backend) if isinstance(backend, str) and backend != "inductor" else backend

        def counting_backend(graph_module, example_inputs):
            counter[0] += 1
            if inner == "inductor":
                from torch._inductor.compile_fx import compile_fx

                return compile_fx(graph_module, example_inputs, config_patches=_inductor_options(mode))
            return inner(graph_module, example_inputs)

        _COMPILED[key] = torch.compile(fn, fullgraph=True, backend=counting_backend), counter
    return _COMPILED[key]


# inductor settings of every compiled region: a concatenation whose inputs are pointwise (the rotary's
# rotate_half) is computed inside the kernels that read it, not written to a buffer by a kernel of its own
# (one kernel fewer per decoder layer: 16 -> 15 on a Llama, CPU)
INDUCTOR_OPTIONS = {"force_pointwise_cat": True}


def _inductor_options(mode: str | None) -> dict:
    """inductor settings of a ``torch.compile`` mode, without its CUDA graphs (the engine records its own)."""
    if mode in (None, "default", CUDA_GRAPHS):
        return dict(INDUCTOR_OPTIONS)
    return {**INDUCTOR_OPTIONS, "max_autotune": True} if mode.startswith("max-autotune") else dict(INDUCTOR_OPTIONS)


class CudaGraph:
    """One recorded step: a ``torch.cuda.CUDAGraph`` in the engine's shared memory pool, recorded on the
    side stream its warm-up ran on (lazily made handles and workspaces belong to that stream)."""

    def __init__(self, pool, stream):
        self.pool, self.stream = pool, stream
        self.graph = None

    def warm_up(self, step: Callable[[], torch.Tensor]) -> None:
        """Run ``step`` once on the recording stream, outside any graph."""
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            step()
        torch.cuda.current_stream().wait_stream(self.stream)

    def record(self, step: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Record ``step`` (nothing runs); returns its output tensor, which every replay rewrites."""
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=self.pool, stream=self.stream):
            out = step()
        return out

    def replay(self) -> None:
        self.graph.replay()


@dataclass
class _Captured:
    graph: CudaGraph
    advancing: torch.Tensor  # (A,) static input
    refining: torch.Tensor  # (R,) static input
    out: torch.Tensor  # (A + R, F) static output
    eager_layers: bool = False  # recorded with layers that ran eagerly (a late compilation refused)
    addresses: dict | None = None  # debug mode: where each tensor the graph reads lived when it was recorded


def workspace_addresses(state, cache) -> dict[str, int]:
    """Where every tensor a recorded step reads lives: the slot state's tensors and each layer's K/V storage."""
    addresses = {f"state.{name}": value.data_ptr() for name, value in state.tensors().items()}
    for store, tensors in (("keys", cache.keys), ("values", cache.values)):
        addresses.update({f"cache.{store}[{layer}]": tensor.data_ptr() for layer, tensor in tensors.items()})
    return addresses


class StepRunner:
    """Runs ``decode_step`` for one engine: eager, with the compiled layer, and/or captured per step key.

    compile: compile the decoder layer (``CompiledLayer``); capture: record one CUDA graph per step key.
    """

    def __init__(self, *, compile: bool = False, capture: bool = False, backend="inductor", mode: str | None = None):
        self.report = WarmupReport()
        self.layers = CompiledLayer(self.report, backend, mode) if compile else call_layer
        # the unembedding, compiled once beside the layer (CompiledStack); None when the step runs eagerly
        self.head = CompiledRegion(unembed, _head_dims, "unembedding", self.report, backend, mode) if compile else None
        self.capture = capture
        self.pool = self.stream = None
        self._graphs: dict[StepKey, _Captured] = {}
        self._stack: CompiledStack | None = None

    def regions(self) -> list[CompiledRegion]:
        """The compiled regions of the step (none when it runs eagerly)."""
        return [region for region in (self.layers, self.head) if isinstance(region, CompiledRegion)]

    def step_stack(self, stack):
        """The stack ``decode_step`` runs on: ``stack`` itself, or compiled, its ``CompiledStack`` (one per stack)."""
        if self.head is None or not isinstance(self.layers, CompiledLayer):
            return stack
        if self._stack is None or self._stack.stack is not stack:
            self._stack = CompiledStack(stack, self.head)
        return self._stack

    def __call__(self, stack, key: StepKey, state, cache, advancing: torch.Tensor,
                 refining: torch.Tensor) -> torch.Tensor:
        """One step of ``key`` (``StepSizes.key``: its invariants, rows and width, computed once by the engine):
        advancing, refining: the (A,) and (R,) slot indices, padded to the key's sizes; cache.width: its W.
        Returns the step's (A + R, F) read."""
        assert (advancing.shape[0], refining.shape[0], cache.width) == (key.advancing, key.refining, key.width), key
        invariants = key.invariants
        regions = self.regions()
        warm = bool(regions) and all(region.warm for region in regions)
        for region in regions:
            region.fell_back = False
        eager_layers = False
        if not self.capture:
            read = decode_step(self.step_stack(stack), invariants, state, cache, advancing, refining,
                               layers=self.layers)
            eager_layers = any(region.fell_back for region in regions)
        else:
            captured = self._graphs.get(key)
            if captured is None:
                captured = self._record(stack, key, state, cache)
            if captured is None:  # recording failed: capturing is off from now on
                return self(stack, key, state, cache, advancing, refining)
            if captured.addresses is not None:
                self._check_addresses(captured, state, cache)
            captured.advancing.copy_(advancing)
            captured.refining.copy_(refining)
            captured.graph.replay()
            read = captured.out
            eager_layers = captured.eager_layers
        if warm:
            self.report.steps += 1
            self.report.eager_steps += eager_layers
        for region in regions:
            region.warm = True  # every layer kind and the unembedding have run: warm-up is over
        return read

    @staticmethod
    def _check_addresses(captured: _Captured, state, cache) -> None:
        """Debug mode (this module's logger at DEBUG, as vLLM checks under VLLM_LOGGING_LEVEL=DEBUG): a graph
        replays only on the tensors it was recorded on; one that moved would be read stale, so say which."""
        now = workspace_addresses(state, cache)
        moved = sorted(name for name, address in captured.addresses.items() if now.get(name) != address)
        if moved:
            raise RuntimeError(f"continuous engine: a recorded step would replay on tensors that moved since it was "
                               f"recorded ({', '.join(moved)}); the workspace must not be replaced without "
                               f"StepRunner.forget().")

    def _record(self, stack, key: StepKey, state, cache) -> _Captured | None:
        """Warm the step up on the trash slot (outside any graph), then record it for ``key`` (the state and
        storage are the engine's workspace, which never moves; ``forget`` drops the graphs when it is replaced)."""
        invariants, num_adv, num_ref = key.invariants, key.advancing, key.refining
        started, compiling = time.perf_counter(), self.report.compile_seconds
        # what the graph reads is fixed at recording, the width and the storage tensors: freeze them here too
        cache = copy.copy(cache)
        cache.keys, cache.values = dict(cache.keys), dict(cache.values)
        trash = state.position.shape[0] - 1
        device = state.position.device
        advancing = torch.full((num_adv,), trash, dtype=torch.long, device=device)
        refining = torch.full((num_ref,), trash, dtype=torch.long, device=device)
        stack = self.step_stack(stack)
        step = lambda: decode_step(stack, invariants, state, cache, advancing, refining, layers=self.layers)  # noqa: E731
        try:
            if self.pool is None and device.type == "cuda":
                self.pool, self.stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream(device)
            graph = CudaGraph(self.pool, self.stream)
            graph.warm_up(step)  # lazy initialisations (and the compilation, once), on the trash slot only
            out = graph.record(step)
        except Exception as error:  # noqa: BLE001 - any recording failure: decode on without graphs
            logger.warning("continuous engine: recording the step as a CUDA graph failed (%s: %s); decoding on "
                           "without CUDA graphs", type(error).__name__, error)
            self.capture = False
            self._graphs.clear()
            return None
        eager_layers = any(region.fell_back for region in self.regions())
        addresses = workspace_addresses(state, cache) if logger.isEnabledFor(logging.DEBUG) else None
        self._graphs[key] = captured = _Captured(graph, advancing, refining, out, eager_layers, addresses)
        self.report.captures += 1
        self.report.capture_keys.append(key)
        self.report.capture_seconds += time.perf_counter() - started - (self.report.compile_seconds - compiling)
        return captured

    def forget(self) -> None:
        """Drop every recorded graph (the workspace they were recorded on is gone)."""
        self._graphs.clear()
