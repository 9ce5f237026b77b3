"""The tree is clean under the project's ruff configuration (pyproject's ``[tool.ruff]``: line length 120,
pycodestyle and pyflakes), checked with the ruff the dev extra pins."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)

ROOT = Path(__file__).resolve().parent.parent


def ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_tree_is_clean_under_ruff():
    done = ruff("check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_ruff_reads_the_project_configuration(tmp_path):
    """Broken on purpose: a line of 121 characters and an unused import, checked with the project's settings."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\nx = '" + "a" * 115 + "'\n")
    done = ruff("check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), str(bad), "--output-format", "concise")
    assert "E501" in done.stdout and "F401" in done.stdout and done.returncode == 1
