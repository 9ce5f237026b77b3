"""The ablation of one EGLR setting at a time (paper Table 4), from runs that differ in their settings.

Each run (one :class:`~eglr_harness.analysis.load.RunPart`) is a point: its settings are read from
``config.eglr`` (``settings``: alpha, k_max, tau_kl; ``tau_h`` of the task; L and T from its
rollouts; ``stop``, the exit rule, and ``seed``, whose axis is the re-sampling yardstick: how far
another seed of the default point moves). The *default point* takes, per setting, the value most
runs share (an axis swept one at a time leaves every other axis at its default); where no value is
shared by more runs than another (a single swept axis), the built-in default of
:mod:`eglr_harness.core.config` when a run has it, else the first run's. A setting a run does not
record (an L=0 run has no tau_h) does not count as a difference. A run that differs from the default
point in exactly one setting is a point of that setting's axis; the default point belongs to every
axis; runs that differ in several settings are listed as off-axis. Pure: no files.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from eglr_harness.analysis.load import RunPart
from eglr_harness.analysis.metrics.compute import run_compute
from eglr_harness.analysis.metrics.intervals import (
    bootstrap_intervals, sign_test_p, wilcoxon_signed_rank, wilson_interval,
)
from eglr_harness.core import config as defaults

__all__ = ["ABLATION_KEYS", "AblationPoint", "Ablation", "point_settings", "ablation"]

ABLATION_KEYS = ("alpha", "k_max", "tau_kl", "tau_h", "L", "stop", "seed")
_BUILTIN = {"alpha": defaults.DEFAULT_ALPHA, "k_max": defaults.DEFAULT_K_MAX, "tau_kl": defaults.DEFAULT_TAU_KL,
            "L": defaults.DEFAULT_L, "stop": defaults.DEFAULT_STOP, "seed": defaults.DEFAULT_SEED}


@dataclass(frozen=True)
class AblationPoint:
    """One run as a point of an axis: its value, accuracy (95 % interval) and compute."""

    axis: str
    value: object
    is_default: bool
    run: str
    docs: int
    rollouts: int
    correct: int
    accuracy: float
    low: float
    high: float
    rho: float | None
    mean_iterations: float | None
    flop_ratio: float | None
    flop_ratio_with_head: float | None
    vs_default: tuple[float, float, float] | None = None  # paired bootstrap of accuracy − default's (problems)
    gained: int | None = None  # problems this point solves and the default point does not (one rollout each)
    lost: int | None = None
    sign_p: float | None = None
    wilcoxon_p: float | None = None  # Wilcoxon signed-rank over the per-problem accuracy differences
    n_effective: int | None = None  # the problems whose accuracy differs from the default point's (its n)


@dataclass(frozen=True)
class Ablation:
    """Points by axis (values ascending), the default settings and the runs off every axis."""

    axes: dict[str, tuple[AblationPoint, ...]]
    default: dict[str, object]
    off_axis: tuple[str, ...] = ()


def point_settings(part: RunPart, task: str) -> dict[str, object]:
    """``{alpha, k_max, tau_kl, tau_h, L, stop, seed}`` of one run (None where the run does not say; L is None
    when its rollouts hold several L values; stop: the exit rule, with its threshold where that is not
    the rule's default, e.g. ``latent 0.05``; ``kl`` for a run whose settings name no rule)."""
    eglr = part.info.eglr or {}
    settings = eglr.get("settings") or {}
    tau_h = eglr.get("tau_h")
    if isinstance(tau_h, Mapping):
        tau_h = tau_h.get(task, next(iter(tau_h.values()), None) if len(tau_h) == 1 else None)
    Ls = {r.L for r in part.rollouts if r.L is not None}
    return {
        "alpha": settings.get("alpha"),
        "k_max": settings.get("k_max"),
        "tau_kl": settings.get("tau_kl"),
        "tau_h": tau_h,
        "L": next(iter(Ls)) if len(Ls) == 1 else None,
        "stop": _stop_label(settings) if settings else None,
        "seed": settings.get("seed"),
    }


def _stop_label(settings: Mapping) -> str:
    rule = defaults.STOP_RULES.get(settings.get("stop", defaults.DEFAULT_STOP))
    if rule is None:
        return str(settings.get("stop"))
    threshold = settings.get(rule.threshold_arg)
    if rule.name == defaults.DEFAULT_STOP or threshold is None or threshold == rule.default:
        return rule.name
    return f"{rule.name} {threshold:g}"


def _default_value(key: str, values: Sequence) -> object:
    counts = Counter(values).most_common()
    if len(counts) == 1 or counts[0][1] > counts[1][1]:
        return counts[0][0]
    return _BUILTIN[key] if _BUILTIN.get(key) in values else values[0]


def per_doc_accuracy(part: RunPart) -> dict[int, float]:
    """doc_id -> the share of its rollouts in ``part`` that are correct."""
    per_doc: dict[int, list[int]] = {}
    for r in part.rollouts:
        per_doc.setdefault(r.doc_id, []).append(r.correct)
    return {d: sum(v) / len(v) for d, v in per_doc.items()}


def _vs_default(point: dict[int, float], default: dict[int, float]) -> tuple:
    """(bootstrap (mean, low, high) of the difference, gained, lost, sign test p, Wilcoxon p, effective n)
    over shared problems."""
    shared = sorted(set(point) & set(default))
    if not shared:
        return (None,) * 6
    diff = [point[d] - default[d] for d in shared]
    gained = sum(point[d] > default[d] for d in shared)
    lost = sum(point[d] < default[d] for d in shared)
    wilcoxon = wilcoxon_signed_rank(diff)
    return (bootstrap_intervals({"d": diff})["d"], gained, lost, sign_test_p(gained, lost), wilcoxon.p,
            wilcoxon.n_effective)


def _accuracy(part: RunPart) -> tuple[int, int, int, float, float, float]:
    """(docs, rollouts, correct, accuracy, low, high): Wilson over problems when each problem has one
    rollout, else a bootstrap over problems of the per-problem accuracy."""
    per_doc: dict[int, list[int]] = {}
    for r in part.rollouts:
        per_doc.setdefault(r.doc_id, []).append(r.correct)
    docs, rollouts = len(per_doc), sum(len(v) for v in per_doc.values())
    correct = sum(sum(v) for v in per_doc.values())
    if not docs:
        return 0, 0, 0, float("nan"), float("nan"), float("nan")
    if rollouts == docs:
        low, high = wilson_interval(correct, docs)
        return docs, rollouts, correct, correct / docs, low, high
    mean, low, high = bootstrap_intervals({"acc": [sum(v) / len(v) for v in per_doc.values()]})["acc"]
    return docs, rollouts, correct, mean, low, high


def ablation(parts: Sequence[RunPart], task: str) -> Ablation | None:
    """The ablation of ``parts`` (module docstring); None when the runs do not differ in any setting."""
    settings = [point_settings(p, task) for p in parts]
    known = {k: [s[k] for s in settings if s[k] is not None] for k in ABLATION_KEYS}  # None: the run does not say
    varying = [k for k in ABLATION_KEYS if len(set(known[k])) > 1]
    if not varying:
        return None
    default = {k: _default_value(k, known[k]) if known[k] else None for k in ABLATION_KEYS}
    found: dict[str, list[AblationPoint]] = {k: [] for k in varying}
    off_axis = []
    center = next((p for p, s in zip(parts, settings) if all(s[k] == default[k] for k in ABLATION_KEYS)), None)
    center_docs = per_doc_accuracy(center) if center is not None else None
    for part, s in zip(parts, settings):
        moved = [k for k in ABLATION_KEYS if s[k] is not None and s[k] != default[k]]
        if len(moved) > 1:
            off_axis.append(part.info.name)
            continue
        compute = run_compute(part.info)
        docs, rollouts, correct, acc, low, high = _accuracy(part)
        paired = (None,) * 6 if center_docs is None or not moved else _vs_default(per_doc_accuracy(part), center_docs)
        for axis in moved or varying:  # the default point is a point of every axis
            found[axis].append(AblationPoint(
                axis, s[axis], not moved, part.info.name, docs, rollouts, correct, acc, low, high,
                compute.rho if compute else None, compute.mean_iterations if compute else None,
                compute.flop_ratio if compute else None, compute.flop_ratio_with_head if compute else None,
                *paired,
            ))
    axes = {}
    for axis, points in found.items():
        by_value: dict = {}
        for p in points:  # one point per value: the first run given wins
            by_value.setdefault(p.value, p)
        axes[axis] = tuple(sorted(by_value.values(),
                                  key=lambda p: (p.value is None, p.value if p.value is not None else 0)))
    return Ablation(axes, default, tuple(off_axis))
