"""The one name of a model in run folders, results and reports: its hub id or its GGUF file name.

Never a path of the machine: a local folder is named by its last component, a GGUF file by its
file name without ``.gguf``, and a preset (``model_config=``) by the model it loads.
"""

from __future__ import annotations

import re
from pathlib import Path


def parse_model_args(model_args: str | dict | None) -> dict:
    """``"a=1,b=x"`` (lm-eval's form) or a dict -> dict of strings."""
    if isinstance(model_args, dict):
        return dict(model_args)
    args: dict = {}
    for part in (model_args or "").split(","):
        if "=" in part:
            key, value = part.split("=", 1)
            args[key.strip()] = value.strip()
    return args


def model_name(model_args: str | dict | None) -> str | None:
    """``SmolLM2-135M-Instruct.Q4_1`` for a GGUF, ``Qwen/Qwen2.5-3B-Instruct`` for a hub id, the folder
    name for a local folder; a ``model_config`` preset is expanded first. None when nothing names a model."""
    args = parse_model_args(model_args)
    if "pretrained" not in args and args.get("model_config"):
        from eglr_harness.presets import load_preset  # noqa: PLC0415 -- presets read YAML; only needed here

        preset = load_preset(str(args["model_config"]))
        args = {**preset["model_args"], **args}
        if "pretrained" not in args:
            return preset["name"]
    gguf, pretrained = args.get("gguf_file"), args.get("pretrained")
    if gguf:
        return re.sub(r"\.gguf$", "", Path(str(gguf)).name)
    if not isinstance(pretrained, str) or not pretrained:
        return None
    if pretrained.startswith(("/", ".", "~")) or Path(pretrained).exists():
        return Path(pretrained.rstrip("/")).name or None
    return pretrained  # a hub id

