"""The facts of one run (:class:`RunInfo`) and its aggregated metrics, from a parsed results JSON."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from eglr_harness.run.model_names import model_name, parse_model_args

__all__ = ["RunInfo", "model_identity", "metric_names", "metric_entry", "metric_value", "run_info"]


@dataclass(frozen=True)
class RunInfo:
    """The facts of one lm-eval run that the analysis needs.

    Attributes:
        path: the results JSON.
        name: how reports name the run (:attr:`RunFiles.name`).
        model: :func:`model_identity` of the run; runs merge only when this is equal.
        model_source: lm-eval model type (``eglr-hf``, ``hf``, ...).
        tasks: tasks with aggregated metrics in ``results``.
        eglr: the ``config.eglr`` block written by eglr-hf (None for other models).
        limit: lm-eval ``--limit`` of the run (None = all documents).
        n_samples: task -> number of documents evaluated.
        wall_time_s: lm-eval's ``total_evaluation_time_seconds``.
        versions: ``lm_eval_version`` / ``transformers_version`` recorded by lm-eval.
        gen_kwargs: lm-eval's ``--gen_kwargs`` of the run (``config.gen_kwargs``; values as lm-eval stored them,
            strings when it kept the command line's text); empty when none were given.
        batch_size: lm-eval's ``config.batch_size`` as stored (``"64"``, ``1``, ``"auto"``, ...); None when absent.
    """

    path: Path
    model: str
    model_source: str | None
    tasks: tuple[str, ...]
    eglr: Mapping | None = None
    limit: float | None = None
    n_samples: Mapping[str, int] = field(default_factory=dict)
    wall_time_s: float | None = None
    versions: Mapping[str, str] = field(default_factory=dict)
    name: str = ""
    gen_kwargs: Mapping = field(default_factory=dict)
    batch_size: object = None


def model_identity(results: Mapping) -> str:
    """:func:`model_name` of a run's model args (lm-eval's ``model_name`` when they name none)."""
    config = results.get("config") or {}
    name = model_name(config.get("model_args")) or model_name({"pretrained": results.get("model_name") or ""})
    return name or str(config.get("model") or "<unknown model>")


def metric_names(results: Mapping, task: str) -> dict[str, str]:
    """``{metric: 'metric,filter'}`` for one task's aggregated metrics (first filter wins,
    except that the ``none`` filter is preferred when a metric has several)."""
    found: dict[str, str] = {}
    for key in (results.get("results") or {}).get(task, {}):
        if "," not in key or key.endswith("_stderr") or "_stderr," in key:
            continue
        metric, filt = key.split(",", 1)
        if metric not in found or filt == "none":
            found[metric] = key
    return found


def metric_entry(results: Mapping, task: str, metric: str) -> tuple[str, float] | None:
    """``(name, value)`` of the first numeric aggregated metric of ``task`` whose name matches
    ``metric`` (a regex such as ``maj@\\d+``; filters as in :func:`metric_names`), or None."""
    pattern = re.compile(metric)
    for name, key in metric_names(results, task).items():
        value = results["results"][task][key]
        if pattern.fullmatch(name) and isinstance(value, (int, float)) and not isinstance(value, bool):
            return name, float(value)
    return None


def metric_value(results: Mapping, task: str, metric: str) -> float | None:
    """The value of :func:`metric_entry`, or None when the run has no such metric."""
    entry = metric_entry(results, task, metric)
    return None if entry is None else entry[1]


def _as_float(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def run_info(results: Mapping, path: Path, name: str = "") -> RunInfo:
    """Build a :class:`RunInfo` from a parsed results JSON (``name``: default the file name)."""
    config = results.get("config") or {}
    n_samples = {
        task: int(counts.get("effective", counts.get("original", 0)))
        for task, counts in (results.get("n-samples") or {}).items()
        if isinstance(counts, Mapping)
    }
    versions = {key: str(results[key]) for key in ("lm_eval_version", "transformers_version") if results.get(key)}
    return RunInfo(
        path=Path(path),
        name=name or Path(path).name,
        model=model_identity(results),
        model_source=results.get("model_source") or config.get("model"),
        tasks=tuple((results.get("results") or {}).keys()),
        eglr=config.get("eglr"),
        limit=_as_float(config.get("limit")),
        n_samples=n_samples,
        wall_time_s=_as_float(results.get("total_evaluation_time_seconds")),
        versions=versions,
        gen_kwargs=parse_model_args(config.get("gen_kwargs")),
        batch_size=config.get("batch_size"),
    )
