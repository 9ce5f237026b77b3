"""The modules of a transformers causal LM that the continuous engine calls one by one.

The continuous engine (``continuous/engine.py``) runs the model's own modules — token embeddings,
rotary embeddings, decoder layers, final norm, unembedding — in a loop of its own, so that rows
that refine join the batch in the top L layers only. That needs the model's forward to be the plain
one (embed, rotary angles, the layers, final norm, unembedding) up to the small declared
differences of ``FAMILIES``: the families below, whose layers take ``(hidden, attention_mask,
position_embeddings, position_ids, cache)`` (the cache under ``cache_kwarg.CACHE_KWARG``), whose
attention goes through transformers' attention interface (so that it calls ``kv_slots.slot_attention``)
and whose rotary angles depend on the position alone:

- Llama, Mistral, Mixtral, Qwen2, Qwen2-MoE, Qwen3, Qwen3-MoE (experts routed per token),
  Phi-3 (fused QKV, partial rotary), OLMo-2 (QK norm, post-norms), OLMo-3 (sliding and full layers,
  rotary angles per layer kind), SmolLM3 (layers without rotary), GLM and GLM-4 (partial rotary),
  StableLM (partial rotary, QK layer norm, parallel residual), Starcoder2 (layer norms, biases),
  Cohere (layer norm, parallel residual, a logit scale): all of that happens inside the layers,
  in the per-kind layer list and rotary module the engine already follows, or is the logit scale;
- Granite and Granite-MoE: embeddings times ``embedding_multiplier`` before the first layer
  (``Preamble``), logits divided by ``logits_scaling`` (``model_parts.LOGIT_SCALES``; residual and
  attention multipliers are inside the layers);
- Gemma, Gemma-2, Gemma-3 (text): their embedding modules apply the embedding scale themselves.

A logit scale is applied wherever the engine makes logits (``ModelStack.logits``), so the entropy
gate, the KL exit and the draw read the logits ``generate`` reads. Everything else is refused,
naming ``engine=hook``, which drives any model through ``generate`` (under ``engine=auto`` with one log
line): other families, bidirectional attention, rotary scalings whose angles depend on the longest
position in the batch (``dynamic``, ``longrope``: Phi-3 128k / Phi-3.5), a model split over devices.

Shape letters: the package's legend (``eglr_harness/decoding/__init__.py``).
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers import AttentionInterface

from eglr_harness.decoding.cache_kwarg import CACHE_KWARG
from eglr_harness.decoding.continuous.kv_slots import ATTENTION_NAME, slot_attention
from eglr_harness.decoding.functional import softcap
from eglr_harness.decoding.model_parts import ModelParts, find_model_parts


@dataclass(frozen=True)
class Preamble:
    """What a family's forward does between its token embedding module and its first decoder layer.

    embedding_multiplier: the config attribute the embeddings are multiplied by (Granite's
        ``inputs_embeds * embedding_multiplier``), or None.
    """

    embedding_multiplier: str | None = None


PLAIN = Preamble()
FAMILIES: dict[str, Preamble] = {
    **{family: PLAIN for family in (
        "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3", "olmo2", "olmo3", "smollm3",
        "glm", "glm4", "stablelm", "starcoder2", "cohere", "gemma", "gemma2", "gemma3_text")},
    **{family: Preamble(embedding_multiplier="embedding_multiplier") for family in ("granite", "granitemoe")},
}
"""model_type -> its preamble: the families the continuous engine drives. Their logit scales (Granite,
Cohere) are ``model_parts.LOGIT_SCALES``'s, shared with engine=hook."""
SUPPORTED_FAMILIES = tuple(FAMILIES)
# rotary scalings whose angles follow the largest position of the call (the batch), not each row's own
POSITION_DEPENDENT_ROPE = ("dynamic", "longrope")
FALLBACK = "use engine=hook, which decodes any transformers causal LM through generate"



