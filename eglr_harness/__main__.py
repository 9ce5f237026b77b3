"""``python -m eglr_harness ...`` = ``eglr-eval ...`` = ``lm_eval ...`` with eglr-harness loaded."""

from eglr_harness.harness.cli import eval_main

if __name__ == "__main__":
    eval_main()
