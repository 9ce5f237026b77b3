"""A store's export (``<name>.jsonl.gz``, what results/ commits instead of the ``.sqlite``): the same records give
the same bytes, a store that opens takes the records of its export it lacks (the file rebuilt when missing), each
checked as a stored one, and ``eglr-store`` writes the exports (a store with no record: none)."""

from __future__ import annotations

import gzip
import json

import pytest

from eglr_harness.commands import store as store_command
from eglr_harness.core.errors import FileFormatError
from eglr_harness.core.jsonl import gzip_bytes
from eglr_harness.run.stores import RolloutStore
from eglr_harness.verify.store import ScoreStore

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)

RECORDS = {f"key{i:02d}": {"text": f"answer {i}", "signals": {"tokens": i}, "engine": "hook"} for i in range(12)}


def _filled(folder, records=RECORDS) -> RolloutStore:
    store = RolloutStore(folder)
    store.put_many(records)
    return store


def test_the_export_is_sorted_and_the_same_bytes_for_the_same_records(tmp_path):
    one = _filled(tmp_path / "a")
    two = _filled(tmp_path / "b", dict(reversed(list(RECORDS.items()))))  # written in the other order
    assert one.export_bytes() == two.export_bytes()
    lines = [json.loads(line) for line in gzip.decompress(one.export_bytes()).splitlines()]
    assert [line["key"] for line in lines] == sorted(RECORDS)
    assert all(set(line) == {"key", "value", "checksum"} for line in lines)


def test_a_missing_store_is_rebuilt_from_its_export(tmp_path):
    folder = tmp_path / "rollouts"
    store = _filled(folder)
    store.export_path.write_bytes(store.export_bytes())
    assert store.export_path.name == "rollouts_rank0.jsonl.gz"
    store.close()
    for leftover in folder.glob("rollouts_rank0.sqlite*"):
        leftover.unlink()
    rebuilt = RolloutStore(folder)
    assert len(rebuilt) == len(RECORDS) and all(rebuilt.get(k) == v for k, v in RECORDS.items())


def test_an_existing_store_takes_what_it_lacks_and_keeps_its_own(tmp_path):
    folder = tmp_path / "rollouts"
    store = _filled(folder, dict(list(RECORDS.items())[:5]))
    store.export_path.write_bytes(store.export_bytes())
    store.close()
    later = RolloutStore(tmp_path / "later")
    later.put_many(dict(list(RECORDS.items())[3:]))
    (folder / "rollouts_rank0.jsonl.gz").write_bytes(later.export_bytes())  # a newer export, as a pull brings
    merged = RolloutStore(folder)
    assert len(merged) == len(RECORDS) and merged.get("key11") == RECORDS["key11"]


def test_an_export_record_that_fails_its_checksum_is_dropped(tmp_path, caplog):
    store = _filled(tmp_path / "x")
    lines = [json.loads(line) for line in gzip.decompress(store.export_bytes()).splitlines()]
    lines[0]["value"] = lines[0]["value"].replace("answer 0", "answer 9")  # edited by hand: its checksum fails
    folder = tmp_path / "rollouts"
    folder.mkdir()
    (folder / "rollouts_rank0.jsonl.gz").write_bytes(gzip_bytes("".join(json.dumps(x) + "\n" for x in lines).encode()))
    rebuilt = RolloutStore(folder)
    assert rebuilt.get("key00") is None and len(rebuilt) == len(RECORDS) - 1
    assert "1 stored rollouts failed its check (the first: its checksum)" in caplog.text


def test_an_export_line_of_another_shape_is_refused_naming_file_and_line(tmp_path):
    folder = tmp_path / "rollouts"
    folder.mkdir()
    (folder / "rollouts_rank0.jsonl.gz").write_bytes(gzip_bytes(b'{"key": "k", "value": {"text": "t"}}\n'))
    with pytest.raises(FileFormatError, match=r"rollouts_rank0\.jsonl\.gz:1: a record without the strings key"):
        RolloutStore(folder)


def test_eglr_store_exports_rollout_and_score_stores_and_skips_an_empty_one(tmp_path, capsys):
    _filled(tmp_path / "run" / "rollouts").close()
    scores = ScoreStore(tmp_path / "run" / "verify")
    scores.put("k", {"steps": [0.5]})
    scores.close()
    RolloutStore(tmp_path / "run" / "empty").close()
    assert store_command.main(["export", str(tmp_path / "run")]) == 0
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.jsonl.gz"))
    assert written == ["run/rollouts/rollouts_rank0.jsonl.gz", "run/verify/verifier_scores.jsonl.gz"]
    before = (tmp_path / "run" / "rollouts" / "rollouts_rank0.jsonl.gz").read_bytes()
    assert store_command.main(["export", str(tmp_path / "run")]) == 0  # again: the same bytes
    assert (tmp_path / "run" / "rollouts" / "rollouts_rank0.jsonl.gz").read_bytes() == before
    assert store_command.main(["export", str(tmp_path / "nowhere")]) == 2
    assert "`PATH`=" in capsys.readouterr().err


def test_the_check_before_the_model_loads_takes_an_export_alone_in(tmp_path):
    """A committed run.sh's rollout_cache holds only the export: the store is built before the load, not after."""
    from eglr_harness.run.stores import check_rollout_cache

    store = _filled(tmp_path / "made")
    folder = tmp_path / "rollouts"
    folder.mkdir()
    (folder / "rollouts_rank0.jsonl.gz").write_bytes(store.export_bytes())
    check_rollout_cache(folder)
    assert (folder / "rollouts_rank0.sqlite").is_file()
    assert len(RolloutStore(folder)) == len(RECORDS)
