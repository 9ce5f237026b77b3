"""The generation options of an eglr run, checked before anything decodes: ``--gen_kwargs`` (before the load), the
model's ``generation_config`` (right after it) and a task's ``generation_kwargs`` (before its first rollout).

The rules are ``core/generation_options``' (valid values, and the valid ones ``engine=continuous`` does not apply)
and ``run/pool``'s (the pool keys ``eglr_L``, ``eglr_T``); this module applies them to each source, naming it.
"""

from __future__ import annotations

from collections.abc import Mapping

from eglr_harness.core.errors import GenerationOptionError, model_arg_errors
from eglr_harness.core.model_args import parse_model_args
from eglr_harness.core.generation_options import (
    LENGTH_OPTIONS,
    check_generation_options,
    continuous_refusals,
    generation_config_options,
    refuse_for_continuous,
)
from eglr_harness.run.pool import TASK_POOL_KEYS, task_axes

__all__ = ["check_cli_gen_kwargs", "check_gen_options", "check_length", "check_loaded_options", "check_task_options",
           "gen_kwargs_of", "parse_args_string"]


def parse_args_string(text: str) -> dict:
    """``key=value,...`` as lm-eval parses ``--model_args`` and ``--gen_kwargs``: the one parser
    (``core/model_args.parse_model_args``) with lm-eval's reading of each value (``4`` an int, ``true`` a bool)."""
    from lm_eval.utils import handle_arg_string

    return parse_model_args(text, read=handle_arg_string)


def gen_kwargs_of(gen_kwargs) -> dict:
    """``--gen_kwargs`` as a dict (it is given as a dict or as its text; None or empty: ``{}``)."""
    if not gen_kwargs:
        return {}
    return parse_args_string(gen_kwargs) if isinstance(gen_kwargs, str) else dict(gen_kwargs)


def check_gen_options(options: Mapping, source: str, written: Mapping | None = None) -> None:
    """Generation options and the pool keys among them (``eglr_L=abc``), one line each."""
    check_generation_options(options, source, ignore=TASK_POOL_KEYS, written=written)
    try:
        task_axes(dict(options))
    except ValueError as err:
        raise GenerationOptionError(f"{err} ({source})") from None


def check_length(options: Mapping, source: str, max_length: int | None) -> None:
    """A length limit that leaves the prompt no room in the model's ``max_length``."""
    if max_length is None:
        return
    for name in LENGTH_OPTIONS:
        value = options.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= max_length:
            shown = int(value) if float(value).is_integer() else value
            raise GenerationOptionError(
                f"`{name}`={shown} ({source}) leaves no room for the prompt in the model's max_length={max_length}; "
                f"allowed: 1..{max_length - 1} (or a larger max_length model arg, if the model takes it).")


def check_cli_gen_kwargs(gen_kwargs, engine: str, max_length: int | None) -> dict:
    """``--gen_kwargs`` (a dict or its text) checked before the load: valid values, room for the prompt in
    ``max_length`` (None: not known yet), and with ``engine=continuous`` nothing it does not apply. The dict."""
    options = gen_kwargs_of(gen_kwargs)
    if options:
        check_gen_options(options, "--gen_kwargs",
                          written=parse_model_args(gen_kwargs) if isinstance(gen_kwargs, str) else None)
        check_length(options, "--gen_kwargs", max_length)
        if engine == "continuous":
            refuse_for_continuous(
                continuous_refusals({k: v for k, v in options.items() if k not in TASK_POOL_KEYS}), "--gen_kwargs")
    return options


def check_loaded_options(generation_config, engine: str) -> None:
    """The model's own generation options, once it is loaded (checked as ``--gen_kwargs`` were before the load)."""
    with model_arg_errors():
        check_generation_options(generation_config_options(generation_config), "the model's generation_config")
        if engine == "continuous":
            refuse_for_continuous(continuous_refusals({}, generation_config), "the model's generation_config")


def check_task_options(task, gen_kwargs: Mapping, engine: str, generation_config=None) -> None:
    """A task's generation options (its YAML merged with ``--gen_kwargs``), before any of its rollouts decodes:
    invalid values, and with ``engine=continuous`` the valid ones it does not apply."""
    source = f"generation_kwargs of task {task}"
    with model_arg_errors():
        check_generation_options(gen_kwargs, source, ignore=TASK_POOL_KEYS)
        if engine == "continuous":
            options = {k: v for k, v in gen_kwargs.items() if k not in TASK_POOL_KEYS}
            refuse_for_continuous(continuous_refusals(options, generation_config), source)
