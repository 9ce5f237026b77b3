"""A write that fails says what to do about its cause (issue 47: a read-only folder was told to "free space")."""

from __future__ import annotations

import errno
import os

import pytest

from eglr_harness.core import outputs
from eglr_harness.core.errors import OutputError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("code, said, not_said", [
    (errno.EROFS, "is read-only: give a writable folder", "free space"),
    (errno.EACCES, "is not writable for this user: give a writable folder", "free space"),
    (errno.ENOSPC, "free space there or give a folder on another disk", "read-only"),
])
def test_a_folder_that_cannot_be_written_is_told_what_to_do_about_its_cause(tmp_path, monkeypatch, code, said,
                                                                             not_said):
    def refuse(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(outputs.tempfile, "NamedTemporaryFile", refuse)  # as the probe write fails there
    with pytest.raises(OutputError) as refused:
        outputs.check_writable(tmp_path / "out", "--output_path")
    assert said in str(refused.value) and not_said not in str(refused.value)
    assert len(str(refused.value).splitlines()) == 1


def test_a_file_that_cannot_be_written_is_told_what_to_do_about_its_cause(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(outputs.tempfile, "mkstemp", refuse)
    with pytest.raises(OutputError, match="is read-only: give a writable folder") as refused:
        outputs.atomic_write_text(tmp_path / "report.md", "x")
    assert "free space" not in str(refused.value)


def test_a_link_at_the_output_is_replaced_not_written_through(tmp_path):
    """A file a command writes whole replaces a link there by the file; the link's target is left alone (the
    report's figures, a score's samples: issue 47, writes through links out of the output folder)."""
    target = tmp_path / "elsewhere.md"
    target.write_text("not yours\n")
    link = tmp_path / "out" / "report.md"
    link.parent.mkdir()
    link.symlink_to(target)
    outputs.atomic_write_text(link, "the report\n")
    assert target.read_text() == "not yours\n"
    assert not link.is_symlink() and link.read_text() == "the report\n"


def test_a_link_given_as_the_input_is_followed_to_the_run_it_names(tmp_path):
    """Issue 55 (a surviving mutant): the guard resolved links on the output side only. The run is read through a
    link; the output, written by its real path, lands inside it."""
    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    (tmp_path / "link").symlink_to(run)
    with pytest.raises(OutputError, match="lies inside the input"):
        outputs.refuse_writing_into([run / "model" / "pool.jsonl"], [tmp_path / "link"], "--out")
    results = run / "model" / "results_2026-01-01T00-00-00.json"
    results.write_text("{}")
    (tmp_path / "results_link.json").symlink_to(results)  # a results file named through a link: its folder is read
    with pytest.raises(OutputError, match="lies inside the folder of the input"):
        outputs.refuse_writing_into([run / "model" / "samples_x.jsonl"], [tmp_path / "results_link.json"], "--out")
    outputs.refuse_writing_into([tmp_path / "elsewhere.jsonl"], [tmp_path / "link"], "--out")  # outside: allowed
