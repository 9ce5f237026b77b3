"""``eglr-sweep``: the paper's ablation (Table 4) in one command, over any EGLR setting.

One axis at a time around the defaults, as the paper does: ``--sweep alpha=0.1,0.2,0.5,0.7,0.9
--sweep k_max=1-5`` runs the default point once and every other value of each axis with the
other settings at their defaults, each as one stock ``lm_eval`` run (the leaderboard's machinery:
:func:`~eglr_harness.leaderboard.runs.build_command`, resume by
:func:`~eglr_harness.leaderboard.runner.finished_run`, a record per run). ``--rollout_cache DIR``
gives every run the rollout store, so a killed sweep recomputes only the missing rollouts. Then
``eglr-report --sections runs,ablation`` over the sweep folder writes the table in the paper's
layout (value, accuracy with a 95 % interval, ρ, k̄, FLOP ratio) and the figure.

    eglr-sweep --model_args model_config=smollm2-135m-instruct,L=4 --tasks eglr_demo \\
        --sweep alpha=0.1,0.2,0.5,0.7,0.9 --sweep k_max=1-5 --limit 100 --output_dir out/ablation

Axes (:data:`AXES`): ``alpha``, ``k_max``, ``tau_kl``, ``tau_h`` (nats, ``inf``), ``L``, the exit rule
``stop`` and its thresholds (``tau_latent``, ...). The exit rules at equal settings, then one rule over
its threshold (the other rules' default points are the kl run's, so put the rule in --model_args):

    eglr-sweep --model_args model_config=smollm2-135m-instruct,L=4,k_max=4 --tasks eglr_demo \
        --sweep stop=latent,accel,margin,entropy --output_dir out/rules
    eglr-sweep --model_args model_config=smollm2-135m-instruct,L=4,k_max=4,stop=latent --tasks eglr_demo \
        --sweep tau_latent=0.01,0.03,0.1 --output_dir out/rules_latent

``seed`` repeats the whole run (every cell of its pool) under other seeds, so that a difference between
two settings can be set against the difference between two seeds of one (``--sweep seed=1334-1337``).

The exit rules at equal compute: ``--rules`` runs every rule over a grid of its thresholds
(:data:`RULES_GRID`; ``--rule latent=0.01,0.03`` gives one rule's grid, repeatable), one run per
(rule, threshold), each named ``stop_<rule>_<threshold>`` (the kl point at the default tau_kl is the
default point). ``eglr-report --sections runs,rules`` then plots accuracy against the measured FLOP
ratio per rule and compares each rule with kl at the nearest FLOP ratio, paired over problems:

    eglr-sweep --model_args model_config=smollm2-135m-instruct,L=4 --tasks eglr_demo --rules \
        --output_dir out/rules

Each run's folder is ``<output_dir>/<axis>_<value>/`` (``default/`` for the default point), the value written
exactly (``alpha_0.1234567``: the run gets that value, and a rerun finds its run), one folder per point. Each value is
read as eglr-hf reads it, and each point's settings together (``seed + seeds - 1`` within 2**53, ...) are checked by
eglr-hf's own rule before anything runs.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from eglr_harness.analysis.load import parse_model_args
from eglr_harness.core import config as defaults
from eglr_harness.leaderboard.runner import finished_run
from eglr_harness.core.model_args import MODEL_ARGS
from eglr_harness.leaderboard.runs import (
    PlannedRun,
    eglr_hf_model_args,
    eglr_settings,
    setting_value,
)

__all__ = ["AXES", "RULES_GRID", "SweepPoint", "parse_axis", "parse_rule_grid", "axis_defaults", "plan_sweep"]

logger = logging.getLogger(__name__)

# axis -> (kind: "int", "real" or "name", built-in default): the rows of core/model_args.MODEL_ARGS marked ``sweep``,
# their kind and default (tau_h's None: the preset's value, or the run's calibration). Each value is read by
# :func:`read_value`, the reader eglr-hf reads the model arg with; the default point's by the run's resolved arguments.
_KINDS = {"int": "int", "real": "real", "choice": "name", "tau_h": "real", "axis": "int"}
AXES = {name: (_KINDS[arg.kind], None if name == "tau_h" else arg.default)
        for name, arg in MODEL_ARGS.items() if arg.sweep}


def read_value(axis: str, value) -> object:
    """One value of ``axis`` as a run's child reads it, checked by the rule eglr-hf checks the model arg with
    (``core/model_args.read_model_arg``; L, one span per point, by ``core/config.LAYER_SPAN_RULE``): text is first
    read as lm-eval reads ``--model_args`` text (``'9007199254740993'`` is that int, not the float 2**53), so that a
    value the child would refuse is refused here. ``ValueError``, one line naming the value, otherwise; ``tau_h=auto``
    is no point (the default point calibrates when the preset names no tau_h)."""
    from eglr_harness.core.model_args import read_model_arg  # noqa: PLC0415

    value = setting_value(value.strip()) if isinstance(value, str) else value
    if axis == "L":
        return defaults.LAYER_SPAN_RULE.read("L", value)
    read = read_model_arg(axis, value)
    if read == "auto":
        raise ValueError("`tau_h`='auto' is not a point of a sweep; allowed: a float in [0, 2**53] nats or 'inf' "
                         "(the default point calibrates tau_h when the preset names none).")
    return read


# The thresholds ``--rules`` runs per exit rule: the rule's default (eglr-method.md, "Exit rules") with one value
# that exits sooner and one that exits later, a decade or so apart, so that each rule spans a range of FLOP ratios.
RULES_GRID = {
    "kl": (5e-4, 5e-3, 5e-2),
    "latent": (0.01, 0.03, 0.1),
    "accel": (0.01, 0.03, 0.1),
    "margin": (0.2, 0.5, 0.8),
    "entropy": (1e-3, 1e-2, 1e-1),
}


def parse_rule_grid(spec: str) -> tuple[str, tuple[float, ...]]:
    """``'latent=0.01,0.03'`` -> ``('latent', (0.01, 0.03))``: one exit rule and its thresholds, each checked
    as eglr-hf checks it; a rule or threshold it refuses -> ``ValueError`` naming it and what is allowed."""
    rule, sep, values = spec.partition("=")
    rule = rule.strip().lower()
    if not sep or rule not in defaults.STOP_RULES:
        raise ValueError(f"`--rule {spec}` is not allowed; allowed: RULE=THRESHOLDS with RULE one of "
                         f"{', '.join(defaults.STOP_RULES)} (e.g. --rule latent=0.01,0.03,0.1).")
    return rule, _values(defaults.STOP_RULES[rule].threshold_arg, values, f"--rule {spec}")


_RANGE = re.compile(r"([+-]?\d+)\s*-\s*([+-]?\d+)")  # an int axis's inclusive range: 1-5, -3--1


def _values(axis: str, spec: str, flag: str) -> tuple:
    """``'0.1,0.5'`` -> (0.1, 0.5); ``'1-5'`` (ints only) -> (1, 2, 3, 4, 5), ``'-3--1'`` -> (-3, -2, -1); ``|`` also
    separates. Each value (a range's ends) read by :func:`read_value`; ``ValueError`` naming ``flag`` as the user wrote
    it otherwise. A range names at most ``core/specs.MAX_AXIS_VALUES`` values (counted before it is expanded)."""
    from eglr_harness.core.specs import MAX_AXIS_VALUES  # noqa: PLC0415

    kind = AXES[axis][0]
    out: list = []
    for part in spec.replace("|", ",").split(","):
        part = part.strip()
        if not part:
            continue
        try:
            span = _RANGE.fullmatch(part) if kind == "int" else None
            if span:
                lo, hi = (read_value(axis, end) for end in span.groups())
                if hi < lo or hi - lo + 1 > MAX_AXIS_VALUES:
                    raise ValueError(f"{part!r} is not a range of {axis}; allowed: LO-HI with LO <= HI, at most "
                                     f"{MAX_AXIS_VALUES} values.")
                out.extend(range(lo, hi + 1))
            else:
                out.append(read_value(axis, part))
        except ValueError as err:
            raise ValueError(f"`{flag}`: {err}") from None
    if not out:
        raise ValueError(f"`{flag}` gives no value; e.g. --sweep {axis}=...,...")
    return tuple(dict.fromkeys(out))


def parse_axis(spec: str) -> tuple[str, tuple]:
    """``'alpha=0.1,0.2'`` -> ``('alpha', (0.1, 0.2))``; unknown axis or a value no run accepts (``k_max=0``,
    ``alpha=2``) -> ``ValueError`` naming the argument and what is allowed."""
    axis, sep, values = spec.partition("=")
    axis = axis.strip()
    if not sep or axis not in AXES:
        raise ValueError(
            f"`--sweep {spec}` is not allowed; allowed: AXIS=VALUES with AXIS one of {', '.join(AXES)} "
            "(e.g. --sweep alpha=0.1,0.2,0.5 --sweep k_max=1-5)."
        )
    return axis, _values(axis, values, f"--sweep {spec}")


def axis_defaults(run) -> dict[str, object]:
    """The value of every axis a run gets when the sweep does not set it, from the run's resolved arguments
    (``run/run_args.RunArgs``: model arg > preset > built-in default); None where it is not one value known before
    the run (an L range, ``tau_h=auto`` or no preset tau_h)."""
    values = {axis: getattr(run.config, axis) for axis in AXES if axis not in ("L", "tau_h")}
    L = run.L if run.L is not None else (run.default_L,)
    tau_h = run.tau_h if run.tau_h is not None else run.preset_tau_h.get("default")
    return {**values, "L": L[0] if len(L) == 1 else None, "tau_h": None if tau_h in (None, "auto") else tau_h}


def _label(value) -> str:
    """A value as a folder name and a model arg write it: exactly (the text reads back as the same number, so the
    child runs with the planned value and the rerun finds its run), in the short ``:g`` form where that is exact
    (``0.1``, ``0.0005``, ``1``: the names of earlier sweeps' folders), else ``repr`` (``0.1234567``)."""
    if isinstance(value, float):
        short = f"{value:g}"
        return short if float(short) == value else repr(value)
    return str(value)


@dataclass(frozen=True)
class SweepPoint:
    """One run of the sweep: the axes it moves off their defaults (empty: the default point), and
    the value of every axis it should run with (None: not known before the run, e.g. a calibrated tau_h)."""

    changes: tuple[tuple[str, object], ...]
    run: PlannedRun
    expected: tuple[tuple[str, object], ...] = ()

    @property
    def name(self) -> str:
        return self.run.name


def plan_sweep(
    model_args: str, task: str, axes: Sequence[tuple[str, tuple]], output_dir: Path, *,
    limit: float | None = None, max_gen_toks: int | None = None, rollout_cache: str | None = None,
    rules: Sequence[tuple[str, tuple[float, ...]]] = (),
) -> list[SweepPoint]:
    """The default point, then each axis's other values (one axis off its default per run), then each
    (exit rule, threshold) of ``rules`` (:func:`parse_rule_grid`) that is not already a point."""
    resolved = eglr_settings(model_args)  # the model args and the preset, read once
    args = parse_model_args(model_args)
    seen_axes = [a for a, _ in axes]
    if dupes := sorted({a for a in seen_axes if seen_axes.count(a) > 1}):
        raise ValueError(f"`--sweep` names {dupes} twice; give each axis once.")
    rule_args = {"stop", *(r.threshold_arg for r in defaults.STOP_RULES.values())} if rules else set()
    for axis in [a for a, _ in axes] + sorted(rule_args):
        if axis in args:
            raise ValueError(
                f"`{axis}` is both in --model_args ({args[axis]!r}) and swept; drop it from --model_args "
                f"(the sweep's default point is the preset's or built-in {axis})."
            )
    base = eglr_hf_model_args(model_args)  # device and batch size go as lm-eval flags (build_command)
    if rollout_cache:
        base += f",rollout_cache={rollout_cache}"
    tokens = (("max_gen_toks", max_gen_toks),) if max_gen_toks else ()

    defaults_all = axis_defaults(resolved)

    def point(changes: tuple) -> SweepPoint:
        shown = changes
        if len(changes) == 2 and changes[0][0] == "stop":  # a rule and its threshold: stop_latent_0.03
            shown = ((changes[0][0], f"{changes[0][1]}_{_label(changes[1][1])}"),)
        name = "_".join(f"{a}_{_label(v)}" for a, v in shown) or "default"
        extra = "".join(f",{a}={_label(v)}" for a, v in changes)
        run = PlannedRun("sweep", name, task, task, "eglr-hf", base + extra, tokens, Path(output_dir) / name,
                         limit=limit)
        return SweepPoint(changes, run, tuple({**defaults_all, **dict(changes)}.items()))

    points = [point(())]
    for axis, values in axes:
        default = defaults_all[axis]
        if default is None and axis == "tau_h":
            logger.warning("no preset tau_h: the default point calibrates it (tau_h=auto)")
        points += [point(((axis, v),)) for v in values if v != default]
    if rules and defaults_all["stop"] != defaults.DEFAULT_STOP:
        raise ValueError(f"the preset's exit rule is {defaults_all['stop']!r}; --rules compares every rule with kl, "
                         "so the default point must be kl (give a preset without `stop`).")
    for rule_name, thresholds in rules:
        rule = defaults.STOP_RULES[rule_name]
        for value in thresholds:
            if rule_name == defaults.DEFAULT_STOP:
                changes = () if _same(value, defaults_all[rule.threshold_arg]) else ((rule.threshold_arg, value),)
            else:
                changes = (("stop", rule_name), (rule.threshold_arg, value))
            if all(p.changes != changes for p in points):
                points.append(point(changes))
    _check_points(points, resolved)
    return points


def _check_points(points: Sequence[SweepPoint], resolved) -> None:
    """Each point's settings together (``--model_args``, the preset and the point's values) resolved by eglr-hf's own
    rule (``run/run_args.resolve_run_args``: ``seed + seeds - 1`` within 2**53, ...), and one folder per point, before
    anything runs; ``ValueError``, one line naming the point, otherwise."""
    from eglr_harness.run.run_args import resolve_run_args  # noqa: PLC0415

    for p in points:
        try:
            resolve_run_args({**resolved.given, **dict(p.changes)}, preset=resolved.preset)
        except ValueError as err:
            raise ValueError(f"the sweep's point {p.name} (--model_args with its values) is not allowed: {err}") \
                from None
    folders = [p.run.output_path for p in points]
    if dupes := sorted({str(f) for f in folders if folders.count(f) > 1}):
        raise ValueError(f"two points of the sweep would share the folder {dupes[0]}; give values that differ.")


def run_settings(results: dict, task: str) -> dict[str, object]:
    """The axes' values a finished run was made with, from its ``config.eglr`` (L from its cells)."""
    eglr = (results.get("config") or {}).get("eglr") or {}
    settings = eglr.get("settings") or {}
    tau_h = eglr.get("tau_h") or {}
    Ls = {label.split(",")[0].removeprefix("L=") for label in ((eglr.get("stats") or {}).get("cells") or {})}
    return {"alpha": settings.get("alpha"), "k_max": settings.get("k_max"), "tau_kl": settings.get("tau_kl"),
            "tau_h": tau_h.get(task) if isinstance(tau_h, dict) else None,
            "L": int(next(iter(Ls))) if len(Ls) == 1 else None,
            # a run that names no rule used kl; a rule's threshold is recorded only beside its rule
            "stop": settings.get("stop", defaults.DEFAULT_STOP) if settings else None,
            "seed": settings.get("seed"),
            **{name: settings.get(name) for name in defaults.STOP_THRESHOLD_ARGS}}  # fmt: skip


def _same(a, b) -> bool:
    """Whether two values of an axis are one: exactly (values are written exactly, :func:`_label`; a run made with
    alpha 0.1 is not the run of 0.1000000001), an int and its float alike, a name only as itself."""
    if a is None or b is None:
        return a is b
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    return float(a) == float(b)  # inf is not 5e-4


def finished_point(p: SweepPoint):
    """The point's finished run (:func:`finished_run`), or None; a run in the point's folder made with
    other settings (where both say: the sweep's defaults changed) is not reused, with a warning."""
    from eglr_harness.analysis.load import read_results  # noqa: PLC0415

    files = finished_run(p.run, p.run.limit)
    if files is None:
        return None
    found = run_settings(read_results(files.results), p.run.task)
    wrong = {a: (v, found.get(a)) for a, v in p.expected
             if v is not None and found.get(a) is not None and not _same(v, found.get(a))}  # fmt: skip
    if wrong:
        logger.warning("%s holds a run made with other settings %s (wanted, found); not reused", p.name, wrong)
        return None
    return files
