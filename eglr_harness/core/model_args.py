"""What ``--model_args`` of ``eglr-hf`` and ``eglr-vllm`` may hold, checked before anything is loaded.

:data:`MODEL_ARGS` is the one table of eglr's own model args: for each its name, how it is written, the values
allowed, its default and the layer that consumes it; :func:`read_model_arg` is the one checker of their values
(numbers by ``core/config.SettingRule.read``, the same limits every reader of a run's files applies). Each
refusal is one line naming the value and what is allowed.

``eglr-hf`` also takes every argument of lm-eval's ``HFLM`` and the loading options of transformers'
``from_pretrained`` (HFLM forwards its extra keyword arguments there). Anything else would reach the model's
constructor after the weights have been read (``l=4`` -> ``TypeError: LlamaForCausalLM.__init__() got an
unexpected keyword argument``), so it is refused up front with the accepted names and the closest ones
(:func:`check_model_args`); the loading values HFLM would refuse only once it loads are read by
:data:`LOAD_RULES`.

Light on purpose (no torch, no lm_eval): the autoload hook imports it at lm_eval's start.
"""

from __future__ import annotations

import difflib
import functools
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from eglr_harness.core.config import (
    DEFAULT_ALPHA,
    DEFAULT_K_MAX,
    DEFAULT_L,
    DEFAULT_SEED,
    DEFAULT_STOP,
    DEFAULT_TAU_KL,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    SETTING_RULES,
    STOP_RULES,
    STOP_THRESHOLD_ARGS,
    SettingRule,
    check_stop,
    parse_tau_h,
)
from eglr_harness.core.errors import ModelArgError
from eglr_harness.core.specs import MAX_AXIS_VALUES, parse_L_spec, parse_T_spec

logger = logging.getLogger(__name__)

# engine=auto|continuous|hook: which engine decodes an eglr-hf run (harness/engine_choice.py); a run records the
# one that decoded each rollout by the same names
ENGINES = ("auto", "continuous", "hook")
DEFAULT_ENGINE = "auto"
# what decoded a rollout, as run files and the rollout store record it: eglr-hf's two (auto chooses one of them)
# and eglr-vllm's one (harness/vllm_model.ENGINE_NAME)
RECORDED_ENGINES = ("continuous", "hook", "vllm")
# earlier names of an engine -> its name: accepted as a model arg for a release (with a warning) and read in
# run files for good (``engine: hf`` in results, samples and rollout stores written before the rename)
RENAMED_ENGINES = {"hf": "hook"}
RECORDED_ENGINES_ALLOWED = (", ".join(repr(e) for e in RECORDED_ENGINES)
                            + " (" + ", ".join(f"{old!r} for {new!r}" for old, new in RENAMED_ENGINES.items())
                            + ", its former name)")


def is_recorded_engine(name) -> bool:
    """Whether a run file or a stored rollout may name ``name`` as the engine that decoded it (its current name or
    an earlier one)."""
    return isinstance(name, str) and (name in RECORDED_ENGINES or name in RENAMED_ENGINES)


COMPILE_SETTINGS = ("auto", "none", "reduce-overhead", "default")  # decoding/compile_setting.py resolves them
DEFAULT_COMPILE = "auto"
DEFAULT_CALIB_LIMIT = 64  # prompts of a task that tau_h=auto calibrates on
SEEDS_RULE = SettingRule(True, lambda v: 1 <= v <= MAX_AXIS_VALUES,
                         f"an int in 1..{MAX_AXIS_VALUES}, a count (seeds=3 repeats the whole pool under seed, "
                         "seed + 1, seed + 2; `seed` sets the first)")
CALIB_LIMIT_RULE = SettingRule(True, lambda v: v >= 1, "an int >= 1")


def one_value(name: str, value):
    """``value`` unchanged, or ``ValueError`` when a model arg that takes one value per run is a list."""
    if isinstance(value, (list, tuple)) or (isinstance(value, str) and any(sep in value for sep in "|;,")):
        raise ValueError(
            f"`{name}`={value!r} is a list; eglr-hf decodes one {name} per run (only L and T are pool axes). "
            f"To compare values, run `eglr-sweep --sweep {name}=...` (one lm_eval run per value, e.g. "
            f"eglr-sweep --model_args ... --tasks ... --sweep {name}=v1,v2)."
        )
    return value


