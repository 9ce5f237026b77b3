"""Compute accounting of an EGLR run: tokens, trigger rate, iterations and FLOP ratios (§4).

Two kinds of figures, and who fills them:

* A rollout's own figures, one ``RolloutAccount`` per rollout, emitted by the engine that decoded it on
  ``Outcome.account`` as the rollout finishes (``own_account``): ``tokens``, ``iterations`` (the k*
  histogram of its gated tokens; ``gated`` and ``refine_layer_evals`` follow from it and ``L``),
  ``head_projections`` (what its exit rule projected, ``head_projections``), and ``shares``: its part of
  the figures of the batch it ran in (``SHARED_FIGURES``). Each engine states its own rule for a row's
  part: the hook engine (``hook/engine.py``) a step per token and ``k_max`` refinement iterations per
  gated token, the continuous engine (``continuous/engine.py``) a step per token after the first and
  one per refinement iteration, eglr-vllm (``vllm/engine.py``) a row's own tokens and iterations. When
  an engine run ends, ``run/accounting.py`` replaces each rollout's ``shares`` by its share of the run's
  real batch figures (``share_batch``) and the rollout store keeps the record (``to_json``); a resumed
  or reused run adds the stored record back (``EglrStats.add_rollout``), so it reports a fresh run's
  per-rollout figures, and its per-decode ones where it batched alike (``run/accounting.per_decode_figures``).
* The running totals of a cell, ``EglrStats``: the batch figures an engine measured (``add_batch``:
  once per ``generate`` call by the hook engine, once per run by the continuous engine, once per
  rollout by eglr-vllm) and the stored records a resumed run restored (``add_rollout``);
  ``run/accounting.py`` merges them across cells, engine runs and ranks into ``config.eglr.stats``.

Vocabulary: "own" figures are a rollout's (what the paper counts per token); "computed" figures count what
ran, finished and discarded rows included (``computed_rows``: rows of the normal pass summed over steps;
``computed_refine_rows``: rows of the refinement passes times the iterations they ran;
``computed_refine_layer_evals``: L times that); "shares": a rollout's part of the computed figures.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field

from eglr_harness.core.config import HUGE
from eglr_harness.core.run_format import STATS_FIGURES


# figures of a batch (a generate call, a continuous run) rather than of a row: a stored rollout keeps its share
SHARED_FIGURES = ("steps", "gated_steps", "computed_rows", "computed_refine_layer_evals", "wall_time_s")
# older names of the shares, as rollout stores written before their renames hold them -> the current names
_OLD_SHARE_NAMES = {"row_steps": "computed_rows", "batched_refine_layer_evals": "computed_refine_layer_evals"}


def record_problem(record) -> str | None:
    """What a rollout's stored accounting (``RolloutAccount.to_json``, as a rollout store holds it) has that the
    readers of a run's files refuse, one line (``` `accounting.tokens`=... is not allowed; allowed: ...```); None when
    it is sound. The rules are the readers' own (``core/run_format.STATS_FIGURES``), since what a resumed run adds
    from the record ends in its ``config.eglr.stats``: counts (``tokens``, ``L``, ``head_projections``, the
    histogram's) ints in [0, 2**53], ``iterations`` ``{"k*": count}`` with k* >= 1 written in ASCII digits and at
    most ``tokens`` gated tokens, its refinement ``L x sum k*`` within 2**53, ``shares`` finite numbers in [0, 2**53],
    ``calibration`` true or false. ``head_projections``, ``shares`` and ``calibration`` may be absent (older stores).
    """
    if not isinstance(record, dict):
        return f"`accounting`={_shown(record)} is not allowed; allowed: a dict (tokens, iterations, L, ...)."
    count, hist, figure = STATS_FIGURES["tokens"], STATS_FIGURES["iteration_hist"], STATS_FIGURES["wall_time_s"]
    rules = {"tokens": count, "iterations": hist, "L": count}
    for name, rule in {**rules, "head_projections": count}.items():
        if (name in rules or name in record) and not rule.check(record.get(name)):
            return f"`accounting.{name}`={_shown(record.get(name))} is not allowed; allowed: {rule.allowed}."
    gated = sum(record["iterations"].values())
    if gated > record["tokens"]:
        return (f"`accounting.iterations`={_shown(record['iterations'])} is not allowed; allowed: at most `tokens` "
                f"({record['tokens']}) gated tokens.")
    if record["L"] * sum(int(k) * n for k, n in record["iterations"].items()) > HUGE:
        return (f"`accounting.L`={record['L']} with `iterations`={_shown(record['iterations'])} is not allowed; "
                "allowed: a refinement (L x the sum of k*) of at most 2**53 layer evaluations.")
    shares = record.get("shares")
    if shares is not None and not (isinstance(shares, dict) and all(isinstance(k, str) for k in shares)):
        return f"`accounting.shares`={_shown(shares)} is not allowed; allowed: a dict name -> {figure.allowed}."
    for name, value in (shares or {}).items():
        if not figure.check(value):
            return f"`accounting.shares.{name}`={_shown(value)} is not allowed; allowed: {figure.allowed}."
    if "calibration" in record and not isinstance(record["calibration"], bool):
        return f"`accounting.calibration`={_shown(record['calibration'])} is not allowed; allowed: true or false."
    return None


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def head_projections(iterations: dict, head_per_iteration: bool) -> int:
    """The refinements' LM-head projections from ``{k*: gated tokens}``: k* each when the exit rule reads a
    distribution at every iteration, else one each (the projection at the exit)."""
    return sum((int(k) if head_per_iteration else 1) * int(n) for k, n in iterations.items() if int(k) > 0)


@dataclass(frozen=True, slots=True)
class RolloutAccount:
    """One rollout's accounting, as its engine emits it and the rollout store keeps it (``to_json``).

    tokens: its generated tokens; iterations: ``((k*, gated tokens), ...)``, k* ascending, no zero counts;
    L: its cell's layer span; head_projections: the LM-head projections its refinements made; shares: its
    part of its batch's figures (``SHARED_FIGURES``; None in a record stored before rollouts carried them);
    calibration: tau_h calibration decoded it (its compute is calibration's).
    """

    tokens: int
    iterations: tuple[tuple[int, int], ...]
    L: int
    head_projections: int
    shares: dict | None = None
    calibration: bool = False

    @property
    def gated(self) -> int:
        return sum(n for _, n in self.iterations)

    @property
    def refine_layer_evals(self) -> int:
        """L × Σ k* over its gated tokens (the paper's refinement cost)."""
        return self.L * sum(k * n for k, n in self.iterations)

    def with_shares(self, shares: dict) -> "RolloutAccount":
        return dataclasses.replace(self, shares=dict(shares))

    def to_json(self) -> dict:
        """The rollout store's form: ``{"tokens", "iterations": {"k*": n}, "L", "head_projections"[,
        "calibration": true][, "shares": {...}]}``."""
        record = {"tokens": self.tokens, "iterations": {str(k): n for k, n in self.iterations}, "L": self.L,
                  "head_projections": self.head_projections}
        if self.calibration:
            record["calibration"] = True
        if self.shares is not None:
            record["shares"] = dict(self.shares)
        return record

    @classmethod
    def from_json(cls, record: dict) -> "RolloutAccount":
        """A stored record (``to_json``), also as older stores wrote it: without ``head_projections`` (k* per
        gated token: the paper's rule, and every rollout stored before the exit rules existed), without
        ``shares``, or with the older share names (``_OLD_SHARE_NAMES``). ``ValueError``, one line, for a record
        :func:`record_problem` refuses (the rollout store hands back none: it is a miss there)."""
        if (problem := record_problem(record)) is not None:
            raise ValueError(problem)
        iterations = _histogram(record["iterations"])
        shares = record.get("shares")
        if shares is not None:
            shares = {_OLD_SHARE_NAMES.get(name, name): value for name, value in shares.items()}
        return cls(tokens=int(record["tokens"]), iterations=iterations, L=int(record["L"]),
                   head_projections=int(record.get("head_projections", head_projections(dict(iterations), True))),
                   shares=shares, calibration=record.get("calibration", False))

    def own_shares(self) -> dict:
        """Its shares, or for a record stored without them its own rows counted as if it ran alone: a step per
        token, a refinement pass of its own k* per gated token."""
        if self.shares is not None:
            return self.shares
        return {"steps": self.tokens, "gated_steps": self.gated, "computed_rows": self.tokens,
                "computed_refine_layer_evals": self.refine_layer_evals, "wall_time_s": 0.0}


def _histogram(iterations) -> tuple[tuple[int, int], ...]:
    """``{k*: gated tokens}`` (keys int or str) as ``RolloutAccount.iterations``."""
    items = iterations.items() if isinstance(iterations, dict) else iterations
    return tuple(sorted((int(k), int(n)) for k, n in items if int(n)))


def own_account(tokens: int, iterations: dict, config, *, steps: int, gated_steps: int,
                computed_refine_layer_evals: int) -> RolloutAccount:
    """A finished rollout's record as its engine emits it: its own figures, and as its ``shares`` the steps it
    took part in and the refinement it ran, counted by its engine's rule for a row (the caller's keywords).
    config: its ``EglrConfig`` (L and the exit rule's LM-head projections)."""
    histogram = _histogram(iterations)
    return RolloutAccount(
        tokens=tokens, iterations=histogram, L=config.L,
        head_projections=head_projections(dict(histogram), config.stop_rule.head_per_iteration),
        shares={"steps": steps, "gated_steps": gated_steps, "computed_rows": tokens,
                "computed_refine_layer_evals": computed_refine_layer_evals, "wall_time_s": 0.0})


def share_wall_time(stats_of: dict, work_of: dict, wall_time_s: float) -> None:
    """Add one engine run's wall time to the stats of each config it decoded, shared by the configs' work.

    stats_of: config -> its ``EglrStats`` of the run; work_of: config -> its layer evaluations in the run
    (N x tokens + sum over gated tokens of L x k*: the work a config's rows did); a run with no work shares
    it evenly."""
    total = sum(work_of.values())
    for config, stats in stats_of.items():
        stats.wall_time_s += wall_time_s * (work_of[config] / total if total else 1 / len(stats_of))


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
    computed_rows: int = 0  # rows of the normal pass summed over steps (finished rows included)
    computed_refine_layer_evals: int = 0  # sum over gated steps of L × iterations run × rows of the pass
    wall_time_s: float = 0.0
    head_layers: float = 0.0  # one LM-head projection in decoder layers (0: not known, not counted)
    head_projections: int = 0  # LM-head projections of the refinements, summed over gated tokens

    def add_batch(self, *, steps: int, gated_steps: int, computed_rows: int, tokens: int, iterations: dict[int, int],
                  L: int, computed_refine_rows: int, head_per_iteration: bool = True) -> None:
        """One ``generate`` call's totals, read from the device once at its end.

        ``iterations`` maps k* to the number of gated tokens that used k* iterations;
        ``computed_refine_rows`` sums over gated steps the rows of the refinement pass times the
        iterations it ran (the batched cost); ``head_per_iteration``: the exit rule projects the LM head
        at every iteration (``StopRule.head_per_iteration``), else once per gated token.
        """
        gated = {k: c for k, c in iterations.items() if c}
        self.steps += steps
        self.gated_steps += gated_steps
        self.computed_rows += computed_rows
        self.tokens += tokens
        self.gated_tokens += sum(gated.values())
        self.iterations.update(gated)
        self.refine_layer_evals += L * sum(k * c for k, c in gated.items())
        self.computed_refine_layer_evals += L * computed_refine_rows
        self.head_projections += head_projections(gated, head_per_iteration)

    def add_rollout(self, account: RolloutAccount) -> None:
        """One stored rollout's record (with the ``shares`` of its batch's figures when its engine run finished):
        a resumed run counts it as when it was decoded."""
        self.tokens += account.tokens
        self.gated_tokens += account.gated
        self.iterations.update(dict(account.iterations))
        self.refine_layer_evals += account.refine_layer_evals
        self.head_projections += account.head_projections
        shares = account.own_shares()
        for name in SHARED_FIGURES:
            setattr(self, name, getattr(self, name) + shares.get(name, 0))

    def merge(self, other: "EglrStats") -> None:
        self.num_layers = self.num_layers or other.num_layers
        self.head_layers = self.head_layers or other.head_layers
        for name in ("tokens", "gated_tokens", "refine_layer_evals", "head_projections", *SHARED_FIGURES):
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
            "batched_flop_ratio": (1.0 + self.computed_refine_layer_evals / (n * self.computed_rows)
                                   if self.computed_rows else 1.0),
            "head_layers": round(self.head_layers, 4),
            "head_projections": self.head_projections,
            "flop_ratio_with_head": 1.0 + (self.refine_layer_evals + self.head_layers * self.head_projections)
            / ((n + self.head_layers) * self.tokens) if self.tokens else 1.0,
            # counts; sums of the stored rollouts' shares (floats) in a resumed run
            "steps": round(self.steps),
            "p_step_gated": round(self.gated_steps) / round(self.steps) if round(self.steps) else 0.0,
            "wall_time_s": round(self.wall_time_s, 3),
        }


