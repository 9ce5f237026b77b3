"""Command lines on lm-eval: ``eglr-eval`` / ``python -m eglr_harness`` (the stock lm_eval CLI with
eglr-harness loaded) and ``eglr-calibrate`` (tau_h into a preset).

``eglr-eval`` takes the same flags as ``lm_eval``. The autoload ``.pth`` already makes ``eglr-hf`` and the tasks visible
to a plain ``lm_eval``; this wrapper also works when autoload is off (``EGLR_AUTOLOAD=0``) or the
``.pth`` was not installed (e.g. running from a source checkout).
"""

from __future__ import annotations

import argparse
import logging
import os

from eglr_harness.calibrate import DEFAULT_CALIB_LIMIT


def eval_main() -> None:
    os.environ.setdefault("EGLR_AUTOLOAD", "1")
    from eglr_harness.harness import autoload as _autoload

    if not _autoload.enabled():
        os.environ["EGLR_AUTOLOAD"] = "1"
    _autoload.install()
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


def calibrate_main(argv: list[str] | None = None) -> None:
    """``eglr-calibrate``: calibrate tau_h for a model on tasks and write it into its preset."""
    parser = argparse.ArgumentParser(prog="eglr-calibrate", description=calibrate_main.__doc__)
    parser.add_argument("--model_config", required=True, help="preset name in model_configs/ or a YAML path")
    parser.add_argument("--tasks", required=True, help="comma-separated lm-eval task names (e.g. gsm8k_eglr,math500_eglr)")
    parser.add_argument("--model_args", default="", help="extra eglr-hf model args, key=value,key2=value2")
    parser.add_argument("--calib_limit", type=int, default=DEFAULT_CALIB_LIMIT, help="prompts per task (default 64)")
    parser.add_argument("--gen_kwargs", default=None, help="e.g. max_gen_toks=256")
    parser.add_argument("--batch_size", default="8")
    parser.add_argument("--apply_chat_template", action="store_true")
    parser.add_argument("--no_write", action="store_true", help="print the thresholds without editing the preset")
    args = parser.parse_args(argv)

    import lm_eval

    from eglr_harness.benchmark_names import benchmark_of
    from eglr_harness.harness.model import EglrHFLM
    from eglr_harness.presets import write_tau_h

    logging.basicConfig(level=logging.INFO)
    extra = lm_eval.utils.simple_parse_args_string(args.model_args)
    lm = EglrHFLM(model_config=args.model_config, L=0, T=0.0, tau_h="auto", calib_limit=args.calib_limit,
                  batch_size=args.batch_size, **extra)
    lm.calibrate_always = True
    for task in args.tasks.split(","):
        lm_eval.simple_evaluate(model=lm, tasks=[task], limit=args.calib_limit, gen_kwargs=args.gen_kwargs,
                                apply_chat_template=args.apply_chat_template)
        value = lm.tau_h_by_task[task]
        print(f"{task}: tau_h = {value:.4f} nats")
        if not args.no_write:
            path = write_tau_h(args.model_config, benchmark_of(task), value)
            print(f"written to {path} (tau_h.{benchmark_of(task)})")