@dataclass(frozen=True)
class ModelStack:
    """A supported causal LM, seen as the parts the continuous engine calls.

    Attributes:
        parts: layers, final norm, unembedding, logit scale and final-logit soft-cap (``model_parts``).
        embed_tokens: the token embedding module (Gemma's scale included).
        embedding_multiplier: what the family's forward multiplies the embeddings by (Granite), or None.
        rotary: the rotary embedding module; ``rotary_by_kind`` when it takes the layer kind (Gemma-3).
        layer_kinds: per layer, ``"full_attention"`` or ``"sliding_attention"``.
        windows: layer kind -> sliding window W (None = full attention).
    """

    model: torch.nn.Module
    parts: ModelParts
    embed_tokens: torch.nn.Module
    embedding_multiplier: float | None
    rotary: torch.nn.Module
    rotary_by_kind: bool
    layer_kinds: tuple[str, ...]
    windows: dict

    @classmethod
    def of(cls, model) -> "ModelStack":
        """The stack of ``model``, or ``ValueError`` naming why the engine cannot drive it."""
        config = model.config
        family = getattr(config, "model_type", None)
        if family not in SUPPORTED_FAMILIES:
            raise ValueError(f"engine=continuous cannot drive model_type={family!r} (supported: "
                             f"{', '.join(SUPPORTED_FAMILIES)}); {FALLBACK}.")
        if getattr(config, "use_bidirectional_attention", False):
            raise ValueError(f"engine=continuous does not support bidirectional attention ({family}); {FALLBACK}.")
        scaled = sorted(rope_types(config) & set(POSITION_DEPENDENT_ROPE))
        if scaled:
            raise ValueError(f"engine=continuous does not support rope_type {scaled[0]!r} ({family}): its angles "
                             f"follow the longest position in the batch; {FALLBACK}.")
        devices = {str(d) for d in (getattr(model, "hf_device_map", None) or {}).values()}
        if len(devices) > 1:
            raise ValueError(f"engine=continuous runs a model on one device, not split over {sorted(devices)} "
                             f"(parallelize / device_map); {FALLBACK}.")
        parts = find_model_parts(model)
        decoder = model.get_decoder()
        rotary = getattr(decoder, "rotary_emb", None)
        if rotary is None or not hasattr(decoder, "embed_tokens"):
            raise ValueError(f"engine=continuous found no embed_tokens/rotary_emb on {type(decoder).__name__}; "
                             f"{FALLBACK}.")
        kinds = tuple(getattr(config, "layer_types", None) or
                      ["sliding_attention" if getattr(config, "sliding_window", None) else "full_attention"]
                      * parts.num_layers)[:parts.num_layers]
        unknown = set(kinds) - {"full_attention", "sliding_attention"}
        if unknown:
            raise ValueError(f"engine=continuous does not know the layer kinds {sorted(unknown)}; {FALLBACK}.")
        # only the kinds the model has (Gemma-3's rotary module holds angles for those alone)
        windows = {kind: int(config.sliding_window) if kind == "sliding_attention" else None
                   for kind in sorted(set(kinds))}
        multiplier = FAMILIES[family].embedding_multiplier
        multiplier = getattr(config, multiplier) if multiplier else None
        return cls(model=model, parts=parts, embed_tokens=decoder.embed_tokens,
                   embedding_multiplier=None if multiplier == 1 else multiplier, rotary=rotary,
                   rotary_by_kind="layer_type" in inspect.signature(rotary.forward).parameters,
                   layer_kinds=kinds, windows=windows)

    @property
    def num_layers(self) -> int:
        return self.parts.num_layers

    @property
    def device(self) -> torch.device:
        return self.parts.lm_head.weight.device

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The first layer's input for token ids, as the model's forward makes it.  (G, Q) -> (G, Q, D)."""
        hidden = self.embed_tokens(ids)
        return hidden if self.embedding_multiplier is None else hidden * self.embedding_multiplier

    def rotary_angles(self, hidden: torch.Tensor, positions: torch.Tensor) -> dict[str, tuple]:
        """Per layer kind, (cos, sin) of shape (G, Q, d) for ``positions`` (G, Q)."""
        if self.rotary_by_kind:
            return {kind: self.rotary(hidden, positions, kind) for kind in self.windows}
        angles = self.rotary(hidden, positions)
        return {kind: angles for kind in self.windows}

    def layer(self, index: int, hidden, mask, angles, positions, cache) -> torch.Tensor:
        """Decoder layer ``index`` on hidden (G, Q, D) -> (G, Q, D)."""
        return call_layer(self.parts.layers[index], hidden, mask, angles, positions, cache)

    def logits(self, last_hidden: torch.Tensor) -> torch.Tensor:
        """The model's logits of h^(N), its logit scale applied, before any soft-cap: (G, D) -> (G, V)."""
        return unembed(self.parts, last_hidden)

    def emitted(self, raw: torch.Tensor) -> torch.Tensor:
        """What ``generate`` decodes from: the soft-capped logits in fp32.  (G, V) -> (G, V)."""
        return softcap(raw, self.parts.logit_softcap).float()

    @contextmanager
    def slot_attention(self):
        """The model's attention modules call ``kv_slots.slot_attention`` while the context is open."""
        if ATTENTION_NAME not in AttentionInterface._global_mapping:  # registered on first use, not at import
            AttentionInterface.register(ATTENTION_NAME, slot_attention)
        config = self.model.config
        previous = config._attn_implementation_internal
        config._attn_implementation_internal = ATTENTION_NAME
        try:
            yield
        finally:
            config._attn_implementation_internal = previous


def call_layer(layer: torch.nn.Module, hidden, mask, angles, positions, cache) -> torch.Tensor:
    """One decoder layer of a supported family on hidden (G, Q, D) -> (G, Q, D). The same function
    for every layer (the layer is an argument), so that one compilation serves them all (``step_graphs.py``)."""
    out = layer(hidden, attention_mask=mask, position_embeddings=angles, position_ids=positions, use_cache=True,
                **{CACHE_KWARG: cache})
    return out[0] if isinstance(out, tuple) else out


def call_layer_at(layer: torch.nn.Module, rotary: torch.nn.Module, kind: str | None, hidden, mask, positions,
                  cache) -> torch.Tensor:
    """``call_layer`` with the layer's rotary angles computed here from its rows' ``positions`` (G, Q), as
    ``ModelStack.rotary_angles`` computes them (``kind``: the layer kind where the rotary module takes it, Gemma-3;
    else None). Compiled (``step_graphs.py``), the angles fuse into the layer's rotary kernels, as vLLM applies
    the rotary embedding inside its attention from the positions. hidden (G, Q, D) -> (G, Q, D)."""
    angles = rotary(hidden, positions) if kind is None else rotary(hidden, positions, kind)
    return call_layer(layer, hidden, mask, angles, positions, cache)


def unembed(parts: ModelParts, last_hidden: torch.Tensor) -> torch.Tensor:
    """The final norm, the unembedding and the logit scale of ``parts`` on h^(N): (G, D) -> (G, V)
    (``ModelStack.logits``; one function, so that the compiled step compiles it once: ``step_graphs.py``)."""
    return parts.scale_logits(parts.lm_head(parts.final_norm(last_hidden[:, None]))[:, 0])


def rope_types(config) -> set[str]:
    """The rotary scaling types of ``config`` (one per layer kind where ``rope_parameters`` has one per kind)."""
    params = getattr(config, "rope_parameters", None) or {}
    nested = [value for value in params.values() if isinstance(value, dict)]
    return {p.get("rope_type", "default") for p in (nested or [params])}