def read_engine(value) -> str:
    """The ``engine`` model arg: one of :data:`ENGINES`; ``hf`` (the hook engine's earlier name) is read as
    ``hook`` with one deprecation warning per process."""
    name = value.strip().lower() if isinstance(value, str) else value
    if name in RENAMED_ENGINES:
        _warn_renamed_engine(name)
        return RENAMED_ENGINES[name]
    if name not in ENGINES:
        raise ValueError(f"`engine`={value!r} is not allowed; allowed: {', '.join(ENGINES)} (auto: continuous "
                         "where it can drive the model, else hook; continuous: refinement folded into the batch; "
                         "hook: transformers' generate with EGLR hooks).")
    return name


@functools.cache
def _warn_renamed_engine(old: str) -> None:
    logger.warning("eglr-hf: `engine=%s` is now `engine=%s`; %s is accepted for this release only.", old,
                   RENAMED_ENGINES[old], old)


def engine_named(name: str | None) -> str | None:
    """The engine a run file names (``continuous``, ``hook``, ``vllm``...), under its current name (``hf`` ->
    ``hook``): what readers show, whatever release wrote the file."""
    return RENAMED_ENGINES.get(name, name)


def read_compile(value) -> str:
    """The ``compile`` model arg normalised (stripped, lower case; None -> ``auto``), or ``ValueError`` naming
    ``compile``, the value and what is allowed."""
    if value is None:
        return DEFAULT_COMPILE
    if isinstance(value, str) and value.strip().lower() in COMPILE_SETTINGS:
        return value.strip().lower()
    hint = ""
    if isinstance(value, bool):  # lm-eval turns compile=true/false into a bool
        hint = f" (for {'CUDA graphs write compile=reduce-overhead' if value else 'eager write compile=none'})"
    written = str(value).lower() if isinstance(value, bool) else repr(value)  # as typed: compile=true
    raise ValueError(f"`compile`={written} is not allowed; allowed: {', '.join(COMPILE_SETTINGS)}{hint}.")


def _as_written(name: str, value):
    """A text arg (a preset's name, a folder): its consumer checks it (run/presets, run/stores)."""
    return value


@dataclass(frozen=True)
class ModelArg:
    """One of eglr's own model args, a row of :data:`MODEL_ARGS`.

    name: as written in ``--model_args``; kind: how its value is written (``int``, ``real``, ``choice``, ``axis``:
    one value or a pool axis, ``tau_h``, ``text``); allowed: its values, as the docs say them; default: its value
    when neither given nor set by the preset (L, T: the pool's when neither the task's nor the preset's pool names one;
    tau_h: ``auto`` when the preset's table has no value either); consumer: the module that reads it;
    read: ``(name, value) -> value`` checked and normalised, ``ValueError`` naming the value otherwise;
    hf_only: eglr-hf takes it and eglr-vllm does not; one_value: a list is refused with a pointer to eglr-sweep (the
    settings a sweep varies; L and T are pool axes, and the others refuse a list as any value they cannot read);
    setting: one of ``RunSettings``' (``run/settings.RunSettings.from_args``), not read by the model itself;
    preset: a preset's ``eglr:`` block may set it (:data:`PRESET_KEYS`; a preset's ``tau_h:`` is its own table);
    sweep: an axis of ``eglr-sweep`` (``leaderboard/sweep.AXES``); none_absent: ``None`` given means "not given"
    (False: the value has a default and ``None`` is refused, as any value its reader refuses).
    """

    name: str
    kind: str
    allowed: str
    default: object
    consumer: str
    read: Callable[[str, object], object]
    hf_only: bool = False
    one_value: bool = True
    setting: bool = True
    preset: bool = False
    sweep: bool = False
    none_absent: bool = True


def _number(name: str, rule: SettingRule, default, consumer: str, *, one_value: bool = False, preset: bool = True,
            sweep: bool = False, none_absent: bool = True) -> ModelArg:
    return ModelArg(name, "int" if rule.integer else "real", rule.allowed, default, consumer, rule.read,
                    one_value=one_value, preset=preset, sweep=sweep, none_absent=none_absent)


