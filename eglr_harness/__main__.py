"""``python -m eglr_harness ...`` = ``eglr-eval ...`` = ``lm_eval ...`` with eglr-harness loaded."""

from eglr_harness.commands.eval import main

if __name__ == "__main__":
    main()
