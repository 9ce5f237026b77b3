"""EGLR inside vLLM: an out-of-tree model plugin (``models.py``) and its per-request settings
(``row_settings.py``).

vLLM loads ``register`` through the ``vllm.general_plugins`` entry point (pyproject.toml) in every
process it starts; it registers one EGLR architecture per supported family, and nothing else: an engine
that names none of them runs exactly as without the project. A model is served with EGLR by the
arguments of ``engine_args``: that architecture in ``hf_overrides``, the row-settings logits processor
in ``logits_processors`` (named here, not by an entry point: vLLM loads those into every engine, and Model
Runner V2 refuses V1-interface classes), the worker extension. L = 0 (or no EGLR settings on a request) is
stock vLLM's forward, token for token.

Nothing here imports vLLM at package import time: ``register`` and the model module do.
"""

from __future__ import annotations

# stock architecture -> (EGLR architecture, "module:class" of its vLLM model)
ARCHITECTURES = {
    "LlamaForCausalLM": ("EglrLlamaForCausalLM", "eglr_harness.vllm.models:EglrLlamaForCausalLM"),
    "Qwen2ForCausalLM": ("EglrQwen2ForCausalLM", "eglr_harness.vllm.models:EglrQwen2ForCausalLM"),
    "MistralForCausalLM": ("EglrMistralForCausalLM", "eglr_harness.vllm.models:EglrMistralForCausalLM"),
    "Qwen3ForCausalLM": ("EglrQwen3ForCausalLM", "eglr_harness.vllm.models:EglrQwen3ForCausalLM"),
    # Gemma-3's text models (1B; the larger checkpoints are Gemma3ForConditionalGeneration, image and text)
    "Gemma3ForCausalLM": ("EglrGemma3ForCausalLM", "eglr_harness.vllm.models:EglrGemma3ForCausalLM"),
}


def register() -> None:
    """The ``vllm.general_plugins`` entry point: register the EGLR architectures (idempotent)."""
    from vllm import ModelRegistry

    for eglr_arch, target in ARCHITECTURES.values():
        if eglr_arch not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(eglr_arch, target)


def engine_args(architecture: str | None, spans=None, num_layers: int | None = None, tags: bool = True) -> dict:
    """``LLM`` keyword arguments that serve a checkpoint of ``architecture`` with EGLR and hand its per-token
    signals back from vLLM's workers (``worker.py``), in whatever processes vLLM runs them.

    spans: the L values the engine refines with (None: every L in 1..N). The compiled normal pass hands out the
    anchor of each (a (T, D) copy per span and step), so an engine that serves one L keeps only that one.
    num_layers: the checkpoint's decoder layer count N. With it (or with ``spans``) the row-settings processor
    refuses an L the engine does not serve when the request arrives (vLLM's ``validate_params``: HTTP 400 behind
    a server); without either, such a request is not refused: its step logs a warning and decodes it plainly.
    tags: whether a request may carry a signal ``tag`` (its per-token signals recorded in the workers for the caller
    to take back, ``worker.py``); False behind a server, whose clients cannot take them: a tag is refused there, and
    ``spans`` or ``num_layers`` is required (a server's clients must hear of an L it does not serve).
    One-line ValueError for a family the plugin does not cover, or a served engine (``tags=False``) without spans or
    layer count.

    CUDA graphs: piecewise only (``compilation_config``; a platform without graphs, the CPU, ignores it). A full
    graph would capture the EGLR forward's host decisions (is a row gated, which rows still refine) once, at
    capture, where no request refines, and replay that: the model refuses such a mode (``models.py``). To set more
    of the compilation config, pass your own with ``cudagraph_mode`` PIECEWISE or NONE instead of this one.
    """
    from eglr_harness.vllm.row_settings import processor_name
    from eglr_harness.vllm.worker import WORKER_EXTENSION

    if spans is None and num_layers is not None:
        spans = range(1, num_layers + 1)
    overrides = engine_overrides(architecture, spans)
    if spans is None and not tags:
        raise ValueError("eglr-vllm: a served engine (tags=False) needs the L values it serves; allowed: "
                         "engine_args(..., spans=[...]) or num_layers=N (the checkpoint's decoder layer count).")
    return {"hf_overrides": overrides, "logits_processors": [processor_name(overrides.get("eglr_spans"), tags)],
            "worker_extension_cls": WORKER_EXTENSION, "compilation_config": {"cudagraph_mode": "PIECEWISE"}}


def engine_overrides(architecture: str | None, spans=None) -> dict:
    """``hf_overrides`` that serve a checkpoint of ``architecture`` (its config.json's; None when it names none)
    with EGLR, refining with the L values ``spans`` (None: all).

    One-line ValueError for a family the plugin does not cover.
    """
    allowed = ", ".join(sorted(ARCHITECTURES))
    if architecture is None:
        raise ValueError(f"eglr-vllm: the checkpoint's config.json names no architecture; allowed: {allowed}.")
    if architecture not in ARCHITECTURES:
        raise ValueError(f"eglr-vllm: architecture {architecture!r} is not supported; allowed: {allowed}.")
    overrides = {"architectures": [ARCHITECTURES[architecture][0]]}
    if spans is not None:
        overrides["eglr_spans"] = sorted({int(span) for span in spans})
    return overrides
