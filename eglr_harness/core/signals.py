"""Per-rollout signals: what the model says about a rollout for free while decoding it.

One place for the signal names, their meaning and the direction in which a signal says "more
likely right". The decoding engine records four per-token arrays of one rollout (the generated
tokens only, in order):

- ``entropies``: entropy H(p⁽⁰⁾) of the normal pass's next-token distribution (nats, raw logits);
- ``logprobs``: log-probability of each emitted token under the distribution it was drawn from
  (the refined one at gated tokens), raw logits (no temperature);
- ``iterations``: refinement iterations k* of the token (0 = not gated);
- ``final_kl``: KL(p⁽ᵏ*⁾ ‖ p⁽ᵏ*⁻¹⁾) of the token's last iteration (ignored where iterations is 0);

(the continuous engine's ``Outcome.entropies``, ``.logprobs``, ``.token_iterations``, ``.final_kls``)

and :func:`rollout_signals` turns them into the per-rollout dict that the tasks log in
``rollouts[i]["signals"]`` (docs/run-format.md). Standard library only: the tasks, the analysis
and the export read it without torch.

The analysis derives one more signal from the logged answers: ``l_agreement`` (the share of the
document's rollouts at the same T and another L whose answer is in the rollout's cluster;
:func:`eglr_harness.analysis.sections.selection.l_agreement`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

__all__ = [
    "SIGNALS",
    "RECORDED_SIGNALS",
    "DERIVED_SIGNALS",
    "HIGHER_IS_BETTER",
    "rollout_signals",
    "confidence",
]

# Signals recorded per rollout (computed by rollout_signals) and derived by the analysis.
RECORDED_SIGNALS = (
    "mean_entropy",  # mean over tokens of the normal pass's entropy
    "max_entropy",  # its maximum
    "mean_logprob",  # mean log-probability of the emitted tokens (DeepConf-style confidence)
    "gated_fraction",  # share of tokens that were refined (iterations > 0)
    "mean_iterations",  # mean k* over the gated tokens (None: no gated token)
    "mean_final_kl",  # mean last-iteration KL over the gated tokens (None: no gated token)
    "tokens",  # number of generated tokens
)
DERIVED_SIGNALS = ("l_agreement",)
SIGNALS = RECORDED_SIGNALS + DERIVED_SIGNALS

# +1: a larger value is taken to mean "more likely right"; -1: a smaller one. (A prior, not a
# fit: the selection section reports each signal in this direction.)
HIGHER_IS_BETTER = {
    "mean_entropy": -1,
    "max_entropy": -1,
    "mean_logprob": +1,
    "gated_fraction": -1,
    "mean_iterations": -1,
    "mean_final_kl": -1,
    "tokens": -1,
    "l_agreement": +1,
}


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def rollout_signals(
    entropies: Sequence[float],
    logprobs: Sequence[float],
    iterations: Sequence[int],
    final_kl: Sequence[float],
) -> dict[str, float | int | None]:
    """The per-rollout signal dict (:data:`RECORDED_SIGNALS`) from the per-token arrays of one rollout.

    Args:
        entropies, logprobs, iterations, final_kl: one value per generated token, same length
            (module docstring). ``final_kl`` is read at gated tokens only.

    Returns:
        ``{name: value}``: floats, ``tokens`` an int; the means over gated tokens are None when no
        token was gated; every value is None for an empty rollout except ``tokens`` (0).
    """
    n = len(entropies)
    if not (len(logprobs) == len(iterations) == len(final_kl) == n):
        raise ValueError(
            f"per-token arrays of unequal length: entropies {n}, logprobs {len(logprobs)}, iterations "
            f"{len(iterations)}, final_kl {len(final_kl)}; allowed: one value per generated token each."
        )
    if any(int(k) < 0 for k in iterations):
        raise ValueError("`iterations` holds a negative count; allowed: ints >= 0 (0 = not gated).")
    gated = [i for i, k in enumerate(iterations) if int(k) > 0]
    for name, values in (("entropies", entropies), ("logprobs", logprobs), ("final_kl", [final_kl[i] for i in gated])):
        if any(not math.isfinite(float(v)) for v in values):
            raise ValueError(f"`{name}` holds a non-finite value; allowed: finite floats (a -inf logprob is a bug).")
    return {
        "mean_entropy": _mean([float(v) for v in entropies]),
        "max_entropy": max((float(v) for v in entropies), default=None),
        "mean_logprob": _mean([float(v) for v in logprobs]),
        "gated_fraction": len(gated) / n if n else None,
        "mean_iterations": _mean([float(iterations[i]) for i in gated]),
        "mean_final_kl": _mean([float(final_kl[i]) for i in gated]),
        "tokens": n,
    }


def confidence(signals: Mapping | None) -> float | None:
    """The DeepConf-style confidence of a rollout: ``exp(mean_logprob)``, the geometric mean of the
    emitted tokens' probabilities, in (0, 1]; None without signals.

    DeepConf (facebookresearch/deepconf) scores a token by the negative mean log-probability of
    its top-k candidates and a trace by the mean over its tokens; the engine here records the
    emitted token's log-probability only, so this is the closest it gives: a trace whose tokens the
    model chose with high probability is a confident one. Positive, so it serves as a vote weight.
    """
    if not signals or signals.get("mean_logprob") is None:
        return None
    return math.exp(float(signals["mean_logprob"]))
