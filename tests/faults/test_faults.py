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

from eglr_harness.run.stores import RolloutStore, TauHCache

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
    value = json.dumps({"tau_h": tau_h, "prompts": 4})
    db.execute("INSERT OR REPLACE INTO tau_h (key, value) VALUES (?, ?)", (key, value))
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


@pytest.mark.parametrize("accounting", [
    {"tokens": -1, "iterations": {}, "L": 2}, {"tokens": 3, "iterations": {"x": 1}, "L": 2},
    {"tokens": 3, "iterations": {"1": 1}, "L": 2, "shares": {"steps": math.nan}}, {"tokens": 3, "iterations": {}},
])
def test_a_rollout_with_an_invalid_accounting_is_not_stored(tmp_path, accounting):
    """The accounting a resumed run adds to its figures (issue 35) is checked like the rest of a record."""
    store = RolloutStore(tmp_path)
    store.put("bad", {"text": "t", "signals": None, "engine": "continuous", "accounting": accounting})
    store.put("good", {"text": "t", "signals": None, "engine": "hook",
                       "accounting": {"tokens": 3, "iterations": {"2": 1}, "L": 2, "shares": {"steps": 1.5}}})
    assert store.get("bad") is None and store.get("good")["accounting"]["shares"] == {"steps": 1.5}


def test_a_store_written_before_the_hook_engine_was_renamed_reads_as_hook(tmp_path):
    """A rollout stored with ``engine: hf`` (the hook engine's name until issue 56) is reused, under its name now:
    a resumed run's samples and ``config.eglr.engines`` say ``hook``, not both names."""
    store = RolloutStore(tmp_path)
    store.put("old", {"text": "t", "signals": None, "engine": "hf"})
    store.put("odd", {"text": "t", "signals": None, "engine": "fast"})
    assert store.get("old") == {"text": "t", "signals": None, "engine": "hook"} and store.get("odd") is None


def test_a_rollout_store_in_a_folder_that_cannot_be_created_names_it(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(OSError, match=r"rollout store .*file/store"):
        RolloutStore(blocker / "store")


# ---------------------------------------------------------------------------------------------
# outputs that cannot be written


def _mount_tmpfs(folder: Path, options: str) -> bool:
    """A tmpfs at ``folder`` (root on Linux only); False where the OS does not allow it."""
    import shutil
    import subprocess

    if os.name != "posix" or os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True)
    return done.returncode == 0


def _umount(folder: Path) -> None:
    import subprocess

    subprocess.run(["umount", str(folder)], capture_output=True)


@pytest.fixture
def real_read_only_folder(tmp_path):
    """A folder the OS refuses writes to: a read-only tmpfs (root on Linux) or a 0555 folder (other
    users); skipped where neither is possible."""
    folder = tmp_path / "ro"
    if _mount_tmpfs(folder, "ro,size=64k"):
        yield folder
        _umount(folder)
    elif os.name == "posix" and os.geteuid() != 0:
        folder.mkdir()
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
    else:
        pytest.skip("no read-only folder here (root without mount)")


