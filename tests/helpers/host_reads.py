"""Counting what waits for the device on a CPU: host reads and data-dependent ops, per op or per iteration of
the continuous engine's loop (shared by ``tests/decoding/`` and ``benchmarks/step_cost.py``).

A host read is what blocks the host until the device has computed a value: ``.item()``, ``bool(t)``,
``int(t)``, ``float(t)`` (the dispatcher's ``_local_scalar_dense``), ``.tolist()``, ``.numpy()``, ``.cpu()``, a
copy off the device, and every op whose output shape depends on the data (``nonzero``, ``masked_select``,
``unique``, ...). On a CPU none of them waits, so they are counted where they are made: ``HostReadCounter`` at
the dispatcher (a ``TorchDispatchMode``), ``LoopHostReads`` also at the Python methods that do not reach the
dispatcher on a CPU tensor (``tolist``, ``numpy``, ``cpu``).

An overlapped read is not a wait: ``LoopHostReads`` counts a read of a host buffer that a non-blocking copy
(``copy_(..., non_blocking=True)``; from a CUDA tensor only into pinned memory) filled in an *earlier* loop
iteration, and that nothing wrote since, as ``deferred``, not as a read: by the time the host reads it the device
has moved on to the next step (vLLM's async scheduling). The same buffer read in the iteration that filled it is a
read: the host waits for its own step.
"""

from __future__ import annotations

import sys
import traceback
from collections import Counter
from dataclasses import dataclass, field
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

# ops whose result is a host value or whose output shape depends on the data (overload packets)
DATA_DEPENDENT = frozenset({
    "aten._local_scalar_dense", "aten.item", "aten.is_nonzero", "aten.equal", "aten.allclose",
    "aten.nonzero", "aten.argwhere", "aten.masked_select", "aten.unique", "aten._unique", "aten._unique2",
    "aten.unique_dim", "aten.unique_consecutive", "aten.bincount", "aten.histc",
})
DATA_DEPENDENT_OVERLOADS = frozenset({"aten.repeat_interleave.Tensor", "aten.repeat_interleave.self_Tensor"})
_HOST = "_counted_as_host"  # attribute of a tensor built on the host from host data (never on the device)
_FILLED = "_filled_by_nonblocking_copy"  # (iteration, data_ptr) of the non-blocking copy that filled a host buffer


def _innermost_eglr_frame(package: str = "/eglr_harness/") -> str:
    frames = [f for f in traceback.extract_stack() if package in f.filename.replace("\\", "/")]
    return f"{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno} {frames[-1].line}" if frames else "?"


class PatchingMode(TorchDispatchMode):
    """A dispatch mode that holds ``mock`` patches while it is open: a subclass's ``__enter__`` builds them and
    returns ``self._open_with(patches)``; they stop, last first, when the mode closes."""

    _patches: tuple = ()

    def _open_with(self, patches: list):
        self._patches = tuple(patches)
        for patch in self._patches:
            patch.start()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            for patch in reversed(self._patches):
                patch.stop()
            self._patches = ()


class HostReadCounter(PatchingMode):
    """Records every op that reads a value on the host, depends on the data for its shape, or moves
    a tensor off ``device``; and every op that raised (on ``meta``: a read of data that is not there).

    reads: (what, where) pairs; ``where`` is the innermost frame of ``eglr_harness/decoding`` that called the op.
    ops: dispatched ops by overload packet name (views included).
    """

    package = "/eglr_harness/decoding/"

    def __init__(self, device: torch.device):
        super().__init__()
        self.device = device
        self.reads: list[tuple[str, str]] = []
        self.ops: Counter = Counter()

    def _flag(self, what: str) -> None:
        self.reads.append((what, _innermost_eglr_frame(self.package)))

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


@dataclass
class Iteration:
    """One iteration of the engine's loop (``_Run.decode``): ``scheduler.next_work()`` and the work it returned.

    kind: ``"prefill"`` (admission, a prefill forward and/or prompt copies, the first settle: a refill),
    ``"step"`` (a decoding step) or ``"end"`` (the last ``next_work``, which returned nothing);
    advancing, refining: the step's rows (0 for the others); reads: (what, where) of each host read;
    deferred: (what, where) of each read of a buffer a non-blocking copy filled in an earlier iteration (overlapped:
    not a wait); uploads: where host data went to the device with a blocking copy (on CUDA: a copy plus a stream
    sync); async_uploads: where it went with a non-blocking one;
    ops: aten ops dispatched, views aside (on a GPU: its kernels, before any fusion); layer_ops: those of them
    inside the decoder layers (what the compiled layer replaces)."""

    kind: str = "?"
    advancing: int = 0
    refining: int = 0
    reads: list[tuple[str, str]] = field(default_factory=list)
    deferred: list[tuple[str, str]] = field(default_factory=list)
    uploads: list[str] = field(default_factory=list)
    async_uploads: list[str] = field(default_factory=list)
    ops: int = 0
    layer_ops: int = 0


