"""The per-row bookkeeping of a refinement loop as pure tensor code: the one copy every engine uses.

The hook engine (``hook/refiner.py``), the continuous engine (``continuous/fixed_step.py``) and the vLLM model
(``vllm/models.py``) keep, for the G rows of a refinement, who is still refining, how many iterations each took,
its run of exit-rule hits and its last exit signal in one ``RefineState``, and move it on after each iteration with
``advance``. Which tensor a row keeps (its logits, its final-normed state, its h^(N) to project at the exit) is the
engine's; ``choose`` keeps it for the rows that took the iteration, and ``exit_projection`` says which rows use the
one projection at the exit of the rules without an LM head per iteration (latent, accel).

The NaN policy (eglr-method.md, "Decision — NaN"), here for all three engines: an iteration whose exit signal is
NaN is not taken (the row stops refining with its last finite iteration, the normal pass's when it was the first)
and the row is flagged ``non_finite``; so is a row whose exit projection is NaN (it keeps the normal pass's
logits). The engine reports the flagged rows: eglr-hf raises ``FloatingPointError``, eglr-vllm logs a warning.

Nothing here reads a tensor on the host or makes a data-dependent shape (the continuous engine's step is traced
with ``fullgraph=True``). Shape letters: the package's legend (``eglr_harness/decoding/__init__.py``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from eglr_harness.decoding.functional import exit_done, exit_hit, hit_streak


class RefineState(NamedTuple):
    """Where each of G rows stands after its last iteration (immutable: ``advance`` returns a new one).

    running: (G,) bool, still refining; iterations: (G,) long, k*: the iterations taken (0 before any);
    streak: (G,) long, consecutive hits of the exit rule up to the last iteration; signal: (G,) fp32, the exit
    signal of the last iteration taken (the KL with ``stop=kl``; 0 before any); non_finite: (G,) bool, rows
    whose refinement met a NaN (an exit signal, or the exit projection).
    """

    running: torch.Tensor
    iterations: torch.Tensor
    streak: torch.Tensor
    signal: torch.Tensor
    non_finite: torch.Tensor


def start(running: torch.Tensor, iterations: torch.Tensor | None = None,
          streak: torch.Tensor | None = None) -> RefineState:
    """The state before an iteration: ``running`` (G,) bool, the rows that refine; ``iterations`` and ``streak``
    (G,) long where a row resumes (the continuous engine keeps them in its slots between steps), else zeros."""
    zeros = torch.zeros(running.shape, dtype=torch.long, device=running.device)
    return RefineState(running, zeros if iterations is None else iterations, zeros if streak is None else streak,
                       torch.zeros(running.shape, dtype=torch.float32, device=running.device),
                       torch.zeros_like(running))


def advance(state: RefineState, rule: str, signal: torch.Tensor, threshold: float | torch.Tensor,
            k: int | torch.Tensor, k_max: int | torch.Tensor, rows: torch.Tensor | None = None
            ) -> tuple[RefineState, torch.Tensor]:
    """The state after iteration k of the running rows (of ``rows`` only, when given): the exit rule ``rule``
    (``functional.exit_hit``, ``hit_streak``, ``exit_done``) ends a row, a NaN signal ends it without taking
    the iteration (``non_finite``); other rows are left as they are.

    signal: (G,) fp32, the rule's signal after iteration k (any value on the rows not moved); threshold: a
    float or (G,) float64; k: an int or (G,) long; k_max likewise; rows: (G,) bool, the rows this call moves
    (an engine mixing rules calls it once per rule). Returns the new state and ``taken`` (G,) bool: the rows
    whose iteration k counts (their state and logits become the chosen ones: ``choose``).
    """
    moving = state.running if rows is None else state.running & rows
    finite = ~signal.isnan()
    taken = moving & finite
    streak = torch.where(moving, hit_streak(exit_hit(rule, signal, threshold, k), state.streak), state.streak)
    ends = moving & (~finite | exit_done(rule, streak, k, k_max))
    new = RefineState(state.running & ~ends, torch.where(taken, k, state.iterations), streak,
                      torch.where(taken, signal.float(), state.signal), state.non_finite | (moving & ~finite))
    return new, taken


def choose(taken: torch.Tensor, new: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """Per row, ``new`` where the row took the iteration, else what it kept.

    taken: (G,) bool; new, kept: (G, X) (logits, log-probabilities or states) -> (G, X) in ``kept``'s dtype.
    """
    return torch.where(taken.to(kept.device)[:, None], new.to(device=kept.device, dtype=kept.dtype), kept)


def exit_projection(state: RefineState, logp: torch.Tensor) -> tuple[RefineState, torch.Tensor]:
    """The rows that use the one projection at the exit (rules without an LM head per iteration): those that
    took an iteration and whose projection is finite; a NaN projection flags its row ``non_finite`` (it keeps
    the normal pass's logits).

    logp: (G, V) fp32 log-probabilities of each row's exit state. Returns the state and ``use`` (G,) bool.
    """
    projected = state.iterations > 0
    finite = ~logp.isnan().any(dim=-1).to(projected.device)
    return state._replace(non_finite=state.non_finite | (projected & ~finite)), projected & finite
