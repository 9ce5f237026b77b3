#!/usr/bin/env python
"""How many greedy answers a token budget cuts off: one row per run folder, written as a Markdown table.

Reads each run's lm-eval results file (the budget, ``max_gen_toks``; the wall time and tokens of
``config.eglr``) and samples file (per problem: its first rollout's length, ``signals.tokens``, and whether it
is right). A rollout is cut off when its length reached the budget. Files in, a table out: no model.

    python cutoff.py RUN... --out cutoff.md
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from pathlib import Path

from eglr_harness.core.jsonl import iter_jsonl  # the samples committed as .jsonl.gz read as plain .jsonl
from eglr_harness.core.run_format import samples_files as find_samples

log = logging.getLogger("cutoff")


def budget_row(run: Path) -> dict:
    """The figures of one greedy run folder (lm-eval's ``--output_path``)."""
    results_files = sorted(run.rglob("results_*.json"))
    samples_files = find_samples(run, recursive=True)
    if len(results_files) != 1 or len(samples_files) != 1:
        raise ValueError(f"`RUN`={str(run)!r} holds {len(results_files)} results and {len(samples_files)} samples "
                         "files; allowed: one of each (one task, one run)")
    results = json.loads(results_files[0].read_text())
    (task, config), = results["configs"].items()
    budget = int(config["generation_kwargs"]["max_gen_toks"])
    lengths, correct = [], []
    for _, sample in iter_jsonl(samples_files[0]):
        first = sample["rollouts"][0]
        tokens = (first.get("signals") or {}).get("tokens")
        if tokens is None:
            raise ValueError(f"{samples_files[0].name}: a rollout without `signals.tokens`; allowed: runs whose "
                             "engine recorded signals (2026-11-25 on)")
        lengths.append(int(tokens))
        correct.append(int(first["correct"]))
    total = results["config"]["eglr"]["stats"]["total"]
    cut = sum(n >= budget for n in lengths)
    return {"run": run.name, "budget": budget, "problems": len(lengths), "cut": cut,
            "cut_share": cut / len(lengths), "solved": sum(correct), "median_tokens": statistics.median(lengths),
            "max_tokens": max(lengths), "tokens": total["tokens"], "wall_time_s": total["wall_time_s"]}


def table(rows: list[dict]) -> str:
    lines = ["| run | budget (new tokens) | problems | cut off | solved | median / max answer tokens | "
             "tokens generated | wall time | tokens/s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['run']} | {r['budget']} | {r['problems']} | {r['cut']} ({100 * r['cut_share']:.1f} %) | "
                     f"{r['solved']} ({100 * r['solved'] / r['problems']:.1f} %) | {r['median_tokens']:g} / "
                     f"{r['max_tokens']} | {r['tokens']} | {r['wall_time_s']:.0f} s | "
                     f"{r['tokens'] / r['wall_time_s']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="greedy run folders (lm-eval --output_path)")
    parser.add_argument("--out", type=Path, required=True, help="the Markdown file to write")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    try:
        rows = [budget_row(run) for run in args.runs if run.is_dir()]
    except (ValueError, KeyError) as err:
        print(f"cutoff: {err}", file=sys.stderr)
        return 1
    args.out.write_text(table(rows))
    log.info("wrote %s (%d runs)", args.out, len(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
