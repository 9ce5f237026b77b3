"""Where the task YAMLs and model presets live: inside the wheel, or at the source tree's root."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # eglr_harness/ (this file is eglr_harness/core/resources.py)


def _resource_dir(name: str) -> Path:
    # A wheel install carries them under eglr_harness/_resources/; a source checkout
    # (editable install, tests) has them at the repository root.
    for candidate in (_PACKAGE_DIR / "_resources" / name, _PACKAGE_DIR.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"eglr_harness: the '{name}' folder was found neither in {_PACKAGE_DIR / '_resources'} "
        f"nor in {_PACKAGE_DIR.parent}; reinstall the package (pip install eglr-harness)."
    )


def tasks_dir() -> Path:
    """The folder of eglr-harness task YAMLs that lm-eval's TaskManager should index."""
    return _resource_dir("tasks")


def model_configs_dir() -> Path:
    """The folder of per-model preset YAMLs (``model_configs/``)."""
    return _resource_dir("model_configs")


def task_names() -> dict[str, Path]:
    """Our packaged task and group names -> their YAML (read from the ``task:`` / ``group:`` line; no lm-eval)."""
    import re

    declared = re.compile(r"^(?:task|group):[ \t]*([A-Za-z0-9_.\-]+)[ \t]*$", re.MULTILINE)
    names = {}
    for path in sorted(tasks_dir().rglob("*.yaml")):
        for name in declared.findall(path.read_text(encoding="utf-8")):
            names[name] = path
    return names


def names_of_tasks(tasks) -> list[str]:
    """The names of ``tasks`` as lm-eval takes them: a name, a task config or a Task object, or a list of them."""
    names = []
    for task in tasks if isinstance(tasks, (list, tuple)) else [tasks]:
        if isinstance(task, str):
            names.append(task)
        elif isinstance(task, Mapping) and isinstance(task.get("task"), str):
            names.append(task["task"])
        elif isinstance(getattr(getattr(task, "config", None), "task", None), str):
            names.append(task.config.task)
    return names
