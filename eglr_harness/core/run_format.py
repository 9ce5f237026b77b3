"""The one check of what a run's files hold (docs/run-format.md), shared by ``eglr-report``,
``eglr-export`` and ``eglr-score``: a samples line, its rollouts and responses, and a results file's
``config`` with its ``config.eglr`` block.

Nothing read from a run is trusted: every value a reader uses is checked here, and a value that is
not what the contract allows is refused with a :class:`~eglr_harness.core.errors.FileFormatError` whose
message is one line, ``FILE:LINE: what is wrong (the value) and what is allowed`` (the commands print
it and exit 2). Keys a rollout or a line carries beyond the declared ones are kept and passed on
untouched (a newer writer's fields).

**Rollout fields** are declared in :data:`ROLLOUT_FIELDS` (name -> :class:`FieldRule`): every one is
optional but ``correct``; a later writer's field is one more entry (say ``ROLLOUT_FIELDS["verifier"]
= FieldRule(_optional(_number), "a number or null")``), checked wherever a rollout is read.

A leaf: it imports only :mod:`eglr_harness.core.jsonl`, :mod:`eglr_harness.core.cell`, the errors,
:mod:`eglr_harness.core.rollout` (its ``FINISHES``) and
:mod:`eglr_harness.core.config`, whose :data:`~eglr_harness.core.config.SETTING_RULES` eglr-hf checks the settings
by before the load: the readers read them by the same table, so whatever a run was made with can be read back.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from eglr_harness.core.cell import Cell
from eglr_harness.core.config import HUGE, SETTING_RULES, STOP_RULES
from eglr_harness.core.model_args import RECORDED_ENGINES_ALLOWED, is_recorded_engine
from eglr_harness.core.specs import MAX_AXIS_VALUES
from eglr_harness.core.errors import FileFormatError
from eglr_harness.core.jsonl import iter_jsonl
from eglr_harness.core.rollout import FINISHES

__all__ = [
    "FieldRule", "ROLLOUT_FIELDS", "SAMPLE_LINE", "SampleLine", "SamplesFile", "check_rollout", "read_samples_file",
    "prompt_of", "completions_of", "read_results", "check_results", "SAMPLES_SUFFIXES", "samples_stem", "samples_files",
]

SAMPLE_LINE = "one lm-eval sample (a JSON object) per line"
CONTRACT = "docs/run-format.md"


# HUGE (core/config.py), the largest count, figure or setting a run can hold: every int up to it is exact as a
# float, so sums and ratios of figures stay finite and exact (a bigger one is a corrupt or hand-made file)
LOGPROB_SLACK = 1e-6  # a log-probability is <= 0; float rounding of log_softmax may leave a hair above


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= HUGE


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)


def _finite_nonneg(v) -> bool:
    return _number(v) and math.isfinite(v) and 0 <= v <= HUGE


def _optional(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or check(v)


def _signal(name: str, x) -> bool:
    """A signal value (eglr_harness/core/signals.py): finite, within +/-2**53; ``mean_logprob`` (a mean of
    log-probabilities) at most 0, so that its exp, the confidence vote weight, is a probability."""
    if x is None:
        return True
    if not (_number(x) and math.isfinite(x) and abs(x) <= HUGE):
        return False
    return x <= LOGPROB_SLACK if name == "mean_logprob" else True


def _signals(v) -> bool:
    return v is None or (isinstance(v, dict) and all(isinstance(k, str) and _signal(k, x) for k, x in v.items()))


def _verifier_scores(v) -> bool:
    """``{spec: {"last", "min", "prod": finite numbers, ...}}`` as eglr-verify writes it (docs/verifiers.md):
    the scores are vote weights, so +/-Infinity (which swallows every other vote) and NaN are refused."""
    def finite(x):
        return _number(x) and math.isfinite(x) and abs(x) <= HUGE

    return isinstance(v, dict) and all(
        isinstance(k, str) and isinstance(r, dict) and all(finite(r.get(a)) for a in ("last", "min", "prod"))
        and (r.get("steps") is None or (isinstance(r["steps"], list) and all(finite(x) for x in r["steps"])))
        for k, r in v.items())


class FieldRule(NamedTuple):
    """How one field is checked: ``check(value) -> bool`` and the words for what is allowed."""

    check: Callable[[Any], bool]
    allowed: str


# name -> rule of every declared rollout field (docs/run-format.md, `rollouts`); all optional but `correct`
ROLLOUT_FIELDS: dict[str, FieldRule] = {
    "repeat": FieldRule(_count, "an int >= 0"),
    "L": FieldRule(_optional(_count), "an int >= 0, or null for a model other than eglr-hf"),
    "T": FieldRule(_optional(_finite_nonneg), "a finite number >= 0, or null for a model other than eglr-hf"),
    "cycle": FieldRule(_optional(_count), "an int >= 0 or null"),
    "answer": FieldRule(lambda v: v is None or isinstance(v, str), "a string, or null for no parseable answer"),
    "correct": FieldRule(lambda v: v in (0, 1) and isinstance(v, (int, bool)), "0 or 1"),
    "cluster": FieldRule(_optional(_count), "an int >= 0 or null"),
    "signals": FieldRule(_signals, "null or a dict of finite numbers (or nulls), `mean_logprob` <= 0; "
                                   "eglr_harness/core/signals.py"),
    "engine": FieldRule(lambda v: v is None or is_recorded_engine(v),
                        f"{RECORDED_ENGINES_ALLOWED} or null"),
    "seed": FieldRule(_optional(SETTING_RULES["seed"].accepts), f"{SETTING_RULES['seed'].allowed}: the seed the "
                      "rollout's repeat of the pool ran under (`seeds=`), or null"),
    "finish": FieldRule(lambda v: v is None or v in FINISHES, f"one of {', '.join(FINISHES)} (how an eglr-baseline "
                        "answer ended), or null"),
    "search_tokens": FieldRule(_optional(_count), "an int >= 0 (tokens an eglr-baseline answer's decoding evaluated, "
                               "summed over beams), or null"),
    "verifier_scores": FieldRule(_optional(_verifier_scores), "spec -> {steps: [numbers], last, min, prod: finite "
                                 "numbers}, as eglr-verify writes it (docs/verifiers.md), or null"),
}
REQUIRED_ROLLOUT_FIELDS = ("correct",)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_rollout(item: Any, where: str, doc_id: int, index: int) -> dict:
    """``item`` (rollout ``#index`` of ``doc_id``'s line at ``where``), checked against
    :data:`ROLLOUT_FIELDS`; a :class:`FileFormatError` names the first field that is not allowed."""
    if not isinstance(item, dict):
        raise FileFormatError(f"{where}: doc {doc_id} rollout #{index} is {_shown(item)}; expected a dict with "
                              f"keys {', '.join(ROLLOUT_FIELDS)} ({CONTRACT}).")
    for name in REQUIRED_ROLLOUT_FIELDS:
        if name not in item:
            raise FileFormatError(f"{where}: doc {doc_id} rollout #{index} has no `{name}`; allowed: "
                                  f"{ROLLOUT_FIELDS[name].allowed} ({CONTRACT}).")
    for name, rule in ROLLOUT_FIELDS.items():
        if name in item and not rule.check(item[name]):
            raise FileFormatError(f"{where}: doc {doc_id} rollout #{index}: `{name}` is {_shown(item[name])}; "
                                  f"allowed: {rule.allowed} ({CONTRACT}).")
    return item


@dataclass(frozen=True)
class SampleLine:
    """One checked document line of a samples file: its ``file:line``, doc id, the line, and its
    checked ``rollouts`` (None where the line has none: a ``--predict_only`` run)."""

    where: str
    doc_id: int
    sample: dict
    rollouts: list[dict] | None


@dataclass(frozen=True)
class SamplesFile:
    """The lines of one samples file for one lm-eval filter (the first in the file unless named)."""

    path: Path
    filter: str | None
    lines: tuple[SampleLine, ...]
    other_filters: tuple[str, ...] = field(default=())


# a samples file as lm-eval writes it, or gzip-compressed (the committed runs; core/jsonl.open_lines reads both)
SAMPLES_SUFFIXES = (".jsonl", ".jsonl.gz")


def samples_stem(path: str | Path) -> str | None:
    """``samples_<task>_<date>`` of a samples file's name (ending ``.jsonl`` or ``.jsonl.gz``), else None."""
    name = Path(path).name
    for suffix in sorted(SAMPLES_SUFFIXES, key=len, reverse=True):
        if name.startswith("samples_") and name.endswith(suffix) and len(name) > len("samples_" + suffix):
            return name[: -len(suffix)]
    return None


def samples_files(folder: str | Path, pattern: str = "samples_*", *, recursive: bool = False) -> list[Path]:
    """The samples files in ``folder`` (under it, when ``recursive``) whose stem matches ``pattern`` (a glob without
    the ending), plain or gzip-compressed, sorted. One run's samples in both forms (``X.jsonl`` and ``X.jsonl.gz``)
    raise :class:`FileFormatError`: which one is the run's cannot be told, so neither is read."""
    folder = Path(folder)
    found: dict[Path, Path] = {}
    for suffix in SAMPLES_SUFFIXES:
        for path in (folder.rglob if recursive else folder.glob)(pattern + suffix):
            stem = samples_stem(path)
            if stem is None or not path.is_file():
                continue
            key = path.with_name(stem)
            if key in found:
                raise FileFormatError(f"{found[key]} and {path.name} beside it: one run's samples twice; allowed: one "
                                      "of them (plain .jsonl or .jsonl.gz): delete or move the other.")
            found[key] = path
    return sorted(found.values())


def _rollout_items(sample: dict) -> list | None:
    """A line's rollout list: ``rollouts`` (or, in runs older than that key, ``best_cfg_acc``'s list)."""
    items = sample.get("rollouts")
    if items is None and isinstance(sample.get("best_cfg_acc"), list):
        items = sample["best_cfg_acc"]
    return items


def read_samples_file(path: str | Path, filter_name: str | None = None, *,
                      require_rollouts: bool = True) -> SamplesFile:
    """Read and check one ``samples_<task>_<date>.jsonl``: every line of the chosen filter has an int
    ``doc_id`` >= 0 seen once, and (when ``require_rollouts``, or when present) a ``rollouts`` list of
    rollouts that pass :func:`check_rollout`. Raises :class:`FileFormatError` naming ``file:line``."""
    path = Path(path)
    filters: list[str] = []
    chosen = filter_name
    seen: dict[int, int] = {}
    lines: list[SampleLine] = []
    for number, sample in iter_jsonl(path, SAMPLE_LINE):
        filt = sample.get("filter")
        if filt not in filters:
            filters.append(filt)
        chosen = filt if chosen is None else chosen
        if filt != chosen:
            continue
        where = f"{path}:{number}"
        doc_id = sample.get("doc_id")
        if not _count(doc_id):
            raise FileFormatError(f"{where}: `doc_id` is {_shown(doc_id)}; allowed: an int >= 0 (an lm-eval "
                                  "samples line).")
        if doc_id in seen:
            raise FileFormatError(f"{where}: doc {doc_id} appears twice for filter {chosen!r} (first on line "
                                  f"{seen[doc_id]}); allowed: one line per document and filter. Is the file corrupt?")
        seen[doc_id] = number
        items = _rollout_items(sample)
        if items is None and not require_rollouts:
            lines.append(SampleLine(where, doc_id, sample, None))
            continue
        if not isinstance(items, list):
            got = "no `rollouts` list" if items is None else f"`rollouts` {_shown(items)}"
            raise FileFormatError(f"{where}: doc {doc_id} has {got}; allowed: a list of "
                                  "rollouts, as eglr tasks log them with --log_samples (e.g. gsm8k_eglr_sc; "
                                  f"{CONTRACT}).")
        if not items:  # report counted the document but took no accuracy from it (5 of 6 while its table said 6)
            raise FileFormatError(f"{where}: doc {doc_id} has `rollouts` []; allowed: a non-empty list of rollouts "
                                  f"(an eglr task logs one per config and repeat; {CONTRACT}).")
        rollouts = [check_rollout(item, where, doc_id, i) for i, item in enumerate(items)]
        lines.append(SampleLine(where, doc_id, sample, rollouts))
    if not filters:
        raise FileFormatError(f"{path}: no document lines (an empty samples file: was the run stopped before it "
                              "saved them?); rerun the task with --log_samples or leave this run out.")
    if filter_name is not None and filter_name not in filters:
        raise FileFormatError(f"{path}: filter {filter_name!r} not found; filters in this file: {filters}.")
    return SamplesFile(path, chosen, tuple(lines), tuple(f for f in filters if f != chosen))


def prompt_of(line: SampleLine) -> str:
    """The context of a line's (first) request: lm-eval 0.4.13 logs ``arguments`` as
    ``{"gen_args_0": {"arg_0": context, "arg_1": gen_kwargs}}``; older writers as ``[[context, kwargs], ...]``."""
    args = line.sample.get("arguments")
    first = None
    if isinstance(args, Mapping) and args:
        first = next(iter(args.values()))
        first = first.get("arg_0") if isinstance(first, Mapping) else None
    elif isinstance(args, list) and args and isinstance(args[0], list) and args[0]:
        first = args[0][0]
    if not isinstance(first, str):
        raise FileFormatError(f"{line.where}: doc {line.doc_id} has `arguments` {_shown(args)}; allowed: lm-eval's "
                              "logged request ({'gen_args_0': {'arg_0': context, 'arg_1': gen_kwargs}}).")
    return first


def completions_of(line: SampleLine, n: int) -> list[str]:
    """The ``n`` rollout texts of a line: one request with ``n`` repeats (``[[r0, ..., rn]]``), or ``n``
    requests of one response each (``[[r0], [r1], ...]``); each a string."""
    resps = line.sample.get("resps")
    texts = None
    if isinstance(resps, list) and len(resps) == 1 and isinstance(resps[0], list) and len(resps[0]) == n:
        texts = resps[0]
    elif isinstance(resps, list) and len(resps) == n and all(isinstance(r, list) and r for r in resps):
        texts = [r[0] for r in resps]
    if texts is None or not all(isinstance(t, str) for t in texts):
        raise FileFormatError(f"{line.where}: doc {line.doc_id} has `resps` {_shown(resps)}; allowed: {n} rollout "
                              f"texts (one per rollout), as [[text, ...]] (an eglr task's samples).")
    return texts


# --------------------------------------------------------------------------- results files

def _line_of(text: str, keys: Sequence[str]) -> int:
    """The line of ``keys`` (a path of JSON keys) in a results file's text, as lm-eval indents it; the
    line of the deepest key found."""
    at = 0
    for key in keys:
        found = text.find(json.dumps(key) + ":", at)
        if found < 0:
            break
        at = found
    return text.count("\n", 0, at) + 1


def _dict_or_none(v) -> bool:
    return v is None or isinstance(v, dict)


# setting of config.eglr.settings -> rule: the numbers by eglr-hf's own table (core/config.SETTING_RULES: the
# same limits as before the load), the exit rule by name, `seeds` as the model arg allows it; absent or null: not
# recorded (older runs); keys not declared here are kept and passed on
NUMERIC_SETTINGS: dict[str, FieldRule] = {name: FieldRule(rule.accepts, rule.allowed)
                                          for name, rule in SETTING_RULES.items()}
SETTING_FIELDS: dict[str, FieldRule] = {
    **NUMERIC_SETTINGS,
    "stop": FieldRule(lambda v: isinstance(v, str) and v in STOP_RULES, f"one of {', '.join(STOP_RULES)}"),
    "seeds": FieldRule(lambda v: _count(v) and 1 <= v <= MAX_AXIS_VALUES, f"an int in 1..{MAX_AXIS_VALUES}"),
}


def _tau_h(v) -> bool:
    def one(x):
        return x is None or _finite_nonneg(x)

    return one(v) or (isinstance(v, dict) and all(one(x) for x in v.values()))


# key of config.eglr -> rule (docs/run-format.md, "Results JSON"); absent keys are fine (older runs)
EGLR_FIELDS: dict[str, FieldRule] = {
    "num_layers": FieldRule(_optional(_count), "an int >= 0 or null"),
    "settings": FieldRule(_dict_or_none, f"a dict of the settings ({', '.join(SETTING_FIELDS)}), each as "
                                         f"{__name__}.SETTING_FIELDS says"),
    "tau_h": FieldRule(_tau_h, "a dict task -> tau_h (a number >= 0, or null), or one such number (older runs)"),
    "stats": FieldRule(_dict_or_none, "a dict with `total` and `cells`"),
    "engines": FieldRule(_dict_or_none, "a dict task -> {cell: engine}"),
    "compile_report": FieldRule(_dict_or_none, "a dict of the continuous engine's compile figures, or null"),
    "prefill_report": FieldRule(_dict_or_none, "a dict of the continuous engine's prefill figures, or null"),
}


def _int_count(v) -> bool:
    """An int >= 0 (a JSON count: never a bool, a float or a string)."""
    return _count(v)


def _finite(v) -> bool:
    return _number(v) and math.isfinite(v)


def _share(v) -> bool:
    return _finite(v) and 0 <= v <= 1


def _ratio(v) -> bool:
    return _finite(v) and 1 <= v <= HUGE


_COUNT = "an int in [0, 2**53]"
_FIGURE = "a finite number in [0, 2**53]"


def _hist(v) -> bool:
    """``{str(k*): count}`` with k* an int >= 1 written as a string and the count an int >= 0."""
    return isinstance(v, dict) and all(isinstance(k, str) and re.fullmatch(r"[0-9]+", k) and int(k) >= 1
                                       and _count(x) for k, x in v.items())  # not isdigit(): "²" is a digit


# figure of config.eglr.stats.total / .cells[label] / .calibration[task].compute -> rule (docs/run-format.md);
# absent figures are fine (older runs), figures not declared here must be finite numbers >= 0 if numbers
STATS_FIGURES: dict[str, FieldRule] = {
    "tokens": FieldRule(_int_count, _COUNT),
    "gated_tokens": FieldRule(_int_count, _COUNT),
    "rho": FieldRule(_share, "a finite number in [0, 1]"),
    "mean_iterations": FieldRule(_finite_nonneg, _FIGURE),
    "iteration_hist": FieldRule(_hist, f"a dict 'k' (an int >= 1, as a string) -> {_COUNT}"),
    "flop_ratio": FieldRule(_ratio, "a number in [1, 2**53]"),
    "batched_flop_ratio": FieldRule(_ratio, "a number in [1, 2**53]"),
    "steps": FieldRule(_int_count, _COUNT),
    "p_step_gated": FieldRule(_share, "a finite number in [0, 1]"),
    "flop_ratio_with_head": FieldRule(_ratio, "a number in [1, 2**53]"),
    "head_layers": FieldRule(_finite_nonneg, _FIGURE),
    "head_projections": FieldRule(_int_count, _COUNT),
    "wall_time_s": FieldRule(_finite_nonneg, _FIGURE),
}
# field of config.eglr.stats.calibration[task] -> rule
CALIBRATION_FIELDS: dict[str, FieldRule] = {
    "tau_h": FieldRule(_finite_nonneg, _FIGURE),
    "prompts": FieldRule(_int_count, _COUNT),
    "entropy_tokens": FieldRule(_optional(_int_count), f"{_COUNT}, or null"),
    "cached": FieldRule(lambda v: isinstance(v, bool), "true or false"),
    "compute": FieldRule(_dict_or_none, "a dict of figures (as `total`) or null"),
}
RHO_TOLERANCE = 1e-6  # rho and mean_iterations are written as exact quotients at full precision


class _Problem(Exception):
    """(key path below config.eglr.stats, the value, what is allowed) of the first unusable figure."""

    def __init__(self, keys: Sequence[str], value: Any, allowed: str):
        super().__init__(keys, value, allowed)
        self.keys, self.value, self.allowed = list(keys), value, allowed


def _check_undeclared(keys: list[str], value: Any) -> None:
    """A figure a newer writer added (not in :data:`STATS_FIGURES`): null, a finite number in [0, 2**53],
    or a dict or list of such."""
    if isinstance(value, dict):
        for key, inner in value.items():
            _check_undeclared([*keys, str(key)], inner)
    elif isinstance(value, list):
        for inner in value:
            _check_undeclared(keys, inner)
    elif value is not None and not _finite_nonneg(value):
        raise _Problem(keys, value, f"{_FIGURE} or null (a figure not declared in {__name__}.STATS_FIGURES)")


def _check_figures(keys: list[str], figures: Any) -> None:
    """One dict of figures (``total``, a cell, a calibration's ``compute``): each figure as
    :data:`STATS_FIGURES` says, and consistent (gated <= tokens, rho = gated / tokens, the histogram
    sums to the gated tokens)."""
    if not isinstance(figures, dict):
        raise _Problem(keys, figures, "a dict of figures (tokens, gated_tokens, rho, ...)")
    for name, value in figures.items():
        rule = STATS_FIGURES.get(name)
        if rule is None:
            _check_undeclared([*keys, name], value)
        elif not rule.check(value):
            raise _Problem([*keys, name], value, rule.allowed)
    tokens, gated = figures.get("tokens"), figures.get("gated_tokens")
    if tokens is not None and gated is not None and gated > tokens:
        raise _Problem([*keys, "gated_tokens"], gated, f"at most `tokens` ({tokens}): a gated token is a token")
    if "rho" in figures and tokens is not None and gated is not None:
        expected = gated / tokens if tokens else 0.0
        if abs(figures["rho"] - expected) > RHO_TOLERANCE:
            raise _Problem([*keys, "rho"], figures["rho"], f"gated_tokens / tokens = {gated}/{tokens} = {expected:.6g}")
    hist = figures.get("iteration_hist")
    if hist is not None and gated is not None and sum(hist.values()) != gated:
        raise _Problem([*keys, "iteration_hist"], hist,
                       f"counts that sum to `gated_tokens` ({gated}); they sum to {sum(hist.values())}")
    mean = figures.get("mean_iterations")
    if hist is not None and mean is not None:
        counted = sum(hist.values())
        expected = sum(int(k) * n for k, n in hist.items()) / counted if counted else 0.0
        if abs(mean - expected) > RHO_TOLERANCE * max(1.0, expected):
            raise _Problem([*keys, "mean_iterations"], mean,
                           f"the mean of `iteration_hist` ({expected:.6g}), as eglr-hf writes it")


def _check_sum(keys: list[str], parts: Mapping, total: Any, what: str) -> None:
    if total is not None and parts and all(_count(v) for v in parts.values()) and sum(parts.values()) != total:
        raise _Problem(keys, total, f"the sum of {what} ({sum(parts.values())})")


def _check_stats(stats: dict) -> None:
    """Every number of ``config.eglr.stats`` (docs/run-format.md): raises :class:`_Problem`."""
    for name in ("total", "calibration"):
        if not _dict_or_none(stats.get(name)):
            raise _Problem([name], stats.get(name), "a dict of figures")
    if "reused_rollouts" in stats and not isinstance(stats["reused_rollouts"], dict):  # eglr-hf writes a dict
        raise _Problem(["reused_rollouts"], stats["reused_rollouts"], "a dict {total, cells}, or absent (older runs)")
    cells = stats.get("cells")
    if not _dict_or_none(cells):
        raise _Problem(["cells"], cells, "a dict 'L=<int>,T=<float>' -> figures")
    for label, figures in (cells or {}).items():
        try:
            Cell.parse(label)
        except ValueError:
            raise _Problem(["cells", label], figures, "cell labels of the form 'L=<int>,T=<float>'") from None
        _check_figures(["cells", label], figures)
    total = stats.get("total")
    if total is not None:
        _check_figures(["total"], total)
        for name in ("tokens", "gated_tokens"):
            _check_sum(["total", name], {k: v.get(name) for k, v in (cells or {}).items()}, total.get(name),
                       f"the cells' `{name}`")
    reused = stats.get("reused_rollouts") or {}
    if "total" in reused and not _count(reused["total"]):
        raise _Problem(["reused_rollouts", "total"], reused["total"], _COUNT)
    reused_cells = reused.get("cells")
    if not _dict_or_none(reused_cells):
        raise _Problem(["reused_rollouts", "cells"], reused_cells, "a dict 'L=<int>,T=<float>' -> int >= 0")
    for label, count in (reused_cells or {}).items():
        if not _count(count):
            raise _Problem(["reused_rollouts", "cells", label], count, _COUNT)
    _check_sum(["reused_rollouts", "total"], reused_cells or {}, reused.get("total"), "`reused_rollouts.cells`")
    for name, value in reused.items():
        if name not in ("total", "cells"):
            _check_undeclared(["reused_rollouts", name], value)
    for task, entry in (stats.get("calibration") or {}).items():
        if not isinstance(entry, dict):
            raise _Problem(["calibration", task], entry, "a dict (tau_h, prompts, entropy_tokens, cached, compute)")
        for name, value in entry.items():
            rule = CALIBRATION_FIELDS.get(name)
            if rule is None:
                _check_undeclared(["calibration", task, name], value)
            elif not rule.check(value):
                raise _Problem(["calibration", task, name], value, rule.allowed)
        if entry.get("compute") is not None:
            _check_figures(["calibration", task, "compute"], entry["compute"])
    for name, value in stats.items():
        if name not in ("total", "cells", "reused_rollouts", "calibration"):
            _check_undeclared([name], value)


def check_results(data: Any, path: str | Path, text: str = "") -> dict:
    """A parsed results JSON, checked where the readers use it (``results``, ``config``, ``config.eglr``)."""
    path = Path(path)
    if not isinstance(data, dict) or not isinstance(data.get("results"), dict):
        got = type(data).__name__ if not isinstance(data, dict) else f"`results` {_shown(data.get('results'))}"
        raise FileFormatError(f"{path}:1: {got}; expected an lm-eval results_<date>.json file (an object with a "
                              "`results` dict).")
    for task, entry in data["results"].items():
        if not isinstance(entry, dict):
            raise FileFormatError(f"{path}:{_line_of(text, ['results', task])}: results[{task!r}] is "
                                  f"{_shown(entry)}; allowed: a dict of metrics.")
    for task, counts in (data.get("n-samples") or {}).items():
        bad = [k for k in ("original", "effective") if k in (counts or {}) and not _count(counts[k])] \
            if isinstance(counts, dict) else ["counts"]
        if bad:
            raise FileFormatError(f"{path}:{_line_of(text, ['n-samples', task])}: n-samples[{task!r}] is "
                                  f"{_shown(counts)}; allowed: {{'original': int >= 0, 'effective': int >= 0}}.")
    config = data.get("config")
    if not _dict_or_none(config):
        raise FileFormatError(f"{path}:{_line_of(text, ['config'])}: `config` is {_shown(config)}; allowed: "
                              "lm-eval's config dict.")
    eglr = (config or {}).get("eglr")
    if not _dict_or_none(eglr):
        raise FileFormatError(f"{path}:{_line_of(text, ['config', 'eglr'])}: `config.eglr` is {_shown(eglr)}; "
                              f"allowed: the dict eglr-hf writes, or absent ({CONTRACT}).")
    for name, rule in EGLR_FIELDS.items():
        if eglr and name in eglr and not rule.check(eglr[name]):
            raise FileFormatError(f"{path}:{_line_of(text, ['config', 'eglr', name])}: `config.eglr.{name}` is "
                                  f"{_shown(eglr[name])}; allowed: {rule.allowed} ({CONTRACT}).")
    for name, rule in SETTING_FIELDS.items():
        value = ((eglr or {}).get("settings") or {}).get(name)
        if value is not None and not rule.check(value):
            raise FileFormatError(f"{path}:{_line_of(text, ['config', 'eglr', 'settings', name])}: "
                                  f"`config.eglr.settings.{name}` is {_shown(value)}; allowed: {rule.allowed} "
                                  f"({CONTRACT}).")
    try:
        if eglr and isinstance(eglr.get("stats"), dict):
            _check_stats(eglr["stats"])
    except _Problem as problem:
        raise FileFormatError(f"{path}:{_line_of(text, ['config', 'eglr', 'stats', *problem.keys])}: "
                              f"`config.eglr.stats.{'.'.join(problem.keys)}` is {_shown(problem.value)}; allowed: "
                              f"{problem.allowed} ({CONTRACT}).") from None
    return data


def read_results(path: str | Path) -> dict:
    """Read and check one results JSON (:func:`check_results`); errors name ``file:line``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text)
    except UnicodeDecodeError as err:
        raise FileFormatError(f"{path}:1: not UTF-8 ({err.reason}); expected an lm-eval results JSON.") from None
    except json.JSONDecodeError as err:
        raise FileFormatError(f"{path}:{err.lineno}: not valid JSON ({err.msg}, column {err.colno}); expected an "
                              "lm-eval results JSON.") from None
    return check_results(data, path, text)

