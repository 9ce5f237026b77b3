"""``eglr-score``: score a run afterwards from its samples files, with the current grader.

A ``--predict_only`` run (lm-eval skips ``process_results``) or a run scored by an older grader
can be (re)scored without regenerating anything::

    eglr-score out/run/<model>/ --output_path out/scored

For every ``samples_<task>_<timestamp>.jsonl`` found, each document's raw responses (``resps``)
are extracted and scored exactly as the task's ``process_results`` does
(:func:`~eglr_harness.scoring.metrics.score_document`; the grid tasks ``*_lxt`` with their
sub-pools), and two files are written to the output folder, laid out like an lm-eval run so that
``eglr-report`` / ``eglr-leaderboard`` read them:

- ``samples_<task>_<timestamp>.jsonl`` — one line per document (filter ``pool``; other filters'
  lines of the input, which repeat the same responses, are dropped), with the per-document keys
  of docs/run-format.md;
- ``results_<timestamp>.json`` — the input run's results file when it is beside the samples
  (its ``config`` keeps the model and the accounting), with ``results[<task>]`` replaced by the
  new aggregates and ``eglr_cell_accuracies[<task>]`` added; else a minimal one.

Which (L, T) produced repeat ``i`` is not in a samples file (lm-eval logs responses as plain
text); it is the pool that eglr-hf resolved, recomputed here with the same rule
(:func:`eglr_harness.pool.resolve_pool`) from the run's model args (results file) and the
task's generation kwargs (the samples' ``arguments``). Runs of other models, or without their
results file, are scored without cells (one ``"unknown"`` cell).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from eglr_harness.errors import OutputError
from eglr_harness.jsonl import iter_jsonl
from eglr_harness.outputs import atomic_write_text, check_writable
from eglr_harness.rollout import Rollout, with_meta
from eglr_harness.scoring.extraction import ANSWER_MODES, extract_answer
from eglr_harness.scoring.metrics import GRID_SUB_POOLS, best_cfg_acc, cell_accuracies, score_document

logger = logging.getLogger(__name__)

POOL_FILTER = "pool"
GRID_SUFFIX = "_lxt"  # tasks scored with GRID_SUB_POOLS


def samples_files(paths: list[Path]) -> list[Path]:
    """Every ``samples_*.jsonl`` named or found under the given files/folders, sorted."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += sorted(path.rglob("samples_*.jsonl"))
        elif path.is_file() and path.name.startswith("samples_") and path.suffix == ".jsonl":
            found.append(path)
        else:
            raise ValueError(f"{path}: not a samples_<task>_<timestamp>.jsonl file or a folder holding some.")
    if not found:
        raise ValueError(f"no samples_*.jsonl under {', '.join(map(str, paths))} (was the run made with --log_samples?).")
    return found


def task_and_timestamp(path: Path) -> tuple[str, str]:
    """``samples_gsm8k_eglr_sc_2026-11-21T09-13-33.7.jsonl`` -> ``("gsm8k_eglr_sc", "2026-11-21T09-13-33.7")``."""
    task, sep, stamp = path.stem.removeprefix("samples_").rpartition("_")
    if not sep or not task:
        raise ValueError(f"{path.name}: expected samples_<task>_<timestamp>.jsonl.")
    return task, stamp


def _model_args(config: dict) -> dict:
    args = config.get("model_args") or {}
    if isinstance(args, str):
        from lm_eval.utils import simple_parse_args_string

        args = simple_parse_args_string(args)
    return dict(args)


def pool_cells(config: dict | None, task: str, gen_kwargs: dict, repeats: int) -> list[tuple[int, float, int]] | None:
    """``(L, T, cycle)`` of every repeat as eglr-hf ran it, or ``None`` (not an eglr-hf run / unknown)."""
    if not config or config.get("model") != "eglr-hf":
        return None
    from eglr_harness.presets import load_preset
    from eglr_harness.settings import RunSettings

    args = _model_args(config)
    preset = load_preset(args["model_config"]) if args.get("model_config") else {}
    plan = RunSettings.from_args(preset, L=args.get("L"), T=args.get("T")).pool_plan(task, gen_kwargs, repeats)
    cells = []
    for repeat in range(repeats):
        cell, cycle = plan.cell_for_repeat(repeat)
        # as eglr-hf logs it (pool.assign_jobs): a deterministic cell is decoded once, every repeat is cycle 0
        cells.append((cell.L, cell.T, cycle if cell.sampled else 0))
    return cells


