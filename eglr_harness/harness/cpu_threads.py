"""Torch's CPU threads for an ``eglr-hf`` run on a CPU that other processes share.

Torch starts one thread per core. Where other processes keep those cores busy, each decoding step waits for its
slowest thread and a run crawls (CHANGELOG.md has the measurement). So, for a run on the CPU whose environment sets
no ``OMP_NUM_THREADS``, :func:`fit_cpu_threads` lowers torch's thread count to the cores left free
(:func:`threads_for`) and says so once; ``OMP_NUM_THREADS`` (any value) leaves torch's choice alone.
"""

from __future__ import annotations

import logging
import math
import os

__all__ = ["fit_cpu_threads", "threads_for"]

THREADS_ENV = "OMP_NUM_THREADS"


def threads_for(threads: int, cores: int, load: float) -> int:
    """The threads to run with: torch's ``threads``, at most the ``cores`` this process may run on that the
    1-minute ``load`` leaves free (the load counts this process once: a load of 1 leaves every core free),
    at least 1."""
    free = math.floor(cores - max(load - 1.0, 0.0))
    return max(1, min(threads, free))


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average (Windows)
        return 0.0


def fit_cpu_threads(device, logger: logging.Logger, label: str = "eglr-hf") -> int | None:
    """For a run on ``device`` ``cpu`` with no ``OMP_NUM_THREADS`` set: torch's threads lowered to
    :func:`threads_for` and one line saying so on ``logger``. Returns the threads set, None where nothing changed."""
    if os.environ.get(THREADS_ENV) or not str(device).startswith("cpu"):
        return None
    import torch

    threads, cores, load = torch.get_num_threads(), _cores(), _load()
    chosen = threads_for(threads, cores, load)
    if chosen >= threads:
        return None
    torch.set_num_threads(chosen)
    logger.info("%s: %d torch threads on %d cores with load %.1f: each step would wait for a busy core; running "
                "%d (set %s to choose)", label, threads, cores, load, chosen, THREADS_ENV)
    return chosen
