"""Write synthetic run folders exactly as lm-eval 0.4.13 does, through lm-eval's own tracker.

The layout (``OUT/<model_name_sanitized>/results_<date>.json`` and
``samples_<task>_<date>.jsonl``) and the JSON shapes come from
``lm_eval.loggers.EvaluationTracker``, so a change in lm-eval's writer shows up here.
"""

from __future__ import annotations

import json
from pathlib import Path

from lm_eval.loggers import EvaluationTracker
from lm_eval.utils import hash_string

MODEL_ARGS = "pretrained=/models/tiny-llama"

# The hand-made 3×3 grid of the tests: cell -> answers of docs 0..3. Gold of doc d is "g{d}".
# Solved sets: (0,0){0} (0,.5){0,1} (0,1){1,2} (1,0){0,2} (1,.5){1} (1,1){0,3} (2,0){2}
# (2,.5){} (2,1){}.
GRID = {
    (0, 0.0): ["g0", None, None, None],
    (0, 0.5): ["g0", "g1", None, None],
    (0, 1.0): ["w1", "g1", "g2", None],
    (1, 0.0): ["g0", "z", "g2", None],
    (1, 0.5): ["w1", "g1", "q", None],
    (1, 1.0): ["g0", None, None, "g3"],
    (2, 0.0): ["w1", "z", "g2", None],
    (2, 0.5): ["w1", "z", None, "7"],
    (2, 1.0): [None, "z", "q", None],
}


def rollouts_for(doc_id: int, cells, grid=GRID) -> list[dict]:
    """The per-document ``rollouts`` list over ``cells`` (repeat order = cells order)."""
    out = []
    for i, cell in enumerate(cells):
        answer = grid[cell][doc_id]
        out.append(
            {
                "repeat": i,
                "L": cell[0],
                "T": cell[1],
                "cycle": 0,
                "answer": answer,
                "correct": int(answer == f"g{doc_id}"),
            }
        )
    return out


def eglr_block(
    tokens=1000, gated=50, mean_iterations=2.8, flop_ratio=1.02, cells=None, task="t", reused=None
) -> dict:
    total = {
        "tokens": tokens,
        "gated_tokens": gated,
        "rho": gated / tokens,
        "mean_iterations": mean_iterations,
        "flop_ratio": flop_ratio,
        "batched_flop_ratio": flop_ratio + 0.01,
        "wall_time_s": 12.5,
    }
    stats = {"total": total, "cells": cells or {}}
    if reused is not None:  # runs made before eglr-hf counted reuse have no such key
        stats["reused_rollouts"] = {"total": sum(reused.values()), "cells": reused}
    return {
        "num_layers": 30,
        "settings": {"alpha": 0.2, "k_max": 3, "tau_kl": 0.0005, "top_k": 50, "top_p": 1.0, "seed": 1333},
        "tau_h": {task: 1.87},
        "stats": stats,
    }


def write_run(
    output_path: Path,
    *,
    task: str,
    docs: dict[int, list[dict]] | None = None,
    model_args: str = MODEL_ARGS,
    model: str = "eglr-hf",
    metrics: dict[str, float] | None = None,
    eglr: dict | None = None,
    limit: float | None = None,
    filters: tuple[str, ...] = ("none",),
    doc_text: str = "problem",
    extra_doc_keys: dict | None = None,
    gen_kwargs: dict | None = None,
) -> Path:
    """Write one run with lm-eval's tracker; returns the results JSON path.

    ``docs``: doc_id -> rollouts list (None: a run without ``--log_samples``).
    """
    tracker = EvaluationTracker(output_path=str(output_path))
    tracker.general_config_tracker.log_experiment_args(
        model_source=model,
        model_args=model_args,
        system_instruction=None,
        chat_template=None,
        fewshot_as_multiturn=False,
    )
    samples = []
    for filt in filters:
        for doc_id, rollouts in (docs or {}).items():
            doc = {"problem": f"{doc_text} {doc_id}", "answer": f"g{doc_id}"}
            first = rollouts[0] if rollouts else {"correct": 0, "answer": None}
            per_doc = {
                "acc": first["correct"],
                "mean_acc": sum(r["correct"] for r in rollouts) / max(1, len(rollouts)),
                f"maj@{len(rollouts)}": 0,
                f"oracle@{len(rollouts)}": int(any(r["correct"] for r in rollouts)),
                "best_cfg_acc": rollouts,
                "rollouts": rollouts,
                **(extra_doc_keys or {}),
            }
            samples.append(
                {
                    "doc_id": doc_id,
                    "doc": doc,
                    "target": f"g{doc_id}",
                    "arguments": [(f"prompt {doc_id}", {"until": ["</s>"]})] * max(1, len(rollouts)),
                    "resps": [[f"... \\boxed{{{r['answer']}}}"] for r in rollouts],
                    "filtered_resps": [f"... \\boxed{{{r['answer']}}}" for r in rollouts],
                    "filter": filt,
                    "metrics": list(per_doc),
                    "doc_hash": hash_string(json.dumps(doc, indent=2, ensure_ascii=False)),
                    "prompt_hash": hash_string(f"prompt {doc_id}"),
                    "target_hash": hash_string(f"g{doc_id}"),
                    **per_doc,
                }
            )
    n = len(docs or {}) or int(limit or 0)
    task_metrics = {"alias": task}
    for filt in filters:
        for name, value in (metrics or {}).items():
            task_metrics[f"{name},{filt}"] = value
            task_metrics[f"{name}_stderr,{filt}"] = "N/A"
    config = {
        "model": model,
        "model_args": model_args,
        "batch_size": 1,
        "batch_sizes": [],
        "device": "cpu",
        "use_cache": None,
        "limit": limit,
        "bootstrap_iters": 0,
        "gen_kwargs": gen_kwargs,
        "random_seed": 0,
        "numpy_seed": 1234,
        "torch_seed": 1234,
        "fewshot_seed": 1234,
    }
    if eglr is not None:
        config["eglr"] = eglr
    results = {
        "results": {task: task_metrics},
        "group_subtasks": {task: []},
        "configs": {task: {"task": task, "repeats": 1}},
        "versions": {task: 1.0},
        "n-shot": {task: 0},
        "higher_is_better": {task: {k: True for k in (metrics or {})}},
        "n-samples": {task: {"original": max(n, 100), "effective": n}},
        "config": config,
        "git_hash": None,
        "date": 0.0,
        "pretty_env_info": "fake",
        "transformers_version": "5.0",
        "lm_eval_version": "0.4.13",
        "upper_git_hash": None,
    }
    if samples:
        by_task = {task: samples}
        tracker.save_results_aggregated(results=results, samples=by_task)
        tracker.save_results_samples(task_name=task, samples=samples)
    else:
        tracker.save_results_aggregated(results=results, samples=None)
    found = sorted(Path(output_path).rglob(f"results_{tracker.date_id}.json"))
    assert len(found) == 1, found
    return found[0]


def write_grid_run(output_path: Path, cells, *, task="toy_eglr_lxt", docs=(0, 1, 2, 3), grid=GRID, **kw) -> Path:
    """A run whose pool is ``cells`` over the documents ``docs`` of :data:`GRID`."""
    return write_run(output_path, task=task, docs={d: rollouts_for(d, cells, grid) for d in docs}, **kw)
