"""The test tree's folders do not shadow packages: pytest puts tests/ on sys.path (tests/conftest.py), so a
folder ``tests/<name>`` imports as a namespace package ``<name>``, and a library that probes for an optional
package of that name (TRL for vLLM, transformers for flash_attn, ...) believes it installed and fails."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
# packages the project's dependencies probe for or import by name
PROBED = {"vllm", "trl", "torch", "transformers", "lm_eval", "datasets", "accelerate", "math_verify", "sympy",
          "flash_attn", "deepspeed", "peft", "wandb", "tensorboard", "liger_kernel", "bitsandbytes", "gguf",
          "matplotlib", "numpy", "pandas", "yaml", "tqdm", "eglr_harness"}


def shadowing(folders) -> list[str]:
    return sorted(name for name in folders if name in PROBED)


def test_no_test_folder_is_named_like_a_probed_package():
    folders = [p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))]
    assert "engine" in folders and shadowing(folders) == []


def test_the_check_names_a_shadowing_folder():
    """Broken on purpose: the vLLM tests in a folder named ``vllm`` (what broke TRL's import once)."""
    assert shadowing(["engine", "vllm", "lm"]) == ["vllm"]
