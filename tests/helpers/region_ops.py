"""The ops a compiled continuous-engine step runs outside its compiled regions, counted on a CPU.

A compiled step (``step_graphs.StepRunner`` with ``compile=True``) runs its decoder layers and its unembedding as
compiled regions (``step_graphs.CompiledRegion``) and the rest of ``decode_step`` as eager ops: on a GPU each of
those is a kernel of its own. ``RegionOps`` runs the regions eagerly (nothing compiles) and counts, per step, the
aten ops that are not views dispatched inside the step and outside its regions, by name, and each region's calls
(used by ``benchmarks/step_cost.py`` and ``tests/decoding/test_gpu_readiness.py``)::

    with RegionOps() as ops:
        ContinuousEngine(model, ..., compile=True).run(requests)
    ops.steps[1:]  # per steady step: (Counter of op names outside the regions, Counter of region calls)
"""

from __future__ import annotations

from collections import Counter
from unittest import mock

from eglr_harness.decoding.continuous import step_graphs

from helpers.host_reads import PatchingMode


class RegionOps(PatchingMode):
    """Counts ops outside the compiled regions per step (``steps``: one (ops, region calls) pair of Counters per
    ``StepRunner`` call, the first the warm-up's); the regions run their functions eagerly while it is open."""

    def __init__(self):
        super().__init__()
        self.steps: list[tuple[Counter, Counter]] = []
        self._in_step = self._in_region = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self._in_step and not self._in_region and not func.is_view:
            self.steps[-1][0][str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        counter, run_step = self, step_graphs.StepRunner.__call__

        def step(runner, *args, **kwargs):
            counter.steps.append((Counter(), Counter()))
            counter._in_step += 1
            try:
                return run_step(runner, *args, **kwargs)
            finally:
                counter._in_step -= 1

        def region(compiled, *args):
            if counter._in_step:
                counter.steps[-1][1][compiled.what] += 1
            counter._in_region += 1
            try:
                return compiled.fn(*args)
            finally:
                counter._in_region -= 1

        return self._open_with([mock.patch.object(step_graphs.StepRunner, "__call__", step),
                                mock.patch.object(step_graphs.CompiledRegion, "__call__", region)])

    def per_steady_step(self) -> tuple[float, dict]:
        """The mean count of ops outside the regions over the steps after the first, and the last step's region
        calls."""
        steady = self.steps[1:]
        return sum(sum(ops.values()) for ops, _ in steady) / len(steady), dict(steady[-1][1])
