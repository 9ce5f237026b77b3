"""Package code and user docs say what a thing does and promises, not which issue brought it: no "issue N" in
``eglr_harness/``, the user's pages (``docs/*.md``, ``README.md``), the task suite (``tasks/``) or the presets
(``model_configs/``). History has its own places, which may name issues: ``CHANGELOG.md``,
``benchmarks/HISTORY.md`` and the results' READMEs (none of them is read here)."""

from __future__ import annotations

import re

import pytest
from test_file_names import ROOT, tracked_files

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)

ISSUE = re.compile(r"\b[Ii]ssues? ?#?[0-9]+")
FOLDERS = ("eglr_harness/", "tasks/", "model_configs/")
TEXTS = (".py", ".md", ".yaml", ".yml", ".txt", ".toml", ".json")
# pages that may cite issues while being rewritten (none now)
BEING_REWRITTEN: set[str] = set()


def user_facing(name: str) -> bool:
    if name in BEING_REWRITTEN:
        return False
    if name == "README.md" or (name.startswith("docs/") and name.endswith(".md")):
        return True
    return name.startswith(FOLDERS) and name.endswith(TEXTS)


def issue_numbers(name: str, text: str) -> list[str]:
    """``name:line: match`` for each "issue N" in ``text``."""
    return [f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group()}" for m in ISSUE.finditer(text)]


def test_no_issue_number_in_package_code_or_user_docs():
    found = [hit for name in filter(user_facing, tracked_files())
             for hit in issue_numbers(name, (ROOT / name).read_text(encoding="utf-8"))]
    assert found == [], "say what the code does and promises; history goes to CHANGELOG.md or benchmarks/HISTORY.md"


def test_the_check_finds_an_issue_number_where_a_user_reads():
    """Broken on purpose: a docstring and a page that still cite their issue, and the records that may."""
    assert issue_numbers("eglr_harness/x.py", '"""The pool (issue 32).\n\nSee issues #39 and 57."""') == [
        "eglr_harness/x.py:1: issue 32", "eglr_harness/x.py:3: issues #39"]
    assert user_facing("docs/engines.md") and user_facing("README.md") and user_facing("eglr_harness/core/jsonl.py")
    assert user_facing("tasks/README.md") and user_facing("model_configs/smollm2-135m-instruct.yaml")
    records = ("CHANGELOG.md", "benchmarks/HISTORY.md", "results/README.md", "tests/conftest.py")
    assert not any(map(user_facing, records))
    assert issue_numbers("docs/a.md", "the issue's estimate; tissue 5") == []
