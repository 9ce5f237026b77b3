"""Every committed report under ``results/`` equals what the current code makes from its committed run.

The command of each report is read where it is documented: the ``eglr-report`` lines of the ``run.sh``
beside the runs (their shell variables and globs expanded by bash, nothing else of the script run), and the
``eglr-report ... --out ...`` commands quoted in ``results/README.md``. Each is run again into a temporary
folder; the report's file names, its ``report.md`` and its CSVs must equal the committed ones byte for byte
(the PNGs by name: their bytes follow matplotlib's version). A change of the report code that changes a
committed report fails here until the report is regenerated with that command.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from helpers.run_scripts import script_commands
import pytest

from eglr_harness.commands.report import main as eglr_report

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results"


def _readme_commands() -> list[list[str]]:
    """The ``eglr-report ... --out ...`` commands quoted in results/README.md (paths from the repository root)."""
    text = (RESULTS / "README.md").read_text(encoding="utf-8")
    return [shlex.split(quoted)[1:] for quoted in re.findall(r"`(eglr-report [^`]*--out [^`]*)`", text)]


def documented_reports() -> list[tuple[str, list[str]]]:
    """``(report folder, eglr-report argv)`` of every documented report command."""
    commands = [argv for script in sorted(RESULTS.rglob("run.sh")) for argv in script_commands(script, "eglr-report")]
    commands += _readme_commands()
    found = {}
    for argv in commands:
        out = argv[argv.index("--out") + 1]
        found[str(Path(out))] = argv
    return sorted(found.items())


REPORTS = documented_reports()


def test_every_committed_report_has_a_documented_command():
    """A report.md under results/ that no documented command makes could not be checked here."""
    committed = {str(p.parent.relative_to(REPO)) for p in RESULTS.rglob("report.md")}
    assert committed and committed <= {out for out, _ in REPORTS}, sorted(committed - {out for out, _ in REPORTS})


@pytest.mark.parametrize("out, argv", REPORTS, ids=[out.removeprefix("results/") for out, _ in REPORTS])
def test_a_committed_report_equals_what_the_code_makes_from_its_run(out, argv, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    made = tmp_path / "report"
    at = argv.index("--out")
    assert eglr_report([*argv[:at + 1], str(made), *argv[at + 2:], "--verbosity", "WARNING"]) == 0
    committed = REPO / out
    names = sorted(p.name for p in committed.iterdir() if p.is_file())
    assert sorted(p.name for p in made.iterdir()) == names, f"regenerate: eglr-report {shlex.join(argv)}"
    for name in names:
        if name.endswith((".md", ".csv")):
            assert (made / name).read_text(encoding="utf-8") == (committed / name).read_text(encoding="utf-8"), (
                f"{out}/{name} is stale; regenerate: eglr-report {shlex.join(argv)}")