_GATE = "decoding (the entropy gate and refinement)"
# eglr's own model args, the one table: both models' constructors name these (and ``pretrained``) apart from what
# lm-eval's model gets; ``run/run_args.resolve_run_args`` reads every value once by its row (given > preset >
# default), and a preset's keys and eglr-sweep's axes are the rows marked so. A new model arg is one row here (and
# its reading where it is used; eglr-hf's and eglr-vllm's signatures name it: tests/run/test_run_args.py checks).
MODEL_ARGS: dict[str, ModelArg] = {arg.name: arg for arg in (
    ModelArg("L", "axis", "0..N (the model's decoder layers): 4, a list 1|4|7 or a range 1-10", DEFAULT_L,
             "run/pool (the pool's L axis; default: the task's pool, else the preset's, else 4)",
             lambda name, value: parse_L_spec(value, name=name), one_value=False, preset=True, sweep=True),
    ModelArg("T", "axis", "a float >= 0 (0 = greedy): 0.7, a list 0.1|0.5 or a range 0.1-1.0:0.1", 0.0,
             "run/pool (the pool's T axis; default: the task's pool, else the preset's, else 0)",
             lambda name, value: parse_T_spec(value, name=name), one_value=False, preset=True),
    _number("alpha", SETTING_RULES["alpha"], DEFAULT_ALPHA, _GATE, one_value=True, sweep=True),
    _number("k_max", SETTING_RULES["k_max"], DEFAULT_K_MAX, _GATE, one_value=True, sweep=True),
    _number("tau_kl", SETTING_RULES["tau_kl"], DEFAULT_TAU_KL, _GATE + ", stop=kl", one_value=True, sweep=True),
    ModelArg("tau_h", "tau_h", "a float in [0, 2**53] nats, 'inf', or 'auto'", "auto",
             "run/calibration (auto; default: the preset's table, else auto), " + _GATE,
             lambda name, value: parse_tau_h(value), sweep=True),
    _number("top_k", SETTING_RULES["top_k"], DEFAULT_TOP_K, "decoding/sampling (T > 0)"),
    _number("top_p", SETTING_RULES["top_p"], DEFAULT_TOP_P, "decoding/sampling (T > 0)"),
    _number("seed", SETTING_RULES["seed"], DEFAULT_SEED, "decoding/sampling (T > 0)", sweep=True),
    _number("seeds", SEEDS_RULE, 1, "run/pool (repeats of the pool)", preset=False),
    ModelArg("model_config", "text", "a preset of model_configs/ or a YAML path", None, "run/presets", _as_written,
             one_value=False, setting=False),
    _number("calib_limit", CALIB_LIMIT_RULE, DEFAULT_CALIB_LIMIT, "run/calibration (tau_h=auto)", preset=False,
            none_absent=False),
    ModelArg("rollout_cache", "text", "a writable folder", None, "run/stores", _as_written, one_value=False,
             setting=False),
    ModelArg("engine", "choice", ", ".join(ENGINES), DEFAULT_ENGINE, "harness/engine_choice",
             lambda name, value: read_engine(value), hf_only=True, one_value=False, setting=False, none_absent=False),
    ModelArg("compile", "choice", ", ".join(COMPILE_SETTINGS), DEFAULT_COMPILE, "decoding/compile_setting",
             lambda name, value: read_compile(value), hf_only=True, one_value=False, setting=False),
    ModelArg("stop", "choice", ", ".join(STOP_RULES), DEFAULT_STOP, _GATE + " (the exit rule)",
             lambda name, value: check_stop(value), preset=True, sweep=True),
    *(_number(rule.threshold_arg, rule.setting, rule.default, _GATE + f", stop={rule.name}", one_value=True,
              sweep=True)
      for rule in STOP_RULES.values() if rule.threshold_arg in STOP_THRESHOLD_ARGS),
)}
EGLR_ARGS = tuple(MODEL_ARGS)
# eglr-hf's engine choice: eglr-vllm has one engine, and takes neither
HF_ONLY_ARGS = tuple(name for name, arg in MODEL_ARGS.items() if arg.hf_only)
# RunSettings' arguments (``RunSettings.from_args``): the settings of a run's cells and its calibration
SETTINGS_ARGS = tuple(name for name, arg in MODEL_ARGS.items() if arg.setting)
# eglr-vllm's own model args
VLLM_ARGS = tuple(name for name in EGLR_ARGS if name not in HF_ONLY_ARGS)
# the keys a preset's ``eglr:`` block may set (``run/presets.load_preset``)
PRESET_KEYS = tuple(name for name, arg in MODEL_ARGS.items() if arg.preset)


