"""The one name of a model in run folders, results and reports: its GGUF file name or its hub id.

Never a path of the machine: a local folder is named by its last component, a GGUF file by its file
name, and a preset (``model_config=``) by the model it loads. The same model installed in two
places has the same name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from eglr_harness.core.model_args import parse_model_args

__all__ = ["loaded_name", "model_name", "name_of", "parse_model_args", "run_folder_name"]


def _is_local_path(name: str) -> bool:
    return name.startswith(("/", ".", "~", "pkg://")) or "\\" in name or re.match(r"[A-Za-z]:", name) is not None


def model_name(model_args) -> str | None:
    """The model's name wherever it was installed: the GGUF file name, else the hub id of
    ``pretrained``, else the last folder name of a local ``pretrained``, else the preset's
    (``model_config``) model; None when the args name no model."""
    args = parse_model_args(model_args)
    if "pretrained" not in args and args.get("model_config"):
        try:  # a preset is a file of this package: read it, load no model
            from eglr_harness.run.presets import preset_of, under_preset  # noqa: PLC0415

            args = under_preset(preset_of(args["model_config"]), args)
        except ValueError:
            return str(args["model_config"])
    return name_of(args)


def name_of(load_args: Mapping) -> str | None:
    """:func:`model_name` of the args a model is loaded with (a preset's merged in already: ``gguf_file``,
    ``pretrained`` or ``model``); a ``pretrained`` that is a loaded model object is named by :func:`loaded_name`."""
    if load_args.get("gguf_file"):
        return Path(str(load_args["gguf_file"])).name
    name = load_args.get("pretrained") or load_args.get("model")
    if not name:
        return None
    if hasattr(name, "config"):  # a model object (GRPO hands the trainer's)
        return loaded_name(name)
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
