"""Make ``eglr-hf`` and the project's tasks visible to the stock ``lm_eval`` CLI: model registration and
task indexing.

lm-eval 0.4.13 has no plugin discovery. The wheel installs ``eglr_harness_autoload.pth``,
which calls :func:`install` at interpreter start. That only adds an import hook: nothing of
lm_eval, torch or transformers is imported until the program imports lm_eval itself. When
``lm_eval.api.registry`` is imported, ``eglr-hf`` (and ``eglr-vllm``) are registered as lazy
placeholders; when ``lm_eval.tasks.manager`` is imported, every ``TaskManager`` also indexes our task
folder. The same hook applies :data:`PATCHED`, the lm-eval behaviours an eglr run changes, each argued
in ``harness/lm_eval_patches.py`` and pinned by ``tests/lm/test_lm_eval_patches.py``.

Set ``EGLR_AUTOLOAD=0`` to switch this off.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import os
import sys

MODEL_NAME = "eglr-hf"
MODEL_TARGET = "eglr_harness.harness.model:EglrHFLM"
# EGLR inside vLLM (docs/vllm.md): a placeholder too; vLLM is imported only when a run names it
VLLM_MODEL_NAME = "eglr-vllm"
VLLM_MODEL_TARGET = "eglr_harness.harness.vllm_model:EglrVLLM"
_DISABLE_VALUES = {"0", "false", "no", "off"}
_TASK_MANAGERS: dict = {}


def _register_model(registry_module) -> None:
    # lm-eval 0.4.13 registers its own models (hf, vllm, ...) only while the registry is empty,
    # so they must be in before ours. lm_eval.models is light: a name -> "module:Class" table.
    importlib.import_module("lm_eval.models")
    registry = registry_module.model_registry
    for name, target in ((MODEL_NAME, MODEL_TARGET), (VLLM_MODEL_NAME, VLLM_MODEL_TARGET)):
        if name not in registry:
            registry.register(name, target=target)
    # Our filters, metrics and aggregations, so that task YAMLs can name them.
    importlib.import_module("eglr_harness.harness.registry")


def _index_our_tasks(manager_module) -> None:
    task_manager_cls = manager_module.TaskManager
    if getattr(task_manager_cls, "_eglr_patched", False):
        return
    original_init = task_manager_cls.__init__

    # lm-eval 0.4.13 discovers no task plugins: our folder goes first in every manager's include_path
    @functools.wraps(original_init)
    def __init__(self, *args, include_path=None, **kwargs):
        from eglr_harness.core.resources import tasks_dir

        paths = [] if include_path is None else (
            list(include_path) if isinstance(include_path, (list, tuple)) else [include_path]
        )
        ours = str(tasks_dir())
        if ours not in {str(p) for p in paths}:
            paths.insert(0, ours)  # user paths come later, so they can override ours
        original_init(self, *args, include_path=paths, **kwargs)
        _TASK_MANAGERS["last"] = self  # for the close names of a task that is not found

    task_manager_cls.__init__ = __init__
    task_manager_cls._eglr_patched = True


def _last_task_manager():
    """The ``TaskManager`` lm-eval made last (for the close names of a task that is not found), or None."""
    return _TASK_MANAGERS.get("last")


def _patch_tracker(tracker_module) -> None:
    from eglr_harness.harness import lm_eval_patches

    lm_eval_patches.patch_tracker(tracker_module)


def _patch_fail_fast(evaluator_module) -> None:
    from eglr_harness.harness import lm_eval_patches

    lm_eval_patches.patch_fail_fast(evaluator_module)


def _patch_task_lookup(config_module) -> None:
    from eglr_harness.harness import lm_eval_patches

    lm_eval_patches.patch_task_lookup(config_module, _last_task_manager)


# The lm-eval attributes the hook rebinds, each kept as ``__wrapped__`` (why: harness/lm_eval_patches.py).
PATCHED = (
    "lm_eval.tasks.manager.TaskManager.__init__",  # task indexing: our task folder in every include_path
    "lm_eval.loggers.evaluation_tracker.GeneralConfigTracker._get_model_name",  # run folder named after the model
    "lm_eval.loggers.evaluation_tracker.EvaluationTracker.__init__",  # --output_path checked before the load
    "lm_eval.loggers.evaluation_tracker.EvaluationTracker.save_results_aggregated",  # written whole or failing
    "lm_eval.loggers.evaluation_tracker.EvaluationTracker.save_results_samples",  # written whole or failing
    "lm_eval.evaluator.simple_evaluate",  # an eglr-hf run checked before the model loads
    "lm_eval.config.evaluate_config.EvaluatorConfig.process_tasks",  # the same before task indexing; close names
)


_POST_IMPORT = {
    "lm_eval.api.registry": _register_model,
    "lm_eval.tasks.manager": _index_our_tasks,
    "lm_eval.loggers.evaluation_tracker": _patch_tracker,
    "lm_eval.evaluator": _patch_fail_fast,
    "lm_eval.config.evaluate_config": _patch_task_lookup,
}


class _PostImportLoader(importlib.abc.Loader):
    def __init__(self, wrapped, hook):
        self._wrapped = wrapped
        self._hook = hook

    def create_module(self, spec):
        return self._wrapped.create_module(spec)

    def exec_module(self, module):
        self._wrapped.exec_module(module)
        try:
            self._hook(module)
        except Exception as err:  # never break lm_eval itself
            print(f"eglr_harness autoload could not patch {module.__name__}: {err!r}", file=sys.stderr)

    def __getattr__(self, name):  # get_code, get_source, is_package ... of the real loader
        return getattr(self._wrapped, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        hook = _POST_IMPORT.get(fullname)
        if hook is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PostImportLoader(spec.loader, hook)
        return spec


def enabled() -> bool:
    return os.environ.get("EGLR_AUTOLOAD", "1").strip().lower() not in _DISABLE_VALUES


def install() -> None:
    """Install the import hook (idempotent); patch modules that are already imported."""
    try:
        if not enabled() or any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
            return
        sys.meta_path.insert(0, _PostImportFinder())
        for name, hook in _POST_IMPORT.items():
            if name in sys.modules:
                hook(sys.modules[name])
    except Exception as err:  # never break interpreter start-up
        print(f"eglr_harness autoload disabled: {err!r}", file=sys.stderr)
