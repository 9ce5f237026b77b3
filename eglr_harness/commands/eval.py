"""``eglr-eval`` / ``python -m eglr_harness``: the stock ``lm_eval`` CLI, same flags, with eglr-harness loaded.

The autoload ``.pth`` already makes ``eglr-hf`` and the tasks visible to a plain ``lm_eval``; this command also
works when autoload is off (``EGLR_AUTOLOAD=0``) or the ``.pth`` was not installed (a source checkout).
"""

from __future__ import annotations

from eglr_harness.core.interrupt import run_interruptible
from eglr_harness.harness.lm_eval_cli import run_lm_eval


def main() -> int:
    """Ctrl-C or SIGTERM end the run with one line: the rollouts stored (``rollout_cache=``) and the command
    that resumes (core/interrupt.py)."""
    return run_interruptible("eglr-eval", run_lm_eval)


if __name__ == "__main__":
    main()
