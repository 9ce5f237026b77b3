"""EGLR's per-token maths as pure tensor functions (eglr-method.md §2).

Shape letters (one set for the whole decoding package): B batch rows, S sequence length, D hidden
size, V vocabulary, G rows of a refinement pass, L layer span, K refinement iterations (T is the
temperature only). Entropies and KL are computed in fp32 whatever the model dtype.
"""

from __future__ import annotations

import torch


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in nats of softmax(logits).

    logits: (B, V) raw logits (no temperature) -> (B,) fp32.
    """
    return entropy_of_log_probs(torch.log_softmax(logits.float(), dim=-1))


def entropy_of_log_probs(logp: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in nats from log-probabilities.  logp: (B, V) fp32 -> (B,)."""
    return -(logp.exp() * logp).sum(dim=-1)


def entropy_gate(entropies: torch.Tensor, tau_h: float, active: torch.Tensor) -> torch.Tensor:
    """Rows to refine: still generating and above the entropy threshold.

    entropies: (B,) fp32; active: (B,) bool -> (B,) bool.
    """
    return active & (entropies > tau_h)


def norm_match(hidden: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
    """Rescale ``hidden`` to the anchor's L2 norm over the hidden dimension.

    hidden, anchor: (B, D) -> (B, D), same dtype as ``hidden``.
    """
    scale = anchor.float().norm(dim=-1, keepdim=True) / hidden.float().norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return (hidden.float() * scale).to(hidden.dtype)


def fuse(anchor: torch.Tensor, refined: torch.Tensor, alpha: float) -> torch.Tensor:
    """u = (1 - alpha) * anchor + alpha * refined.  anchor, refined: (B, D) -> (B, D)."""
    return (1.0 - alpha) * anchor + alpha * refined


def kl_divergence(logp_new: torch.Tensor, logp_old: torch.Tensor) -> torch.Tensor:
    """KL(p_new || p_old) = sum p_new (log p_new - log p_old).

    logp_new, logp_old: (B, V) fp32 log-probabilities -> (B,) fp32.
    """
    return (logp_new.exp() * (logp_new - logp_old)).sum(dim=-1)


def softcap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """Final-logit soft-capping (Gemma-2 style): cap * tanh(logits / cap); identity when cap is None."""
    if not cap:
        return logits
    return torch.tanh(logits / cap) * cap


def check_finite(entropies: torch.Tensor, where: str) -> None:
    """Raise a clear error when the model produced NaN/inf logits (entropy is then NaN).  entropies: (B,)."""
    raise_on_nan_rows(torch.isnan(entropies), where)


def raise_on_nan_rows(nan_rows: torch.Tensor, where: str) -> None:
    """Raise ``FloatingPointError`` naming the rows whose logits were non-finite.  nan_rows: (B,) bool."""
    if nan_rows.any():
        rows = torch.nonzero(nan_rows).flatten().tolist()
        raise FloatingPointError(
            f"EGLR: non-finite logits at {where} (rows {rows}); the model produced NaN/inf. "
            "Try dtype=float32 or bfloat16 instead of float16."
        )
