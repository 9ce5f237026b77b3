"""What ``--model_args`` of ``eglr-hf`` may hold, checked before anything is loaded.

``eglr-hf`` takes its own arguments (:data:`EGLR_ARGS`), every argument of lm-eval's ``HFLM`` and
the loading options of transformers' ``from_pretrained`` (HFLM forwards its extra keyword
arguments there). Anything else would reach the model's constructor after the weights have been
read (``l=4`` -> ``TypeError: LlamaForCausalLM.__init__() got an unexpected keyword argument``),
so it is refused up front with the accepted names and the closest ones.

Light on purpose (no torch, no lm_eval): the autoload hook imports it at lm_eval's start.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable, Mapping

from eglr_harness.core.config import STOP_THRESHOLD_ARGS
from eglr_harness.core.errors import ModelArgError

# eglr's own model args, the one list of their names: both models' constructors take these (and
# ``pretrained``) apart from what lm-eval's model gets (``harness/eglr_args.EglrArgs.split``), and
# ``run/settings.RunSettings.from_args`` takes the settings among them. A new model arg is one entry here
# (and its reading where it is used).
EGLR_ARGS = ("L", "T", "alpha", "k_max", "tau_kl", "tau_h", "top_k", "top_p", "seed", "seeds", "model_config",
             "calib_limit", "rollout_cache", "engine", "compile", "stop", *STOP_THRESHOLD_ARGS)
# eglr-hf's engine choice: eglr-vllm has one engine, and takes neither
HF_ONLY_ARGS = ("engine", "compile")
# read by the model itself, not by the settings
MODEL_ARGS_NOT_SETTINGS = ("model_config", "rollout_cache", *HF_ONLY_ARGS)
# RunSettings' arguments (``RunSettings.from_args``): the settings of a run's cells and its calibration
SETTINGS_ARGS = tuple(name for name in EGLR_ARGS if name not in MODEL_ARGS_NOT_SETTINGS)
# eglr-vllm's own model args
VLLM_ARGS = tuple(name for name in EGLR_ARGS if name not in HF_ONLY_ARGS)

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


def check_model_args(given: Mapping[str, object] | Iterable[str], passthrough: Iterable[str]) -> None:
    """Raise :class:`ModelArgError` (a ``ValueError``) for any name that is neither eglr-hf's, nor in ``passthrough``.

    Args:
        given: the model args (names, or a mapping of them).
        passthrough: the names HFLM and from_pretrained accept (the caller knows lm-eval's signature).
    """
    allowed = set(EGLR_ARGS) | set(passthrough) | set(FROM_PRETRAINED_OPTIONS)
    unknown = [name for name in given if name not in allowed]
    if not unknown:
        if isinstance(given, Mapping):
            check_load_values(given)
        return
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


def _int_at_least(value, low: int) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, str):
        value = value.strip()
        if not re.fullmatch(r"[+-]?\d+", value):
            return False
        value = int(value)
    if isinstance(value, float) and value.is_integer():  # lm-eval reads "-5" as -5.0
        value = int(value)
    return isinstance(value, int) and value >= low


def check_load_values(args: Mapping[str, object]) -> None:
    """Raise :class:`ModelArgError` for a loading value the model would refuse only once it loads (or,
    for ``max_length``, never: ``abc`` was taken as "not given" and ``-5`` asked for 1..-6):
    ``dtype``/``torch_dtype``, ``max_length``, ``batch_size``, ``max_batch_size``."""
    for name in ("dtype", "torch_dtype"):
        value = args.get(name)
        if value is None or type(value).__name__ == "dtype":  # a torch.dtype, passed by a program
            continue
        if not isinstance(value, str) or value.removeprefix("torch.") not in DTYPES:
            raise ModelArgError(f"`{name}`={value!r} is not allowed; allowed: {', '.join(DTYPES)}. Nothing was loaded.")
    value = args.get("max_length")
    if value is not None and not _int_at_least(value, 2):
        raise ModelArgError(f"`max_length`={value!r} is not allowed; allowed: an int >= 2 (the prompt and at least one "
                            "generated token), or leave it out to use the model's own. Nothing was loaded.")
    for name in ("batch_size", "max_batch_size"):
        value = args.get(name)
        if value is None or _int_at_least(value, 1):
            continue
        if name == "batch_size" and isinstance(value, str) and re.fullmatch(r"auto(:\d+)?", value.strip()):
            continue
        raise ModelArgError(f"`{name}`={value!r} is not allowed; allowed: an int >= 1"
                            f"{' or auto, auto:N' if name == 'batch_size' else ''}. Nothing was loaded.")


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
