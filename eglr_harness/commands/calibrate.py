"""``eglr-calibrate``: calibrate tau_h for a model on tasks and write it into a preset file."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from eglr_harness.core.interrupt import run_interruptible
from eglr_harness.run.calibration import DEFAULT_CALIB_LIMIT, MIN_TRUSTED_TOKENS


def calibrate_target(model_config: str, out: str | None) -> Path:
    """Where ``eglr-calibrate`` writes: ``--out``, else the YAML file ``--model_config`` names, else (a preset
    name) ``model_configs/<name>.yaml`` under the current folder: in a checkout its own preset, elsewhere a
    new copy of the installed one, never the installed package's file (a reinstall would drop it)."""
    if out:
        return Path(out)
    given = Path(model_config)
    if given.suffix in {".yaml", ".yml"}:
        return given
    return Path("model_configs") / f"{model_config}.yaml"


def _check_tasks(tasks: list[str], written: str) -> None:
    """``ValueError`` naming the tasks lm-eval does not know (and the closest names), before the model loads:
    ours are read from their YAML; any other name is looked up in lm-eval's own index."""
    from eglr_harness.core.model_args import close_task_names  # noqa: PLC0415
    from eglr_harness.core.resources import task_names  # noqa: PLC0415

    if not tasks:
        raise ValueError(f"`--tasks`={written!r} names no task; allowed: comma-separated task names, e.g. gsm8k_eglr.")
    ours = task_names()
    unknown = [t for t in tasks if t not in ours]
    if unknown:  # perhaps a stock lm-eval task: ask its index (seconds, still before the model)
        from eglr_harness.harness.task_source import lm_eval_task_names  # noqa: PLC0415

        known = lm_eval_task_names()
        unknown = [t for t in unknown if t not in known]
    if unknown:
        close = close_task_names(unknown, ours)
        hint = "".join(f"; {n} -> did you mean {', '.join(c[:3])}?" for n, c in close.items() if c)
        raise ValueError(f"`--tasks`={written!r}: no task {', '.join(unknown)} (neither eglr-harness's nor "
                         f"lm-eval's){hint}")


def _main(argv: list[str] | None = None) -> int:
    """``eglr-calibrate``: calibrate tau_h for a model on tasks and write it into a preset file."""
    parser = argparse.ArgumentParser(
        prog="eglr-calibrate", description=_main.__doc__,
        epilog="Writes --out, else the YAML file --model_config names, else model_configs/<name>.yaml under the "
               "current folder (the checkout's preset when run from a checkout; a new copy of the installed preset "
               "elsewhere: run eglr-hf with model_config=model_configs/<name>.yaml). Comments are kept. A value from "
               f"fewer than {MIN_TRUSTED_TOKENS} token entropies is printed, not written, unless --allow_few_tokens.")
    parser.add_argument("--model_config", required=True, help="preset name in model_configs/ or a YAML path")
    parser.add_argument("--tasks", required=True,
                        help="comma-separated lm-eval task names (e.g. gsm8k_eglr,math500_eglr)")
    parser.add_argument("--model_args", default="", help="extra eglr-hf model args, key=value,key2=value2")
    parser.add_argument("--calib_limit", type=int, default=DEFAULT_CALIB_LIMIT, help="prompts per task (default 64)")
    parser.add_argument("--gen_kwargs", default=None, help="e.g. max_gen_toks=256")
    parser.add_argument("--batch_size", default="8")
    parser.add_argument("--apply_chat_template", action="store_true")
    parser.add_argument("--out", default=None, help="the preset file to write (default: see below)")
    parser.add_argument("--allow_few_tokens", action="store_true",
                        help=f"write a value from fewer than {MIN_TRUSTED_TOKENS} token entropies too")
    parser.add_argument("--no_write", action="store_true", help="print the thresholds without editing the preset")
    args = parser.parse_args(argv)

    from eglr_harness.core.outputs import OutputError, check_writable
    from eglr_harness.run.presets import preset_path

    target = calibrate_target(args.model_config, args.out)
    try:
        preset_path(args.model_config)  # an unknown preset names the known ones, before the model loads
        if args.calib_limit < 1:  # was a 19-line traceback
            raise ValueError(f"`--calib_limit`={args.calib_limit} is not allowed; allowed: an int >= 1 (prompts per "
                             f"task; default {DEFAULT_CALIB_LIMIT}).")
        _check_tasks([t.strip() for t in args.tasks.split(",") if t.strip()], args.tasks)
        if not args.no_write:
            if target.is_dir():  # found only when the whole calibration was done
                raise ValueError(f"`--out`={str(target)!r} is a folder; allowed: the preset YAML file to write "
                                 "(created if missing, its comments kept if it exists).")
            check_writable(target.parent, "--out")
        from eglr_harness.data.loading import check_local_data  # noqa: PLC0415

        # data that cannot be had: now, after what was typed (a fresh clone without data meets its --out first)
        check_local_data([t.strip() for t in args.tasks.split(",") if t.strip()])
    except (ValueError, OutputError) as err:
        print(f"eglr-calibrate: error: {err}", file=sys.stderr)
        return 2

    from eglr_harness.core.benchmark_names import benchmark_of
    from eglr_harness.harness.calibrate_tasks import calibrate_tasks
    from eglr_harness.run.presets import write_tau_h

    logging.basicConfig(level=logging.INFO)
    refused = []
    for task, value, tokens in calibrate_tasks(args.model_config, args.model_args, args.tasks.split(","),
                                               calib_limit=args.calib_limit, batch_size=args.batch_size,
                                               gen_kwargs=args.gen_kwargs,
                                               apply_chat_template=args.apply_chat_template):
        print(f"{task}: tau_h = {value:.4f} nats (from {tokens if tokens is not None else '?'} token entropies)")
        if args.no_write:
            continue
        if tokens is not None and tokens < MIN_TRUSTED_TOKENS and not args.allow_few_tokens:
            print(f"eglr-calibrate: error: {task}: tau_h = {value:.4f} comes from {tokens} token entropies (fewer "
                  f"than {MIN_TRUSTED_TOKENS}): too few to trust, not written to {target}; raise --calib_limit or "
                  "max_gen_toks, or pass --allow_few_tokens.", file=sys.stderr)
            refused.append(task)
            continue
        try:
            path = write_tau_h(args.model_config, benchmark_of(task), value, out=target)
        except ValueError as err:
            print(f"eglr-calibrate: error: {err}", file=sys.stderr)
            return 2
        print(f"written to {path} (tau_h.{benchmark_of(task)}); use it with --model_args model_config={path}")
    return 2 if refused else 0



def main(argv: list[str] | None = None) -> int:
    """Console entry point of ``eglr-calibrate`` (:func:`_main`); Ctrl-C or SIGTERM end it with one line saying what was
    stored and the command that resumes (core/interrupt.py)."""
    return run_interruptible("eglr-calibrate", lambda: _main(argv), argv)

if __name__ == "__main__":
    sys.exit(main())
