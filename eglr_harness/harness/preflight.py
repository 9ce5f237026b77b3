"""An ``eglr-hf`` run checked before the model loads: everything about it that can be known then.

lm-eval loads the model first, builds the tasks after, and meets most mistakes only when it
decodes: a minute of loading on a CPU, then a traceback. Everything that can be known from the
command line, the preset, the model's config file (read without the weights) and the tasks' YAML is
checked here instead, each mistake as one line naming the value and what is allowed (a
:class:`~eglr_harness.core.errors.UserError`, which the CLI prints without a traceback):

- :func:`check_run_args`, before lm-eval indexes its tasks (after ``--use_cache``, refused for both our models by
  ``lm_eval_patches``): ``--limit``, and the run's
  :class:`~eglr_harness.harness.eglr_args.EglrArgs` (the model args, ``pretrained``, ``engine``,
  ``compile``, the pinned ``L`` against the model's layer count, ``--gen_kwargs``: values, pool keys,
  length against the model's ``max_length``);
- :func:`check_run_tasks`, once the task names are resolved (with that ``EglrArgs``): the eglr tasks' local data, each
  task's generation options and pool (its size against the task's repeats, its ``L`` against the
  layers, its length against ``max_length``) and names that cannot be part of a samples file name.

The autoload hook calls :func:`check_run_args` when lm-eval's CLI resolves the task names and both
when ``simple_evaluate`` starts (so Python callers get them too); ``EglrHFLM`` builds its
``EglrArgs`` again when it is constructed (directly, too).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from eglr_harness.core.errors import RunArgError, model_arg_errors
from eglr_harness.core.generation_options import LENGTH_OPTIONS
from eglr_harness.core.model_args import parse_model_args
from eglr_harness.core.resources import names_of_tasks
from eglr_harness.harness.eglr_args import EglrArgs, declared_limits
from eglr_harness.harness.gen_options import check_gen_options, check_length, gen_kwargs_of, parse_args_string

__all__ = ["check_run_args", "check_run_tasks", "declared_limits", "parse_args_string"]

# the names these checks had before EglrArgs held them (tests import them from here)
_check_options, _check_length = check_gen_options, check_length


def check_run_args(model_args, *, gen_kwargs=None, limit=None, passed=None) -> EglrArgs | None:
    """What an eglr-hf run's own arguments say, before lm-eval indexes its tasks (module docstring): the
    run's ``EglrArgs`` (``harness/eglr_args.py``), None where a model object was passed (``model_args`` None).

    passed: what lm-eval hands the model beside its model args (``device``, ``batch_size``,
    ``max_batch_size``; None where it hands nothing)."""
    _check_limit(limit)
    args = _args_of(model_args)
    for name, value in (passed or {}).items():
        if value is not None and name in args:  # lm-eval would call the model with the keyword twice
            raise RunArgError(f"`{name}={args[name]}` in --model_args: lm-eval passes its own --{name} ({value}) to "
                              f"every model; give it as `--{name} {args[name]}` instead.")
    if model_args is None:  # a model object: built already, with its arguments checked; the gen kwargs still
        options = gen_kwargs_of(gen_kwargs)
        if options:
            written = parse_model_args(gen_kwargs) if isinstance(gen_kwargs, str) else None
            _check_options(options, "--gen_kwargs", written=written)
        return None
    return EglrArgs.for_hf(args, gen_kwargs=gen_kwargs)


def check_run_tasks(eglr_args: EglrArgs | None, tasks, *, log_samples=False, output_path=None,
                    data_dir=None) -> None:
    """What the run's tasks say (module docstring); ``tasks`` as lm-eval resolved them (names, configs).
    ``eglr_args`` None (a model object was passed): the local data and the file names only."""
    from eglr_harness.data.loading import check_local_data  # noqa: PLC0415

    names = names_of_tasks(tasks)
    if log_samples and output_path:
        _check_sample_file_names(names)
    check_local_data(names, data_dir)
    if eglr_args is None:  # a model object: built already, it checks each task's pool with its own settings
        return
    settings, layers, max_length, cli = (eglr_args.settings, eglr_args.declared_layers, eglr_args.declared_max_length,
                                         eglr_args.gen_kwargs)
    for name, (yaml_kwargs, repeats) in _our_tasks(names).items():
        source = f"generation_kwargs of task {name}"
        _check_options(yaml_kwargs, source)
        merged = {**yaml_kwargs, **cli}  # as lm-eval updates a task's generation_kwargs with --gen_kwargs
        _check_length(merged, source if not any(k in cli for k in LENGTH_OPTIONS) else "--gen_kwargs", max_length)
        with model_arg_errors():
            pool = settings.pool_for(name, merged, repeats)
            if layers is not None:
                settings.check_cells(pool.cells, layers)


def _check_limit(limit) -> None:
    if limit is None:
        return
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not math.isfinite(limit) or limit <= 0:
        shown = f"{limit:g}" if isinstance(limit, (int, float)) and not isinstance(limit, bool) else repr(limit)
        raise RunArgError(f"`--limit`={shown} is not allowed; allowed: a number > 0 (problems per task, or below 1 "
                          "the fraction of them); leave it out for every problem.")


def _args_of(model_args) -> dict:
    """Model args as the model receives them: lm-eval's CLI hands over a dict, Python callers may pass the text."""
    if isinstance(model_args, Mapping):
        return dict(model_args)
    return parse_args_string(model_args) if isinstance(model_args, str) else {}


def _check_sample_file_names(names: Iterable[str]) -> None:
    for name in names:
        bad = [c for c in ("/", "\\") if c in name]
        if bad:
            raise RunArgError(
                f"task {name!r} holds {bad[0]!r}, which cannot be part of its samples file name "
                f"(samples_<task>_<date>.jsonl) under --output_path with --log_samples; allowed: a task name without "
                "/ or \\ (rename the task in its YAML).")


def _our_tasks(names: Iterable[str]) -> dict[str, tuple[dict, int]]:
    """``{task: (generation_kwargs, repeats)}`` of the project's tasks among ``names``, groups expanded."""
    from lm_eval.tasks._yaml_loader import load_yaml  # noqa: PLC0415 -- lm-eval's own include rule

    from eglr_harness.core.resources import task_names  # noqa: PLC0415

    known = task_names()
    found: dict[str, tuple[dict, int]] = {}
    pending, seen = list(names), set()
    while pending:
        name = pending.pop(0)
        if name in seen or name not in known:
            continue
        seen.add(name)
        config = load_yaml(known[name], resolve_func=False)
        if config.get("group") == name:
            pending += [m for m in config.get("task") or [] if isinstance(m, str)]
            continue
        found[name] = (dict(config.get("generation_kwargs") or {}), max(int(config.get("repeats") or 1), 1))
    return found
