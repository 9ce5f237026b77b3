"""Errors the user fixes (a file, a folder, a value), as opposed to bugs (a leaf module).

Their message is complete on its own: the file or argument, the value, what is allowed and the fix.
A command prints one as a single line and exits non-zero instead of showing a traceback
(``harness/output.py`` installs that for the stock ``lm_eval`` CLI).
"""

from __future__ import annotations

from contextlib import contextmanager

__all__ = ["FileFormatError", "GenerationOptionError", "ModelArgError", "OutputError", "RunArgError", "UserError",
           "model_arg_errors"]


class UserError(Exception):
    """Base of the errors whose message is all the user needs."""


class OutputError(UserError, OSError):
    """An output that cannot be written: the message names the path, the OS error and the fix."""


class FileFormatError(UserError, ValueError):
    """An input file (benchmark data, lm-eval samples) that cannot be read as it should: the message
    names ``file:line`` (1-based) and what was expected."""


class ModelArgError(UserError, ValueError):
    """A model arg (or a preset value) that cannot be used: the message names the argument, the value
    as written, what is allowed and the fix."""


class RunArgError(UserError, ValueError):
    """An argument of the run itself (``--tasks``, ``--limit``, ``--use_cache``, ``--log_samples``) that
    cannot be used: the message names the argument, the value as written and what is allowed."""


class GenerationOptionError(UserError, ValueError):
    """A generation option (task YAML, ``--gen_kwargs``, the model's ``generation_config``) whose value
    is not allowed, or that the engine asked for cannot apply: the message names the option as
    written, its value, where it came from and what is allowed."""


@contextmanager
def model_arg_errors():
    """Re-raise the ``ValueError`` of an argument check as a :class:`ModelArgError` (still a ValueError),
    so that the stock CLI prints it as one line."""
    try:
        yield
    except ValueError as err:
        if isinstance(err, UserError):
            raise
        raise ModelArgError(str(err)) from None
