"""The arguments of an ``eglr-hf`` or ``eglr-vllm`` run: one frozen object, validated once, before the load.

:class:`EglrArgs` takes a run's resolved arguments (``run/run_args.resolve_run_args``: the preset loaded once, each
of eglr's own model args read once by its row of ``core/model_args.MODEL_ARGS``) and adds what needs lm-eval or the
model's config: the load (what lm-eval's ``HFLM`` or ``VLLM`` is built with: unknown names refused, ``pretrained``
found, the layer count and ``max_length`` read from the config without the weights), the compile setting against
the device the model will load on, and ``--gen_kwargs`` (``harness/gen_options.py``). Each mistake is one line naming
the value and what is allowed (a :class:`~eglr_harness.core.errors.UserError`).

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
from eglr_harness.core.model_args import VLLM_ARGS, check_model_args, check_pretrained_path
from eglr_harness.harness import gen_options
from eglr_harness.run.run_args import RunArgs, resolve_run_args
from eglr_harness.run.settings import RunSettings

__all__ = ["EglrArgs", "declared_limits"]

# what HFLM takes by name, and what it forwards to from_pretrained
_PASSTHROUGH_ARGS = (*inspect.signature(HFLM.__init__).parameters,
                     *inspect.signature(PreTrainedModel.from_pretrained).parameters)
# HFLM's max_length when neither the model arg, the model's config nor its tokenizer says one
_HFLM_CONFIG_LENGTHS = ("n_positions", "max_position_embeddings", "n_ctx")


@dataclass(frozen=True)
class EglrArgs:
    """What an eglr model was asked for, checked.

    run: the resolved arguments (``run/run_args.RunArgs``); load_args: what lm-eval's ``HFLM`` (or ``VLLM``) is built
    with (``run.load_args``, the device lm-eval defaulted made real, the loading numbers as ints); settings: the
    per-request answers (``RunSettings.of(run)``); engine, compile: ``run``'s (``vllm``, ``none`` for eglr-vllm);
    declared_layers, declared_max_length: the model's, read from its config without the weights (None where that is
    not cheap: checked after the load); gen_kwargs: ``--gen_kwargs``, checked.
    """

    run: RunArgs
    load_args: Mapping
    settings: RunSettings
    engine: str
    compile: str
    declared_layers: int | None
    declared_max_length: int | None
    gen_kwargs: Mapping = field(default_factory=dict)

    @property
    def preset(self) -> Mapping:
        return self.run.preset

    @property
    def rollout_cache(self) -> str | None:
        return self.run.store

    @classmethod
    def for_hf(cls, model_args: Mapping, *, gen_kwargs=None) -> EglrArgs:
        """eglr-hf's arguments: ``model_args`` as the model receives them (eglr's own, HFLM's, from_pretrained's);
        ``gen_kwargs`` (``--gen_kwargs``: a dict or its text) where known."""
        from eglr_harness.decoding.compile_setting import resolve_compile

        with model_arg_errors():  # one line each in the CLI
            run = resolve_run_args(model_args)
            hf_args = dict(run.load_args)
            hf_args.update(check_model_args(hf_args, _PASSTHROUGH_ARGS))  # max_length=2048.0 reaches HFLM as 2048
            if "pretrained" not in hf_args:
                raise ValueError("eglr-hf needs `pretrained` (a hub id or folder) or `model_config` (a preset name).")
            _resolve_default_device(hf_args, run.preset)
            check_pretrained_path(hf_args["pretrained"])
            if run.compile not in ("auto", "none"):  # an explicit compile refused before the load
                resolve_compile(run.compile, intended_device(hf_args), run.engine)
            settings = RunSettings.of(run)
            layers, max_length = declared_limits(hf_args)
            settings.check_layers(layers)  # where the config says it without the weights
            if run.store:
                _check_rollout_cache(run.store)
        options = gen_options.check_cli_gen_kwargs(gen_kwargs, run.engine, max_length) if gen_kwargs else {}
        return cls(run, hf_args, settings, run.engine, run.compile, layers, max_length, options)

    @classmethod
    def for_vllm(cls, model_args: Mapping) -> EglrArgs:
        """eglr-vllm's arguments (its own, ``VLLM_ARGS``, and lm-eval VLLM's); vLLM takes no GGUF and no data
        parallel."""
        with model_arg_errors():  # every check before the weights load
            run = resolve_run_args(model_args, own_names=VLLM_ARGS)
            vllm_args = dict(run.load_args)
            if "pretrained" not in vllm_args:
                raise ValueError("eglr-vllm needs `pretrained` (a folder of safetensors or a hub id) or "
                                 "`model_config`.")
            if "gguf_file" in vllm_args:
                raise ValueError("`gguf_file` is not allowed with eglr-vllm; allowed: a folder of fp32/bf16 "
                                 "safetensors (docs/vllm.md converts a GGUF).")
            if int(vllm_args.get("data_parallel_size", 1)) != 1:
                raise ValueError(f"`data_parallel_size`={vllm_args['data_parallel_size']!r} is not allowed with "
                                 "eglr-vllm; allowed: 1 (tensor_parallel_size is taken).")
            settings = RunSettings.of(run)
            layers = _vllm_layers(vllm_args["pretrained"], bool(vllm_args.get("trust_remote_code", False)))
            settings.check_layers(layers)
            if run.store:
                _check_rollout_cache(run.store)
        return cls(run, vllm_args, settings, run.engine, run.compile, layers, None)

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


def _check_rollout_cache(folder: str) -> None:
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
