"""Make ``eglr-hf`` and the project's tasks visible to the stock ``lm_eval`` CLI: an import hook.

lm-eval 0.4.13 has no plugin discovery. The wheel installs ``eglr_harness_autoload.pth``,
which calls :func:`install` at interpreter start. That only adds an import hook: nothing of
lm_eval, torch or transformers is imported until the program imports lm_eval itself. When lm-eval
imports one of the modules of ``lm_eval_patches.POST_IMPORT``, the hook runs what the project adds to
it: the model registration, the task indexing and the patches an eglr run needs, each argued in
``harness/lm_eval_patches.py`` (which imports nothing of this module).

For an ``lm_eval`` command line that names one of the project's models (``lm_eval_patches.PROJECT_MODELS``), the
first of those imports also says the run is starting (:func:`say_starting`: lm-eval prints nothing while it
imports) and installs the exception hook of ``harness/output.py`` (Ctrl-C and SIGTERM as one line); any other
command's signals and output are lm-eval's own.

Set ``EGLR_AUTOLOAD=0`` to switch this off.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import logging
import os
import sys

from eglr_harness.harness.lm_eval_patches import (  # light: the standard library only
    POST_IMPORT, command_line_model, command_line_names_model, resume_hint,
)

_DISABLE_VALUES = {"0", "false", "no", "off"}


class _PostImportLoader(importlib.abc.Loader):
    def __init__(self, wrapped, hook):
        self._wrapped = wrapped
        self._hook = hook

    def create_module(self, spec):
        return self._wrapped.create_module(spec)

    def exec_module(self, module):
        self._wrapped.exec_module(module)
        try:
            self._hook(module)
        except Exception as err:  # never break lm_eval itself
            print(f"eglr_harness autoload could not patch {module.__name__}: {err!r}", file=sys.stderr)

    def __getattr__(self, name):  # get_code, get_source, is_package ... of the real loader
        return getattr(self._wrapped, name)


def _lm_eval_cli() -> bool:
    """Whether this process is the ``lm_eval`` command (its console script, or ``python -m lm_eval``)."""
    program = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return os.path.basename(program) == "lm_eval" or os.path.basename(os.path.dirname(program)) == "lm_eval"


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        hook = POST_IMPORT.get(fullname)
        if hook is None:
            return None
        # Ctrl-C while lm-eval imports torch (its first ~15 s) is one line, not a traceback, for a run of the
        # project's models; any other run's signals are lm-eval's own
        if _lm_eval_cli() and command_line_names_model(sys.argv[1:]):
            say_starting(command_line_model(sys.argv[1:]))
            try:
                from eglr_harness.harness.output import install_user_error_hook  # noqa: PLC0415 -- light

                install_user_error_hook(hint=resume_hint)
            except Exception as err:  # never break lm_eval itself
                print(f"eglr_harness autoload could not install its interrupt line: {err!r}", file=sys.stderr)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PostImportLoader(spec.loader, hook)
        return spec


STARTING = "%s: lm_eval is starting; it prints nothing while it imports (seconds on an idle CPU, minutes on a busy one)"


def say_starting(model: str) -> None:
    """One line (once) as lm-eval starts a run of the project's ``model``, before its imports: lm-eval's own logging
    is not set up yet, so the line has a handler of its own (stderr)."""
    logger = logging.getLogger("eglr_harness.start")
    if logger.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.info(STARTING, model)


def enabled() -> bool:
    return os.environ.get("EGLR_AUTOLOAD", "1").strip().lower() not in _DISABLE_VALUES


def install() -> None:
    """Install the import hook (idempotent); patch modules that are already imported."""
    try:
        if not enabled() or any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
            return
        sys.meta_path.insert(0, _PostImportFinder())
        for name, hook in POST_IMPORT.items():
            if name in sys.modules:
                hook(sys.modules[name])
    except Exception as err:  # never break interpreter start-up
        print(f"eglr_harness autoload disabled: {err!r}", file=sys.stderr)
