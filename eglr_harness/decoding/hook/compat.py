"""The cache and attention settings on which the refinement replay is exact, checked before decoding.

The replay (``refiner.py``) re-runs the top L layers at position t against the keys/values the
normal pass attended to, with the slot of position t overwritten. That is exact when the layer's
attention is a plain function of (query, keys, values, 4-D mask) and when EGLR knows which slot of
the returned keys holds position t. Both hold for the settings below, and each of them is tested
against the naive reference (tests/decoding/test_engine_paths.py). Every other setting is refused
before generation, naming it, rather than decoded silently wrong.
"""

from __future__ import annotations

from transformers.cache_utils import (

    Cache, DynamicLayer, DynamicSlidingWindowLayer, StaticLayer, StaticSlidingWindowLayer,

)

from eglr_harness.decoding.cache_kwarg import CACHE_KWARG

SUPPORTED_ATTENTION = ("eager", "sdpa")
# Exact types: quantized layers subclass DynamicLayer but hand the attention a dequantized copy.
EXACT_CACHE_LAYERS = (DynamicLayer, DynamicSlidingWindowLayer, StaticLayer, StaticSlidingWindowLayer)
SUPPORTED_CACHES = "cache_implementation 'dynamic' (the default) or 'static', with full or sliding-window layers"
_HOW = (f"EGLR refinement supports attn_implementation in {SUPPORTED_ATTENTION} and {SUPPORTED_CACHES}; "
        "L=0 or tau_h=inf decodes without refinement and accepts any setting.")


def check_refinable(model, cache, generation_config, top_layers: range) -> None:
    """Raise ``ValueError`` before decoding when refinement would not be exact with these settings.

    Args:
        model: the causal LM; its ``config._attn_implementation`` is checked.
        cache: the KV cache ``generate`` prepared (``model_kwargs[CACHE_KWARG]``), or None.
        generation_config: names the ``cache_implementation`` the user asked for.
        top_layers: indices of the L layers the refinement re-runs (only their cache layers matter).
    """
    attention = getattr(model.config, "_attn_implementation", None) or "eager"
    if attention not in SUPPORTED_ATTENTION:
        raise ValueError(f"attn_implementation={attention!r} is not supported with refinement. {_HOW}")
    requested = getattr(generation_config, "cache_implementation", None)
    setting = f"cache_implementation={requested!r}" if requested else f"{CACHE_KWARG}={type(cache).__name__}"
    if cache is None:
        raise ValueError(f"EGLR refinement needs the KV cache (use_cache=False was given). {_HOW}")
    if not isinstance(cache, Cache):
        raise ValueError(f"{setting} (a legacy tuple cache) is not supported with refinement. {_HOW}")
    if getattr(cache, "offloading", False):
        # Layers move to the CPU after each update; the replay would keep the top L on the device.
        raise ValueError(f"{setting} (an offloaded cache) is not supported with refinement. {_HOW}")
    for index in top_layers:
        if index < len(cache.layers):
            layer_type = type(cache.layers[index])
        elif getattr(cache, "layer_class_to_replicate", None) is not None:
            layer_type = cache.layer_class_to_replicate
        else:
            raise ValueError(f"{setting} has no cache layer {index} for the refined layers. {_HOW}")
        if layer_type not in EXACT_CACHE_LAYERS:
            raise ValueError(f"{setting} (cache layer {layer_type.__name__} at layer {index}) is not supported "
                             f"with refinement. {_HOW}")