def parse_model_args(model_args, read: Callable[[str], object] | None = None) -> dict:
    """The one reader of ``key=value,...`` text (``--model_args``, ``--gen_kwargs``, a run file's ``model_args``):
    a mapping is copied as it is; text is split as lm-eval splits it (at ``,``, empty parts skipped; a key before
    the first ``=``, stripped; a part without ``=`` is a key with the value ``''``). ``read``: how each value is
    read (``harness/gen_options.parse_args_string`` passes lm-eval's, which turns ``4`` into an int and ``true``
    into a bool); by default the value as written, stripped."""
    if isinstance(model_args, Mapping):
        return dict(model_args)
    if not model_args:
        return {}
    out = {}
    for part in str(model_args).strip().split(","):
        if part:
            key, _, value = part.partition("=")
            out[key.strip()] = read(value) if read is not None else value.strip()
    return out


def read_model_arg(name: str, value):
    """The one checker of eglr's model args: ``value`` of ``name`` (as written, or a preset's) checked by its row of
    :data:`MODEL_ARGS` and normalised (a number's type, an axis's values, ``engine=hf`` as ``hook``);
    ``ValueError``, one line naming the value and what is allowed, otherwise."""
    arg = MODEL_ARGS[name]
    if arg.one_value:
        one_value(name, value)
    return arg.read(name, value)


# Keyword arguments that transformers' from_pretrained reads itself (besides its named parameters)
# and the bitsandbytes options lm-eval's HFLM reads from them.
FROM_PRETRAINED_OPTIONS = (
    "attn_implementation", "device_map", "max_memory", "offload_folder", "offload_buffers", "quantization_config",
    "torch_dtype", "low_cpu_mem_usage", "variant", "key_mapping", "use_kernels", "kernel_config",
    "experts_implementation", "tp_size", "device_mesh", "distributed_config", "adapter_name", "adapter_kwargs",
    "proxies", "generation_config", "load_in_4bit", "load_in_8bit", "bnb_4bit_compute_dtype",
    "bnb_4bit_quant_type", "bnb_4bit_use_double_quant",
)

USE_CACHE_REFUSAL = (
    "eglr-hf does not support lm-eval's --use_cache: it keys on (context, gen_kwargs) and would collapse a pool "
    "of (L, T) configs into one answer. Use --model_args rollout_cache=DIR instead (config-aware and resumable)."
)


def use_cache_refusal(model: str) -> str:
    """:data:`USE_CACHE_REFUSAL` for ``model`` (``eglr-hf`` or ``eglr-vllm``: both answer a pool's repeats of one
    (context, gen_kwargs) with different rollouts, which lm-eval's cache would answer with one)."""
    return USE_CACHE_REFUSAL.replace("eglr-hf", model, 1)


def check_model_args(given: Mapping[str, object] | Iterable[str], passthrough: Iterable[str]) -> dict:
    """Raise :class:`ModelArgError` (a ``ValueError``) for any name that is neither eglr-hf's, nor in ``passthrough``;
    for a mapping, also for a loading value HFLM would refuse once it loads (:func:`check_load_values`, whose numbers
    it returns; ``{}`` for names).

    Args:
        given: the model args (names, or a mapping of them).
        passthrough: the names HFLM and from_pretrained accept (the caller knows lm-eval's signature).
    """
    allowed = set(EGLR_ARGS) | set(passthrough) | set(FROM_PRETRAINED_OPTIONS)
    unknown = [name for name in given if name not in allowed]
    if not unknown:
        return check_load_values(given) if isinstance(given, Mapping) else {}
    lines = []
    for name in unknown:
        close = [n for n in EGLR_ARGS if n.lower() == name.lower()]
        close += [n for n in difflib.get_close_matches(name, sorted(allowed), n=3, cutoff=0.6) if n not in close]
        hint = f" Did you mean {' or '.join(f'`{n}`' for n in close)}?" if close else ""
        lines.append(f"unknown eglr-hf model arg `{name}`.{hint}")
    raise ModelArgError(
        " ".join(lines)
        + f" eglr-hf's own args: {', '.join(EGLR_ARGS)}; besides them it takes lm-eval hf's args (pretrained, "
        "dtype, device, batch_size, max_length, parallelize, peft, gguf_file, ...) and transformers' "
        "from_pretrained loading options (attn_implementation, device_map, ...). Nothing was loaded."
    )


