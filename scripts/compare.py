#!/usr/bin/env python
"""Whether several greedy runs of one task logged the same answer text, problem by problem.

Reads each run folder's samples file (lm-eval ``--log_samples``), takes each problem's first response, and
writes a Markdown table: per problem, whether every run's text equals the first run's, and the first run's
text. Exit status 1 when any text differs. Files in, a table out: no model.

    python compare.py REFERENCE_RUN OTHER_RUN... --out agreement.md
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from eglr_harness.core.jsonl import iter_jsonl  # the samples committed as .jsonl.gz read as plain .jsonl
from eglr_harness.core.run_format import samples_files

log = logging.getLogger("compare")


def texts(run: Path) -> dict[int, str]:
    """doc_id -> the first response of the run's only samples file."""
    files = samples_files(run, recursive=True)
    if len(files) != 1:
        raise ValueError(f"`RUN`={str(run)!r} holds {len(files)} samples files; allowed: exactly one")
    out = {}
    for _, sample in iter_jsonl(files[0]):
        out[sample["doc_id"]] = sample["resps"][0][0]
    return out


def agreement(runs: list[Path]) -> tuple[str, bool]:
    """The Markdown table and whether every run's texts equal the first run's."""
    by_run = [texts(run) for run in runs]
    docs = sorted(by_run[0])
    if any(sorted(t) != docs for t in by_run[1:]):
        raise ValueError(f"the runs hold different problems: {[sorted(t) for t in by_run]}")
    names = [run.name for run in runs]
    lines = ["| doc_id | " + " | ".join(f"{n} = {names[0]}" for n in names[1:]) + f" | text of {names[0]} |",
             "|---|" + "---|" * len(names)]
    same_all = True
    for doc in docs:
        same = [t[doc] == by_run[0][doc] for t in by_run[1:]]
        same_all &= all(same)
        text = by_run[0][doc].replace("\n", "⏎").replace("|", "\\|")
        lines.append(f"| {doc} | " + " | ".join("yes" if s else "**no**" for s in same) + f" | {text} |")
    verdict = (f"All {len(docs)} problems: identical text in all {len(runs)} runs." if same_all
               else "Some texts differ (marked **no**).")
    return "\n".join([verdict, "", *lines]) + "\n", same_all


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (lm-eval --output_path); the first is "
                        "the reference")
    parser.add_argument("--out", type=Path, required=True, help="the Markdown file to write")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    if len(args.runs) < 2:
        print(f"compare: {len(args.runs)} run given; allowed: 2 or more", file=sys.stderr)
        return 1
    try:
        text, same = agreement(args.runs)
    except ValueError as err:
        print(f"compare: {err}", file=sys.stderr)
        return 1
    args.out.write_text(text)
    log.info("wrote %s: %s", args.out, text.splitlines()[0])
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
