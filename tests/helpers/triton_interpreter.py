"""Model Runner V2 on vLLM's CPU build, its Triton kernels run by Triton's interpreter.

vLLM's CPU build ships MRV2 (``vllm/v1/worker/cpu/model_runner.py``, a subclass of the GPU runner) and runs it where
Triton has a "cpu" backend (``vllm/triton_utils/importing.py``); PyPI's Triton has none, so vLLM refuses MRV2 here
("Model Runner V2 requires Triton."). Triton's interpreter (``TRITON_INTERPRET=1``) runs every ``@triton.jit``
kernel in Python on CPU tensors, with no compiler and no driver. ``install`` turns it on and registers a "cpu"
backend whose driver only says it is active, so that vLLM's check counts Triton; the interpreter never asks that
driver to compile or launch. Call it before vLLM is imported; ``install_for_children`` makes every Python process
started from this one (vLLM's engine-core and worker processes, which vLLM's CPU build spawns, and the commands the
tests run: ``lm_eval``, ``vllm serve``) call it at its start too.

This is for tests, not for serving: the interpreter runs each kernel as Python over NumPy, launch by launch."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path


def install() -> None:
    """Turn Triton's interpreter on and make vLLM's CPU build count Triton (see the module's docstring)."""
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    import triton.backends as triton_backends
    from triton.backends.compiler import BaseBackend
    from triton.backends.driver import DriverBase

    class InterpreterDriver(DriverBase):
        """Active, and nothing else: under the interpreter Triton compiles and launches nothing."""

        @classmethod
        def is_active(cls) -> bool:
            return True

        def __init__(self) -> None:
            pass

        def get_active_torch_device(self):
            return torch.device("cpu")

        def map_python_to_cpp_type(self, ty):
            raise NotImplementedError("Triton's interpreter compiles nothing")

        def get_current_target(self):
            raise NotImplementedError("Triton's interpreter compiles nothing")

        def get_benchmarker(self):
            raise NotImplementedError("Triton's interpreter compiles nothing")

    triton_backends.backends.setdefault("cpu", triton_backends.Backend(compiler=BaseBackend, driver=InterpreterDriver))


def install_for_children() -> None:
    """``install`` here and at the start of every Python process started from here: a ``sitecustomize`` module
    (which Python's ``site`` imports at start-up from ``sys.path``) on ``PYTHONPATH`` that loads this file by its
    path and calls ``install``."""
    install()
    folder = Path(tempfile.mkdtemp(prefix="eglr_triton_interpreter_"))
    atexit.register(shutil.rmtree, folder, True)
    (folder / "sitecustomize.py").write_text(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('eglr_triton_interpreter', {str(Path(__file__))!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "module.install()\n")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)
