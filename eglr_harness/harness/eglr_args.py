"""The arguments of an ``eglr-hf`` or ``eglr-vllm`` run: one frozen object, validated once, before the load.

:class:`EglrArgs` resolves three things and nothing else: the preset (``model_config``: its model args under
the given ones), the engine (``engine`` and ``compile``, against the device the model will load on) and the load
(what lm-eval's ``HFLM`` or ``VLLM`` is built with: unknown names refused, ``pretrained`` found, the layer count
and ``max_length`` read from the config without the weights). Every value of eglr's own model args is read by
the one table of them and its one checker (``core/model_args.MODEL_ARGS``, ``read_model_arg``; the settings
through ``run/settings.RunSettings.from_args``); the generation options by ``harness/gen_options.py``. Each
mistake is one line naming the value and what is allowed (a :class:`~eglr_harness.core.errors.UserError`).

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

from eglr_harness.core.errors import model_arg_errors
from eglr_harness.core.model_args import (
    DEFAULT_CALIB_LIMIT,
    DEFAULT_COMPILE,
    DEFAULT_ENGINE,
    EGLR_ARGS,
    SETTINGS_ARGS,
    VLLM_ARGS,
    check_load_values,
    check_model_args,
    check_pretrained_path,
    read_model_arg,
)
from eglr_harness.harness import gen_options
from eglr_harness.run.settings import RunSettings

__all__ = ["EglrArgs", "check_eglr_model_args", "declared_limits"]

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
        from eglr_harness.decoding.compile_setting import resolve_compile

        with model_arg_errors():  # one line each in the CLI
            check_eglr_model_args(load_args)
            preset = _preset(own.get("model_config"))
            check_eglr_model_args(preset["model_args"])
            hf_args = _merged(preset, load_args, own.get("pretrained"))
            if "pretrained" not in hf_args:
                raise ValueError("eglr-hf needs `pretrained` (a hub id or folder) or `model_config` (a preset name).")
            _resolve_default_device(hf_args, preset)
            check_pretrained_path(hf_args["pretrained"])
            hf_args.update(check_load_values(hf_args))  # max_length=2048.0 reaches HFLM as 2048
            engine = read_model_arg("engine", _given(own, "engine", DEFAULT_ENGINE))
            compile_setting = read_model_arg("compile", _given(own, "compile", DEFAULT_COMPILE))
            if compile_setting not in ("auto", "none"):  # an explicit compile refused before the load
                resolve_compile(compile_setting, intended_device(hf_args), engine)
            settings = _settings(preset, own)
            layers, max_length = declared_limits(hf_args)
            settings.check_layers(layers)  # where the config says it without the weights
            _check_rollout_cache(own.get("rollout_cache"))
        options = gen_options.check_cli_gen_kwargs(gen_kwargs, engine, max_length)
        return cls(preset, hf_args, settings, engine, compile_setting, own.get("rollout_cache") or None, layers,
                   max_length, options)

    @classmethod
    def for_vllm(cls, own: Mapping, load_args: Mapping) -> EglrArgs:
        """eglr-vllm's arguments (its own and lm-eval VLLM's); vLLM takes no GGUF and no data parallel."""
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
            settings = _settings(preset, own)
            layers = _vllm_layers(vllm_args["pretrained"], bool(vllm_args.get("trust_remote_code", False)))
            settings.check_layers(layers)
            _check_rollout_cache(own.get("rollout_cache"))
        return cls(preset, vllm_args, settings, "vllm", "none", own.get("rollout_cache") or None, layers, None)

    def check_loaded(self, num_layers: int, generation_config) -> None:
        """What is known only once the weights are in: the layer count, and the model's own generation
        options (checked as ``--gen_kwargs`` were before the load)."""
        with model_arg_errors():
            self.settings.check_layers(num_layers)
        gen_options.check_loaded_options(generation_config, self.engine)

    def check_task_options(self, task, gen_kwargs: Mapping, generation_config=None) -> None:
        """A task's generation options (its YAML merged with ``--gen_kwargs``), before any of its rollouts
        decodes (``gen_options.check_task_options`` with this run's engine)."""
        gen_options.check_task_options(task, gen_kwargs, self.engine, generation_config)

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


def _settings(preset: Mapping, own: Mapping) -> RunSettings:
    given = {k: own[k] for k in SETTINGS_ARGS if k != "calib_limit" and own.get(k) is not None}  # None: not given
    return RunSettings.from_args(preset, **given, calib_limit=_given(own, "calib_limit", DEFAULT_CALIB_LIMIT))


def _check_rollout_cache(folder) -> None:
    if folder:
        from eglr_harness.run.stores import check_rollout_cache

        check_rollout_cache(folder)  # writable, and a damaged store moved aside now


# the `--device` lm-eval's CLI hands every model when none is given (EvaluatorConfig.device)
LM_EVAL_DEFAULT_DEVICE = "cuda:0"


def _resolve_default_device(hf_args: dict, preset: Mapping) -> None:
    """lm-eval's CLI passes ``device=cuda:0`` when ``--device`` is not given, over the preset's device. Without CUDA,
    HFLM loads such a run on the CPU anyway (and the load line said ``cuda:0``): there the device becomes the
    preset's, else ``cpu``. A device given otherwise, or with CUDA present, is left as given."""
    if hf_args.get("device") != LM_EVAL_DEFAULT_DEVICE:
        return
    import torch

    if not torch.cuda.is_available():
        hf_args["device"] = preset["model_args"].get("device") or "cpu"


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
