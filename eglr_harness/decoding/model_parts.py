"""Find, in any transformers decoder-only LM, the modules EGLR needs.

EGLR uses four things and nothing architecture-specific beyond them: the ordered list of
decoder layers, the final norm (``LN_f``), the unembedding (``get_output_embeddings``) and what
the model's forward does to the unembedding's output before ``generate`` reads it: a constant
logit scale of some families (``LOGIT_SCALES``) and the optional final-logit soft-cap. Rotary angles, masks and cache
handling are reused from the
model's own forward pass (see ``refiner.py``), so any family whose layers follow the usual
transformers calling convention works (Llama, Qwen2, Mistral, Gemma/Gemma2, SmolLM2, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

_DECODER_ATTRS = ("model", "transformer", "gpt_neox", "decoder")
_LAYER_ATTRS = ("layers", "h", "blocks")
_NORM_ATTRS = ("norm", "ln_f", "final_layernorm", "norm_f", "final_norm")

LOGIT_SCALES: dict[str, tuple[str, str]] = {
    **{family: ("divide", "logits_scaling") for family in (
        "granite", "granite_swa", "granitemoe", "granitemoe_swa", "granitemoeshared", "granitemoehybrid")},
    **{family: ("multiply", "logit_scale") for family in ("cohere", "cohere2", "cohere2_moe")},
    "hyperclovax": ("multiply", "logits_scaling"),
}
"""model_type -> (operation, config attribute): the constant by which the family's ``ForCausalLM.forward``
divides or multiplies the unembedding's output, in the model's dtype, before anything reads its
logits (``logits / config.logits_scaling`` in Granite, ``logits * config.logit_scale`` in Cohere).
The entropy gate and the KL exit read the logits as ``generate`` sees them, so both engines apply it
(``ModelParts.scale_logits``). Attribute names alone do not say the operation (Granite divides by
``logits_scaling``, HyperCLOVA X multiplies by it), hence the list of families."""


@dataclass(frozen=True)
class ModelParts:
    """The modules of a causal LM that EGLR hooks into.

    Attributes:
        layers: decoder layers in order; ``len(layers)`` is N.
        final_norm: LN_f, applied to the last layer's output before the unembedding.
        lm_head: W_o, the unembedding.
        logit_softcap: the model's final-logit soft-cap (Gemma-2), or None.
        logit_scale: ``(operation, constant)`` the model applies to the unembedding's output before
            the soft-cap (``LOGIT_SCALES``; Granite, Cohere), or None.
    """

    layers: tuple[nn.Module, ...]
    final_norm: nn.Module
    lm_head: nn.Module
    logit_softcap: float | None
    logit_scale: tuple[str, float] | None = None

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def head_layers(self) -> float:
        """One LM-head projection's cost in decoder layers: the unembedding's weights over one decoder
        layer's (a matmul costs 2 FLOPs per weight and position, so the ratio of weights is the ratio of
        FLOPs; attention's context-length term is left out, as the paper's L/N accounting leaves it out)."""
        head = sum(p.numel() for p in self.lm_head.parameters())
        layer = sum(p.numel() for p in self.layers[0].parameters())
        return head / layer if layer else 0.0

    def scale_logits(self, unembedded: torch.Tensor) -> torch.Tensor:
        """The model's logits before any soft-cap, from the unembedding's output: the same operation in
        the same dtype as the model's forward (a division stays a division).  (..., V) -> (..., V)."""
        if self.logit_scale is None:
            return unembedded
        operation, constant = self.logit_scale
        return unembedded / constant if operation == "divide" else unembedded * constant


def find_model_parts(model: nn.Module) -> ModelParts:
    """Locate EGLR's modules in ``model`` or raise ``ValueError`` naming what is missing."""
    config = getattr(model, "config", None)
    name = type(model).__name__
    if config is not None and getattr(config, "is_encoder_decoder", False):
        raise ValueError(f"EGLR needs a decoder-only causal LM; {name} is an encoder-decoder model.")

    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    if decoder is None or decoder is model:
        decoder = next((getattr(model, a) for a in _DECODER_ATTRS if isinstance(getattr(model, a, None), nn.Module)),
                       None)
    if decoder is None:
        raise ValueError(
            f"EGLR could not find the decoder of {name}: expected get_decoder() or one of the attributes "
            f"{_DECODER_ATTRS}."
        )

    layers = next((getattr(decoder, a) for a in _LAYER_ATTRS if isinstance(getattr(decoder, a, None), nn.ModuleList)),
                  None)
    if layers is None:
        raise ValueError(
            f"EGLR could not find the decoder layers of {name}: expected an nn.ModuleList named one of {_LAYER_ATTRS} "
            f"on {type(decoder).__name__}."
        )
    num_layers = getattr(config, "num_hidden_layers", None) or len(layers)

    final_norm = next((getattr(decoder, a) for a in _NORM_ATTRS if isinstance(getattr(decoder, a, None), nn.Module)),
                      None)
    if final_norm is None:
        raise ValueError(
            f"EGLR could not find the final norm of {name}: expected one of {_NORM_ATTRS} on {type(decoder).__name__}."
        )

    lm_head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if lm_head is None:
        raise ValueError(f"EGLR needs the unembedding of {name}, but get_output_embeddings() returned None.")

    softcap = getattr(config, "final_logit_softcapping", None) if config is not None else None
    return ModelParts(
        layers=tuple(layers[:num_layers]),
        final_norm=final_norm,
        lm_head=lm_head,
        logit_softcap=float(softcap) if softcap else None,
        logit_scale=logit_scale(config),
    )


def logit_scale(config) -> tuple[str, float] | None:
    """``(operation, constant)`` of the family's logit scale (``LOGIT_SCALES``), or None (also for a constant of 1)."""
    family = getattr(config, "model_type", None)
    if family not in LOGIT_SCALES:
        return None
    operation, attribute = LOGIT_SCALES[family]
    constant = getattr(config, attribute, None)
    if constant is None or constant == 1:
        return None
    return operation, constant
