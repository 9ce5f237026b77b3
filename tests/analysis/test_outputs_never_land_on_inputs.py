"""Issue 47 (2): no command writes over or into what it reads, nor through a link out of its output
folder, and the leaderboard's guard of committed files fails closed. Each case runs the console script
on a copy of a genuine run (``data/real_gsm8k_eglr_sc``) and checks the run's bytes afterwards."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eglr_harness.leaderboard.runner import check_output_dir, tracked_files

REAL = Path(__file__).parent / "data" / "real_gsm8k_eglr_sc"


def _run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(REAL, run)
    return run


def _digest(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _console(name: str, *args: str) -> subprocess.CompletedProcess:
    """The installed console script (as a user runs it), else its module."""
    script = Path(sys.executable).with_name(name)
    module = "eglr_harness.commands." + name.removeprefix("eglr-")
    argv = [str(script)] if script.exists() else [sys.executable, "-m", module]
    return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=300)


def _one_line_refusal(done: subprocess.CompletedProcess, command: str) -> str:
    lines = [x for x in done.stderr.splitlines() if not x.startswith(("INFO", "WARNING"))]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 1 and lines[0].startswith(f"{command}: error: "), lines
    return lines[0]


def test_export_onto_the_runs_own_samples_is_refused(tmp_path):
    """Exited 0 and replaced the run's samples with export rows."""
    run = _run(tmp_path)
    (samples,) = run.rglob("samples_*.jsonl")
    before = _digest(run)
    message = _one_line_refusal(_console("eglr-export", str(run), "--out", str(samples)), "eglr-export")
    expected = f"`--out`={str(samples)!r} lies inside the input {str(run)!r}"
    assert expected in message.replace("--out=", "`--out`="), message
    assert _digest(run) == before


def test_export_through_a_link_into_the_run_is_refused(tmp_path):
    run = _run(tmp_path)
    (samples,) = run.rglob("samples_*.jsonl")
    link = tmp_path / "pool.jsonl"
    link.symlink_to(samples)
    before = _digest(run)
    message = _one_line_refusal(_console("eglr-export", str(run), "--out", str(link)), "eglr-export")
    assert f"(as {samples.resolve()})" in message, message
    assert _digest(run) == before and link.is_symlink()


def test_export_beside_the_run_is_written(tmp_path):
    """The other side: a path outside the run is allowed."""
    run = _run(tmp_path)
    done = _console("eglr-export", str(run), "--out", str(tmp_path / "pool.jsonl"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "pool.jsonl").stat().st_size > 0


@pytest.mark.parametrize("given", ["run", "samples_file"])
def test_score_into_its_own_run_is_refused(tmp_path, given):
    """`eglr-score RUN --output_path RUN` rescored in place without asking; a samples file given directly
    with --output_path its run folder lands the scored file on its source (OUT/<model folder>/<file>)."""
    run = _run(tmp_path)
    (samples,) = run.rglob("samples_*.jsonl")
    before = _digest(run)
    source = run if given == "run" else samples
    message = _one_line_refusal(_console("eglr-score", str(source), "--output_path", str(run)), "eglr-score")
    assert "--output_path" in message and "never writes over or into what it reads" in message, message
    assert _digest(run) == before


def test_report_replaces_links_in_its_folder_instead_of_writing_through_them(tmp_path):
    run = _run(tmp_path)
    out = tmp_path / "report"
    out.mkdir()
    outside = tmp_path / "precious"
    outside.mkdir()
    names = ["report.md", "cell_accuracy.csv", "accuracy_heatmap.png"]
    for name in names:
        (outside / name).write_text("keep me\n")
        (out / name).symlink_to(outside / name)
    done = _console("eglr-report", str(run), "--out", str(out))
    assert done.returncode == 0, done.stderr
    for name in names:
        assert (outside / name).read_text() == "keep me\n", name
        assert not (out / name).is_symlink() and (out / name).stat().st_size > 0, name


def _git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                   capture_output=True)


@pytest.fixture
def checkout(tmp_path):
    """A git checkout with a committed leaderboard under results/lb."""
    repo = tmp_path / "checkout"
    (repo / "results" / "lb").mkdir(parents=True)
    (repo / "results" / "lb" / "leaderboard.md").write_text("committed\n")
    _git("init", "-q", ".", cwd=repo)
    _git("add", "-A", cwd=repo)
    _git("commit", "-qm", "results", cwd=repo)
    return repo


