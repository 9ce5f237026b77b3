"""Cross-rank steps under data parallel, written against an injected all-gather.

A :data:`Gather` takes one picklable object and returns every rank's object, in rank order, the
same list on every rank. :func:`local_gather` is the single-process one; :func:`process_gather`
wraps ``torch.distributed.all_gather_object``. Every rank must make the same sequence of gather
calls, so the functions that take one are called on every rank, with or without local work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Gather = Callable[[Any], list]


def local_gather(value) -> list:
    """The gather of a single process."""
    return [value]


def process_gather(world_size: int) -> Gather:
    """``torch.distributed``'s all-gather when several processes run, else :func:`local_gather`."""
    import torch.distributed as dist

    if world_size <= 1 or not dist.is_available() or not dist.is_initialized():
        return local_gather

    def gather(value) -> list:
        out: list = [None] * dist.get_world_size()
        dist.all_gather_object(out, value)
        return out

    return gather
