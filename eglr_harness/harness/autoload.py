"""Make ``eglr-hf`` and the project's tasks visible to the stock ``lm_eval`` CLI: an import hook.

lm-eval 0.4.13 has no plugin discovery. The wheel installs ``eglr_harness_autoload.pth``,
which calls :func:`install` at interpreter start. That only adds an import hook: nothing of
lm_eval, torch or transformers is imported until the program imports lm_eval itself. When lm-eval
imports one of the modules of ``lm_eval_patches.POST_IMPORT``, the hook runs what the project adds to
it: the model registration, the task indexing and the patches an eglr run needs, each argued in
``harness/lm_eval_patches.py`` (which imports nothing of this module).

Set ``EGLR_AUTOLOAD=0`` to switch this off.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys

from eglr_harness.harness.lm_eval_patches import POST_IMPORT  # light: the standard library only

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
        if _lm_eval_cli():  # Ctrl-C while lm-eval imports torch (its first ~15 s) is one line, not a traceback
            try:
                from eglr_harness.harness.output import install_user_error_hook  # noqa: PLC0415 -- light

                install_user_error_hook()
            except Exception as err:  # never break lm_eval itself
                print(f"eglr_harness autoload could not install its interrupt line: {err!r}", file=sys.stderr)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PostImportLoader(spec.loader, hook)
        return spec


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