def test_the_guard_resolves_a_link_into_the_checkout(checkout, tmp_path):
    """Through a symlink git heard "nothing tracked" and the committed leaderboard was overwritten."""
    link = tmp_path / "elsewhere"
    link.symlink_to(checkout / "results" / "lb")
    assert tracked_files(link) == ["leaderboard.md"]
    with pytest.raises(ValueError, match="tracked by git"):
        check_output_dir(link)


def test_the_guard_refuses_when_git_cannot_decide(checkout, monkeypatch):
    """git missing (here: not on PATH) inside a checkout: refused, saying why, not read as "nothing tracked"."""
    monkeypatch.setenv("PATH", str(checkout))  # no git there
    with pytest.raises(ValueError, match=r"git cannot say whether .* \(git is not installed\)"):
        check_output_dir(checkout / "results" / "lb")


def test_the_guard_refuses_a_repository_git_refuses(checkout, monkeypatch):
    (checkout / ".git" / "HEAD").write_text("garbage\n")  # git: "not a git repository"
    with pytest.raises(ValueError, match=r"git ls-files exited \d+: "):
        check_output_dir(checkout / "results" / "lb" / "new")


def test_the_guard_allows_a_folder_outside_any_checkout_without_git(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert tracked_files(tmp_path / "out" / "lb") == []


def test_the_leaderboard_console_script_refuses_a_link_to_committed_results(checkout, tmp_path):
    link = tmp_path / "lb_link"
    link.symlink_to(checkout / "results" / "lb")
    done = _console("eglr-leaderboard", "--model_args", "pretrained=/models/smol", "--tasks", "gsm8k", "--limit", "1",
                    "--output_dir", str(link))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "tracked by git" in done.stderr
    assert (checkout / "results" / "lb" / "leaderboard.md").read_text() == "committed\n"
    assert os.path.islink(link)


def test_score_on_a_full_disk_leaves_both_files_or_neither(tmp_path, monkeypatch, capsys):
    """Issue 47: on a full disk eglr-score left the scored samples without their results. The disk fills
    while the second file is flushed: neither file may appear, and the command says so in one line."""
    import errno

    from eglr_harness.commands.score import main as score_main

    run = _run(tmp_path)
    real_fsync, calls = os.fsync, []

    def fills_on_the_second(fd):  # the results file is flushed after the samples file
        calls.append(os.readlink(f"/proc/self/fd/{fd}"))
        if Path(calls[-1]).name.startswith(".results_"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    out = tmp_path / "scored"
    out.mkdir()
    monkeypatch.setattr(os, "fsync", fills_on_the_second)
    assert score_main([str(run), "--output_path", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0], err
    assert [p for p in out.rglob("*") if p.is_file()] == []  # no samples without results, no temp file
    assert any(Path(c).name.startswith(".samples_") for c in calls)  # the samples had been written and flushed


def test_report_on_a_full_disk_leaves_the_earlier_report_whole(tmp_path, monkeypatch, capsys):
    """Issue 47: on a full disk eglr-report left part of its files. The report is a set: the disk fills while its
    last file (report.md) is flushed, and the earlier report in --out stays as it was, every file of it, with no
    temporary file left; the command says so in one line."""
    import errno

    from eglr_harness.commands.report import main as report_main

    run, out = _run(tmp_path), tmp_path / "report"
    assert report_main([str(run), "--out", str(out), "--sections", "runs,pools", "-v", "WARNING"]) == 0
    (out / "notes.txt").write_text("mine\n")  # a file of the user's: left alone
    before = _digest(out)
    real_fsync = os.fsync

    def fills_on_report_md(fd):
        if Path(os.readlink(f"/proc/self/fd/{fd}")).name.startswith(".report.md"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fills_on_report_md)
    capsys.readouterr()
    assert report_main([str(run), "--out", str(out), "--sections", "runs,pools,selection", "-v", "WARNING"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0], err
    assert _digest(out) == before and not list(out.glob(".*"))  # not selection.csv alone, no staging folder
