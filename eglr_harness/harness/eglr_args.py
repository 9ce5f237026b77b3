"""The arguments of an ``eglr-hf`` or ``eglr-vllm`` run: one frozen object, validated once, before the load.

:class:`EglrArgs` is built from the model args, the preset and (where lm-eval's CLI gives them) the
``--gen_kwargs``; the model reads everything from it after. Each mistake is one line naming the value
and what is allowed (a :class:`~eglr_harness.core.errors.UserError`). Where each check lives:

=========================================  =============================================  ==================
check                                      rule (one place)                               when
=========================================  =============================================  ==================
unknown model arg (own, preset's)          ``core/model_args.check_model_args``           ``EglrArgs.for_hf``
``pretrained`` given, path exists          ``core/model_args.check_pretrained_path``      ``EglrArgs.for_hf``
``engine``, ``compile`` (and the device)   ``engine_choice``, ``compile_setting``         ``EglrArgs.for_hf``
L, T, alpha, ..., calib_limit, the preset  ``run/settings.RunSettings.from_args``         ``EglrArgs.for_*``
L against the config's layers              ``core/config.check_layer_span``               before and after
a task's pool against the layers           ``core/config.check_layer_span``               pool resolution
``rollout_cache`` writable                 ``run/stores.check_rollout_cache``             ``EglrArgs.for_*``
``--gen_kwargs`` values, pool keys, length ``core/generation_options``, ``pool.task_axes``  ``EglrArgs.for_hf``
the model's ``generation_config``          ``core/generation_options``                    ``check_loaded``
a task's generation options                ``core/generation_options``                    ``check_task_options``
=========================================  =============================================  ==================

``harness/preflight.py`` builds it when lm-eval's CLI resolves the task names and when
``simple_evaluate`` starts (then checks what the tasks say); ``EglrHFLM`` and ``EglrVLLM`` build it
at the top of their constructor, before the weights load.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field

from lm_eval.models.huggingface import HFLM
from transformers import PreTrainedModel

from eglr_harness.core.config import DEFAULT_STOP
from eglr_harness.core.errors import GenerationOptionError, model_arg_errors
from eglr_harness.core.generation_options import (
    LENGTH_OPTIONS,
    check_generation_options,
    continuous_refusals,
    generation_config_options,
    refuse_for_continuous,
)
from eglr_harness.core.model_args import EGLR_ARGS, SETTINGS_ARGS, VLLM_ARGS, check_model_args, check_pretrained_path
from eglr_harness.run.pool import TASK_POOL_KEYS, task_axes
from eglr_harness.run.settings import RunSettings

__all__ = ["EglrArgs", "check_eglr_model_args", "declared_limits", "parse_args_string"]

# what HFLM takes by name, and what it forwards to from_pretrained
_PASSTHROUGH_ARGS = (*inspect.signature(HFLM.__init__).parameters,
                     *inspect.signature(PreTrainedModel.from_pretrained).parameters)
NO_PRESET = {"model_args": {}, "eglr": {}, "tau_h": {}, "name": None}
# HFLM's max_length when neither the model arg, the model's config nor its tokenizer says one
_HFLM_CONFIG_LENGTHS = ("n_positions", "max_position_embeddings", "n_ctx")


@dataclass(frozen=True)
class EglrArgs:
    """What an eglr model was asked for, checked.

    load_args: what lm-eval's ``HFLM`` (or ``VLLM``) is built with: the preset's model args under the
    given ones, eglr's own removed; engine, compile: the settings normalised (``vllm``, ``none`` for
    eglr-vllm); declared_layers, declared_max_length: the model's, read from its config without the
    weights (None where that is not cheap: checked after the load); gen_kwargs: ``--gen_kwargs``, checked.
    """

    preset: Mapping
    load_args: Mapping
    settings: RunSettings
    engine: str
    compile: str
    rollout_cache: str | None
    declared_layers: int | None
    declared_max_length: int | None
    gen_kwargs: Mapping = field(default_factory=dict)

    @classmethod
    def for_hf(cls, own: Mapping, load_args: Mapping, *, gen_kwargs=None) -> EglrArgs:
        """eglr-hf's arguments: ``own`` (``EGLR_ARGS`` and ``pretrained``), ``load_args`` (everything else,
        for HFLM and from_pretrained); ``gen_kwargs`` (``--gen_kwargs``: a dict or its text) where known."""
        from eglr_harness.decoding.compile_setting import DEFAULT_COMPILE, check_compile_setting, resolve_compile
        from eglr_harness.harness.engine_choice import DEFAULT_ENGINE, check_engine
        from eglr_harness.run.calibration import DEFAULT_CALIB_LIMIT

        with model_arg_errors():  # one line each in the CLI
            check_eglr_model_args(load_args)
            preset = _preset(own.get("model_config"))
            check_eglr_model_args(preset["model_args"])
            hf_args = _merged(preset, load_args, own.get("pretrained"))
            if "pretrained" not in hf_args:
                raise ValueError("eglr-hf needs `pretrained` (a hub id or folder) or `model_config` (a preset name).")
            check_pretrained_path(hf_args["pretrained"])
            engine = check_engine(_given(own, "engine", DEFAULT_ENGINE))
            compile_setting = check_compile_setting(_given(own, "compile", DEFAULT_COMPILE))
            if compile_setting not in ("auto", "none"):  # an explicit compile refused before the load
                resolve_compile(compile_setting, intended_device(hf_args), engine)
            settings = _settings(preset, own, DEFAULT_CALIB_LIMIT)
            layers, max_length = declared_limits(hf_args)
            settings.check_layers(layers)  # where the config says it without the weights
            _check_rollout_cache(own.get("rollout_cache"))
        options = _gen_kwargs_of(gen_kwargs)
        if options:
            from eglr_harness.run.model_names import parse_model_args

            check_gen_options(options, "--gen_kwargs",
                              written=parse_model_args(gen_kwargs) if isinstance(gen_kwargs, str) else None)
            check_length(options, "--gen_kwargs", max_length)
            if engine == "continuous":
                refuse_for_continuous(
                    continuous_refusals({k: v for k, v in options.items() if k not in TASK_POOL_KEYS}), "--gen_kwargs")
        return cls(preset, hf_args, settings, engine, compile_setting, own.get("rollout_cache") or None, layers,
                   max_length, options)

    @classmethod
    def for_vllm(cls, own: Mapping, load_args: Mapping) -> EglrArgs:
        """eglr-vllm's arguments (its own and lm-eval VLLM's); vLLM takes no GGUF and no data parallel."""
        from eglr_harness.run.calibration import DEFAULT_CALIB_LIMIT

        with model_arg_errors():  # every check before the weights load
            preset = _preset(own.get("model_config"))
            vllm_args = _merged(preset, load_args, own.get("pretrained"))
            if "pretrained" not in vllm_args:
                raise ValueError("eglr-vllm needs `pretrained` (a folder of safetensors or a hub id) or "
                                 "`model_config`.")
            if "gguf_file" in vllm_args:
                raise ValueError("`gguf_file` is not allowed with eglr-vllm; allowed: a folder of fp32/bf16 "
                                 "safetensors (docs/vllm.md converts a GGUF).")
            if int(vllm_args.get("data_parallel_size", 1)) != 1:
                raise ValueError(f"`data_parallel_size`={vllm_args['data_parallel_size']!r} is not allowed with "
                                 "eglr-vllm; allowed: 1 (tensor_parallel_size is taken).")
            settings = _settings(preset, own, DEFAULT_CALIB_LIMIT)
            if settings.base.stop != DEFAULT_STOP:
                raise ValueError(f"`stop`={settings.base.stop!r} is not allowed with eglr-vllm; allowed: "
                                 f"{DEFAULT_STOP} (the other exit rules run in eglr-hf).")
            layers = _vllm_layers(vllm_args["pretrained"], bool(vllm_args.get("trust_remote_code", False)))
            settings.check_layers(layers)
            _check_rollout_cache(own.get("rollout_cache"))
        return cls(preset, vllm_args, settings, "vllm", "none", own.get("rollout_cache") or None, layers, None)

    def check_loaded(self, num_layers: int, generation_config) -> None:
        """What is known only once the weights are in: the layer count, and the model's own generation
        options (checked as ``--gen_kwargs`` were before the load)."""
        with model_arg_errors():
            self.settings.check_layers(num_layers)
            check_generation_options(generation_config_options(generation_config), "the model's generation_config")
            if self.engine == "continuous":
                refuse_for_continuous(continuous_refusals({}, generation_config), "the model's generation_config")

    def check_task_options(self, task, gen_kwargs: Mapping, generation_config=None) -> None:
        """A task's generation options (its YAML merged with ``--gen_kwargs``), before any of its rollouts
        decodes: invalid values, and with ``engine=continuous`` the valid ones it does not apply."""
        source = f"generation_kwargs of task {task}"
        with model_arg_errors():
            check_generation_options(gen_kwargs, source, ignore=TASK_POOL_KEYS)
            if self.engine == "continuous":
                options = {k: v for k, v in gen_kwargs.items() if k not in TASK_POOL_KEYS}
                refuse_for_continuous(continuous_refusals(options, generation_config), source)

    @classmethod
    def split(cls, model_args: Mapping, own_names=EGLR_ARGS) -> tuple[dict, dict]:
        """Model args as lm-eval hands them (one dict) -> ``(own, load_args)``: eglr's own (``own_names``:
        eglr-hf's ``EGLR_ARGS``, eglr-vllm's ``VLLM_ARGS``) and ``pretrained``, and the rest, for lm-eval's model."""
        own = {k: v for k, v in model_args.items() if k in own_names or k == "pretrained"}
        return own, {k: v for k, v in model_args.items() if k not in own}

    @classmethod
    def of_hf_model(cls, model_args: Mapping) -> EglrArgs:
        """eglr-hf's constructor arguments, split and checked (``for_hf``)."""
        return cls.for_hf(*cls.split(model_args))

    @classmethod
    def of_vllm_model(cls, model_args: Mapping) -> EglrArgs:
        """eglr-vllm's constructor arguments, split and checked (``for_vllm``)."""
        return cls.for_vllm(*cls.split(model_args, VLLM_ARGS))