# dtype names lm-eval's HFLM turns into a torch dtype (``getattr(torch, name)``), and "auto"
DTYPES = ("auto", "float32", "float", "float16", "half", "bfloat16", "float64", "double")


# HFLM's loading values that it would refuse only once it loads (or, for ``max_length``, never: ``abc`` was taken as
# "not given" and ``-5`` asked for 1..-6), read by the one reader of written numbers
LOAD_RULES = {
    "max_length": SettingRule(True, lambda v: v >= 2, "an int >= 2 (the prompt and at least one generated token), "
                                                      "or leave it out to use the model's own"),
    "batch_size": SettingRule(True, lambda v: v >= 1, "an int >= 1 or auto, auto:N"),
    "max_batch_size": SettingRule(True, lambda v: v >= 1, "an int >= 1"),
}


def check_load_values(args: Mapping[str, object]) -> dict:
    """The loading values among ``args`` that HFLM would refuse only once it loads, read: ``dtype``/``torch_dtype``
    (a name of :data:`DTYPES`), ``max_length``, ``batch_size`` (or ``auto``, ``auto:N``), ``max_batch_size``
    (:data:`LOAD_RULES`). Returns the numbers among them as ints (``max_length=2048.0`` -> 2048, which HFLM slices
    by); :class:`ModelArgError` naming the value otherwise."""
    for name in ("dtype", "torch_dtype"):
        value = args.get(name)
        if value is None or type(value).__name__ == "dtype":  # a torch.dtype, passed by a program
            continue
        if not isinstance(value, str) or value.removeprefix("torch.") not in DTYPES:
            raise ModelArgError(f"`{name}`={value!r} is not allowed; allowed: {', '.join(DTYPES)}. Nothing was loaded.")
    numbers = {}
    for name, rule in LOAD_RULES.items():
        value = args.get(name)
        if value is None or (name == "batch_size" and isinstance(value, str)
                             and re.fullmatch(r"auto(:\d+)?", value.strip())):
            continue
        try:
            numbers[name] = rule.read(name, value)
        except ValueError as err:
            raise ModelArgError(f"{err} Nothing was loaded.") from None
    return numbers


# What the hub takes as a model id: ``name`` or ``namespace/name`` (huggingface_hub's rule).
_HUB_ID = re.compile(r"[\w.\-]+(/[\w.\-]+)?")


def check_pretrained_path(pretrained) -> None:
    """Raise :class:`ModelArgError` when ``pretrained`` names a local path that does not exist.

    A folder that is missing would otherwise reach the hub, whose answer ("Repo id must be in the
    form 'repo_name' or 'namespace/repo_name'") does not say that the folder is missing. A value the
    hub can take as a model id (``org/name``) is left alone, as is anything that is not a string.
    """
    if not isinstance(pretrained, str) or os.path.exists(os.path.expanduser(pretrained)):
        return
    if _HUB_ID.fullmatch(pretrained) and not pretrained.startswith("."):
        return
    raise ModelArgError(f"`pretrained`={pretrained!r} does not exist; allowed: a model folder (with config.json, or "
                        "the folder of a gguf_file) or a hub id such as HuggingFaceTB/SmolLM2-135M-Instruct.")


def close_task_names(missing: Iterable[str], known: Iterable[str]) -> dict[str, list[str]]:
    """For each task name that was not found, the known names closest to it (best first, at most 5)."""
    known = sorted(set(known))

    def closest(name: str) -> list[str]:
        scored = [(difflib.SequenceMatcher(None, name, k).ratio(), k) for k in known]
        return [k for score, k in sorted(scored, key=lambda p: (-p[0], p[1])) if score >= 0.6][:5]

    return {name: closest(name) for name in missing}
