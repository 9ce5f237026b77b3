#!/usr/bin/env python
"""Two or more runs of one pool by different engines, side by side: speed, and whether they decoded the same.

Reads each run folder's results and samples files (lm-eval ``--output_path`` with ``--log_samples``) and writes a
Markdown table: per run, its engine, generated tokens, the decode seconds its engine recorded
(``config.eglr.stats.total.wall_time_s``), tokens per decode second, lm-eval's seconds for the whole evaluation
(model load, engine start and compilation included), the majority-vote accuracy, and how many of its rollouts
decoded the same text as the first run's. Files in, a table out: no model.

    python speed.py FIRST_RUN OTHER_RUN... --out speed.md
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from eglr_harness.core.jsonl import iter_jsonl  # the samples committed as .jsonl.gz read as plain .jsonl
from eglr_harness.core.run_format import samples_files

log = logging.getLogger("speed")


def _one(run: Path, pattern: str) -> Path:
    files = samples_files(run, pattern, recursive=True) if pattern == "samples_*" else sorted(run.rglob(pattern))
    if len(files) != 1:
        raise ValueError(f"`RUN`={str(run)!r} holds {len(files)} files {pattern}; allowed: exactly one")
    return files[0]


def read_run(run: Path) -> dict:
    """A run's figures and its rollouts' texts by (doc_id, rollout index)."""
    results = json.loads(_one(run, "results_*.json").read_text())
    eglr = results["config"]["eglr"]
    total = eglr["stats"]["total"]
    (task,) = results["results"]
    texts = {}
    for _, sample in iter_jsonl(_one(run, "samples_*")):
        for i, text in enumerate(sample["resps"][0]):
            texts[(sample["doc_id"], i)] = text
    maj = next(v for k, v in results["results"][task].items() if k.startswith("maj@") and "stderr" not in k)
    return {"name": run.name, "engine": eglr["engine"], "tokens": total["tokens"], "decode_s": total["wall_time_s"],
            "evaluation_s": float(results["total_evaluation_time_seconds"]), "maj": maj, "texts": texts}


def table(runs: list[dict]) -> str:
    first = runs[0]
    lines = ["| run | engine | tokens | decode s | tokens / decode s | whole run s | maj accuracy | rollouts with "
             f"{first['name']}'s text |", "|---|---|---|---|---|---|---|---|"]
    for run in runs:
        if sorted(run["texts"]) != sorted(first["texts"]):
            raise ValueError(f"{run['name']} and {first['name']} hold different rollouts")
        same = sum(run["texts"][key] == text for key, text in first["texts"].items())
        rate = run["tokens"] / run["decode_s"] if run["decode_s"] else float("nan")
        lines.append(f"| {run['name']} | {run['engine']} | {run['tokens']:,} | {run['decode_s']:.1f} | {rate:.2f} | "
                     f"{run['evaluation_s']:.1f} | {run['maj']:.3f} | {same} of {len(first['texts'])} |")
    rates = [run["tokens"] / run["decode_s"] for run in runs if run["decode_s"]]
    if len(rates) == len(runs):
        lines += ["", "Tokens per decode second over the first run's: "
                  + ", ".join(f"{run['name']} {rate / rates[0]:.3f}x" for run, rate in zip(runs, rates)) + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (lm-eval --output_path); the first is "
                        "the reference")
    parser.add_argument("--out", type=Path, required=True, help="the Markdown file to write")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    if len(args.runs) < 2:
        print(f"speed: {len(args.runs)} run given; allowed: 2 or more", file=sys.stderr)
        return 1
    try:
        text = table([read_run(run) for run in args.runs])
    except (ValueError, KeyError) as err:
        print(f"speed: {err}", file=sys.stderr)
        return 1
    args.out.write_text(text)
    log.info("wrote %s", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
