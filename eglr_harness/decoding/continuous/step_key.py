"""The sizes the continuous engine's decoding steps are specialised on, named in one place.

A compiled step (``step_graphs.py``) is compiled once with its sizes symbolic, and on CUDA recorded as
one graph per ``StepKey``: (advancing rows, refining rows, K/V width, and the run's step invariants). The
engine computes a step's key once (``StepSizes.key``) and the step runner trusts it, as vLLM's
``CudagraphDispatcher`` hands its ``BatchDescriptor`` to the ``CUDAGraphWrapper``. Each size is a bucket,
so that a run meets few keys whatever its rows do:

- **rows** (``row_buckets``): the index tensors of a compiled step are padded (with the trash slot) to
  powers of two from 2, the run's ``max_batch`` and its slot count. Never 1: the compiler specialises a
  size of 1. An eager step takes exact counts (padding rows would cost compute and save nothing). A step
  of refining rows only has no advancing rows at all (A = 0, compiled or eager): it runs the top layers alone.
- **width** (``length_bucket``): the K/V columns a step reads, a bucket of the running rows' newest
  position: base x 1, 1.5, 2, 3, 4, 6, ... (at most 1.5x too wide, log-many widths). Storage
  capacities are length buckets too.

- **invariants** (``step_state.StepInvariants``): what the run's pool fixes for all its steps (the layer
  spans, the exit rules, the processors): a graph recorded for one run's invariants never replays another's.

``StepSizes`` holds a run's buckets, which the engine logs when a run starts (``describe``); when a run
ends it logs the keys it captured (as SGLang logs the batch sizes it captures).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def length_bucket(positions: int, base: int) -> int:
    """The smallest bucket >= ``positions``: base · 1, 1.5, 2, 3, 4, 6, 8, 12, ... (at most 1.5x too large,
    log-many distinct sizes).  base: an even int >= 2."""
    size, step = base, 0
    while size < positions:
        size = size * 3 // 2 if step % 2 == 0 else size * 4 // 3
        step += 1
    return size


def row_buckets(limit: int, *also: int) -> list[int]:
    """Index-tensor sizes a compiled step may use: powers of two from 2 below ``limit``, ``also`` (when
    below), and ``limit`` (at least 2: a size of 1 would be specialised by the compiler)."""
    limit = max(limit, 2)
    sizes, size = set(), 2
    while size < limit:
        sizes.add(size)
        size *= 2
    return sorted({*sizes, *(a for a in also if 1 < a < limit), limit})


def bucket_of(count: int, sizes: Sequence[int]) -> int:
    """The smallest of ``sizes`` (ascending) that holds ``count``."""
    return next(size for size in sizes if size >= count)


@dataclass(frozen=True)
class StepKey:
    """What one decoding step is shaped by, and the key of its recorded graph: its advancing rows A, refining
    rows R (0: none), K/V width W, and the run's ``StepInvariants`` (None where no step runs on them: a test's
    key of sizes only)."""

    advancing: int
    refining: int
    width: int
    invariants: object = None

    def said(self) -> str:
        """``(A, R, W)``, as the log says a key."""
        return f"({self.advancing}, {self.refining}, {self.width})"


@dataclass(frozen=True)
class StepSizes:
    """The buckets of one run of the continuous engine.

    advancing, refining: the row buckets of a compiled step (``row_buckets``); bucketed: whether steps
    are padded to them (compiled) or take exact counts (eager). kv_bucket: the smallest width;
    capacity: the widest a step of the run can read (the bucket of its longest request: C).
    """

    advancing: tuple[int, ...]
    refining: tuple[int, ...]
    kv_bucket: int
    capacity: int
    bucketed: bool
    invariants: object = None

    @classmethod
    def of(cls, num_slots: int, max_advancing: int, kv_bucket: int, capacity: int, bucketed: bool, *,
           invariants=None) -> "StepSizes":
        """invariants: the run's ``StepInvariants``, part of every key."""
        # advancing rows: up to max_advancing, more for a step when refining rows exit together
        return cls(tuple(row_buckets(num_slots, max_advancing)), tuple(row_buckets(num_slots)), kv_bucket, capacity,
                   bucketed, invariants)

    def width(self, needed_columns: int) -> int:
        """The columns a step reads when its rows need ``needed_columns``."""
        return length_bucket(needed_columns, self.kv_bucket)

    def key(self, num_advancing: int, num_refining: int, needed_columns: int) -> StepKey:
        """The key of a step of ``num_advancing`` advancing and ``num_refining`` refining rows. A step runs at least
        one advancing row (the trash slot when none advances), except a step of refining rows only: its A is 0,
        and it runs the layers from ``join`` on alone (``fixed_step.decode_step``)."""
        width = self.width(needed_columns)
        if num_advancing == 0 and num_refining:
            advancing = 0
        else:
            advancing = bucket_of(max(num_advancing, 1), self.advancing) if self.bucketed else max(num_advancing, 1)
        if not self.bucketed:
            return StepKey(advancing, num_refining, width, self.invariants)
        return StepKey(advancing, bucket_of(num_refining, self.refining) if num_refining else 0, width, self.invariants)

    def widths(self) -> list[int]:
        """Every width a step of this run can read, up to the capacity."""
        widths, size = [], self.kv_bucket
        while size <= self.capacity:
            widths.append(size)
            size = length_bucket(size + 1, self.kv_bucket)
        return widths

    def describe(self) -> str:
        """The run's buckets, for the log line at its start (the keys captured are logged at its end)."""
        widths = self.widths()
        shown = widths if len(widths) <= 8 else [*widths[:3], "...", *widths[-2:]]
        return (f"step buckets: advancing rows {list(self.advancing)}, refining rows {[0, *self.refining]}, K/V "
                f"widths {', '.join(map(str, shown))}")
