"""Every committed summary a results script makes (``python $HERE/<script>.py RUNS... --out $HERE/<file>`` in a
``run.sh`` under ``results/``: the cut-off count, the L = 0 agreement, the engines' speed) equals what that script
makes now from the committed runs: a change to the script, or to the runs it reads, fails here until the summary is
made again with its command. The commands are read from the ``run.sh`` lines themselves (shell variables expanded
by bash, nothing else of the script run), as tests/analysis/test_committed_reports.py reads the eglr-report lines.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results"
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=[^`$(]*(\$[A-Za-z_{][^`(]*)?$")  # no command substitution
_SUMMARY = re.compile(r"^python \$HERE/\w+\.py .* --out \S+$")
# bash that prints, NUL-separated and one command per line, the arguments each summary line would get
_RECORDER = "python() { printf '%s\\0' \"$@\"; printf '\\n'; }\n"


def _summary_commands(script: Path) -> list[list[str]]:
    """The argv (after ``python``) of each summary line of ``script``, as bash expands it from the repository root."""
    lines, pending = [], ""
    for line in script.read_text(encoding="utf-8").splitlines():
        line = pending + line
        if line.endswith("\\"):
            pending = line[:-1]
            continue
        pending = ""
        if _ASSIGNMENT.match(line.strip()) or _SUMMARY.match(line.strip()):
            lines.append(line.strip())
    if not any(_SUMMARY.match(line) for line in lines):
        return []
    done = subprocess.run(["bash", "-c", _RECORDER + "\n".join(lines)], cwd=REPO, capture_output=True, text=True,
                          check=True)
    return [[a for a in command.split("\0") if a] for command in done.stdout.split("\n") if command.strip()]


SUMMARIES = [argv for script in sorted(RESULTS.rglob("run.sh")) for argv in _summary_commands(script)]


def test_the_summaries_are_found():
    """The three scripts that write summaries beside the Qwen runs (a pattern that matched nothing would pass)."""
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
