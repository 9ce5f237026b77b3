"""``eglr-eval`` and ``python -m eglr_harness``: the stock lm_eval CLI with eglr-harness loaded.

Same flags as ``lm_eval``. The autoload ``.pth`` already makes ``eglr-hf`` and the tasks visible
to a plain ``lm_eval``; this wrapper also works when autoload is off (``EGLR_AUTOLOAD=0``) or the
``.pth`` was not installed (e.g. running from a source checkout).
"""

from __future__ import annotations

import os


def eval_main() -> None:
    os.environ.setdefault("EGLR_AUTOLOAD", "1")
    from eglr_harness import _autoload

    if not _autoload.enabled():
        os.environ["EGLR_AUTOLOAD"] = "1"
    _autoload.install()
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()
