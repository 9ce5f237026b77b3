"""``eglr-score``: score a run afterwards from its samples files, with the current grader.

A ``--predict_only`` run (lm-eval skips ``process_results``) or a run scored by an older grader
can be (re)scored without regenerating anything::

    eglr-score out/run/<model>/ --output_path out/scored

For every ``samples_<task>_<timestamp>.jsonl`` (or gzip-compressed ``.jsonl.gz``) found, each document's raw
responses (``resps``) are extracted and scored exactly as the task's ``process_results`` does
(:func:`~eglr_harness.scoring.doc_scores.score_document`; the grid tasks ``*_lxt`` with their
sub-pools), and two files are written to the output folder, laid out like an lm-eval run so that
``eglr-report`` / ``eglr-leaderboard`` read them:

- ``samples_<task>_<timestamp>.jsonl`` (``.jsonl.gz`` for a compressed input) — one line per document
  (filter ``pool``; other filters' lines of the input, which repeat the same responses, are dropped), with the
  per-document keys of docs/run-format.md; everything but the scores is kept as read: each logged rollout's cell,
  ``signals`` (so ``wmaj@B`` is scored again), ``engine`` and any later field;
- ``results_<timestamp>.json`` — the input run's results file when it is beside the samples
  (its ``config`` keeps the model and the accounting), with the metric values of ``results[<task>]``
  replaced by the new aggregates (its other keys and ``_stderr`` entries kept, recomputed) and
  ``eglr_cell_accuracies[<task>]`` added; else a minimal one.

Lines and results files are checked by :mod:`eglr_harness.core.run_format`, as eglr-report checks them.
A scored run logs which (L, T) produced repeat ``i``; a ``--predict_only`` run does not (lm-eval
logs responses as plain text): there it is the pool that eglr-hf resolved, recomputed here with the
same rule (:func:`eglr_harness.run.pool.resolve_pool`) from the run's model args (results file) and the
task's generation kwargs (the samples' ``arguments``). Runs of other models, or without their
results file, are scored without cells (one ``"unknown"`` cell).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from eglr_harness.core.errors import FileFormatError
from eglr_harness.core.jsonl import dumps, encode_lines
from eglr_harness.core.model_args import engine_named
from eglr_harness.core.outputs import atomic_writer
from eglr_harness.core.rollout import RolloutText, with_meta
from eglr_harness.core.run_format import read_results, read_samples_file, samples_stem
from eglr_harness.core.run_format import samples_files as find_samples
from eglr_harness.scoring.doc_scores import GRID_SUB_POOLS, best_cfg_acc, cell_accuracies, score_document
from eglr_harness.scoring.extraction import ANSWER_MODES, extract_answer

logger = logging.getLogger(__name__)

POOL_FILTER = "pool"
GRID_SUFFIX = "_lxt"  # tasks scored with GRID_SUB_POOLS


def samples_files(paths: list[Path]) -> list[Path]:
    """Every ``samples_*.jsonl`` (or gzip-compressed ``.jsonl.gz``) named or found under the given files/folders,
    sorted (one run's samples in both forms are refused: :func:`eglr_harness.core.run_format.samples_files`)."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += find_samples(path, recursive=True)
        elif path.is_file() and samples_stem(path) is not None:
            found.append(path)
        else:
            raise ValueError(f"{path}: not a samples_<task>_<timestamp>.jsonl (or .jsonl.gz) file or a folder "
                             "holding some.")
    if not found:
        raise ValueError(f"no samples_*.jsonl under {', '.join(map(str, paths))} (was the run made with "
                         "--log_samples?).")
    return found


def task_and_timestamp(path: Path) -> tuple[str, str]:
    """``samples_gsm8k_eglr_sc_2026-11-21T09-13-33.7.jsonl`` (or ``.jsonl.gz``) -> ``("gsm8k_eglr_sc",
    "2026-11-21T09-13-33.7")``."""
    task, sep, stamp = (samples_stem(path) or "").removeprefix("samples_").rpartition("_")
    if not sep or not task:
        raise ValueError(f"{path.name}: expected samples_<task>_<timestamp>.jsonl.")
    return task, stamp


def _model_args(config: dict) -> dict:
    args = config.get("model_args") or {}
    if isinstance(args, str):
        from lm_eval.utils import simple_parse_args_string

        args = simple_parse_args_string(args)
    return dict(args)


def pool_cells(config: dict | None, task: str, gen_kwargs: dict,
               repeats: int) -> list[tuple[int, float, int, int | None]] | None:
    """``(L, T, cycle, seed)`` of every repeat as eglr-hf ran it (seed: None unless the run had ``seeds`` > 1),
    or ``None`` (not an eglr-hf run / unknown)."""
    if not config or config.get("model") != "eglr-hf":
        return None
    from eglr_harness.run.presets import load_preset
    from eglr_harness.run.settings import RunSettings

    args = _model_args(config)
    preset = load_preset(args["model_config"]) if args.get("model_config") else {}
    settings = RunSettings.from_args(preset, L=args.get("L"), T=args.get("T"), seed=args.get("seed"),
                                     seeds=args.get("seeds"))
    pool = settings.pool_for(task, gen_kwargs, repeats)
    cells = []
    for repeat in range(repeats):
        cell, seed_index, cycle = pool.entry_for_repeat(repeat)
        # as eglr-hf logs it (pool.assign_jobs): a deterministic cell is decoded once, every repeat is cycle 0
        cells.append((cell.L, cell.T, cycle if cell.sampled else 0,
                      settings.base.seed + seed_index if pool.seeds > 1 else None))
    return cells


def _gen_kwargs(sample: dict) -> dict:
    args = sample.get("arguments") or {}
    first = args.get("gen_args_0") if isinstance(args, dict) else (args[0] if args else None)
    if isinstance(first, dict):
        first = [first.get("arg_0"), first.get("arg_1")]
    kwargs = first[1] if first and len(first) > 1 else {}
    return dict(kwargs) if isinstance(kwargs, dict) else {}


# what rescoring recomputes of a logged rollout; every other key (L, T, cycle, signals, engine, and any
# field a later writer adds) is carried over as the run logged it
RESCORED_ROLLOUT_KEYS = ("repeat", "answer", "correct", "cluster")


def _logged_rollouts(sample: dict, n: int) -> list[dict] | None:
    """The line's logged ``rollouts`` when it has one per response (a scored run), else None (``--predict_only``)."""
    logged = sample.get("rollouts")
    if isinstance(logged, list) and len(logged) == n and all(isinstance(r, dict) for r in logged):
        return logged
    return None


def score_sample(sample: dict, task: str, config: dict | None, where: str = "sample") -> dict:
    """One samples line rescored: ``filtered_resps`` re-extracted, the per-document keys replaced.

    Each rollout keeps what the run logged of it but the answer and its scores
    (:data:`RESCORED_ROLLOUT_KEYS`): its cell (the logged one; recomputed with :func:`pool_cells` only
    for a ``--predict_only`` line), ``signals`` (so ``wmaj@B`` is scored again) and ``engine``.
    """
    doc, resps = sample.get("doc"), sample.get("resps")
    if not isinstance(doc, dict) or not isinstance(doc.get("answer"), (str, int, float)):
        raise FileFormatError(f"{where}: `doc` is {str(doc)[:80]!r}; allowed: the task's document, a dict whose "
                              "`answer` is the gold answer (an eglr task's samples).")
    if not (isinstance(resps, list) and len(resps) == 1 and isinstance(resps[0], list)
            and all(isinstance(t, str) for t in resps[0])):
        raise FileFormatError(f"{where}: `resps` is {str(resps)[:80]!r}; allowed: one request's texts over the "
                              "repeats, [[text, ...]] (an eglr task's samples).")
    (texts,) = resps  # one request per document: its responses over the repeats
    mode = doc.get("answer_format") or "math"
    if mode not in ANSWER_MODES:
        raise FileFormatError(f"{where}: doc {sample.get('doc_id')}: answer_format={mode!r}; allowed: "
                              f"{', '.join(ANSWER_MODES)}.")
    logged = _logged_rollouts(sample, len(texts))
    if logged is None and isinstance(sample.get("rollouts"), list):
        raise FileFormatError(f"{where}: doc {sample.get('doc_id')} has {len(texts)} texts in `resps` but "
                              f"{len(sample['rollouts'])} logged rollouts; allowed: one text per rollout.")
    if logged is not None and all(r.get("L") is not None and r.get("T") is not None for r in logged):
        texts = [RolloutText(text, L=r["L"], T=r["T"], cycle=r.get("cycle") or 0, signals=r.get("signals"),
                             engine=engine_named(r.get("engine")), seed=r.get("seed"))
                 for text, r in zip(texts, logged)]
    elif (cells := pool_cells(config, task, _gen_kwargs(sample), len(texts))) is not None:
        texts = [RolloutText(text, L=L, T=T, cycle=cycle, seed=seed) for text, (L, T, cycle, seed) in zip(texts, cells)]
    answers = [with_meta(extract_answer(text, mode) or "", text) for text in texts]
    scores = score_document(str(doc["answer"]), answers,
                            sub_pools=GRID_SUB_POOLS if task.endswith(GRID_SUFFIX) else None)
    if logged is not None:
        scores["rollouts"] = [{**new, **{k: v for k, v in old.items() if k not in new}}
                              for new, old in zip(scores["rollouts"], logged)]
    kept = {k: v for k, v in sample.items() if k not in set(sample.get("metrics") or ()) | {"bypass"}}
    return {**kept, "filter": POOL_FILTER, "filtered_resps": [[str(a) for a in answers]],
            "metrics": list(scores), **scores}


def _stderr(values: list) -> float | str:
    """lm-eval's standard error of a mean (``mean_stderr``); "N/A" where it has none."""
    if len(values) < 2:
        return "N/A"
    mean = sum(values) / len(values)
    return (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5 / len(values) ** 0.5


def task_entry(previous: dict | None, task: str, samples: list[dict], metrics: dict[str, Any]) -> dict:
    """``results[<task>]`` of the rescored run: the input's entry (``name``, ``alias``, ``sample_len``, ...)
    with every metric replaced by its new value, and a standard error wherever the input had one ("N/A"
    stays "N/A": the run was made without them; the aggregations other than a mean have none)."""
    previous = dict(previous or {"alias": task})
    kept = {k: v for k, v in previous.items() if "," not in k}
    out = {**kept, **metrics}
    for key in metrics:
        metric = key.split(",", 1)[0]
        stderr_key = f"{metric}_stderr,{POOL_FILTER}"
        old = next((v for k, v in previous.items() if k.split(",", 1)[0] == f"{metric}_stderr"), None)
        if old is None:
            continue
        numeric = metric not in ("rollouts", "best_cfg_acc") and old != "N/A"
        out[stderr_key] = _stderr([s[metric] for s in samples if metric in s]) if numeric else "N/A"
    return out


def aggregate(samples: list[dict]) -> dict[str, Any]:
    """Run-level values of every per-document key, as the task YAMLs aggregate them."""
    keys = list(dict.fromkeys(k for s in samples for k in s["metrics"]))
    out: dict[str, Any] = {}
    for key in keys:
        values = [s[key] for s in samples if key in s]
        if key == "rollouts":
            out[f"{key},{POOL_FILTER}"] = sum(len(v) for v in values)
        elif key == "best_cfg_acc":
            out[f"{key},{POOL_FILTER}"] = best_cfg_acc(values)
        else:
            out[f"{key},{POOL_FILTER}"] = sum(values) / len(values)
    return out


def rescore_file(path: Path, output: Path) -> tuple[str, dict[str, Any]]:
    """Rescore one samples file into ``output``; returns ``(task, aggregated metrics)``."""
    task, stamp = task_and_timestamp(path)
    results_path = path.with_name(f"results_{stamp}.json")
    results = read_results(results_path) if results_path.is_file() else None
    if results is None:
        logger.warning("%s: no %s beside it; scoring without (L, T) cells.", path, results_path.name)
    config = (results or {}).get("config")

    scored = []
    for line in read_samples_file(path, require_rollouts=False).lines:  # the first filter's lines, checked
        try:
            scored.append(score_sample(line.sample, task, config, where=line.where))
        except (KeyError, TypeError) as err:
            detail = f"no key {err}" if isinstance(err, KeyError) else str(err)
            raise FileFormatError(f"{line.where}: not an lm-eval samples line of an eglr task ({detail}).") from None
        except FileFormatError:
            raise
        except ValueError as err:  # e.g. the pool the line's generation kwargs resolve to
            raise FileFormatError(f"{line.where}: {err}") from None

    output.mkdir(parents=True, exist_ok=True)
    samples_text = "".join(dumps(s) + "\n" for s in scored)
    metrics = aggregate(scored)
    out_results = dict(results or {"config": {}, "configs": {}, "versions": {}})
    previous_entry = (out_results.get("results") or {}).get(task)
    entry = task_entry(previous_entry if isinstance(previous_entry, dict) else None, task, scored, metrics)
    out_results["results"] = {**(out_results.get("results") or {}), task: entry}
    cells = dict(out_results.get("eglr_cell_accuracies") or {})
    cells[task] = cell_accuracies(s["rollouts"] for s in scored)
    out_results["eglr_cell_accuracies"] = cells
    results_out = output / results_path.name
    if results_out.is_file():  # several tasks of one run share the results file
        previous = read_results(results_out)
        # the other tasks as an earlier call scored them (the input still holds them unscored), this task anew
        out_results["results"] = {**out_results["results"], **previous.get("results", {}), task: entry}
        out_results["eglr_cell_accuracies"] = {**cells, **previous.get("eglr_cell_accuracies", {}), task: cells[task]}
    # both files whole or both as they were: each is written and flushed to disk (where a full disk fails)
    # before either is renamed into place (samples without their results was left on a full disk)
    # (the samples in the form they were read in: a .jsonl.gz input gives a .jsonl.gz output, core/jsonl.encode_lines)
    with atomic_writer(output / path.name, "wb") as samples_file, atomic_writer(results_out, "wb") as results_file:
        for handle, data in ((samples_file, encode_lines(path.name, samples_text)),
                             (results_file, (dumps(out_results, indent=2) + "\n").encode("utf-8"))):
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    return task, metrics
