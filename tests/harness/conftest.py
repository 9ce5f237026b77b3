"""Fixtures of the adapter tests (eglr-hf inside lm-eval)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tiny_lm(llama_dir, request):
    """Factory: ``make(**model_args)`` -> eglr-hf on the CPU in float32 over the tiny Llama (``llama_dir``).

    A test module's ``LM_DEFAULTS`` (a dict of model args, if it has one) come first, the call's own model args
    over them; ``pretrained=`` picks another model folder.
    """
    from eglr_harness.harness.model import EglrHFLM

    defaults = getattr(request.module, "LM_DEFAULTS", {})

    def make(**model_args):
        return EglrHFLM(**{"pretrained": llama_dir, "device": "cpu", "dtype": "float32", **defaults, **model_args})

    return make
