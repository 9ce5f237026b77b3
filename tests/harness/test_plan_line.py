"""The plan line's size: the product it prints gives the rollouts it counts (issue 38: a 4-cell pool over a
10-repeat task read "6 problems x 4 cells = 60 rollouts")."""

from __future__ import annotations

import re

from eglr_harness.harness.pool_runner import pool_size_text


def _product_holds(text: str) -> bool:
    problems, factor, rollouts = map(int, re.match(r"(\d+) problems x (\d+) \w+ .* = (\d+) rollouts", text).groups())
    return problems * factor == rollouts


def test_a_pool_cycled_over_more_repeats_says_repeats_not_cells():
    cells = ["L=0,T=0.0", "L=0,T=0.7", "L=2,T=0.0", "L=2,T=0.7"]
    text = pool_size_text(6, cells, 60)
    assert text.startswith("6 problems x 10 repeats (4 cells, each run 2-3 times: L=0,T=0.0") and _product_holds(text)
    assert _product_holds(pool_size_text(3, cells[:2], 60)) and "each run 10 times" in pool_size_text(3, cells[:2], 60)


def test_one_rollout_per_cell_says_cells():
    text = pool_size_text(4, ["L=1,T=0.0", "L=2,T=0.0"], 8)
    assert text == "4 problems x 2 cells (L=1,T=0.0, L=2,T=0.0) = 8 rollouts" and _product_holds(text)
    assert pool_size_text(2, [f"L={L},T=0.0" for L in range(1, 11)], 20).endswith("L=4,T=0.0, ...) = 20 rollouts")


def test_one_of_a_thing_is_said_in_the_singular():
    """ "1 rollouts": the plan line of a one-problem run, and the interrupt line of a run that stored one rollout."""
    from eglr_harness.core import interrupt

    assert pool_size_text(1, ["L=4,T=0.0"], 1) == "1 problem x 1 cell (L=4,T=0.0) = 1 rollout"
    before = dict(interrupt._stored)  # what this process's other tests stored
    interrupt._stored.clear()
    try:
        interrupt.note_stored("rollouts in cache/rollouts_rank0.sqlite", ["a"])
        interrupt.note_stored("finished runs in lb", ["greedy", "beam2"])
        assert interrupt.stored_summary() == "1 rollout in cache/rollouts_rank0.sqlite, 2 finished runs in lb"
    finally:
        interrupt._stored.clear()
        interrupt._stored.update(before)


def test_a_pool_repeated_under_seeds_says_the_seeds():
    """Issue 55, item 15: ``seeds=3`` read "1 cells, each run 10 times" and named no seed."""
    text = pool_size_text(4, ["L=0,T=0.7"], 40, range(1333, 1336))
    assert text == ("4 problems x 10 repeats (1 cell, each run 10 times: L=0,T=0.7; the pool under seeds 1333..1335 "
                    "(seeds=3)) = 40 rollouts") and _product_holds(text)


def test_the_plan_line_and_the_bar_name_the_model_that_runs():
    """Issue 55, item 19: eglr-vllm's plan line and progress bar were labelled "eglr-hf"."""
    from types import SimpleNamespace

    from eglr_harness.harness.pool_runner import PoolRunner

    def runner(engine):
        return PoolRunner(SimpleNamespace(settings=None, engine=engine), SimpleNamespace(), num_layers=4, gather=None,
                          rank=0, model_name="m", max_gen_toks=8, batch_size=1)

    assert runner("vllm").label == "eglr-vllm" and runner("continuous").label == runner("hook").label == "eglr-hf"
    assert runner("vllm").decoder.label == "eglr-vllm"  # its "rollouts reused" line


def test_a_rerun_that_finds_every_rollout_shows_no_empty_bar(monkeypatch):
    """A rerun with everything in the rollout store showed a progress bar of 0 tokens and 0/0 rollouts."""
    from types import SimpleNamespace

    from eglr_harness.harness import decode

    bars = []
    monkeypatch.setattr(decode, "RolloutProgress", lambda *args, **kwargs: bars.append(args) or None)
    decoder = decode.RolloutDecoder(codec=None, engines=[], fingerprint={}, names=[])
    record = {"text": "42", "signals": None, "engine": "hook", "accounting": None}
    decoder.memory.memo.update({"a": record, "b": record})
    spec = SimpleNamespace(config=None)
    done = decoder.decode([("p", spec), ("q", spec)], stats_for=None, desc="eglr-hf generation", keys=["a", "b"])
    assert done.records == [record, record] and bars == []
