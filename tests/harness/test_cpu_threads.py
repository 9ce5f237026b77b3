"""Torch's threads for an eglr-hf run on a shared CPU (harness/cpu_threads.py): the cores the load leaves free,
only where OMP_NUM_THREADS is not set and the run is on the CPU."""

from __future__ import annotations

import logging

import pytest
import torch

from eglr_harness.harness import cpu_threads
from eglr_harness.harness.cpu_threads import fit_cpu_threads, threads_for

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("threads, cores, load, expected", [
    (2, 2, 1.0, 2),    # idle but for this process: torch's own choice
    (2, 2, 0.2, 2),
    (2, 2, 3.0, 1),    # the demo's machine at load 3-25: one thread
    (2, 2, 25.0, 1),
    (16, 16, 5.0, 12),
    (16, 4, 1.0, 4),   # an affinity of 4 cores on a 16-core machine
    (1, 8, 0.0, 1),    # never more than torch's
])
def test_the_threads_are_the_free_cores(threads, cores, load, expected):
    assert threads_for(threads, cores, load) == expected


@pytest.fixture
def machine(monkeypatch):
    """A 2-core machine at load 6, torch at 2 threads; what set_num_threads is called with."""
    calls = []
    monkeypatch.setattr(cpu_threads, "_cores", lambda: 2)
    monkeypatch.setattr(cpu_threads, "_load", lambda: 6.0)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    return calls


def test_a_busy_cpu_run_drops_to_the_free_cores_and_says_so(machine, caplog):
    with caplog.at_level(logging.INFO):
        assert fit_cpu_threads("cpu", logging.getLogger("eglr_harness.test")) == 1
    assert machine == [1]
    assert "eglr-hf: 2 torch threads on 2 cores with load 6.0" in caplog.text and "OMP_NUM_THREADS" in caplog.text


@pytest.mark.parametrize("device, env", [("cuda:0", None), ("cpu", "2"), ("cpu", "1")])
def test_omp_num_threads_or_another_device_leaves_torch_alone(machine, monkeypatch, device, env):
    if env is not None:
        monkeypatch.setenv("OMP_NUM_THREADS", env)
    assert fit_cpu_threads(device, logging.getLogger("eglr_harness.test")) is None and machine == []
