"""The one name of a model in run folders, results and reports: its GGUF file name or its hub id.

Never a path of the machine: a local folder is named by its last component, a GGUF file by its file
name, and a preset (``model_config=``) by the model it loads. The same model installed in two
places has the same name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

__all__ = ["loaded_name", "model_name", "parse_model_args", "run_folder_name"]


def parse_model_args(model_args) -> dict:
    """``'pretrained=x,gguf_file=y'`` (or a dict, as lm-eval 0.4.13 stores it) -> dict."""
    if isinstance(model_args, Mapping):
        return dict(model_args)
    if not model_args:
        return {}
    out = {}
    for part in str(model_args).split(","):
        if "=" in part:
            key, value = part.split("=", 1)
            out[key.strip()] = value.strip()
    return out


def _is_local_path(name: str) -> bool:
    return name.startswith(("/", ".", "~", "pkg://")) or "\\" in name or re.match(r"[A-Za-z]:", name) is not None


def model_name(model_args) -> str | None:
    """The model's name wherever it was installed: the GGUF file name, else the hub id of
    ``pretrained``, else the last folder name of a local ``pretrained``, else the preset's
    (``model_config``) model; None when the args name no model."""
    args = parse_model_args(model_args)
    if "pretrained" not in args and args.get("model_config"):
        try:  # a preset is a file of this package: read it, load no model
            from eglr_harness.run.presets import load_preset  # noqa: PLC0415

            args = {**load_preset(str(args["model_config"]))["model_args"], **args}
        except ValueError:
            return str(args["model_config"])
    if args.get("gguf_file"):
        return Path(str(args["gguf_file"])).name
    name = args.get("pretrained") or args.get("model")
    if not name:
        return None
    name = str(name).rstrip("/\\")
    return Path(name.replace("\\", "/")).name if _is_local_path(name) else name


def run_folder_name(model_args) -> str | None:
    """The model's name as lm-eval's run folder: :func:`model_name` without a ``.gguf`` ending, so that
    the folder does not look like a file (``SmolLM2-135M-Instruct.Q4_1/``)."""
    name = model_name(model_args)
    return name[: -len(".gguf")] if name and name.endswith(".gguf") else name


def loaded_name(pretrained) -> str:
    """``pretrained`` as HFLM got it: a hub id or folder as given, or the name inside a loaded model object."""
    if isinstance(pretrained, str):
        return pretrained
    return getattr(getattr(pretrained, "config", None), "_name_or_path", None) or type(pretrained).__name__
