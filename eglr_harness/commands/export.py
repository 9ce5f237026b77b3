"""``eglr-export``: a run's rollouts as one flat table (CSV or JSONL), one row per rollout."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from eglr_harness.analysis.export import export_rows, write_rows
from eglr_harness.core.errors import OutputError
from eglr_harness.core.interrupt import run_interruptible
from eglr_harness.core.outputs import refuse_writing_into


def _main(argv: Sequence[str] | None = None) -> int:
    """Console entry point of ``eglr-export``; 0 on success, 2 on bad input."""
    parser = argparse.ArgumentParser(
        prog="eglr-export",
        description="One row per rollout of saved lm-eval runs (prompt, completion, reward, group_id, cell, "
        "settings, signals) as JSON lines or Parquet, for GRPO groups and best-of-N.",
    )
    parser.add_argument("run_dirs", nargs="+", metavar="RUN", help="folder given to lm_eval --output_path")
    parser.add_argument("--out", "-o", required=True, help="FILE.jsonl or FILE.parquet")
    parser.add_argument("--task", "-t", default=None, help="only this task (default: every task with samples)")
    args = parser.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(levelname)s %(name)s: %(message)s")
    try:
        refuse_writing_into([args.out], args.run_dirs, "--out")  # RUN/<model>/samples_*.jsonl was replaced by rows
        rows = list(export_rows(args.run_dirs, args.task))
        if not rows:
            raise ValueError(f"no rollouts under {args.run_dirs}: were the runs made with --log_samples on eglr tasks?")
        out = write_rows(rows, args.out)
    except (ValueError, OutputError) as err:
        print(f"eglr-export: error: {err}", file=sys.stderr)
        return 2
    groups = len({r["group_id"] for r in rows})
    print(f"{out}: {len(rows)} rollouts in {groups} groups")
    return 0



def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point of ``eglr-export`` (:func:`_main`); Ctrl-C or SIGTERM end it with one line saying what was
    stored and the command that resumes (core/interrupt.py)."""
    return run_interruptible("eglr-export", lambda: _main(argv), argv)

if __name__ == "__main__":
    sys.exit(main())
