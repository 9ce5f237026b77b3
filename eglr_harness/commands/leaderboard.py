"""``eglr-leaderboard``: EGLR against greedy and beam search through the stock lm_eval CLI, resumable, as Markdown + CSV
tables."""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from eglr_harness.core.interrupt import run_interruptible
from eglr_harness.leaderboard.runner import Executor, check_output_dir, run_leaderboard, subprocess_executor
from eglr_harness.leaderboard.runs import (
    LeaderboardOptions,
    check_plan,
    default_output_dir,
    gen_kwargs_arg,
    parse_beams,
    parse_limit,
    plan_runs,
)

logger = logging.getLogger("eglr_harness.commands.leaderboard")


def leaderboard_parser() -> argparse.ArgumentParser:
    """The command line parser (flags named as in lm_eval where they mean the same)."""
    parser = argparse.ArgumentParser(
        prog="eglr-leaderboard",
        description="Greedy, Beam-n, EGLR (best L), EGLR-SC_L and Oracle_L for one model on several "
        "benchmarks, each through the stock lm_eval CLI; resumable; writes a Markdown + CSV table.",
    )
    parser.add_argument(
        "--model_args",
        required=True,
        nargs="+",
        help="HF model args shared by every run, e.g. pretrained=DIR,gguf_file=F.gguf",
    )
    parser.add_argument("--tasks", required=True, help="benchmarks, comma-separated: gsm8k,math500 (or gsm8k_eglr,...)")
    parser.add_argument(
        "--limit",
        default=None,
        help="problems per benchmark (lm_eval --limit): 100 for all, or per benchmark gsm8k=100,math500=50",
    )
    parser.add_argument("--max_gen_toks", type=int, default=None, help="max new tokens (gen kwarg for every run)")
    parser.add_argument("--batch_size", default=None, help="lm_eval --batch_size")
    parser.add_argument(
        "--beam_batch_size",
        default=None,
        help="lm_eval --batch_size of the beam runs (each problem holds num_beams rows; default: --batch_size)",
    )
    parser.add_argument("--device", default=None, help="lm_eval --device")
    parser.add_argument("--output_dir", default=None, help="default: out/leaderboard/<model>")
    parser.add_argument(
        "--update_committed",
        action="store_true",
        help="allow an --output_dir that holds files git tracks (rerunning a committed leaderboard)",
    )
    parser.add_argument("--apply_chat_template", action="store_true", help="pass --apply_chat_template to lm_eval")
    parser.add_argument("--beams", default="4,11", help="beam sizes to run, comma-separated, or 'none' (default 4,11)")
    parser.add_argument("--eglr_model_args", default="", help="extra model args for eglr-hf only, e.g. tau_h=auto")
    parser.add_argument(
        "--greedy_task_suffix", default="_eglr", help="task of greedy/beam runs: <b> + this (default _eglr)"
    )
    parser.add_argument(
        "--sc_task_suffix", default="_eglr_sc", help="task of the EGLR run: <b> + this (default _eglr_sc)"
    )
    parser.add_argument(
        "--lm_eval_args", default="", help="extra lm_eval flags for every run, one quoted string: '--seed 0'"
    )
    parser.add_argument(
        "--python", default=sys.executable, help="interpreter that runs `-m lm_eval` (default: this one)"
    )
    parser.add_argument("--dry_run", action="store_true", help="print the commands of unfinished runs, run nothing")
    parser.add_argument("--verbosity", "-v", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser


def options_from_args(args: argparse.Namespace) -> LeaderboardOptions:
    """Validated options from parsed CLI arguments."""
    model_args = ",".join(a.strip(",") for a in args.model_args)
    limit, limits = parse_limit(args.limit)
    return LeaderboardOptions(
        model_args=model_args,
        tasks=tuple(t.strip() for t in args.tasks.split(",") if t.strip()),
        output_dir=Path(args.output_dir) if args.output_dir else default_output_dir(model_args),
        beams=parse_beams(args.beams),
        limit=limit,
        limits=limits,
        max_gen_toks=args.max_gen_toks,
        batch_size=args.batch_size,
        beam_batch_size=args.beam_batch_size,
        device=args.device,
        apply_chat_template=args.apply_chat_template,
        eglr_model_args=args.eglr_model_args,
        greedy_suffix=args.greedy_task_suffix,
        sc_suffix=args.sc_task_suffix,
        lm_eval_args=tuple(shlex.split(args.lm_eval_args)),
        python=args.python,
    )


def check_cells(opts: LeaderboardOptions) -> None:
    """Every cell's data and arguments, which its lm_eval run would meet only after its model loaded: each
    task's benchmark data (``EGLR_DATA_DIR``, else the hub or its cache: one line naming both ways), and for the
    eglr-hf runs the run's preflight (``harness/preflight.py``: the pool, ``L`` against the layers, the lengths
    against ``max_length``). ``ValueError`` naming the cell, before the first one runs."""
    from eglr_harness.data.loading import check_local_data  # noqa: PLC0415
    from eglr_harness.harness.preflight import check_run_args, check_run_tasks  # noqa: PLC0415

    for run in plan_runs(opts):
        try:
            check_local_data([run.task])
            if run.model == opts.eglr_model:
                eglr = check_run_args(run.model_args, gen_kwargs=gen_kwargs_arg(run.gen_kwargs) or None,
                                      limit=run.limit)
                check_run_tasks(eglr, [run.task])
        except ValueError as err:
            raise ValueError(f"cell {run.benchmark}/{run.name} ({run.task}): {err}") from None


def _main(argv: Sequence[str] | None, executor: Executor) -> int:
    """Console entry point of ``eglr-leaderboard``; 0 when every run finished, 1 otherwise, 2 on bad input."""
    args = leaderboard_parser().parse_args(argv)
    logging.basicConfig(level=args.verbosity, format="%(levelname)s %(name)s: %(message)s")
    try:
        opts = options_from_args(args)
        check_plan(opts)  # before anything runs
        check_output_dir(opts.output_dir, update_committed=args.update_committed or args.dry_run)
        if not args.dry_run:  # a dry run runs nothing: nothing to refuse
            check_cells(opts)
        outcome = run_leaderboard(opts, executor, dry_run=args.dry_run)
    except ValueError as err:
        print(f"eglr-leaderboard: error: {err}", file=sys.stderr)
        return 2
    if outcome.tables:
        print(outcome.tables["markdown"])
    logger.info("ran %d, skipped %d (finished), failed %d", len(outcome.ran), len(outcome.skipped), len(outcome.failed))
    return 1 if outcome.failed else 0



def main(argv: Sequence[str] | None = None, executor: Executor = subprocess_executor) -> int:
    """Console entry point of ``eglr-leaderboard`` (:func:`_main`): 0 when every run finished, 1 otherwise, 2 on
    bad input; Ctrl-C or SIGTERM end it with one line (the finished runs, the command that resumes),
    its lm_eval child quiet (core/interrupt.py)."""
    return run_interruptible("eglr-leaderboard", lambda: _main(argv, executor), argv)

if __name__ == "__main__":
    sys.exit(main())
