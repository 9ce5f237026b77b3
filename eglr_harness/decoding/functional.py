"""EGLR's per-token maths as pure tensor functions (eglr-method.md §2): the one rule both engines call.

The hook engine (``refiner.py``) and the continuous engine (``fixed_step.py``) gate, fuse, stop
and check with these functions, so a change of the rule changes both (and their tests).

Shape letters: the package's legend (``eglr_harness/decoding/__init__.py``). Entropies and KL are computed in fp32
whatever the model dtype.
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


def entropy_gate(entropies: torch.Tensor, tau_h: float | torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """Rows to refine: still generating and strictly above the entropy threshold (compared in float64,
    as the Python float of the config).

    entropies: (B,) fp32; tau_h: a float or (B,) float64; active: (B,) bool -> (B,) bool.
    """
    return active & (entropies.double() > tau_h)


def refinement_done(kl: torch.Tensor, tau_kl: float | torch.Tensor, iterations: torch.Tensor | int,
                    k_max: int | torch.Tensor) -> torch.Tensor:
    """Rows whose refinement ends after this iteration: KL(p_k || p_k-1) below tau_kl (a NaN KL ends it
    too; ``non_finite`` reports it) or the budget k_max used up.

    kl: (R,) fp32; tau_kl: a float or (R,) float64; iterations: k, an int or (R,); k_max likewise -> (R,) bool.
    """
    return ~(kl.double() >= tau_kl) | (torch.as_tensor(iterations, device=kl.device) >= k_max)


def norm_match(hidden: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
    """Rescale ``hidden`` to the anchor's L2 norm over the hidden dimension.

    hidden, anchor: (B, D) -> (B, D), same dtype as ``hidden``.
    """
    scale = anchor.float().norm(dim=-1, keepdim=True) / hidden.float().norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return (hidden.float() * scale).to(hidden.dtype)


def fuse(anchor: torch.Tensor, refined: torch.Tensor, alpha: torch.Tensor, one_minus_alpha: torch.Tensor
         ) -> torch.Tensor:
    """u = (1 - alpha)·a + alpha·ĥ with a per-row alpha; each product in fp32, rounded to the model dtype.

    anchor, refined: (B, D) model dtype; alpha, one_minus_alpha: (B,) fp32 (1 - alpha taken in float64,
    as a Python float is) -> (B, D) model dtype.
    """
    dtype = anchor.dtype
    kept = (one_minus_alpha[:, None] * anchor.float()).to(dtype)
    moved = (alpha[:, None] * refined.float()).to(dtype)
    return kept + moved


def fusion_weights(alpha: float, rows: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``fuse``'s (alpha, 1 - alpha) for ``rows`` rows of one config: two (rows,) fp32 tensors."""
    return (torch.full((rows,), alpha, dtype=torch.float32, device=device),
            torch.full((rows,), 1.0 - alpha, dtype=torch.float32, device=device))


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


def non_finite(entropies: torch.Tensor, kls: torch.Tensor) -> torch.Tensor:
    """Rows whose logits were NaN/inf: the normal pass's entropy or the refinement's KL is NaN.

    entropies, kls: (B,) fp32 (kls 0 where a row did not refine) -> (B,) bool.
    """
    return entropies.isnan() | kls.isnan()


def raise_on_nan_rows(rows: list[int], where: str) -> None:
    """Raise ``FloatingPointError`` naming the rows (host ints) whose logits were non-finite."""
    if rows:
        raise FloatingPointError(
            f"EGLR: non-finite logits at {where} (rows {rows}); the model produced NaN/inf. "
            "Try dtype=float32 or bfloat16 instead of float16."
        )
