"""Every file name a doc or a docstring gives (``tests/decoding/test_scheduler.py``, ``hook/refiner.py``,
``docs/engines.md``) names a file of the tree: a renamed or removed file fails here until the text follows.

Read: the Markdown pages (but the dated records, ``CHANGELOG.md`` and ``benchmarks/HISTORY.md``, which name files as
they were, and the reports ``eglr-report`` writes under ``results/``) and the docstrings of every module, class
and function of the package, the benchmarks and the tests. Checked: names of the project's own kinds of file
(``.py``, ``.md``); a name resolves when a tracked file has it as its path, or as the tail of its path (a bare
``engine.py``, a ``continuous/engine.py``); a name of another package's source (``lm_eval/...``) is not ours."""

from __future__ import annotations

import ast
import os
import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)

ROOT = Path(__file__).resolve().parent.parent
DATED = {"CHANGELOG.md", "benchmarks/HISTORY.md"}
OTHER_PACKAGES = ("lm_eval/", "transformers/", "vllm/", "torch/", "trl/", "recpre/")  # recpre: Huginn's
# a file name: path segments, a name, a .py or .md ending; not inside a pattern (<date>, *, {a,b})
FILE_NAME = re.compile(r"(?<![\w<*{$/.-])((?:[\w.-]+/)*[\w-]+\.(?:py|md))(?![\w/-])")


def tracked_files() -> list[str]:
    done = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    return [name for name in done.stdout.split() if (ROOT / name).is_file()]


def resolves(name: str, files: list[str], where: str = "") -> bool:
    """Whether ``name``, read in the file ``where``, names a file of ``files`` (a link relative to ``where``'s
    folder, a path from the root, or the tail of one)."""
    if name.startswith(OTHER_PACKAGES):
        return True
    relative = os.path.normpath(os.path.join(os.path.dirname(where), name))
    return relative in files or any(f == name or f.endswith("/" + name) for f in files)


def texts(path: Path):
    """(line, text) of each text of ``path`` that names files: a page whole, or each docstring of a module."""
    if path.suffix == ".md":
        yield 1, path.read_text(encoding="utf-8")
        return
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring:
                yield getattr(node, "lineno", 1), docstring


def read(name: str) -> bool:
    if name in DATED or (name.startswith("results/") and name.endswith("/report.md")):
        return False
    return name.endswith(".md") or (name.endswith(".py") and name.startswith(("eglr_harness/", "benchmarks/",
                                                                              "tests/")))


def missing_names(files: list[str]) -> list[str]:
    missing = []
    for name in filter(read, files):
        for line, text in texts(ROOT / name):
            missing += [f"{name}:{line}: {found}" for found in FILE_NAME.findall(text)
                        if not resolves(found, files, name)]
    return sorted(set(missing))


def test_every_file_named_in_a_doc_or_docstring_exists():
    assert missing_names(tracked_files()) == []


def test_the_check_names_a_file_that_is_gone():
    """Broken on purpose: a docstring that still names the hook engine by its name before the layers."""
    files = tracked_files()
    assert resolves("decoding/hook/engine.py", files) and resolves("refiner.py", files)
    assert not resolves("hook_engine.py", files) and not resolves("tests/engine/test_scheduler.py", files)
    assert FILE_NAME.findall("the step (``hook_engine.py``; ``results_<date>.json``, ``samples_*.md``)") == [
        "hook_engine.py"]
