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


@pytest.mark.parametrize("engine, batch_size, rule", [("continuous", 4, {}),
                                                      ("hook", 3, {"stop": "latent", "tau_latent": 0.0})])
def test_a_batched_run_resumed_reports_the_uninterrupted_runs_figures_but_the_per_decode_ones(
        tiny_lm, tmp_path, monkeypatch, engine, batch_size, rule):
    """Issue 71 (7): resumed at batch > 1, the rollouts left are batched in other company, so the figures that count
    batches (``run/accounting.per_decode_figures`` of the run's engine, as its results name it) may differ (here 327
    steps against 283 at batch 4, 96 against 48 with the hook engine); every other figure equals the uninterrupted
    run's, as run/accounting.py says."""
    from eglr_harness.run.accounting import per_decode_figures

    requests = requests_for(CONTEXTS[:3], POOL, repeats=4)
    whole = tiny_lm(engine=engine, batch_size=batch_size, **rule)
    whole.generate_until(requests)
    restore = _killed_after(monkeypatch, 5)
    with pytest.raises(KeyboardInterrupt):
        tiny_lm(engine=engine, batch_size=batch_size, rollout_cache=str(tmp_path), **rule).generate_until(requests)
    restore()
    resumed = tiny_lm(engine=engine, batch_size=batch_size, rollout_cache=str(tmp_path), **rule)
    resumed.generate_until(requests)
    info = resumed.get_model_info()["eglr"]
    assert info["engine"] == engine and info["stats"]["reused_rollouts"]["total"] == 0
    per_decode = per_decode_figures(info["engine"])
    ours, theirs = _figures(resumed), _figures(whole)
    assert ours.keys() == theirs.keys()
    for part, figures in theirs.items():
        assert ours[part].keys() == figures.keys(), part
        for name, value in figures.items():
            if name not in per_decode:  # floats: sums of shares in one run, of records in the other
                assert ours[part][name] == (pytest.approx(value) if isinstance(value, float) else value), (part, name)
    assert theirs["total"]["gated_tokens"] > 0 and ours["total"]["steps"] > 0


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


@pytest.mark.unit
def test_each_rollout_gets_its_own_share_of_its_batch():
    """Issue 71: a swap of two rollouts' shares kept every sum of ``share_batch``; each rollout's own share, worked
    out here: rows by its tokens, refinement by its refinement layer evaluations, steps, gated steps and time by all
    its layer evaluations (N tokens + refinement)."""
    from eglr_harness.core.config import EglrConfig
    from eglr_harness.decoding.stats import EglrStats, own_account
    from eglr_harness.run.accounting import share_batch

    batch = EglrStats(num_layers=8, wall_time_s=2.04)
    batch.add_batch(steps=13, gated_steps=5, computed_rows=44, tokens=22, iterations={1: 2, 3: 4}, L=2,
                    computed_refine_rows=21)
    rollouts = [own_account(t, k, EglrConfig(L=2), steps=t, gated_steps=0, computed_refine_layer_evals=0)
                for t, k in ((12, {1: 2, 3: 1}), (7, {3: 3}), (3, {}))]
    assert [r.refine_layer_evals for r in rollouts] == [10, 18, 0]  # L x the sum of k*
    work = [8 * 12 + 10, 8 * 7 + 18, 8 * 3]  # 106, 74, 24 of 204 layer evaluations
    expected = [{"computed_rows": 44 * t / 22, "computed_refine_layer_evals": 42 * e / 28, "steps": 13 * w / 204,
                 "gated_steps": 5 * w / 204, "wall_time_s": 2.04 * w / 204}
                for t, e, w in zip((12, 7, 3), (10, 18, 0), work)]
    assert share_batch(batch, rollouts) == [pytest.approx(e) for e in expected]
    # the order of the rollouts is each one's own: reversed in, reversed out
    assert share_batch(batch, rollouts[::-1]) == [pytest.approx(e) for e in expected[::-1]]


@pytest.mark.unit
def test_the_per_decode_figures_are_named_per_engine():
    from eglr_harness.run.accounting import per_decode_figures

    assert per_decode_figures("continuous") == per_decode_figures("vllm") == ("steps", "p_step_gated", "wall_time_s")
    assert per_decode_figures("hook") == per_decode_figures("mixed") == (*per_decode_figures("continuous"),
                                                                         "batched_flop_ratio")
    with pytest.raises(ValueError, match=r"^`engine`='auto' is not allowed; allowed: continuous, hook, hf"):
        per_decode_figures("auto")


@pytest.mark.unit
def test_a_stored_records_counts_may_reach_2_53_and_not_pass_it():
    """The readers' bound, exactly at its edge (a slow CLI test alone held it before): a count or share of 2**53 is
    stored and restored, one above is refused in one line naming the field; so is a refinement L x sum k* of 2**53
    against one above it."""
    from eglr_harness.core.config import HUGE
    from eglr_harness.decoding.stats import record_problem

    assert HUGE == 2**53
    sound = {"tokens": 12, "iterations": {"1": 2}, "L": 4, "head_projections": 2, "shares": {"steps": 3.0}}
    for name, edge in (("tokens", {"tokens": 2**53}), ("head_projections", {"head_projections": 2**53}),
                       ("shares.steps", {"shares": {"steps": float(2**53)}}),
                       ("L", {"L": 2**51, "iterations": {"4": 1}, "tokens": 1})):
        assert record_problem({**sound, **edge}) is None, name
    for name, beyond in (("tokens", {"tokens": 2**53 + 1}), ("head_projections", {"head_projections": 2**53 + 1}),
                         ("shares.steps", {"shares": {"steps": 2.0**53 * (1 + 2**-52)}}),
                         ("L", {"L": 2**51 + 1, "iterations": {"4": 1}, "tokens": 1})):
        problem = record_problem({**sound, **beyond})
        assert problem is not None and problem.startswith(f"`accounting.{name}`=") and "\n" not in problem, name
        assert "2**53" in problem, problem
