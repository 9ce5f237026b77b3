"""The stock lm_eval CLI with eglr-harness loaded (model registration and task indexing), for ``eglr-eval``."""

from __future__ import annotations

import os


def run_lm_eval() -> None:
    """Run ``lm_eval``'s own command line (its flags, its argv) with eglr-harness installed into it, also when
    autoload is off (``EGLR_AUTOLOAD=0``) or the ``.pth`` was not installed (e.g. a source checkout)."""
    os.environ.setdefault("EGLR_AUTOLOAD", "1")
    from eglr_harness.harness import autoload as _autoload

    if not _autoload.enabled():
        os.environ["EGLR_AUTOLOAD"] = "1"
    _autoload.install()
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()