@pytest.fixture
def read_only_folder(tmp_path, monkeypatch):
    """:func:`real_read_only_folder` where the OS allows one, else writes that fail with EROFS (monkeypatched)."""
    import errno

    folder = tmp_path / "ro"
    if _mount_tmpfs(folder, "ro,size=64k"):
        yield folder
        _umount(folder)
        return
    folder.mkdir()
    if os.name == "posix" and os.geteuid() != 0:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return

    def refuse(*_args, **_kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(os, "fsync", refuse)
    yield folder


@pytest.fixture
def small_disk(tmp_path):
    """A 96 KiB tmpfs (root on Linux); skipped where the OS does not allow one."""
    folder = tmp_path / "small"
    if not _mount_tmpfs(folder, "size=96k"):
        pytest.skip("no tmpfs here (needs root on Linux); the full disk is covered by the monkeypatched case")
    yield folder
    _umount(folder)


def _fill(folder: Path) -> None:
    with open(folder / "filler", "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError:
            pass


def test_output_path_that_cannot_be_written_is_refused_before_the_model_loads(read_only_folder):
    """What an eglr run's ``process_tasks`` and ``simple_evaluate`` call first (harness/lm_eval_patches.py)."""
    from eglr_harness.core.errors import OutputError
    from eglr_harness.harness.output import check_output_path

    target = read_only_folder / "out"
    with pytest.raises(OutputError, match=r"--output_path=.*ro/out.* cannot be written"):
        check_output_path(str(target))


def test_a_full_disk_is_refused_before_the_run(small_disk):
    from eglr_harness.core.errors import OutputError
    from eglr_harness.harness.output import check_output_path

    _fill(small_disk)
    with pytest.raises(OutputError, match="No space left"):
        check_output_path(str(small_disk / "out"))


def _tracker_with_samples(output: Path):
    from lm_eval.loggers.evaluation_tracker import EvaluationTracker

    tracker = EvaluationTracker(output_path=str(output))
    tracker.general_config_tracker.log_experiment_args(model_source="eglr-hf", model_args="pretrained=x",
                                                       system_instruction=None, chat_template=None,
                                                       fewshot_as_multiturn=False)
    samples = [{"doc_id": i, "doc": {"problem": "p" * 2000}, "target": "1", "arguments": [("prompt", {})],
                "resps": [["text " * 400]], "filtered_resps": ["1"], "filter": "none", "metrics": ["acc"],
                "acc": 1, "doc_hash": "d", "prompt_hash": "p", "target_hash": "t"} for i in range(40)]
    return tracker, samples


def test_a_disk_that_fills_during_the_run_fails_it_and_leaves_no_cut_file(small_disk):
    from eglr_harness.core.errors import OutputError

    tracker, samples = _tracker_with_samples(small_disk / "out")
    tracker.save_results_aggregated(results={"results": {}, "config": {}}, samples=None)
    _fill(small_disk)  # the disk fills while the model decodes
    with pytest.raises(OutputError, match=r"samples_t_.*\.jsonl: cannot be written \(No space left"):
        tracker.save_results_samples(task_name="t", samples=samples)  # today: logged at INFO, file cut mid-line
    leftovers = [p.name for p in small_disk.rglob("*") if p.is_file() and p.name != "filler"]
    assert not any(name.startswith(("samples_", ".samples_")) for name in leftovers), leftovers


def test_samples_are_written_whole_or_not_at_all(tmp_path):
    tracker, samples = _tracker_with_samples(tmp_path / "out")
    tracker.save_results_aggregated(results={"results": {}, "config": {}}, samples={"t": samples})
    broken = [dict(s) for s in samples]
    del broken[20]["arguments"]  # the save fails half-way
    with pytest.raises(KeyError):
        tracker.save_results_samples(task_name="broken", samples=broken)  # today: 20 lines kept, rc 0
    assert not list((tmp_path / "out").rglob("*broken*"))
    tracker.save_results_samples(task_name="t", samples=samples)  # lm-eval's names and lines
    (results,) = (tmp_path / "out").rglob("results_*.json")
    (written,) = (tmp_path / "out").rglob("samples_t_*.jsonl")
    assert results.stem.removeprefix("results_") == written.stem.removeprefix("samples_t_")
    lines = written.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 40 and json.loads(lines[-1])["arguments"] == {"gen_args_0": {"arg_0": "prompt", "arg_1": {}}}
    assert "task_hashes" in json.loads(results.read_text())
    assert oct(written.stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_the_cli_refuses_an_unwritable_output_path_in_one_line(real_read_only_folder, tmp_path):
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "eglr_harness", "--model", "eglr-hf", "--model_args", "pretrained=/nonexistent",
         "--tasks", "eglr_demo", "--limit", "1", "--output_path", str(real_read_only_folder / "out"), "--log_samples"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "EGLR_CACHE_DIR": str(tmp_path)},
    )
    assert done.returncode != 0  # today: 0 after the whole run (pretrained=/nonexistent: it fails on loading)
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: --output_path=") and "cannot be written" in last


# ---------------------------------------------------------------------------------------------
# input files: benchmark data, samples


@pytest.fixture
def bad_data_dir(tmp_path, shared_data_dir):
    """A copy of the benchmark data whose aime24 file has a non-UTF-8 byte on line 7."""
    import shutil

    folder = tmp_path / "data"
    shutil.copytree(shared_data_dir, folder)
    path = folder / "aime24" / "test.jsonl"
    lines = path.read_bytes().split(b"\n")
    lines[6] = lines[6][:20] + b"\xff" + lines[6][21:]
    path.write_bytes(b"\n".join(lines))
    return folder


def test_a_non_utf8_byte_in_a_data_file_names_file_and_line(bad_data_dir):
    from eglr_harness.data.loading import load_problems

    with pytest.raises(ValueError, match=r"aime24/test\.jsonl:7: not UTF-8 \(byte 0xff at column 21\)"):
        load_problems("aime24", data_dir=bad_data_dir)  # today: UnicodeDecodeError, no file or line


def test_a_bad_data_line_stops_the_run_before_the_model_loads(bad_data_dir, monkeypatch, tmp_path):
    from lm_eval.evaluator import simple_evaluate

    from eglr_harness.core.errors import FileFormatError

    monkeypatch.setenv("EGLR_DATA_DIR", str(bad_data_dir))
    # pretrained=an empty folder: the model would fail to load, so the data must be read first
    for tasks in (["aime24_eglr_sc"], ["eglr_math"]):
        with pytest.raises(FileFormatError, match=r"aime24/test\.jsonl:7:"):
            simple_evaluate(model="eglr-hf", model_args=f"pretrained={tmp_path}", tasks=tasks, limit=1)
    from eglr_harness.data.loading import check_local_data

    check_local_data(["eglr_demo", "gsm8k_eglr_sc", "aime24"])  # tasks that do not read that file are not held up


def test_a_data_row_without_the_fields_names_its_1_based_line(tmp_path):
    from eglr_harness.data.loading import load_problems

    (tmp_path / "aime25").mkdir()
    (tmp_path / "aime25" / "test.jsonl").write_text('{"problem": "p", "answer": "1"}\n\n{"question": "q"}\n')
    with pytest.raises(ValueError, match=r"aime25/test\.jsonl:3: a row of 'aime25' with fields \['question'\]"):
        load_problems("aime25", data_dir=tmp_path)


def _fake_run(tmp_path: Path) -> Path:
    """A small eglr-hf run (results and samples) written by lm-eval's tracker (tests/helpers/lmeval_fakes.py)."""
    from helpers import lmeval_fakes

    results = lmeval_fakes.write_grid_run(tmp_path / "run", list(lmeval_fakes.GRID), task="toy_eglr_lxt")
    return next(results.parent.glob("samples_*.jsonl"))


@pytest.mark.parametrize("damage", ["cut", "empty", "not_json", "not_a_sample"])
def test_score_and_report_refuse_broken_samples_with_file_and_line(tmp_path, capsys, damage):
    from eglr_harness.commands.report import main as report_main
    from eglr_harness.commands.score import main as score_main

    samples = _fake_run(tmp_path)
    text = samples.read_text(encoding="utf-8")
    broken = {"cut": text[: len(text) // 2], "empty": "", "not_json": text.replace("\n", "\n[1, 2\n", 1),
              "not_a_sample": text.replace("\n", "\n[1, 2]\n", 1)}[damage]
    samples.write_text(broken, encoding="utf-8")
    line = broken.count("\n") + 1 if damage == "cut" else 2
    where = f"{samples}:{line}:" if damage != "empty" else f"{samples}: no document lines"
    for command in (lambda: score_main([str(samples.parent), "--output_path", str(tmp_path / "scored")]),
                    lambda: report_main([str(samples.parent), "--out", str(tmp_path / "report")])):
        code = command()  # today: a JSONDecodeError traceback (eglr-score) or rc 0 over 0 documents (eglr-report)
        err = capsys.readouterr().err.strip().splitlines()
        assert code != 0 and err and where in err[-1], err


# ---------------------------------------------------------------------------------------------
# tau_h from the cache, a calibration or a preset: never NaN


def test_a_nan_in_the_tau_h_cache_is_calibrated_again(tmp_path):
    from eglr_harness.run.calibration import cached_calibration, new_calibration

    cache = TauHCache(tmp_path / "tau_h.sqlite")
    key = "calibration key"
    _stored_tau_h(cache.path, key, math.nan)
    assert cached_calibration(cache, key) is None  # so the caller decodes afresh; today: NaN, nothing ever gated
    result = new_calibration([0.5, 1.0, 3.0], 1, cache=cache, key=key)
    assert math.isfinite(result.tau_h) and not result.cached
    assert cache.get(key)["tau_h"] == result.tau_h


def test_nan_entropies_never_become_a_tau_h():
    import torch

    from eglr_harness.run.calibration import calibrated_threshold

    with pytest.raises(FloatingPointError, match="NaN"):
        calibrated_threshold(torch.tensor([0.5, math.nan, 1.0]))  # today: min(nan, 2.5) = nan


@pytest.mark.parametrize("bad", [".nan", "-3", "abc"])
def test_a_preset_tau_h_that_gates_nothing_is_refused(tmp_path, bad):
    from eglr_harness.run.presets import load_preset

    path = tmp_path / "p.yaml"
    path.write_text(f"model_args: {{pretrained: x}}\ntau_h: {{gsm8k: {bad}}}\n")
    with pytest.raises(ValueError, match=r"p\.yaml: `tau_h\.gsm8k`=.* is not allowed"):
        load_preset(str(path))


def test_a_damaged_rollout_store_is_found_before_the_model_loads(tmp_path, caplog):
    from eglr_harness.run.stores import check_rollout_cache

    path = _filled_store(tmp_path, _rollouts())
    os.truncate(path, 10_000)
    with caplog.at_level(logging.WARNING):
        check_rollout_cache(tmp_path)  # the autoload calls it where eglr-hf's model args are checked
    assert _damaged_aside(tmp_path) and any(str(path) in m for m in _warnings(caplog))


def test_an_unwritable_rollout_cache_is_refused_before_the_model_loads(real_read_only_folder):
    from eglr_harness.core.errors import OutputError
    from eglr_harness.run.stores import check_rollout_cache

    with pytest.raises(OutputError, match=r"rollout_cache=.* cannot be written"):
        check_rollout_cache(real_read_only_folder / "store")


def test_score_report_and_export_refuse_an_unwritable_output_in_one_line(tmp_path, real_read_only_folder, capsys):
    from eglr_harness.commands.report import main as report_main
    from eglr_harness.commands.export import main as export_main
    from eglr_harness.commands.score import main as score_main

    run = _fake_run(tmp_path).parent
    for command, flag, name in ((score_main, "--output_path", "out"), (report_main, "--out", "out"),
                                (export_main, "--out", "out/pool.jsonl"), (export_main, "--out", "pool.parquet")):
        assert command([str(run), flag, str(real_read_only_folder / name)]) == 2  # today: an OSError traceback
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"ro/{name}" in err[0] and "cannot be" in err[0], err
