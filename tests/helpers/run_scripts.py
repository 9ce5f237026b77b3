"""The commands a ``run.sh`` under ``results/`` gives one program, as bash expands them: how the committed-results
tests find the command that made each committed report or summary, without running anything else of the script."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=[^`$(]*(\$[A-Za-z_{][^`(]*)?$")  # no command substitution


def script_commands(script: Path, program: str, line_pattern: str | None = None) -> list[list[str]]:
    """The argv (after ``program``) of each line of ``script`` that calls ``program`` (and, with
    ``line_pattern``, matches it), with the script's plain variable assignments expanded by bash from the repository
    root: ``program`` is replaced by a shell function that prints its arguments."""
    wanted = re.compile(line_pattern or rf"^{re.escape(program)} ")
    lines, pending = [], ""
    for line in script.read_text(encoding="utf-8").splitlines():
        line = pending + line
        if line.endswith("\\"):
            pending = line[:-1]
            continue
        pending = ""
        if _ASSIGNMENT.match(line.strip()) or wanted.match(line.strip()):
            lines.append(line.strip())
    if not any(wanted.match(line) for line in lines):
        return []
    recorder = f"{program}() {{ printf '%s\\0' \"$@\"; printf '\\n'; }}\n"  # NUL-separated, a command a line
    done = subprocess.run(["bash", "-c", recorder + "\n".join(lines)], cwd=REPO, capture_output=True, text=True,
                          check=True)
    return [[a for a in command.split("\0") if a] for command in done.stdout.split("\n") if command.strip()]
