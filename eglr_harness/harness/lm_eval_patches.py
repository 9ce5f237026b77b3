"""The lm-eval 0.4.13 behaviours an ``eglr-hf`` run changes, each for a reason lm-eval gives no hook for.

The autoload hook (``harness/autoload.py``) applies them when lm-eval imports the patched module. Each
keeps lm-eval's original as ``__wrapped__``; ``tests/lm/test_lm_eval_patches.py`` pins in that original
what the patch relies on or works around, so that an lm-eval upgrade that makes one needless fails a test.

- ``GeneralConfigTracker._get_model_name``: runs through a preset or a GGUF are named after the model
  (``model_names.run_folder_name``), not after a random id or a path of the machine;
- ``EvaluationTracker.__init__``, ``.save_results_aggregated``, ``.save_results_samples``
  (``harness/output.py``): ``--output_path`` checked before the model loads, the results and samples
  files written whole or the run fails (lm-eval logs a failed write and exits 0);
- ``simple_evaluate``: an ``eglr-hf`` run checked before the model loads (``harness/preflight.py``), for
  Python callers too (lm-eval loads the model before it builds the tasks);
- ``EvaluatorConfig.process_tasks``: the same checks before lm-eval indexes its tasks (~10 s), and the
  closest task names added to its "Tasks not found" error.

Light on purpose: everything beyond the standard library is imported when a patch runs.
"""

from __future__ import annotations

import functools
import logging

from eglr_harness.harness.autoload import MODEL_NAME  # the registered name, defined once


def patch_run_names(tracker_module) -> None:
    """lm-eval names a run folder by ``_get_model_name(model_args)``: a GGUF run would be named after its path."""
    tracker_cls = tracker_module.GeneralConfigTracker
    if getattr(tracker_cls, "_eglr_patched", False):
        return
    original = tracker_cls._get_model_name

    @functools.wraps(original)
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


def patch_tracker(tracker_module) -> None:
    """Runs named after the model; ``--output_path`` checked before the model loads, results and
    samples written whole or failing the run (``harness/output.py``)."""
    from eglr_harness.harness.output import patch_tracker as patch_outputs

    patch_run_names(tracker_module)
    patch_outputs(tracker_module)


def patch_fail_fast(evaluator_module) -> None:
    """lm-eval's ``simple_evaluate`` loads the model before it reads a task: check an eglr-hf run first
    (its arguments, ``--use_cache``, the tasks' pools and local data files), for Python callers too."""
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


def patch_task_lookup(config_module, last_task_manager) -> None:
    """eglr-hf's model args (and its ``rollout_cache`` folder) checked before lm-eval indexes its tasks;
    lm-eval's "Tasks not found: x" with the closest task names (``aime_eglr_sc`` -> ``aime24_eglr_sc``).
    last_task_manager(): the TaskManager lm-eval made last (the autoload's task indexing keeps it), or None."""
    config_cls = config_module.EvaluatorConfig
    if getattr(config_cls, "_eglr_patched", False):
        return
    original = config_cls.process_tasks

    @functools.wraps(original)
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
            if not message.startswith("Tasks not found: ") or last_task_manager() is None:
                raise
            from eglr_harness.core.errors import RunArgError
            from eglr_harness.core.model_args import close_task_names

            missing = message.removeprefix("Tasks not found: ").split(", ")
            hints = [f"{name} -> did you mean {', '.join(close)}?"
                     for name, close in close_task_names(missing, last_task_manager().all_tasks).items() if close]
            raise RunArgError("; ".join([f"`--tasks`: {message}", *hints])) from None
        if ours:  # the tasks are known now; the model is not loaded yet
            from eglr_harness.harness.preflight import check_run_tasks

            metadata = getattr(self, "metadata", None)
            check_run_tasks(eglr_args, self.tasks, log_samples=getattr(self, "log_samples", False),
                            output_path=getattr(self, "output_path", None),
                            data_dir=metadata.get("eglr_data_dir") if isinstance(metadata, dict) else None)
        return manager

    config_cls.process_tasks = process_tasks
    config_cls._eglr_patched = True
