"""``eglr-verify RUN... --verifier SPEC [--verifier SPEC ...] --out OUT``: score a saved pool's rollouts
with verifiers into a copy of its samples (:mod:`eglr_harness.verify.run`)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from eglr_harness.core.errors import OutputError
from eglr_harness.core.interrupt import run_interruptible
from eglr_harness.run.model_names import parse_model_args
from eglr_harness.verify.spec import FORMATS, SELF_KINDS, parse_spec

__all__ = ["main", "parser"]


def parser() -> argparse.ArgumentParser:
    formats = "; ".join(f"{k}:PATH = {v}" for k, v in FORMATS.items())
    selfs = "; ".join(f"self:{k} = {v}" for k, v in SELF_KINDS.items())
    p = argparse.ArgumentParser(
        prog="eglr-verify",
        description="Score every rollout of saved lm-eval runs (--log_samples of eglr tasks) with a verifier: step "
        "scores and the solution score (last, min, prod) go into a copy of the samples under OUT "
        "(rollouts[i].verifier_scores); the runs' own files are not written. Resumable: rerun the same command.",
    )
    p.add_argument("run_dirs", nargs="+", metavar="RUN", help="folder given to lm_eval --output_path")
    p.add_argument("--verifier", "-V", action="append", required=True, metavar="SPEC",
                   help=f"repeatable. {formats}; {selfs}")
    p.add_argument("--out", "-o", required=True, help="folder of the copies and the score store")
    p.add_argument("--task", "-t", default=None, help="only this task's samples (default: every task)")
    p.add_argument("--limit", type=int, default=None, help="score the first N documents of each samples file")
    p.add_argument("--doc_ids", default=None,
                   help="score only these documents, comma-separated lm-eval doc_ids "
                        "(with --limit: the first N of them)")
    p.add_argument("--batch_size", type=int, default=8, help="inputs per forward (default 8)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--dtype", default="auto",
                   help="auto (bfloat16 on cuda, float32 on cpu), float32, bfloat16, float16")
    p.add_argument("--model_args", default=None,
                   help="self-verifiers: the model's loading args (default: the runs' own, e.g. model_config=...)")
    p.add_argument("--trust_remote_code", action="store_true",
                   help="allow model code shipped with the verifier's weights (Qwen2.5-Math-PRM needs it)")
    p.add_argument("--system_prompt", default=None, help="qwen-prm / orm system prompt (default: qwen-prm's card's)")
    p.add_argument("--verbosity", "-v", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def _main(argv: Sequence[str] | None = None) -> int:
    """Console entry point of ``eglr-verify``; 0 on success, 2 on bad input."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    logging.basicConfig(level=args.verbosity, format="%(levelname)s %(name)s: %(message)s")
    try:
        specs = [parse_spec(s) for s in args.verifier]  # before anything loads
        from eglr_harness.verify.scorers import check_weights  # noqa: PLC0415 -- after the spec's own check

        for spec in specs:
            check_weights(spec, args.trust_remote_code)
        if args.dtype not in {"auto", "float32", "bfloat16", "float16"}:
            raise ValueError(f"`--dtype`={args.dtype!r} is not allowed; allowed: auto, float32, bfloat16, float16.")
        if args.device is not None and not args.device.startswith(("cpu", "cuda")):
            raise ValueError(f"`--device`={args.device!r} is not allowed; allowed: cpu, cuda, cuda:N.")
        doc_ids = None
        if args.doc_ids is not None:
            try:
                doc_ids = [int(d) for d in args.doc_ids.split(",") if d.strip()]
            except ValueError:
                raise ValueError(f"`--doc_ids`={args.doc_ids!r} is not allowed; allowed: comma-separated ints, "
                                 "e.g. 3,14,15.") from None
        from eglr_harness.verify.run import verify_runs  # noqa: PLC0415 -- after the checks: it imports more

        record = verify_runs(
            args.run_dirs, specs, args.out, task=args.task, limit=args.limit, doc_ids=doc_ids,
            batch_size=args.batch_size,
            device=args.device, dtype=args.dtype, trust_remote_code=args.trust_remote_code,
            model_args=parse_model_args(args.model_args) if args.model_args else None,
            system_prompt=args.system_prompt, argv=argv,
        )
    except (ValueError, OutputError) as err:
        print(f"eglr-verify: error: {err}", file=sys.stderr)
        return 2
    for key, v in record["verifiers"].items():
        print(f"{args.out}: {key}: {v['rollouts']} rollouts ({v['texts_scored']} texts scored, "
              f"{v['texts_from_store']} from the store)")
    return 0



def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point of ``eglr-verify`` (:func:`_main`); Ctrl-C or SIGTERM end it with one line saying what was
    stored and the command that resumes (core/interrupt.py)."""
    return run_interruptible("eglr-verify", lambda: _main(argv), argv)

if __name__ == "__main__":
    sys.exit(main())
