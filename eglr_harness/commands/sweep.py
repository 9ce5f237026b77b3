"""``eglr-sweep``: one EGLR setting varied over values (an ablation), each point a stock lm_eval run, resumable."""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from eglr_harness.core.interrupt import note_stored, run_interruptible
from eglr_harness.leaderboard.runner import Executor, execute_run, subprocess_executor
from eglr_harness.leaderboard.runs import LeaderboardOptions, build_command, shell_command
from eglr_harness.leaderboard.sweep import AXES, RULES_GRID, finished_point, parse_axis, parse_rule_grid, plan_sweep

logger = logging.getLogger("eglr_harness.commands.sweep")


def sweep_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eglr-sweep",
        description="One-axis-at-a-time ablation of EGLR settings (paper Table 4), each point a stock "
        "lm_eval run; resumable; then the report's ablation section.",
    )
    parser.add_argument("--model_args", required=True, nargs="+", help="eglr-hf model args shared by every run")
    parser.add_argument("--tasks", required=True, help="one task, e.g. math500_eglr or eglr_demo")
    parser.add_argument("--sweep", action="append", default=[], metavar="AXIS=VALUES",
                        help=f"an axis and its values, repeatable; axes: {', '.join(AXES)}")
    parser.add_argument("--rules", action="store_true",
                        help="every exit rule over its built-in threshold grid ("
                        + "; ".join(f"{r}: {','.join(f'{v:g}' for v in vs)}" for r, vs in RULES_GRID.items())
                        + "), then the report's exit-rules section")
    parser.add_argument("--rule", action="append", default=[], metavar="RULE=THRESHOLDS",
                        help="one exit rule over these thresholds (repeatable; replaces that rule's --rules grid)")
    parser.add_argument("--limit", type=float, default=None, help="lm_eval --limit")
    parser.add_argument("--max_gen_toks", type=int, default=None, help="max new tokens (gen kwarg)")
    parser.add_argument("--batch_size", default=None, help="lm_eval --batch_size")
    parser.add_argument("--device", default=None, help="lm_eval --device")
    parser.add_argument("--metadata", default=None, help="lm_eval --metadata (JSON), e.g. the demo's levels")
    parser.add_argument("--apply_chat_template", action="store_true", help="pass --apply_chat_template to lm_eval")
    parser.add_argument("--rollout_cache", default=None, help="rollout store folder shared by every run (resume)")
    parser.add_argument("--output_dir", required=True, help="one folder per point under it, then report/")
    parser.add_argument("--lm_eval_args", default="", help="extra lm_eval flags, one quoted string")
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs `-m lm_eval`")
    parser.add_argument("--no_report", action="store_true", help="run only; no eglr-report afterwards")
    parser.add_argument("--dry_run", action="store_true", help="print the commands of unfinished runs, run nothing")
    parser.add_argument("--verbosity", "-v", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser


def _main(argv: Sequence[str] | None, executor: Executor) -> int:
    """Console entry point of ``eglr-sweep``: 0 when every point finished, 1 otherwise, 2 on bad input."""
    args = sweep_parser().parse_args(argv)
    logging.basicConfig(level=args.verbosity, format="%(levelname)s %(name)s: %(message)s")
    try:
        model_args = ",".join(a.strip(",") for a in args.model_args)
        tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
        if len(tasks) != 1:
            raise ValueError(f"`--tasks`={args.tasks!r}: a sweep runs one task; give one (e.g. math500_eglr).")
        extra = shlex.split(args.lm_eval_args)
        if args.metadata:
            extra += ["--metadata", args.metadata]
        opts = LeaderboardOptions(
            model_args=model_args, tasks=tuple(tasks), output_dir=Path(args.output_dir), beams=(),
            batch_size=args.batch_size, device=args.device, apply_chat_template=args.apply_chat_template,
            lm_eval_args=tuple(extra), python=args.python,
        )
        rules = dict(RULES_GRID) if args.rules else {}
        rules.update(parse_rule_grid(s) for s in args.rule)
        if not args.sweep and not rules:
            raise ValueError("nothing to run; give --sweep AXIS=VALUES, --rules or --rule RULE=THRESHOLDS.")
        points = plan_sweep(model_args, tasks[0], [parse_axis(s) for s in args.sweep], Path(args.output_dir),
                            limit=args.limit, max_gen_toks=args.max_gen_toks, rollout_cache=args.rollout_cache,
                            rules=tuple(rules.items()))
    except ValueError as err:
        print(f"eglr-sweep: error: {err}", file=sys.stderr)
        return 2
    try:
        return _run_points(args, opts, points, bool(rules), tasks[0], executor)
    except ValueError as err:  # a finished point's files that are not allowed (FileFormatError: FILE:LINE)
        print(f"eglr-sweep: error: {err}", file=sys.stderr)
        return 2


def _run_points(args: argparse.Namespace, opts: LeaderboardOptions, points: list, rules: bool, task: str,
                executor: Executor) -> int:
    """Run the unfinished points (or print them with --dry_run), then the report: 0 when every point finished, 1
    otherwise."""
    failed = []
    for p in points:
        argv_run = build_command(p.run, opts)
        if finished_point(p) is not None:
            logger.info("skip %s: finished", p.name)
            note_stored(f"finished runs in {args.output_dir}", [p.name])
        elif args.dry_run:
            print(shell_command(argv_run))
        else:
            execute_run(p.run, argv_run, executor)
            if finished_point(p) is None:
                logger.error("%s failed (no results file in %s)", p.name, p.run.output_path)
                failed.append(p.name)
            else:
                note_stored(f"finished runs in {args.output_dir}", [p.name])
    if failed:
        print(f"eglr-sweep: error: {len(failed)} of {len(points)} runs failed ({', '.join(failed)}; lm_eval's error "
              "is above); no report written. Fix the cause and run the same command again: finished runs are kept.",
              file=sys.stderr)
        return 1
    if args.dry_run or args.no_report:
        return 0
    done = [p.run.output_path for p in points if finished_point(p) is not None]
    if done:
        from eglr_harness.analysis.report import build_report  # noqa: PLC0415

        sections = ("runs", "ablation", "rules") if rules else ("runs", "ablation")
        out = build_report(done, Path(args.output_dir) / "report", task=task, sections=sections)
        print(out / "report.md")
    return 0



def main(argv: Sequence[str] | None = None, executor: Executor = subprocess_executor) -> int:
    """Console entry point of ``eglr-sweep`` (:func:`_main`): 0 when every point finished, 1 otherwise, 2 on bad
    input; Ctrl-C or SIGTERM end it with one line (the finished runs, the command that resumes),
    its lm_eval child quiet (core/interrupt.py)."""
    return run_interruptible("eglr-sweep", lambda: _main(argv, executor), argv)

if __name__ == "__main__":
    sys.exit(main())
