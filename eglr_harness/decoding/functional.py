"""EGLR's per-token maths as pure tensor functions (eglr-method.md §2): the one rule both engines call.

The hook engine (``refiner.py``) and the continuous engine (``fixed_step.py``) gate, fuse, stop
(each exit rule of ``core.config.STOP_RULES``: its signal, its hit, the two-hit streak) and check with
these functions, so a change of the rule changes both (and their tests).

Shape letters: the package's legend (``eglr_harness/decoding/__init__.py``). Entropies and KL are computed in fp32
whatever the model dtype.
"""

from __future__ import annotations

import torch

from eglr_harness.core.config import STOP_RULES


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


def relative_change(hidden: torch.Tensor, hidden_prev: torch.Tensor) -> torch.Tensor:
    """``latent``'s signal: ||h_k - h_{k-1}|| / ||h_k|| over the hidden dimension, in fp32 (Huginn's latent-diff).

    hidden, hidden_prev: (R, D) h^(N) of iterations k and k-1 -> (R,) fp32.
    """
    new = hidden.float()
    return (new - hidden_prev.float()).norm(dim=-1) / new.norm(dim=-1).clamp_min(1e-12)


def relative_acceleration(hidden: torch.Tensor, hidden_prev: torch.Tensor, hidden_prev2: torch.Tensor) -> torch.Tensor:
    """``accel``'s signal: the second difference ||Δ_k - Δ_{k-1}|| / ||h_k||, Δ_k = h_k - h_{k-1}, in fp32
    (arXiv 2509.23314's acceleration, made scale-free as ``latent`` is).

    hidden, hidden_prev, hidden_prev2: (R, D) h^(N) of iterations k, k-1, k-2 -> (R,) fp32.
    """
    new, prev, prev2 = hidden.float(), hidden_prev.float(), hidden_prev2.float()
    return ((new - prev) - (prev - prev2)).norm(dim=-1) / new.norm(dim=-1).clamp_min(1e-12)


def top2_margin(logp: torch.Tensor) -> torch.Tensor:
    """``margin``'s signal: p(top-1) - p(top-2) of a distribution (CALM's softmax-response margin).

    logp: (R, V) fp32 log-probabilities -> (R,) fp32.
    """
    best = torch.topk(logp, 2, dim=-1).values.exp()  # (R, 2)
    return best[:, 0] - best[:, 1]


def exit_signal(rule: str, *, logp: torch.Tensor | None = None, logp_prev: torch.Tensor | None = None,
                hidden: torch.Tensor | None = None, hidden_prev: torch.Tensor | None = None,
                hidden_prev2: torch.Tensor | None = None) -> torch.Tensor:
    """The value exit rule ``rule`` (``core.config.STOP_RULES``) compares with its threshold after iteration k.

    Each rule reads only its inputs: kl and entropy ``logp`` (R, V) and ``logp_prev`` (R, V) (p_k, p_{k-1});
    margin ``logp``; latent ``hidden`` and ``hidden_prev`` (R, D) (h^(N) of iterations k, k-1, the normal
    pass's for k = 1); accel these and ``hidden_prev2`` (R, D) (k-2; any value at k = 1, whose signal
    ``exit_hit`` ignores). ``rule`` is a Python string, so a compiled step traces one rule. -> (R,) fp32.
    """
    if rule == "kl":
        return kl_divergence(logp, logp_prev)
    if rule == "entropy":
        return (entropy_of_log_probs(logp) - entropy_of_log_probs(logp_prev)).abs()
    if rule == "margin":
        return top2_margin(logp)
    if rule == "latent":
        return relative_change(hidden, hidden_prev)
    if rule == "accel":
        return relative_acceleration(hidden, hidden_prev, hidden_prev2)
    raise ValueError(f"`stop`={rule!r} is not allowed; allowed: {', '.join(STOP_RULES)}.")


def exit_hit(rule: str, signal: torch.Tensor, threshold: float | torch.Tensor,
             iterations: torch.Tensor | int) -> torch.Tensor:
    """Rows whose signal after iteration k meets the rule: below the threshold (above it for margin),
    compared in float64 as the config's Python float; a NaN signal is a hit (it ends the refinement;
    ``non_finite`` reports it); no hit before the rule's first defined iteration (accel: k >= 2).

    signal: (R,) fp32; threshold: a float or (R,) float64; iterations: k, an int or (R,) -> (R,) bool.
    """
    stop = STOP_RULES[rule]
    value = signal.double()
    hit = ~(value <= threshold) if stop.exits_above else ~(value >= threshold)
    if stop.first_hit > 1:
        hit = hit & (torch.as_tensor(iterations, device=signal.device) >= stop.first_hit)
    return hit


def hit_streak(hit: torch.Tensor, streak: torch.Tensor | int) -> torch.Tensor:
    """Consecutive hits up to iteration k: the streak of k-1 plus one on a hit, else 0.

    hit: (R,) bool; streak: (R,) long or 0 (before the first iteration) -> (R,) long.
    """
    return torch.where(hit, torch.as_tensor(streak, device=hit.device) + 1, 0)


def exit_done(rule: str, streak: torch.Tensor, iterations: torch.Tensor | int,
              k_max: int | torch.Tensor) -> torch.Tensor:
    """Rows whose refinement ends after this iteration: the rule hit on its ``hits_needed`` last iterations
    (accel's two-hit check; one hit for the others) or the budget k_max is used up.

    streak: (R,) long (``hit_streak``); iterations: k, an int or (R,); k_max likewise -> (R,) bool.
    """
    return (streak >= STOP_RULES[rule].hits_needed) | (torch.as_tensor(iterations, device=streak.device) >= k_max)


def refinement_done(kl: torch.Tensor, tau_kl: float | torch.Tensor, iterations: torch.Tensor | int,
                    k_max: int | torch.Tensor) -> torch.Tensor:
    """The paper's rule (``stop=kl``) in one call: KL(p_k || p_k-1) below tau_kl (a NaN KL ends it too) or
    the budget k_max used up. The rules' own functions (``exit_hit``, ``exit_done``) with one hit.

    kl: (R,) fp32; tau_kl: a float or (R,) float64; iterations: k, an int or (R,); k_max likewise -> (R,) bool.
    """
    return exit_done("kl", hit_streak(exit_hit("kl", kl, tau_kl, iterations), 0), iterations, k_max)


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
    """Rows whose logits were NaN/inf: the normal pass's entropy or the refinement's last exit signal
    (the KL with ``stop=kl``) is NaN.

    entropies, kls: (B,) fp32 (kls: the exit signals, 0 where a row did not refine) -> (B,) bool.
    """
    return entropies.isnan() | kls.isnan()


def raise_on_nan_rows(rows: list[int], where: str) -> None:
    """Raise ``FloatingPointError`` naming the rows (host ints) whose logits were non-finite."""
    if rows:
        raise FloatingPointError(
            f"EGLR: non-finite logits at {where} (rows {rows}); the model produced NaN/inf. "
            "Try dtype=float32 or bfloat16 instead of float16."
        )
