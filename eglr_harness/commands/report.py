"""``eglr-report RUN_DIR... [--out DIR] [--task NAME]``: the report of saved lm-eval runs."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from eglr_harness.analysis.metrics.budget import DEFAULT_ORDERS, DEFAULT_SEED
from eglr_harness.analysis.report import build_report
from eglr_harness.core.interrupt import run_interruptible

__all__ = ["main", "parser"]


def parser() -> argparse.ArgumentParser:
    """The command line parser (flags named as in lm_eval where they mean the same)."""
    parser = argparse.ArgumentParser(
        prog="eglr-report",
        description="Tables and figures of the L×T grid from saved lm-eval runs (--output_path with "
        "--log_samples). Several runs of one task and one model are merged. No model is loaded.",
    )
    parser.add_argument(
        "run_dirs", nargs="+", metavar="RUN_DIR", help="folder given to lm_eval --output_path, or a results_*.json"
    )
    parser.add_argument(
        "--out", "-o", default=None, help="report folder (default: RUN_DIR/report for the first RUN_DIR)"
    )
    parser.add_argument("--task", "-t", default=None, help="task to analyse when the runs hold several")
    parser.add_argument(
        "--filter", dest="filter_name", default=None, help="lm-eval filter to read (default: the first in each file)"
    )
    parser.add_argument(
        "--orders", type=int, default=DEFAULT_ORDERS, help=f"random orders for budget curves (default {DEFAULT_ORDERS})"
    )
    parser.add_argument(
        "--seed", type=int, default=DEFAULT_SEED, help=f"seed of the random orders (default {DEFAULT_SEED})"
    )
    parser.add_argument(
        "--sections",
        default=None,
        help="report sections to write, comma-separated (default all), e.g. runs,ablation for an eglr-sweep",
    )
    parser.add_argument("--verbosity", "-v", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser


def _main(argv: Sequence[str] | None = None) -> int:
    """Console entry point of ``eglr-report``; returns the exit status."""
    args = parser().parse_args(argv)
    logging.basicConfig(level=args.verbosity, format="%(levelname)s %(name)s: %(message)s")
    try:
        out = build_report(
            args.run_dirs, args.out, task=args.task, filter_name=args.filter_name, n_orders=args.orders, seed=args.seed,
            sections=None if args.sections is None else [s.strip() for s in args.sections.split(",") if s.strip()],
        )
    except ValueError as err:
        print(f"eglr-report: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # the report folder cannot be written
        where = err.filename or args.out or "the report folder"
        print(f"eglr-report: error: {where}: cannot be written ({err.strerror or err}); give a writable --out.",
              file=sys.stderr)
        return 2
    print(out / "report.md")
    return 0



def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point of ``eglr-report`` (:func:`_main`); Ctrl-C or SIGTERM end it with one line saying what was
    stored and the command that resumes (core/interrupt.py)."""
    return run_interruptible("eglr-report", lambda: _main(argv), argv)

if __name__ == "__main__":
    sys.exit(main())