def _gen_kwargs(sample: dict) -> dict:
    args = sample.get("arguments") or {}
    first = args.get("gen_args_0") if isinstance(args, dict) else (args[0] if args else None)
    if isinstance(first, dict):
        first = [first.get("arg_0"), first.get("arg_1")]
    kwargs = first[1] if first and len(first) > 1 else {}
    return dict(kwargs) if isinstance(kwargs, dict) else {}


def score_sample(sample: dict, task: str, config: dict | None) -> dict:
    """One samples line rescored: ``filtered_resps`` re-extracted, the per-document keys replaced."""
    doc = sample["doc"]
    (texts,) = sample["resps"]  # one request per document: its responses over the repeats
    mode = doc.get("answer_format") or "math"
    if mode not in ANSWER_MODES:
        raise ValueError(f"doc {sample.get('doc_id')}: answer_format={mode!r}; allowed: {', '.join(ANSWER_MODES)}.")
    cells = pool_cells(config, task, _gen_kwargs(sample), len(texts))
    if cells is not None:
        texts = [Rollout(text, L=L, T=T, cycle=cycle) for text, (L, T, cycle) in zip(texts, cells)]
    answers = [with_meta(extract_answer(text, mode) or "", text) for text in texts]
    scores = score_document(doc["answer"], answers, sub_pools=GRID_SUB_POOLS if task.endswith(GRID_SUFFIX) else None)
    kept = {k: v for k, v in sample.items() if k not in set(sample.get("metrics") or ()) | {"bypass"}}
    return {**kept, "filter": POOL_FILTER, "filtered_resps": [[str(a) for a in answers]],
            "metrics": list(scores), **scores}


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
    results = _read_json(results_path) if results_path.is_file() else None
    if results is None:
        logger.warning("%s: no %s beside it; scoring without (L, T) cells.", path, results_path.name)
    config = (results or {}).get("config")

    lines = list(iter_jsonl(path, "one lm-eval sample (a JSON object) per line"))
    if not lines:
        raise ValueError(f"{path}: no document lines (an empty samples file: was the run stopped before it saved "
                         "them?); rerun the task with --log_samples or leave this file out.")
    first_filter = lines[0][1].get("filter")
    scored = []
    for line, sample in lines:
        if sample.get("filter") != first_filter:
            continue
        try:
            scored.append(score_sample(sample, task, config))
        except (KeyError, TypeError) as err:
            detail = f"no key {err}" if isinstance(err, KeyError) else str(err)
            raise ValueError(f"{path}:{line}: not an lm-eval samples line of an eglr task ({detail}).") from None
        except ValueError as err:
            raise ValueError(f"{path}:{line}: {err}") from None

    output.mkdir(parents=True, exist_ok=True)
    atomic_write_text(output / path.name, "".join(json.dumps(s, ensure_ascii=False) + "\n" for s in scored))
    metrics = aggregate(scored)
    out_results = dict(results or {"config": {}, "configs": {}, "versions": {}})
    out_results["results"] = {**(out_results.get("results") or {}), task: {"alias": task, **metrics}}
    cells = dict(out_results.get("eglr_cell_accuracies") or {})
    cells[task] = cell_accuracies(s["rollouts"] for s in scored)
    out_results["eglr_cell_accuracies"] = cells
    results_out = output / results_path.name
    if results_out.is_file():  # several tasks of one run share the results file
        previous = _read_json(results_out)
        out_results["results"] = {**previous.get("results", {}), **out_results["results"]}
        out_results["eglr_cell_accuracies"] = {**previous.get("eglr_cell_accuracies", {}), **cells}
    atomic_write_text(results_out, json.dumps(out_results, indent=2, ensure_ascii=False) + "\n")
    return task, metrics


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a readable results JSON ({err}); move it away or restore it.") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a JSON {type(data).__name__}, expected lm-eval's results object.")
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="eglr-score",
        description="Score lm-eval samples files (e.g. of a --predict_only run) with the eglr grader.",
    )
    parser.add_argument("paths", nargs="+", type=Path, help="samples_<task>_<timestamp>.jsonl files or run folders")
    parser.add_argument("--output_path", type=Path, required=True, help="folder for the scored samples and results")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        files = samples_files(args.paths)
        check_writable(args.output_path, "--output_path")
    except ValueError as err:
        parser.error(str(err))
    except OutputError as err:
        print(f"eglr-score: error: {err}", file=sys.stderr)
        return 2
    for path in files:
        try:
            task, metrics = rescore_file(path, args.output_path / path.parent.name)
        except (ValueError, OutputError) as err:
            print(f"eglr-score: error: {err}", file=sys.stderr)
            return 2
        print(f"{task} ({path.name})")
        for key, value in metrics.items():
            print(f"  {key:<24} {value:.4f}" if isinstance(value, float) else f"  {key:<24} {value}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
