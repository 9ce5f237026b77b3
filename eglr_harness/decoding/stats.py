"""Compute accounting of an EGLR run: tokens, trigger rate, iterations and FLOP ratios (§4)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class EglrStats:
    """Running totals of one cell (or of a calibration), added to by either engine: once per ``generate``
    call by the hook engine (one read from the device), once per run by the continuous engine.

    ``flop_ratio`` follows the paper's per-row accounting: layer evaluations divided by
    ``N × tokens``. ``flop_ratio_with_head`` adds the LM-head projections, each worth ``head_layers``
    decoder layers (``ModelParts.head_layers``): one per token in the normal pass, and per gated token
    the ones its exit rule made (``head_projections``: k* for the rules that read a distribution at
    every iteration, kl, margin, entropy; one, at the exit, for latent and accel), so that rules
    compare at their real cost: ``((N + h)·tokens + Σ L·k* + h·head_projections) / ((N + h)·tokens)``.
    ``batched_flop_ratio`` counts what ran: the normal pass over every batch row
    (finished rows included, as ``generate`` computes them) and the refinement pass, which runs
    k_max iterations over the contiguous rows from the first to the last gated row (rows that
    exited early or were not gated are computed and discarded: no host-device sync per iteration).
    """

    num_layers: int = 0
    tokens: int = 0  # generated tokens of rows still running
    gated_tokens: int = 0
    iterations: Counter = field(default_factory=Counter)  # k* -> count over gated tokens
    refine_layer_evals: int = 0  # sum over gated tokens of L * k*
    steps: int = 0  # decoding steps (batched forward passes)
    gated_steps: int = 0  # steps in which at least one row was refined
    row_steps: int = 0  # steps × batch rows
    batched_refine_layer_evals: int = 0  # sum over gated steps of L × iterations run × rows of the pass
    wall_time_s: float = 0.0
    head_layers: float = 0.0  # one LM-head projection in decoder layers (0: not known, not counted)
    head_projections: int = 0  # LM-head projections of the refinements, summed over gated tokens

    def add_batch(self, *, steps: int, gated_steps: int, row_steps: int, tokens: int, iterations: dict[int, int],
                  L: int, pass_row_iterations: int, head_per_iteration: bool = True) -> None:
        """One ``generate`` call's totals, read from the device once at its end.

        ``iterations`` maps k* to the number of gated tokens that used k* iterations;
        ``pass_row_iterations`` sums over gated steps the rows of the refinement pass times the
        iterations it ran (the batched cost); ``head_per_iteration``: the exit rule projects the LM head
        at every iteration (``StopRule.head_per_iteration``), else once per gated token.
        """
        gated = {k: c for k, c in iterations.items() if c}
        self.steps += steps
        self.gated_steps += gated_steps
        self.row_steps += row_steps
        self.tokens += tokens
        self.gated_tokens += sum(gated.values())
        self.iterations.update(gated)
        self.refine_layer_evals += L * sum(k * c for k, c in gated.items())
        self.batched_refine_layer_evals += L * pass_row_iterations
        self.head_projections += head_projections(gated, head_per_iteration)

    def add_rollout(self, accounting: dict) -> None:
        """One stored rollout's accounting (``rollout_accounting``, with the ``shares`` of its batch's
        figures when its engine run finished): a resumed run counts it as when it was decoded."""
        iterations = {int(k): int(n) for k, n in accounting["iterations"].items() if int(n)}
        evals = accounting["L"] * sum(k * n for k, n in iterations.items())
        self.tokens += accounting["tokens"]
        self.gated_tokens += sum(iterations.values())
        self.iterations.update(iterations)
        self.refine_layer_evals += evals
        self.head_projections += accounting.get("head_projections", head_projections(iterations, True))
        # without shares (its run was cut short): the per-row figures, as the continuous engine counts them
        shares = accounting.get("shares") or {"row_steps": accounting["tokens"], "batched_refine_layer_evals": evals}
        for name in BATCH_FIELDS:
            setattr(self, name, getattr(self, name) + shares.get(name, 0))

    def merge(self, other: "EglrStats") -> None:
        self.num_layers = self.num_layers or other.num_layers
        self.head_layers = self.head_layers or other.head_layers
        for name in ("tokens", "gated_tokens", "refine_layer_evals", "steps", "gated_steps", "row_steps",
                     "batched_refine_layer_evals", "wall_time_s", "head_projections"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.iterations.update(other.iterations)

    def summary(self) -> dict:
        n = max(self.num_layers, 1)
        gated = max(self.gated_tokens, 1)
        return {
            "tokens": self.tokens,
            "gated_tokens": self.gated_tokens,
            "rho": self.gated_tokens / self.tokens if self.tokens else 0.0,
            "mean_iterations": sum(k * c for k, c in self.iterations.items()) / gated if self.gated_tokens else 0.0,
            "iteration_hist": {str(k): self.iterations[k] for k in sorted(self.iterations)},
            "flop_ratio": 1.0 + self.refine_layer_evals / (n * self.tokens) if self.tokens else 1.0,
            "batched_flop_ratio": (1.0 + self.batched_refine_layer_evals / (n * self.row_steps) if self.row_steps
                                   else 1.0),
            "head_layers": round(self.head_layers, 4),
            "head_projections": self.head_projections,
            "flop_ratio_with_head": 1.0 + (self.refine_layer_evals + self.head_layers * self.head_projections)
            / ((n + self.head_layers) * self.tokens) if self.tokens else 1.0,
            # counts; sums of the stored rollouts' shares (floats) in a resumed run
            "steps": round(self.steps),
            "p_step_gated": round(self.gated_steps) / round(self.steps) if round(self.steps) else 0.0,
            "wall_time_s": round(self.wall_time_s, 3),
        }


# figures of a batch (a generate call, a continuous run) rather than of a row: a stored rollout keeps its share
BATCH_FIELDS = ("steps", "gated_steps", "row_steps", "batched_refine_layer_evals", "wall_time_s")


def head_projections(iterations: dict, head_per_iteration: bool) -> int:
    """The refinements' LM-head projections from ``{k*: gated tokens}``: k* each when the exit rule reads a
    distribution at every iteration, else one each (the projection at the exit)."""
    return sum((int(k) if head_per_iteration else 1) * int(n) for k, n in iterations.items() if int(k) > 0)


def rollout_accounting(tokens: int, iterations: dict, L: int, head_per_iteration: bool = True) -> dict:
    """A rollout's own accounting, as the rollout store keeps it: its generated tokens, ``{k*: gated
    tokens}`` and layer span (what ``tokens``, rho, the iteration histogram and ``flop_ratio`` sum); with
    an exit rule that projects the LM head once (latent, accel), its ``head_projections`` too (without
    them, k* per gated token: the paper's rule, and every rollout stored before the rules existed)."""
    accounting = {"tokens": tokens, "iterations": {str(k): n for k, n in sorted(iterations.items()) if n}, "L": L}
    if not head_per_iteration:
        accounting["head_projections"] = head_projections(iterations, False)
    return accounting


def batch_shares(batch: "EglrStats", rollouts: list[dict]) -> list[dict]:
    """Each rollout's share of ``batch``'s figures (``BATCH_FIELDS``; the rollouts are the ones the batch
    decoded, as ``rollout_accounting``): rows by tokens, refinement passes by refinement layer
    evaluations, steps and time by all layer evaluations. The shares sum to ``batch``'s figures."""
    n = max(batch.num_layers, 1)
    tokens = [r["tokens"] for r in rollouts]
    refine = [r["L"] * sum(int(k) * c for k, c in r["iterations"].items()) for r in rollouts]
    work = [n * t + e for t, e in zip(tokens, refine)]

    def split(total, weights):
        whole = sum(weights)
        return [total * w / whole if whole else total / len(weights) for w in weights]

    parts = {"row_steps": split(batch.row_steps, tokens),
             "batched_refine_layer_evals": split(batch.batched_refine_layer_evals, refine),
             **{name: split(getattr(batch, name), work) for name in ("steps", "gated_steps", "wall_time_s")}}
    return [{name: parts[name][i] for name in BATCH_FIELDS} for i in range(len(rollouts))]
