"""Samples files compressed as ``.jsonl.gz`` (how results/ commits them) read as their plain ``.jsonl``: by the run
finder and eglr-report, eglr-export and eglr-verify's copies (eglr-score: tests/tasks/test_task_rescore.py); one
run's samples in both forms refused; the compression deterministic (the same text, the same bytes)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from helpers import lmeval_fakes
from eglr_harness.analysis import build_report, find_runs, read_task_samples
from eglr_harness.analysis.manifest import compress_samples
from eglr_harness.commands import export
from eglr_harness.core.errors import FileFormatError
from eglr_harness.core.jsonl import encode_lines, gzip_bytes, iter_jsonl
from eglr_harness.harness.rescore import samples_files

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)


def _gzipped_copy(run: Path, to: Path) -> Path:
    """``run`` copied to ``to/<its name>`` (so reports name both alike) with its samples compressed (as results/
    keeps them)."""
    to = shutil.copytree(run, to / run.name)
    assert compress_samples(to), "the copy holds no plain samples file to compress"
    assert not list(to.rglob("samples_*.jsonl")) and list(to.rglob("samples_*.jsonl.gz"))
    return to


def test_compression_is_deterministic_and_reads_back_line_for_line(tmp_path):
    text = "".join(json.dumps({"doc_id": i, "text": "é" * i}, ensure_ascii=False) + "\n" for i in range(50))
    first, again = gzip_bytes(text.encode()), gzip_bytes(text.encode())
    assert first == again and first[4:8] == b"\0\0\0\0"  # no time stamp in the header
    assert not first[3] & 0x08  # no file name in the header (FNAME flag)
    path = tmp_path / "samples_t_2026-01-01T00-00-00.jsonl.gz"
    path.write_bytes(encode_lines(path, text))
    assert gzip.decompress(path.read_bytes()).decode() == text
    assert [row for _, row in iter_jsonl(path)] == [json.loads(line) for line in text.splitlines()]
    assert encode_lines(tmp_path / "x.jsonl", text) == text.encode()  # a plain name stays plain


def test_a_damaged_gzip_file_is_one_line_naming_it(tmp_path):
    path = tmp_path / "samples_t_2026-01-01T00-00-00.jsonl.gz"
    path.write_bytes(gzip_bytes(b'{"doc_id": 0}\n' * 2000)[:-40])  # cut: the stream ends early
    with pytest.raises(FileFormatError, match=r"samples_t_.*\.jsonl\.gz: not sound gzip after line \d+"):
        list(iter_jsonl(path))


def test_report_and_export_read_a_compressed_run_as_the_plain_one(full_run, tmp_path):
    packed = _gzipped_copy(full_run, tmp_path / "packed")
    (plain_run,), (gz_run,) = find_runs(full_run), find_runs(packed)
    assert list(gz_run.samples) == list(plain_run.samples) == ["toy_eglr_lxt"]
    assert gz_run.samples["toy_eglr_lxt"].name.endswith(".jsonl.gz")
    plain, gz = (read_task_samples(r.samples["toy_eglr_lxt"]) for r in (plain_run, gz_run))
    assert gz.rollouts == plain.rollouts and gz.doc_hashes == plain.doc_hashes
    a = build_report([full_run], tmp_path / "a", n_orders=1)
    b = build_report([packed], tmp_path / "b", n_orders=1)
    for name in ("report.md", *(p.name for p in a.glob("*.csv"))):
        assert (b / name).read_text() == (a / name).read_text(), name
    for run, out in ((full_run, "a.jsonl"), (packed, "b.jsonl")):
        assert export.main([str(run), "--out", str(tmp_path / out)]) == 0
    assert (tmp_path / "a.jsonl").read_text() == (tmp_path / "b.jsonl").read_text()


def test_one_run_with_both_forms_is_refused_naming_both(full_run):
    (plain,) = full_run.rglob("samples_*.jsonl")
    plain.with_name(plain.name + ".gz").write_bytes(gzip_bytes(plain.read_bytes()))
    with pytest.raises(FileFormatError, match=rf"{plain.name} and {plain.name}\.gz beside it: one run's samples twice"):
        find_runs(full_run)
    with pytest.raises(FileFormatError, match="one run's samples twice"):
        samples_files([full_run])


def test_eglr_verify_copies_a_compressed_run_compressed(full_run, tmp_path):
    from eglr_harness.verify.run import plan_copies

    packed = _gzipped_copy(full_run, tmp_path / "packed")
    (copy,) = plan_copies([packed], tmp_path / "scored")
    ((source, target),) = copy.samples.items()
    assert source.name.endswith(".jsonl.gz") and target.name == source.name


def test_lmeval_fakes_write_plain_samples(tmp_path):
    """The fakes stand for a user's fresh lm-eval output, which stays plain .jsonl."""
    lmeval_fakes.write_grid_run(tmp_path / "run", list(lmeval_fakes.GRID)[:2])
    assert list((tmp_path / "run").rglob("samples_*.jsonl")) and not list((tmp_path / "run").rglob("*.gz"))
