"""Make ``eglr-hf`` and the project's tasks visible to the stock ``lm_eval`` CLI.

lm-eval 0.4.13 has no plugin discovery. The wheel installs ``eglr_harness_autoload.pth``,
which calls :func:`install` at interpreter start. That only adds an import hook: nothing of
lm_eval, torch or transformers is imported until the program imports lm_eval itself. When
``lm_eval.api.registry`` is imported, ``eglr-hf`` is registered as a lazy placeholder; when
``lm_eval.tasks.manager`` is imported, every ``TaskManager`` also indexes our task folder; when
its evaluation tracker is imported, runs through a preset (``model_config=``) or a GGUF file are
named after the model (``model_names.run_folder_name``) instead of a random id or a path of the machine,
``--output_path`` is checked for writing and the results and samples files are written whole or fail
the run (``harness/output.py``);
when lm-eval's CLI resolves the task names and when ``lm_eval.evaluator.simple_evaluate`` starts, an
``eglr-hf`` run is checked before the model loads (``harness/preflight.py``: model args, ``--use_cache``,
``--limit``, ``--gen_kwargs``, the tasks' pools, lengths and local data files); a task name that is not
found gets the closest task names in lm-eval's error, as one line.

Set ``EGLR_AUTOLOAD=0`` to switch this off.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import logging
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


def _patch_task_manager(manager_module) -> None:
    task_manager_cls = manager_module.TaskManager
    if getattr(task_manager_cls, "_eglr_patched", False):
        return
    original_init = task_manager_cls.__init__

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


def _patch_run_names(tracker_module) -> None:
    tracker_cls = tracker_module.GeneralConfigTracker
    if getattr(tracker_cls, "_eglr_patched", False):
        return
    original = tracker_cls._get_model_name

    def _get_model_name(model_args):
        from eglr_harness.run.model_names import parse_model_args, run_folder_name

        args = parse_model_args(model_args) if isinstance(model_args, (str, dict)) else {}
        if args.get("model_config") or args.get("gguf_file"):
            name = run_folder_name(args)
            if name:
                return name
        return original(model_args)

    tracker_cls._get_model_name = staticmethod(_get_model_name)
    tracker_cls._eglr_patched = True


def _patch_tracker(tracker_module) -> None:
    """Runs named after the model; ``--output_path`` checked before the model loads, results and
    samples written whole or failing the run (``harness/output.py``)."""
    from eglr_harness.harness.output import patch_tracker

    _patch_run_names(tracker_module)
    patch_tracker(tracker_module)


def _patch_fail_fast(evaluator_module) -> None:
    """Refuse ``--use_cache`` with ``eglr-hf`` and read the eglr tasks' local data files (a bad line
    named ``file:line``) before the model loads (lm-eval asks the model and loads data only after)."""
    original = evaluator_module.simple_evaluate
    if getattr(original, "_eglr_patched", False):
        return

    @functools.wraps(original)
    def simple_evaluate(*args, **kwargs):
        from eglr_harness.data.loading import check_local_data
        from eglr_harness.harness.output import install_user_error_hook
        from eglr_harness.harness.preflight import check_run_args, check_run_tasks

        model = kwargs.get("model", args[0] if args else None)
        ours = model == MODEL_NAME or type(model).__name__ == "EglrHFLM"
        install_user_error_hook()
        tasks, metadata = kwargs.get("tasks"), kwargs.get("metadata")
        tasks = tasks if isinstance(tasks, (list, tuple)) else [tasks]
        data_dir = metadata.get("eglr_data_dir") if isinstance(metadata, dict) else None  # as the tasks read it
        if ours:  # everything that can be known before the model loads (harness/preflight.py)
            model_args = kwargs.get("model_args") if model == MODEL_NAME else None
            tracker = kwargs.get("evaluation_tracker")
            eglr_args = check_run_args(model_args, gen_kwargs=kwargs.get("gen_kwargs"), limit=kwargs.get("limit"),
                                       use_cache=kwargs.get("use_cache"), passed=_passed_to_model(kwargs.get))
            check_run_tasks(eglr_args, tasks, log_samples=kwargs.get("log_samples"),
                            output_path=getattr(tracker, "output_path", None), data_dir=data_dir)
        else:
            check_local_data(tasks, data_dir)  # before the model loads
        if ours and kwargs.get("gen_kwargs"):  # lm-eval warns about do_sample whenever --gen_kwargs is given
            logging.getLogger("lm_eval.eglr_hf").info(
                "eglr-hf: lm-eval's warning \"Ensure 'do_sample=True' for non-greedy decoding\" does not apply: "
                "eglr-hf sets do_sample per cell of the pool (cells with T > 0 draw from their own seeded streams).")
        return original(*args, **kwargs)

    simple_evaluate._eglr_patched = True
    evaluator_module.simple_evaluate = simple_evaluate


def _passed_to_model(get) -> dict:
    """What lm-eval hands a model beside its model args (``create_from_arg_string``'s additional config)."""
    return {name: get(name) for name in ("device", "batch_size", "max_batch_size")}


def _patch_task_lookup(config_module) -> None:
    """eglr-hf's model args (and its ``rollout_cache`` folder) checked before lm-eval indexes its tasks;
    lm-eval's "Tasks not found: x" with the closest task names (``aime_eglr_sc`` -> ``aime24_eglr_sc``)."""
    config_cls = config_module.EvaluatorConfig
    if getattr(config_cls, "_eglr_patched", False):
        return
    original = config_cls.process_tasks

    def process_tasks(self, *args, **kwargs):
        ours = getattr(self, "model", None) == MODEL_NAME
        if ours:  # before lm-eval indexes every task (~10 s): the run's own arguments (harness/preflight.py)
            from eglr_harness.harness.preflight import check_run_args

            eglr_args = check_run_args(getattr(self, "model_args", None), gen_kwargs=getattr(self, "gen_kwargs", None),
                                       limit=getattr(self, "limit", None), use_cache=getattr(self, "use_cache", None),
                                       passed=_passed_to_model(lambda name: getattr(self, name, None)))
        try:
            manager = original(self, *args, **kwargs)
        except ValueError as err:
            message = str(err)
            if not message.startswith("Tasks not found: ") or _TASK_MANAGERS.get("last") is None:
                raise
            from eglr_harness.core.errors import RunArgError
            from eglr_harness.core.model_args import close_task_names

            missing = message.removeprefix("Tasks not found: ").split(", ")
            hints = [f"{name} -> did you mean {', '.join(close)}?"
                     for name, close in close_task_names(missing, _TASK_MANAGERS["last"].all_tasks).items() if close]
            raise RunArgError("; ".join([f"`--tasks`: {message}", *hints])) from None
        if ours:  # the tasks are known now; the model is not loaded yet
            from eglr_harness.harness.preflight import check_run_tasks

            metadata = getattr(self, "metadata", None)
            check_run_tasks(eglr_args, self.tasks, log_samples=getattr(self, "log_samples", False),
                            output_path=getattr(self, "output_path", None), data_dir=metadata.get("eglr_data_dir") if isinstance(metadata, dict) else None)
        return manager

    config_cls.process_tasks = process_tasks
    config_cls._eglr_patched = True


_POST_IMPORT = {
    "lm_eval.api.registry": _register_model,
    "lm_eval.tasks.manager": _patch_task_manager,
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