class LoopHostReads(HostReadCounter):
    """Counts, per iteration of a ``ContinuousEngine`` run's loop, its host reads, blocking uploads and ops.

    Use around ``engine.run`` with an eager engine created inside the block (the decoder layer's calls are
    counted through ``step_graphs.call_layer``, which an engine binds when it is made)::

        with LoopHostReads() as counter:
            ContinuousEngine(model, max_batch=4).run(requests)
        counter.iterations  # list[Iteration]

    Not counted as reads: reads of tensors built on the host from host lists (``torch.tensor(data)`` without a
    device, and what is computed from such tensors alone), and everything inside transformers'
    ``StopStringCriteria`` (the stop-string check runs on the host from the rows' token lists). Such a tensor
    moved with ``.to(device)`` counts as a device tensor from then on. Counted as ``deferred``, not as reads: reads
    of a buffer (or a view of it) that a non-blocking copy filled in an earlier iteration (the module docstring).
    Kinds of iteration: ``"prefill"``, ``"step"``, ``"drain"`` (the scheduler's ``Drain``: a step's overlapped read
    comes in with no step to launch), ``"end"``.
    """

    package = "/eglr_harness/"

    def __init__(self, device: torch.device = torch.device("cpu")):
        super().__init__(device)
        self.iterations: list[Iteration] = []
        self._host_depth = 0  # > 0: inside the stop-string check
        self._layer_depth = 0  # > 0: inside a decoder layer

    @property
    def _current(self) -> Iteration | None:
        return self.iterations[-1] if self.iterations else None

    def _flag(self, what: str) -> None:
        if self._current is not None and not self._host_depth:
            self._current.reads.append((what, _innermost_eglr_frame(self.package)))

    def _filled_before(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is a host buffer that a non-blocking copy filled in an earlier iteration (and nothing
        wrote since): reading it waits for nothing the device still runs."""
        filled = getattr(tensor, _FILLED, None)
        return (filled is not None and filled[0] < len(self.iterations) - 1
                and filled[1] == tensor.untyped_storage().data_ptr())

    def _read(self, tensor: torch.Tensor, what: str) -> None:
        if self._filled_before(tensor):
            if self._current is not None and not self._host_depth:
                self._current.deferred.append((what, _innermost_eglr_frame(self.package)))
        elif not getattr(tensor, _HOST, False):
            self._flag(what)

    def _track_buffers(self, func, args, kwargs) -> bool:
        """Tag the destination of a non-blocking copy into host memory with the iteration (True: it was one), and
        untag a tagged buffer that another op writes."""
        if func is torch.ops.aten.copy_.default:
            dst, src = args[0], args[1]
            non_blocking = kwargs.get("non_blocking", args[2] if len(args) > 2 else False)
            pinned_or_cpu = src.device.type == "cpu" or dst.is_pinned()  # else the copy itself waits
            if non_blocking and dst.device.type == "cpu" and pinned_or_cpu:
                setattr(dst, _FILLED, (len(self.iterations) - 1, dst.untyped_storage().data_ptr()))
                return True
        for argument, value in zip(func._schema.arguments, args):
            if argument.alias_info is not None and argument.alias_info.is_write and hasattr(value, _FILLED):
                delattr(value, _FILLED)
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        tensors = [t for t in tree_leaves((args, kwargs or {})) if isinstance(t, torch.Tensor)]
        if self._current is not None and self._track_buffers(func, args, kwargs or {}):
            self._current.ops += 1
            return func(*args, **(kwargs or {}))
        if func.is_view and tensors and hasattr(tensors[0], _FILLED):  # a view of a filled buffer reads it too
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor):
                setattr(out, _FILLED, getattr(tensors[0], _FILLED))
            return out
        if str(func.overloadpacket) in DATA_DEPENDENT and tensors and self._filled_before(tensors[0]):
            self._read(tensors[0], str(func))
            return func(*args, **(kwargs or {}))
        host = bool(tensors) and all(getattr(t, _HOST, False) for t in tensors)
        if self._host_depth or host:  # host work: not a read, not a device op
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and host:
                    setattr(t, _HOST, True)
            return out
        if self._current is not None and not func.is_view:
            self._current.ops += 1
            self._current.layer_ops += self._layer_depth > 0
        return super().__torch_dispatch__(func, types, args, kwargs)

    # ------------------------------------------------------------ the patches
    def __enter__(self):
        from transformers import StopStringCriteria

        from eglr_harness.decoding.continuous import step_graphs
        from eglr_harness.decoding.continuous.scheduler import Drain, Prefill, Scheduler, Step

        counter = self
        next_work = Scheduler.next_work

        def counted_next_work(scheduler):
            iteration = Iteration()
            counter.iterations.append(iteration)
            work = next_work(scheduler)
            iteration.kind = ("end" if work is None else "prefill" if isinstance(work, Prefill) else
                              "drain" if isinstance(work, Drain) else "step")
            if isinstance(work, Step):
                iteration.advancing, iteration.refining = len(work.advancing), len(work.refining)
            return work

        def read(name):
            real = getattr(torch.Tensor, name)

            def reading(tensor, *args, **kwargs):
                counter._read(tensor, f"Tensor.{name} {tuple(tensor.shape)}")
                return real(tensor, *args, **kwargs)
            return reading

        make_tensor = torch.tensor

        def tensor(data, *args, **kwargs):
            out = make_tensor(data, *args, **kwargs)
            if kwargs.get("device") is None:
                setattr(out, _HOST, True)
            else:
                counter._upload()
            return out

        def moving(name):
            real = getattr(torch.Tensor, name)

            def move(tensor, *args, **kwargs):
                to_device = name == "cuda" or "device" in kwargs or any(
                    isinstance(a, (str, torch.device)) for a in args)
                out = real(tensor, *args, **kwargs)
                caller = sys._getframe(1).f_code.co_filename.replace("\\", "/")
                if to_device and "/eglr_harness/" in caller:
                    counter._upload(asynchronous=bool(kwargs.get("non_blocking")))
                if to_device and hasattr(out, _HOST):
                    delattr(out, _HOST)  # on the device from now on (on a CPU: the same tensor)
                return out
            return move

        stop_call = StopStringCriteria.__call__

        def stop_check(criterion, *args, **kwargs):
            counter._host_depth += 1
            try:
                out = stop_call(criterion, *args, **kwargs)
            finally:
                counter._host_depth -= 1
            setattr(out, _HOST, True)
            return out

        call_layer = step_graphs.call_layer

        def counted_layer(*args, **kwargs):
            counter._layer_depth += 1
            try:
                return call_layer(*args, **kwargs)
            finally:
                counter._layer_depth -= 1

        return self._open_with([mock.patch.object(Scheduler, "next_work", counted_next_work),
                         mock.patch.object(torch, "tensor", tensor),
                         mock.patch.object(StopStringCriteria, "__call__", stop_check),
                         mock.patch.object(step_graphs, "call_layer", counted_layer),
                         *[mock.patch.object(torch.Tensor, name, read(name)) for name in ("tolist", "numpy", "cpu")],
                         *[mock.patch.object(torch.Tensor, name, moving(name)) for name in ("to", "cuda")]])

    def _upload(self, asynchronous: bool = False) -> None:
        if self._current is not None and not self._host_depth:
            caller = sys._getframe(2)
            where = f"{caller.f_code.co_filename.rsplit('/', 1)[-1]}:{caller.f_lineno}"
            (self._current.async_uploads if asynchronous else self._current.uploads).append(where)

    # ------------------------------------------------------------ summaries
    def summary(self) -> dict:
        """Per kind of iteration (``step``, ``prefill``, ``drain``): how many, and the host reads, deferred reads,
        blocking and non-blocking uploads and ops of each (min, max, mean), with where each read was made."""
        out = {}
        for kind in ("step", "prefill", "drain"):
            its = [i for i in self.iterations if i.kind == kind]
            if not its:
                continue

            def figures(values):
                return {"min": min(values), "max": max(values), "mean": round(sum(values) / len(values), 2)}
            out[kind] = {"iterations": len(its), "host_reads": figures([len(i.reads) for i in its]),
                         "deferred_reads": figures([len(i.deferred) for i in its]),
                         "blocking_uploads": figures([len(i.uploads) for i in its]),
                         "async_uploads": figures([len(i.async_uploads) for i in its]),
                         "ops": figures([i.ops for i in its]), "layer_ops": figures([i.layer_ops for i in its]),
                         "host_reads_where": dict(Counter(where for i in its for _, where in i.reads)),
                         "deferred_reads_where": dict(Counter(where for i in its for _, where in i.deferred)),
                         "blocking_uploads_where": dict(Counter(where for i in its for where in i.uploads))}
        return out
