"""Every committed summary a results script makes (``python scripts/<script>.py RUNS... --out $HERE/<file>``
in a ``run.sh`` under ``results/``: the cut-off count, the L = 0 agreement, the engines' speed) equals what that script
makes now from the committed runs: a change to the script, or to the runs it reads, fails here until the summary is
made again with its command. The commands are read from the ``run.sh`` lines themselves (shell variables expanded
by bash, nothing else of the script run), as tests/analysis/test_committed_reports.py reads the eglr-report lines.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers.run_scripts import script_commands
import pytest

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results"
_SUMMARY = r"^python scripts/\w+\.py .* --out \S+$"


SUMMARIES = [argv for script in sorted(RESULTS.rglob("run.sh")) for argv in script_commands(script, "python", _SUMMARY)]


def test_the_summaries_are_found():
    """The three scripts of scripts/ that write summaries beside the Qwen runs (a pattern that matched nothing would
    pass)."""
    assert {Path(argv[0]).name for argv in SUMMARIES} >= {"cutoff.py", "compare.py", "speed.py"}, SUMMARIES


@pytest.mark.parametrize("argv", SUMMARIES, ids=[argv[argv.index("--out") + 1].removeprefix("results/")
                                                 for argv in SUMMARIES])
def test_a_committed_summary_equals_what_its_script_makes(argv, tmp_path):
    at = argv.index("--out")
    committed = REPO / argv[at + 1]
    made = tmp_path / committed.name
    # compare.py exits 1 when the texts differ: that is a finding it writes down, not a failure to make the summary
    done = subprocess.run([sys.executable, *argv[:at + 1], str(made), *argv[at + 2:]], cwd=REPO, capture_output=True,
                          text=True)
    assert made.exists(), done.stderr
    assert made.read_text(encoding="utf-8") == committed.read_text(encoding="utf-8"), (
        f"{committed.relative_to(REPO)} is stale; make it again: python {' '.join(argv)}")
