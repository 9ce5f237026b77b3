"""An ``eglr-hf`` run checked before the model loads: everything about it that can be known then.

lm-eval loads the model first, builds the tasks after, and meets most mistakes only when it
decodes: a minute of loading on a CPU, then a traceback. Everything that can be known from the
command line, the preset, the model's config file (read without the weights) and the tasks' YAML is
checked here instead, each mistake as one line naming the value and what is allowed (a
:class:`~eglr_harness.core.errors.UserError`, which the CLI prints without a traceback):

- :func:`check_run_args`, before lm-eval indexes its tasks: the model args, ``pretrained``,
  ``--use_cache``, ``--limit``, ``--gen_kwargs`` (values, pool keys, length against the model's
  ``max_length``), and the pinned ``L`` against the model's layer count;
- :func:`check_run_tasks`, once the task names are resolved: the eglr tasks' local data, each
  task's generation options and pool (its size against the task's repeats, its ``L`` against the
  layers, its length against ``max_length``) and names that cannot be part of a samples file name.

The autoload hook calls :func:`check_run_args` when lm-eval's CLI resolves the task names and both
when ``simple_evaluate`` starts (so Python callers get them too); ``EglrHFLM`` checks its own
arguments again when it is built directly.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping

from eglr_harness.core.errors import GenerationOptionError, ModelArgError, RunArgError, model_arg_errors
from eglr_harness.core.generation_options import (
    LENGTH_OPTIONS,
    check_generation_options,
    continuous_refusals,
    refuse_for_continuous,
)
from eglr_harness.core.model_args import USE_CACHE_REFUSAL, check_pretrained_path
from eglr_harness.run.model_names import parse_model_args
from eglr_harness.run.pool import TASK_POOL_KEYS, task_axes

__all__ = ["check_run_args", "check_run_tasks", "declared_limits", "hf_args_of", "parse_args_string"]

# HFLM's max_length when neither the model arg, the model's config nor its tokenizer says one
_HFLM_CONFIG_LENGTHS = ("n_positions", "max_position_embeddings", "n_ctx")
_EGLR_SETTINGS = ("L", "T", "alpha", "k_max", "tau_kl", "tau_h", "top_k", "top_p", "seed", "calib_limit")


def hf_args_of(args: Mapping, preset: Mapping) -> dict:
    """What HFLM is built with: the preset's model args under the given ones (eglr-hf's own removed)."""
    from eglr_harness.core.model_args import EGLR_ARGS  # noqa: PLC0415

    hf_args = {**preset.get("model_args", {}), **{k: v for k, v in args.items() if k not in EGLR_ARGS}}
    if args.get("pretrained") is not None:
        hf_args["pretrained"] = args["pretrained"]
    return hf_args


@functools.lru_cache(maxsize=8)
def _declared(pretrained: str, gguf_file, revision, trust_remote_code: bool) -> tuple[int | None, int | None]:
    from transformers import AutoConfig  # noqa: PLC0415

    try:
        config = AutoConfig.from_pretrained(pretrained, gguf_file=gguf_file, revision=revision,
                                            trust_remote_code=trust_remote_code)
    except Exception:  # noqa: BLE001 -- any failure: HFLM's own load reports it properly
        return None, None
    text = getattr(config, "text_config", None) or config
    length = next((getattr(config, a) for a in _HFLM_CONFIG_LENGTHS if getattr(config, a, None)), None)
    return getattr(text, "num_hidden_layers", None), length


def declared_limits(hf_args: Mapping) -> tuple[int | None, int | None]:
    """``(decoder layers, max_length)`` of the model, read from its config file without the weights
    (``max_length``: the model arg, else the config's context length, as HFLM reads it); None where it
    cannot be read cheaply (the checks then run after loading)."""
    pretrained = hf_args.get("pretrained")
    if not isinstance(pretrained, str):
        return None, None
    layers, length = _declared(pretrained, hf_args.get("gguf_file"), hf_args.get("revision") or "main",
                               bool(hf_args.get("trust_remote_code", False)))
    given = hf_args.get("max_length")
    if given is not None:
        try:
            length = int(given)
        except (TypeError, ValueError):
            length = None
    return layers, length


def _settings_of(args: Mapping):
    """The preset, HFLM's args and the validated ``RunSettings`` of eglr-hf's model args."""
    from eglr_harness.run.presets import load_preset  # noqa: PLC0415
    from eglr_harness.run.settings import RunSettings  # noqa: PLC0415

    with model_arg_errors():
        preset = load_preset(args["model_config"]) if args.get("model_config") else {"model_args": {}, "eglr": {}}
        settings = RunSettings.from_args(preset, **{k: args[k] for k in _EGLR_SETTINGS if args.get(k) is not None})
    return preset, settings


def check_run_args(model_args, *, gen_kwargs=None, limit=None, use_cache=None, passed=None) -> None:
    """What an eglr-hf run's own arguments say, before lm-eval indexes its tasks (module docstring).

    passed: what lm-eval hands the model beside its model args (``device``, ``batch_size``,
    ``max_batch_size``; None where it hands nothing)."""
    from eglr_harness.harness.model import check_eglr_model_args  # noqa: PLC0415

    if use_cache:
        raise RunArgError(USE_CACHE_REFUSAL)
    _check_limit(limit)
    args = _args_of(model_args)
    for name, value in (passed or {}).items():
        if value is not None and name in args:  # lm-eval would call the model with the keyword twice
            raise RunArgError(f"`{name}={args[name]}` in --model_args: lm-eval passes its own --{name} ({value}) to "
                              f"every model; give it as `--{name} {args[name]}` instead.")
    check_eglr_model_args(args)
    if args.get("rollout_cache"):
        from eglr_harness.run.stores import check_rollout_cache  # noqa: PLC0415

        check_rollout_cache(args["rollout_cache"])
    preset, settings = _settings_of(args)
    hf_args = hf_args_of(args, preset)
    check_eglr_model_args(preset.get("model_args", {}))
    check_pretrained_path(hf_args.get("pretrained"))
    layers, max_length = declared_limits(hf_args)
    with model_arg_errors():
        settings.check_layers(layers)
    options = _gen_kwargs_of(gen_kwargs)
    if options:
        _check_options(options, "--gen_kwargs", written=parse_model_args(gen_kwargs) if isinstance(gen_kwargs, str) else None)
        _check_length(options, "--gen_kwargs", max_length)
        if str(args.get("engine", "")).strip() == "continuous":
            refuse_for_continuous(continuous_refusals({k: v for k, v in options.items() if k not in TASK_POOL_KEYS}),
                                  "--gen_kwargs")


def check_run_tasks(model_args, tasks, *, gen_kwargs=None, log_samples=False, output_path=None,
                    data_dir=None) -> None:
    """What the run's tasks say (module docstring); ``tasks`` as lm-eval resolved them (names, configs).
    ``model_args`` None (a model object was passed): the local data and the file names only."""
    from eglr_harness.data.loading import check_local_data  # noqa: PLC0415

    names = _task_names(tasks)
    if log_samples and output_path:
        _check_sample_file_names(names)
    check_local_data(names, data_dir)
    if model_args is None:  # a model object: built already, it checks each task's pool with its own settings
        return
    args = _args_of(model_args)
    preset, settings = _settings_of(args)
    layers, max_length = declared_limits(hf_args_of(args, preset))
    cli = _gen_kwargs_of(gen_kwargs)
    for name, (yaml_kwargs, repeats) in _our_tasks(names).items():
        source = f"generation_kwargs of task {name}"
        _check_options(yaml_kwargs, source)
        merged = {**yaml_kwargs, **cli}  # as lm-eval updates a task's generation_kwargs with --gen_kwargs
        _check_length(merged, source if not any(k in cli for k in LENGTH_OPTIONS) else "--gen_kwargs", max_length)
        with model_arg_errors():
            plan = settings.pool_plan(name, merged, repeats)
            if layers is not None:
                settings.check_cells(plan.cells, layers)


def _check_limit(limit) -> None:
    if limit is None:
        return
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not math.isfinite(limit) or limit <= 0:
        shown = f"{limit:g}" if isinstance(limit, (int, float)) and not isinstance(limit, bool) else repr(limit)
        raise RunArgError(f"`--limit`={shown} is not allowed; allowed: a number > 0 (problems per task, or below 1 "
                          "the fraction of them); leave it out for every problem.")


def parse_args_string(text: str) -> dict:
    """``key=value,...`` as lm-eval parses ``--model_args`` and ``--gen_kwargs`` (``4`` an int, ``true`` a bool)."""
    from lm_eval.utils import simple_parse_args_string  # noqa: PLC0415

    return simple_parse_args_string(text)


def _args_of(model_args) -> dict:
    """Model args as the model receives them: lm-eval's CLI hands over a dict, Python callers may pass the text."""
    if isinstance(model_args, Mapping):
        return dict(model_args)
    return parse_args_string(model_args) if isinstance(model_args, str) else {}


def _gen_kwargs_of(gen_kwargs) -> dict:
    if not gen_kwargs:
        return {}
    return parse_args_string(gen_kwargs) if isinstance(gen_kwargs, str) else dict(gen_kwargs)


def _check_options(options: Mapping, source: str, written: Mapping | None = None) -> None:
    """Generation options and the pool keys among them (``eglr_L=abc``), one line each."""
    check_generation_options(options, source, ignore=TASK_POOL_KEYS, written=written)
    try:
        task_axes(dict(options))
    except ValueError as err:
        raise GenerationOptionError(f"{err} ({source})") from None


def _check_length(options: Mapping, source: str, max_length: int | None) -> None:
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


def _task_names(tasks) -> list[str]:
    """The names of ``tasks`` (strings, lm-eval task configs or Task objects)."""
    names = []
    for task in tasks if isinstance(tasks, (list, tuple)) else [tasks]:
        if isinstance(task, str):
            names.append(task)
        elif isinstance(task, Mapping) and isinstance(task.get("task"), str):
            names.append(task["task"])
        elif isinstance(getattr(getattr(task, "config", None), "task", None), str):
            names.append(task.config.task)
    return names


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
