"""Fault injection (issue 28): nothing lost, nothing trusted blindly.

Damaged stores (truncated sqlite files, garbage bytes, a changed byte inside a record, invalid
values), outputs that cannot be written (a read-only folder where the OS allows it, a full disk by
monkeypatched writes), bad data lines, broken samples files and sweep values that no run accepts.
Each case ends in a one- or two-line error naming the file or argument, or in a safe recovery that
says so; never in a traceback of a library, a file cut mid-line or a silently wrong value.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sqlite3
from pathlib import Path

import pytest

from eglr_harness.stores import RolloutStore, TauHCache

# ---------------------------------------------------------------------------------------------
# stores


def _rollouts(n: int = 200) -> dict[str, dict]:
    return {f"key-{i}": {"text": f"rollout {i}: " + "the answer is 42. " * 20, "signals": None} for i in range(n)}


def _filled_store(folder: Path, records: dict) -> Path:
    store = RolloutStore(folder)
    store.put_many(records)
    store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # everything in the main file, as after a clean exit
    store.close()
    return folder / "rollouts_rank0.sqlite"


def _damaged_aside(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if ".damaged-" in p.name and not p.name.endswith(("-wal", "-shm")))


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_truncated_rollout_store_is_moved_aside_and_named(tmp_path, caplog):
    records = _rollouts()
    path = _filled_store(tmp_path, records)
    os.truncate(path, 10_000)
    with caplog.at_level(logging.WARNING):
        store = RolloutStore(tmp_path)  # today: a sqlite traceback, no file named
        for key, value in records.items():
            assert store.get(key) in (None, value)  # what survives is exact, the rest is recomputed
        store.put("new", {"text": "fresh", "signals": None})
        assert store.get("new") == {"text": "fresh", "signals": None}
    (aside,) = _damaged_aside(tmp_path)
    (message,) = [m for m in _warnings(caplog) if "damaged" in m]
    assert str(path) in message and aside.name in message and ".recover" in message


@pytest.mark.parametrize("offset", [0, 4096, 9000, 30_000, 60_000])
def test_garbage_bytes_in_a_rollout_store_never_raise_nor_return_a_wrong_text(tmp_path, caplog, offset):
    records = _rollouts()
    path = _filled_store(tmp_path, records)
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(bytes(range(200, 232)))  # 32 bytes that are neither UTF-8 nor a sound page
    with caplog.at_level(logging.WARNING):
        store = RolloutStore(tmp_path)
        got = {key: store.get(key) for key in records}
    assert all(value in (None, records[key]) for key, value in got.items())
    if any(value is None for value in got.values()):  # what was lost is said, with the file
        assert any(str(path) in m for m in _warnings(caplog))


def test_damage_found_mid_run_recovers_in_place(tmp_path, caplog):
    records = {f"key-{i}": {"text": f"{i} " + "abc" * 1000, "signals": None} for i in range(1500)}
    store = RolloutStore(tmp_path)
    store.put_many(records)
    store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store._db.execute("PRAGMA cache_size=10")  # later reads go to the file
    path = tmp_path / "rollouts_rank0.sqlite"
    size = path.stat().st_size
    with open(path, "r+b") as handle:
        for offset in range(8192, size, 65536):
            handle.seek(offset)
            handle.write(os.urandom(64))
    with caplog.at_level(logging.WARNING):
        got = {key: store.get(key) for key in records}  # today: "database disk image is malformed"
        store.put("new", {"text": "fresh", "signals": None})
    assert all(value in (None, records[key]) for key, value in got.items())
    assert sum(value is not None for value in got.values()) > len(records) // 2  # the sound records are kept
    assert store.get("new") == {"text": "fresh", "signals": None}
    assert _damaged_aside(tmp_path) and any("damaged" in m and str(path) in m for m in _warnings(caplog))


def test_a_changed_byte_inside_a_stored_text_is_dropped_once_with_the_file(tmp_path, caplog):
    records = _rollouts(20)
    path = _filled_store(tmp_path, records)
    data = bytearray(path.read_bytes())
    for key in ("rollout 7:", "rollout 8:"):
        at = data.index(key.encode())
        data[at] = ord("R")  # "Rollout 7: ..." is still valid JSON and UTF-8
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        store = RolloutStore(tmp_path)
        assert store.get("key-7") is None and store.get("key-8") is None  # today: returned as is
        assert store.get("key-6") == records["key-6"]
    dropped = [m for m in _warnings(caplog) if "failed its check" in m]
    assert len(dropped) == 1 and str(path) in dropped[0]


def _stored_tau_h(path: Path, key: str, tau_h) -> None:
    """A cache row written behind the cache's back (no checksum: a file of an older eglr-harness)."""
    db = sqlite3.connect(path)
    db.execute("INSERT OR REPLACE INTO tau_h (key, value) VALUES (?, ?)", (key, json.dumps({"tau_h": tau_h, "prompts": 4})))
    db.commit()
    db.close()


@pytest.mark.parametrize("bad", [-3, 0, math.nan, "abc", None])
def test_an_invalid_cached_tau_h_is_never_returned(tmp_path, bad):
    path = tmp_path / "tau_h.sqlite"
    TauHCache(path)  # the file and its table
    _stored_tau_h(path, "k", bad)
    assert TauHCache(path).get("k") is None  # today: NaN gates nothing, a plain run labelled EGLR


def test_a_flipped_digit_of_a_cached_tau_h_is_caught(tmp_path):
    path = tmp_path / "tau_h.sqlite"
    cache = TauHCache(path)
    cache.put("k", {"tau_h": 2.5, "prompts": 4, "tokens": 100, "label": "t"})
    cache.put("other", {"tau_h": math.inf, "prompts": 4, "tokens": 100, "label": "t"})
    db = sqlite3.connect(path)
    db.execute("UPDATE tau_h SET value = replace(value, '2.5', '0.5') WHERE key = 'k'")  # still a valid tau_h
    db.commit()
    db.close()
    cache = TauHCache(path)
    assert cache.get("k") is None
    assert cache.get("other")["tau_h"] == math.inf  # inf is a valid gate (nothing is gated)


def test_an_invalid_tau_h_is_not_stored(tmp_path, caplog):
    cache = TauHCache(tmp_path / "tau_h.sqlite")
    with caplog.at_level(logging.WARNING):
        cache.put("k", {"tau_h": math.nan, "prompts": 4, "tokens": 0})
    assert cache.get("k") is None and len(cache) == 0
    assert any("tau_h" in m and "nan" in m for m in _warnings(caplog))


def test_a_rollout_store_in_a_folder_that_cannot_be_created_names_it(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(OSError, match=r"rollout store .*file/store"):
        RolloutStore(blocker / "store")
