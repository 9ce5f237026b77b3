"""The test tree's folders do not shadow packages: pytest puts tests/ on sys.path (pyproject's pythonpath), so a
folder ``tests/<name>`` imports as a namespace package ``<name>``, and a library that probes for an optional
package of that name (TRL for vLLM, transformers for flash_attn, ...) believes it installed and fails.

And the test runner stays out of what users install (pyproject's dev extra)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)

TESTS = Path(__file__).resolve().parent
# packages the project's dependencies probe for or import by name
PROBED = {"vllm", "trl", "torch", "transformers", "lm_eval", "datasets", "accelerate", "math_verify", "sympy",
          "flash_attn", "deepspeed", "peft", "wandb", "tensorboard", "liger_kernel", "bitsandbytes", "gguf",
          "matplotlib", "numpy", "pandas", "yaml", "tqdm", "eglr_harness"}


def shadowing(folders) -> list[str]:
    return sorted(name for name in folders if name in PROBED)


def test_no_test_folder_is_named_like_a_probed_package():
    folders = [p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))]
    assert "decoding" in folders and shadowing(folders) == []


def test_the_check_names_a_shadowing_folder():
    """Broken on purpose: the vLLM tests in a folder named ``vllm`` (what broke TRL's import once)."""
    assert shadowing(["decoding", "vllm", "harness"]) == ["vllm"]


def requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s<>=!~\[;]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_test_runner_is_a_dev_dependency_not_a_runtime_one():
    """Users of the harness do not get pytest: the README's install asks for the dev extra."""
    project = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())["project"]
    assert "pytest" not in requirement_names(project["dependencies"])
    assert "pytest" in requirement_names(project["optional-dependencies"]["dev"])
    assert "torch" in requirement_names(project["dependencies"])