def check_eglr_model_args(args: Mapping) -> None:
    """Refuse a model arg that neither eglr-hf, nor HFLM, nor from_pretrained takes (``model_args.py``)."""
    check_model_args(args, _PASSTHROUGH_ARGS)


def _preset(model_config) -> dict:
    from eglr_harness.run.presets import load_preset

    return load_preset(model_config) if model_config else NO_PRESET


def _merged(preset: Mapping, load_args: Mapping, pretrained) -> dict:
    """The preset's model args under the given ones; ``pretrained`` over both."""
    merged = {**preset["model_args"], **load_args}
    if pretrained is not None:
        merged["pretrained"] = pretrained
    return merged


def _given(own: Mapping, name: str, default):
    """A setting that has a default: as given (None too, which its check refuses), else the default."""
    return own.get(name, default)


def _settings(preset: Mapping, own: Mapping, default_calib_limit: int) -> RunSettings:
    given = {k: own[k] for k in SETTINGS_ARGS if k != "calib_limit" and own.get(k) is not None}  # None: not given
    return RunSettings.from_args(preset, **given, calib_limit=_given(own, "calib_limit", default_calib_limit))


def _check_rollout_cache(folder) -> None:
    if folder:
        from eglr_harness.run.stores import check_rollout_cache

        check_rollout_cache(folder)  # writable, and a damaged store moved aside now


def intended_device(hf_args: Mapping) -> str:
    """The device HFLM will load the model on: its ``device`` arg, else CUDA where there is one."""
    import torch

    return str(hf_args.get("device") or ("cuda" if torch.cuda.is_available() else "cpu"))


@functools.lru_cache(maxsize=8)
def _declared(pretrained: str, gguf_file, revision, trust_remote_code: bool) -> tuple[int | None, int | None]:
    from transformers import AutoConfig

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


def _vllm_layers(pretrained: str, trust_remote_code: bool) -> int | None:
    """The checkpoint's decoder layers as its config.json says (eglr-vllm needs the config readable)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(pretrained, trust_remote_code=trust_remote_code)
    config = getattr(config, "text_config", None) or config
    return getattr(config, "num_hidden_layers", None)


def parse_args_string(text: str) -> dict:
    """``key=value,...`` as lm-eval parses ``--model_args`` and ``--gen_kwargs`` (``4`` an int, ``true`` a bool)."""
    from lm_eval.utils import simple_parse_args_string

    return simple_parse_args_string(text)


def _gen_kwargs_of(gen_kwargs) -> dict:
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
