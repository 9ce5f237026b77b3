"""``eglr-score``: rescore saved samples files with the current answer checking, without decoding again."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from eglr_harness.core.errors import OutputError
from eglr_harness.core.interrupt import note_stored, run_interruptible
from eglr_harness.core.outputs import check_writable, refuse_writing_into
from eglr_harness.harness.rescore import rescore_file, samples_files


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="eglr-score",
        description="Score lm-eval samples files (e.g. of a --predict_only run) with the eglr grader.",
    )
    parser.add_argument("paths", nargs="+", type=Path, help="samples_<task>_<timestamp>.jsonl files or run folders")
    parser.add_argument("--output_path", type=Path, required=True, help="folder for the scored samples and results")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        files = samples_files(args.paths)
        # what it writes (output_path/<folder>/<file>) never lands in a run it reads: RUN rescored in place
        inputs = [*args.paths, *{f.parent for f in files}]
        refuse_writing_into([args.output_path / f.parent.name / f.name for f in files], inputs, "--output_path")
        refuse_writing_into([args.output_path], inputs, "--output_path")
        check_writable(args.output_path, "--output_path")
    except (ValueError, OutputError) as err:  # one line, as every refusal of the eglr-* commands (no usage)
        print(f"eglr-score: error: {err}", file=sys.stderr)
        return 2
    for path in files:
        try:
            task, metrics = rescore_file(path, args.output_path / path.parent.name)
        except (ValueError, OutputError) as err:
            print(f"eglr-score: error: {err}", file=sys.stderr)
            return 2
        note_stored(f"scored samples files in {args.output_path}", [str(path)])  # an interrupt after it says so
        print(f"{task} ({path.name})")
        for key, value in metrics.items():
            print(f"  {key:<24} {value:.4f}" if isinstance(value, float) else f"  {key:<24} {value}")
    return 0



def main(argv: list[str] | None = None) -> int:
    """Console entry point of ``eglr-score`` (:func:`_main`); Ctrl-C or SIGTERM end it with one line saying what was
    stored and the command that resumes (core/interrupt.py)."""
    return run_interruptible("eglr-score", lambda: _main(argv), argv)

if __name__ == "__main__":
    sys.exit(main())
