"""The rollout store hands back only records its readers accept (issue 71, item 4): a stored rollout's accounting
and signals are checked by the rules ``core/run_format.py`` reads a run's files with, when the store is read; a
bad record is a miss (decoded again), said once per store with the count. Before, ``iterations {"0": 5}`` was
reused and then eglr-report refused the run's own file; ``"²"`` or ``head_projections "abc"`` was a ValueError
traceback; ``"calibration": "false"`` was read as True."""

from __future__ import annotations

import json
import logging

import pytest

from eglr_harness.core.run_format import _check_stats, _Problem
from eglr_harness.decoding.stats import EglrStats, RolloutAccount
from eglr_harness.run.stores import RolloutStore, _checksum

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)

SOUND = {"tokens": 12, "iterations": {"1": 2, "3": 1}, "L": 4, "head_projections": 5,
         "shares": {"steps": 10.5, "gated_steps": 2.0, "computed_rows": 12, "computed_refine_layer_evals": 20.0,
                    "wall_time_s": 0.25}}

BAD = {
    "k 0": {**SOUND, "iterations": {"0": 5}},
    "superscript two": {**SOUND, "iterations": {"\u00b2": 1}},
    "head_projections text": {**SOUND, "head_projections": "abc"},
    "head_projections -5": {**SOUND, "head_projections": -5},
    "tokens 2**60": {**SOUND, "tokens": 2**60},
    "steps 1e300": {**SOUND, "shares": {**SOUND["shares"], "steps": 1e300}},
    "calibration text": {**SOUND, "calibration": "false"},
    "more gated than tokens": {**SOUND, "tokens": 2},
    "L -1": {**SOUND, "L": -1},
    "iterations list": {**SOUND, "iterations": [[1, 2]]},
    "count float": {**SOUND, "iterations": {"1": 2.0}},
    "refinement beyond 2**53": {**SOUND, "L": 2**52, "iterations": {"4": 2}},
}


def _rollout(accounting=None, signals=None) -> dict:
    record = {"text": "an answer", "signals": signals, "engine": "hook"}
    if accounting is not None:
        record["accounting"] = accounting
    return record


def _stored_behind_the_stores_back(folder, records: dict) -> None:
    """Records written with their checksums but without the store's check on write (an older eglr-harness's)."""
    store = RolloutStore(folder)
    rows = []
    for key, value in records.items():
        text = json.dumps(value)
        rows.append((key, text, _checksum(key, text)))
    store._insert(rows)
    store.close()


def _summary(accounting: dict) -> dict:
    """The figures a run that reused the record reports (the record taken as it is, as the store took it before)."""
    stats = EglrStats(num_layers=30)
    stats.add_rollout(RolloutAccount(
        tokens=accounting["tokens"], iterations=tuple(sorted((int(k), n) for k, n in accounting["iterations"].items())),
        L=accounting["L"], head_projections=accounting["head_projections"], shares=accounting["shares"]))
    return stats.summary()


def test_a_sound_record_is_reused_and_its_figures_read_back(tmp_path):
    _stored_behind_the_stores_back(tmp_path, {"k": _rollout(SOUND)})
    assert RolloutStore(tmp_path).get("k") == _rollout(SOUND)
    summary = _summary(SOUND)
    _check_stats({"total": summary, "cells": {"L=4,T=0.0": summary}})  # the reader takes it


@pytest.mark.parametrize("name", list(BAD))
def test_a_record_its_readers_refuse_is_a_miss(tmp_path, name):
    _stored_behind_the_stores_back(tmp_path, {"k": _rollout(BAD[name]), "good": _rollout(SOUND)})
    store = RolloutStore(tmp_path)
    assert store.get("k") is None  # decoded again; was reused (or a traceback at from_json)
    assert store.get("good") == _rollout(SOUND)
    assert len(store) == 1  # dropped from the file


@pytest.mark.parametrize("name", ["k 0", "head_projections -5", "tokens 2**60", "steps 1e300",
                                  "more gated than tokens"])
def test_why_such_a_record_must_not_be_reused(name):
    """What the record would have made: a results file its own reader refuses."""
    summary = _summary(BAD[name])
    with pytest.raises(_Problem):
        _check_stats({"total": summary, "cells": {"L=4,T=0.0": summary}})


@pytest.mark.parametrize("name", ["superscript two", "head_projections text", "calibration text"])
def test_from_json_refuses_a_bad_record_in_one_line(name):
    with pytest.raises(ValueError, match="allowed") as info:
        RolloutAccount.from_json(BAD[name])
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("signals", [{"mean_logprob": 3.0}, {"mean_entropy": float("nan")},
                                     {"mean_entropy": 1e300}, ["x"]])
def test_signals_the_samples_reader_refuses_are_a_miss(tmp_path, signals):
    _stored_behind_the_stores_back(tmp_path, {"k": _rollout(SOUND, signals)})
    assert RolloutStore(tmp_path).get("k") is None


def test_the_drops_are_said_once_with_the_store_and_the_count(tmp_path, caplog):
    records = {f"bad-{i}": _rollout(BAD[name]) for i, name in enumerate(BAD)}
    _stored_behind_the_stores_back(tmp_path, {**records, "good": _rollout(SOUND)})
    with caplog.at_level(logging.WARNING, logger="eglr_harness"):
        store = RolloutStore(tmp_path)
        assert all(store.get(key) is None for key in records) and store.get("good") is not None
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert str(store.path) in warnings[0] and f"{len(BAD)} stored rollouts" in warnings[0], warnings[0]


def test_a_bad_record_is_not_stored(tmp_path, caplog):
    store = RolloutStore(tmp_path)
    with caplog.at_level(logging.WARNING, logger="eglr_harness"):
        store.put("k", _rollout(BAD["calibration text"]))
    assert store.get("k") is None and "not storing an invalid record" in caplog.text
    store.put("c", _rollout({**SOUND, "calibration": True}))
    assert RolloutAccount.from_json(store.get("c")["accounting"]).calibration is True
