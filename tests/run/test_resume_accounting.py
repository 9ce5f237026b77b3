"""Issue 38 (9): the figures of a run resumed from the rollout store, and what the store refuses to reuse.

A rollout is stored as soon as it finishes, carrying its own part of the batch figures (``steps``,
``p_step_gated``, ...); its engine run replaces that by its share of the run's figures when it ends. A
run killed in between, then rerun into the same ``rollout_cache``, counts every rollout: run one row
at a time (``batch_size=1``, where a row's own figures are its batch's), it reports exactly what an
uninterrupted run does. A stored row without a checksum is decoded again, never trusted.
"""

from __future__ import annotations

import sqlite3

import pytest
from helpers.inputs import CONTEXTS, requests_for

from eglr_harness.run.stores import RolloutStore

GREEDY = {"until": ["\n\n", "."], "max_gen_toks": 12, "do_sample": False}
POOL = {**GREEDY, "eglr_L": "0-3", "eglr_T": 0}


# tiny_lm's model args here (tests/conftest.py). tau_h=0: every token of an L > 0 cell is gated; tau_kl=0: no KL
# exit (float noise cannot flip one)
LM_DEFAULTS = dict(tau_h=0.0, tau_kl=0.0)


def _killed_after(monkeypatch, n: int):
    """Make the rollout store's n-th ``put`` (a finished rollout) end the run, as a kill would after it."""
    original, stored = RolloutStore.put, []

    def put(self, key, record):
        original(self, key, record)
        stored.append(key)
        if len(stored) == n:
            raise KeyboardInterrupt

    monkeypatch.setattr(RolloutStore, "put", put)
    return lambda: monkeypatch.setattr(RolloutStore, "put", original)


def _figures(lm) -> dict:
    """``config.eglr.stats`` total and cells without the wall time (a clock, not a count)."""
    stats = lm.get_model_info()["eglr"]["stats"]
    return {part: {k: v for k, v in figures.items() if k != "wall_time_s"}
            for part, figures in [("total", stats["total"]), *stats["cells"].items()]}


def _signals_match(got, expected, *, stored: int, exact: bool) -> None:
    """Issue 55, item 13: a resumed run's signals. The ``stored`` rollouts the killed run finished come back bit for
    bit (decoded in the uninterrupted run's batches, stored as decoded); the rest equal the uninterrupted run's to
    float rounding, as their batches differ (docs/lm-eval.md#resume), or bit for bit where ``exact`` (engine=hf one
    row at a time: each row is its own generate call)."""
    differ = [i for i, (x, y) in enumerate(zip(got, expected)) if x.signals != y.signals]
    assert all(x.signals for x in got) and len({x.signals["mean_entropy"] for x in got}) > 1
    for x, y in zip(got, expected):
        assert x.signals.keys() == y.signals.keys()
        for name, value in x.signals.items():
            if isinstance(value, int) or y.signals[name] is None:  # counts and "none gated": exact
                assert value == y.signals[name], name
            else:  # means of fp32 values: about 1e-7 relative apart (the KLs, near 0, in absolute terms)
                assert value == pytest.approx(y.signals[name], rel=1e-5, abs=1e-6), name
    assert len(differ) <= len(got) - stored and (not exact or not differ), differ


# latent: a rule that projects the LM head once per gated token (a stored rollout that kept no head_projections
# was counted as kl's k* projections: issue 55, a surviving mutant)
@pytest.mark.parametrize("engine, rule", [("continuous", {}), ("hook", {}),
                                          ("continuous", {"stop": "latent", "tau_latent": 0.0})])
def test_a_run_killed_midway_and_resumed_reports_the_uninterrupted_runs_steps(tiny_lm, tmp_path, monkeypatch, engine,
                                                                              rule):
    requests = requests_for(CONTEXTS[:3], POOL, repeats=4)  # 3 documents x 4 cells, one row at a time
    whole = tiny_lm(engine=engine, batch_size=1, rollout_cache=str(tmp_path / "whole"), **rule)
    expected = whole.generate_until(requests)

    restore = _killed_after(monkeypatch, 5)
    with pytest.raises(KeyboardInterrupt):
        tiny_lm(engine=engine, batch_size=1, rollout_cache=str(tmp_path / "resumed"), **rule).generate_until(requests)
    restore()
    resumed = tiny_lm(engine=engine, batch_size=1, rollout_cache=str(tmp_path / "resumed"), **rule)
    got = resumed.generate_until(requests)

    assert [str(x) for x in got] == [str(x) for x in expected]
    _signals_match(got, expected, stored=5, exact=engine == "hf")
    ours, theirs = _figures(resumed), _figures(whole)
    assert theirs["total"]["steps"] > theirs["total"]["tokens"] / 2 and 0 < theirs["total"]["p_step_gated"] < 1
    # today: the 5 rollouts stored before the kill bring no steps (steps and p_step_gated of their cells drop)
    assert ours == theirs
    assert resumed.get_model_info()["eglr"]["stats"]["reused_rollouts"]["total"] == 0


def test_a_second_process_reading_rollouts_still_running_counts_their_steps(tiny_lm, tmp_path, monkeypatch):
    """A rollout another process stored while its engine run goes on (so without its run's shares yet)."""
    requests = requests_for(CONTEXTS[:3], POOL, repeats=4)
    whole = tiny_lm(engine="continuous", batch_size=1)
    whole.generate_until(requests)

    restore = _killed_after(monkeypatch, 12)  # every rollout stored, the run's shares never written
    with pytest.raises(KeyboardInterrupt):
        tiny_lm(engine="continuous", batch_size=1, rollout_cache=str(tmp_path)).generate_until(requests)
    restore()
    reader = tiny_lm(engine="continuous", batch_size=1, rollout_cache=str(tmp_path))
    reader.generate_until(requests)
    assert _figures(reader) == _figures(whole)


def test_a_stored_row_without_checksum_is_decoded_again(tiny_lm, tmp_path):
    requests = requests_for(CONTEXTS[:2], GREEDY)
    first = tiny_lm(engine="hook", batch_size=2, L=0, rollout_cache=str(tmp_path))
    decoded = [str(x) for x in first.generate_until(requests)]
    db = sqlite3.connect(tmp_path / "rollouts_rank0.sqlite")
    rows = db.execute("SELECT key, value FROM rollouts_v2").fetchall()
    assert len(rows) == 2
    for key, value in rows:  # a forged text with no checksum (as a file from before checksums would hold)
        db.execute("UPDATE rollouts_v2 SET value = ?, checksum = NULL WHERE key = ?",
                   (value.replace('"text": "', '"text": "The answer is 42. '), key))
    db.commit()
    db.close()
    again = tiny_lm(engine="hook", batch_size=2, L=0, rollout_cache=str(tmp_path))
    got = [str(x) for x in again.generate_until(requests)]
    assert got == decoded and not any("42" in text for text in got)  # today: the forged texts come back
    assert again.get_model_info()["eglr"]["stats"]["total"]["tokens"] > 0  # decoded, not reused


def test_a_batched_run_stores_each_rollout_with_its_share_of_the_batch(tiny_lm, tmp_path):
    """Rows decoded together share each step: every stored rollout ends with its share of its engine run's
    figures (``run/accounting.EngineRunAccounts.share_out``), so a rerun from the store reports the run's
    figures, not each row's counted as if it had run alone."""
    requests = requests_for(CONTEXTS[:3], POOL, repeats=4)
    first = tiny_lm(engine="continuous", batch_size=4, rollout_cache=str(tmp_path))
    first.generate_until(requests)
    again = tiny_lm(engine="continuous", batch_size=4, rollout_cache=str(tmp_path))
    again.generate_until(requests)
    ours, theirs = _figures(again), _figures(first)
    assert again.get_model_info()["eglr"]["stats"]["reused_rollouts"]["total"] == 0  # restored: counted as decoded
    assert ours.keys() == theirs.keys()
    for part, figures in theirs.items():
        assert ours[part].keys() == figures.keys(), part
        for name, value in figures.items():  # the shares are floats: their sums may differ in the last bits
            assert ours[part][name] == (pytest.approx(value) if isinstance(value, float) else value), (part, name)
