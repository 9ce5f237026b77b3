"""What the project adds to lm-eval 0.4.13, applied by the autoload hook (``harness/autoload.py``) when lm-eval
imports the module it concerns (:data:`POST_IMPORT`).

A run whose model and tasks are not the project's behaves byte for byte as without the project: the same files,
file names, messages and exit codes (``tests/harness/test_lm_eval_untouched.py`` runs lm-eval's ``dummy`` model
both ways through the ``lm_eval`` console script).

Through lm-eval's own registries (adding names, rebinding nothing):

- the models ``eglr-hf``, ``eglr-vllm`` and ``eglr-baseline`` (the baselines: ``harness/baseline_model.py``), as
  lazy ``module:Class`` placeholders (:func:`register_models`), where lm-eval does not read them from the package's
  ``lm_eval.models`` entry points itself (an lm-eval after 0.4.13);
- our filters, metrics and aggregations, so that task YAMLs can name them (``harness/registry.py``);
- a logging filter that drops lm-eval's "TASK: Custom kwargs can be passed to ``--metadata``" warning for our tasks
  (:class:`_OurTasksMetadataHint`; another task's passes).

Rebound, because lm-eval 0.4.13 gives no hook for them (no plugin discovery of tasks, no hook around saving or
before the model loads). Each keeps lm-eval's original as ``__wrapped__``; ``tests/harness/test_lm_eval_patches.py``
pins in that original what the patch relies on or works around, so that an lm-eval upgrade that makes one
needless fails a test. All but the first act only on a run of :data:`OUR_MODELS` or of our tasks; for any other
the methods are lm-eval's own (:class:`_ForOurRuns` picks them when they are read, so that another model's
traceback holds no frame of ours) and the functions call lm-eval's original with the same arguments:

- ``TaskManager.__init__``: our task folder first in every manager's ``include_path``, so that a run can name our
  tasks without ``--include_path`` (what the ``lm_eval.tasks`` plugins of a newer lm-eval would do). It adds names
  only: a run that names none of them reads, logs and writes what it did before;
- ``GeneralConfigTracker.log_experiment_args``: runs through a preset or a GGUF are named after the model
  (``model_names.run_folder_name``), not after a random id or a path of the machine;
- ``EvaluationTracker.save_results_aggregated``, ``.save_results_samples`` (``harness/output.py``): the results and
  samples files written whole or the run fails (lm-eval logs a failed write and exits 0); for these three a
  run of another model on our tasks (the leaderboard's ``hf`` baselines) is an eglr run too: ``simple_evaluate``
  marks its tracker;
- ``simple_evaluate``: a run checked before the model loads (``harness/preflight.py``: its arguments,
  ``--output_path`` for writing, the tasks' pools and local data), for Python callers too (lm-eval loads the model
  before it builds the tasks); a run of another model on our tasks gets the local data check;
- ``EvaluatorConfig.process_tasks``: the same checks before lm-eval indexes its tasks (~10 s), and the closest
  task names added to its "Tasks not found" error;
- ``HarnessCLI.execute`` (the ``lm_eval`` command and ``eglr-eval``): the eglr tasks' files in ``EGLR_DATA_DIR``
  read before lm-eval imports torch; an error of ours that the user fixes (a
  ``UserError``: an argument, a data file, an output folder) ends the command with its one line and exit status 2,
  as every ``eglr-*`` command ends it (lm-eval ends every uncaught exception with 1); lm-eval's own errors keep
  theirs.

What another model's run still passes through: the functions ``TaskManager.__init__``, ``log_experiment_args``
and ``simple_evaluate`` are wrappers, so that an exception raised inside lm-eval's own code under one of them
shows one more traceback frame (this module's) than without the project; a method read on an instance
(``process_tasks``, the two saves) adds none.

Light on purpose (the ``.pth`` imports it at interpreter start through ``autoload``): everything beyond the
standard library is imported when a hook runs.
"""

from __future__ import annotations

import functools
import importlib
import logging
import sys

MODEL_NAME = "eglr-hf"
MODEL_TARGET = "eglr_harness.harness.model:EglrHFLM"
# EGLR inside vLLM (docs/vllm.md): a placeholder too; vLLM is imported only when a run names it
VLLM_MODEL_NAME = "eglr-vllm"
VLLM_MODEL_TARGET = "eglr_harness.harness.vllm_model:EglrVLLM"
OUR_MODELS = (MODEL_NAME, VLLM_MODEL_NAME)
# the baselines' model (greedy and beam search as lm-eval's hf decodes them, with stop strings per row and each
# answer's finish and cost recorded): an hf model, so lm-eval treats its runs as hf's (not one of OUR_MODELS)
BASELINE_MODEL_NAME = "eglr-baseline"
BASELINE_MODEL_TARGET = "eglr_harness.harness.baseline_model:BaselineHFLM"
_OUR_MODEL_CLASSES = ("EglrHFLM", "EglrVLLM")
# the models whose runs get the project's interrupt line (what was stored, the resuming command) and its exit
# status: OUR_MODELS and the baselines'; every other model's run is stopped by a signal as lm-eval's own run is
PROJECT_MODELS = (*OUR_MODELS, BASELINE_MODEL_NAME)
_PROJECT_MODEL_CLASSES = (*_OUR_MODEL_CLASSES, "BaselineHFLM")
_TASK_MANAGERS: dict = {}


# name -> lazy "module:Class" placeholder; pyproject.toml's `lm_eval.models` entry points say the same
MODELS = {MODEL_NAME: MODEL_TARGET, VLLM_MODEL_NAME: VLLM_MODEL_TARGET, BASELINE_MODEL_NAME: BASELINE_MODEL_TARGET}


def register_models(registry_module) -> None:
    """``eglr-hf``, ``eglr-vllm`` and ``eglr-baseline`` in lm-eval's model registry (:data:`MODELS`), unless this
    lm-eval reads them from the package's ``lm_eval.models`` entry points itself (:func:`reads_model_entry_points`):
    one registration either way. Then our filters, metrics and aggregations."""
    # lm-eval 0.4.13 registers its own models (hf, vllm, ...) only while the registry is empty,
    # so they must be in before ours. lm_eval.models is light: a name -> "module:Class" table.
    importlib.import_module("lm_eval.models")
    if not reads_model_entry_points(registry_module):
        registry = registry_module.model_registry
        for name, target in MODELS.items():
            if name not in registry:
                registry.register(name, target=target)
    importlib.import_module("eglr_harness.harness.registry")


def reads_model_entry_points(registry_module) -> bool:
    """Whether this lm-eval finds models through the ``lm_eval.models`` entry-point group (its registry module has
    ``load_plugins``: lm-eval after 0.4.13); 0.4.13 has no plugin discovery."""
    return callable(getattr(registry_module, "load_plugins", None))


def _is_ours(model) -> bool:
    """Whether ``model`` (a registered name or an LM object) is one of the project's models."""
    return model in OUR_MODELS if isinstance(model, str) else type(model).__name__ in _OUR_MODEL_CLASSES


class _ForOurRuns:
    """A method that is lm-eval's own for every run but the project's: the choice is made when the attribute is
    read (``is_ours(instance)``), so that another model's call, and its traceback, never passes through the
    project's code. Read on the class, it is itself, with lm-eval's original as ``__wrapped__``."""

    def __init__(self, original, ours, is_ours):
        functools.update_wrapper(self, original)  # __name__, __doc__ ..., and __wrapped__ = original
        self._ours = ours
        self._is_ours = is_ours

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        method = self._ours if self._is_ours(instance) else self.__wrapped__
        return method.__get__(instance, owner)


def _is_project_model(model) -> bool:
    """Whether ``model`` (a registered name or an LM object) is one of :data:`PROJECT_MODELS`."""
    return model in PROJECT_MODELS if isinstance(model, str) else type(model).__name__ in _PROJECT_MODEL_CLASSES


def _names_our_tasks(tasks) -> bool:
    from eglr_harness.core.resources import names_of_tasks, task_names

    return not set(names_of_tasks(tasks)).isdisjoint(task_names())


# ------------------------------------------------------------------ TaskManager.__init__
def index_our_tasks(manager_module) -> None:
    """lm-eval 0.4.13 discovers no task plugins: our folder goes first in every manager's ``include_path``."""
    task_manager_cls = manager_module.TaskManager
    if getattr(task_manager_cls, "_eglr_patched", False):
        return
    original_init = task_manager_cls.__init__

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
    logging.getLogger("lm_eval.api.task").addFilter(_METADATA_HINT)


class _OurTasksMetadataHint(logging.Filter):
    """lm-eval warns "TASK: Custom kwargs can be passed to `--metadata` ... For example
    --metadata='{"max_seq_lengths":[4096, 8192]}'" whenever a task builds its dataset in Python, as each of ours does,
    on every run. Dropped for the project's tasks only (a record naming any other task passes)."""

    HINT = ": Custom kwargs can be passed to `--metadata`"

    def __init__(self):
        super().__init__()
        self._ours: frozenset[str] | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.msg if isinstance(record.msg, str) else ""
        task, hint, _ = message.partition(self.HINT)
        if not hint:
            return True
        if self._ours is None:
            from eglr_harness.core.resources import task_names

            self._ours = frozenset(task_names())
        return task not in self._ours


_METADATA_HINT = _OurTasksMetadataHint()


def _last_task_manager():
    """The ``TaskManager`` lm-eval made last (for the close names of a task that is not found), or None."""
    return _TASK_MANAGERS.get("last")


# ------------------------------------------------------------------ the tracker
def patch_run_names(tracker_module) -> None:
    """lm-eval names a run folder after ``_get_model_name(model_args)``: an eglr run through a GGUF would be named
    after its path, one through a preset after a random id."""
    tracker_cls = tracker_module.GeneralConfigTracker
    if getattr(tracker_cls, "_eglr_patched", False):
        return
    original = tracker_cls.log_experiment_args

    @functools.wraps(original)
    def log_experiment_args(self, model_source, model_args, *args, **kwargs):
        original(self, model_source, model_args, *args, **kwargs)
        if not _an_eglr_run(self):
            return
        from eglr_harness.run.model_names import parse_model_args, run_folder_name

        parsed = parse_model_args(model_args) if isinstance(model_args, (str, dict)) else {}
        name = run_folder_name(parsed) if parsed.get("model_config") or parsed.get("gguf_file") else None
        if name:
            self.model_name = name
            self.model_name_sanitized = tracker_module.sanitize_model_name(name)

    tracker_cls.log_experiment_args = log_experiment_args
    tracker_cls._eglr_patched = True


def patch_tracker(tracker_module) -> None:
    """eglr runs named after the model; their results and samples written whole or failing the run
    (``harness/output.py``)."""
    from eglr_harness.harness import output

    patch_run_names(tracker_module)
    tracker_cls = tracker_module.EvaluationTracker
    if getattr(tracker_cls, "_eglr_patched", False):
        return
    for name, save in (("save_results_aggregated", output.save_results_aggregated),
                       ("save_results_samples", output.save_results_samples)):
        original = getattr(tracker_cls, name)
        setattr(tracker_cls, name, _ForOurRuns(original, output.whole_or_failing(original, save),
                                               lambda tracker: _an_eglr_run(tracker.general_config_tracker)))
    tracker_cls._eglr_patched = True


def _an_eglr_run(config_tracker) -> bool:
    """Whether a ``GeneralConfigTracker`` logs a run of our models, or one ``simple_evaluate`` found to name our
    tasks (``hf`` on ``gsm8k_eglr``: the leaderboard's baselines)."""
    return getattr(config_tracker, "model_source", None) in OUR_MODELS or getattr(config_tracker, "_eglr_tasks", False)


# ------------------------------------------------------------------ simple_evaluate
def patch_fail_fast(evaluator_module) -> None:
    """lm-eval's ``simple_evaluate`` loads the model before it reads a task: check an eglr run first
    (its arguments, ``--use_cache``, ``--output_path``, the tasks' pools and local data files), for Python
    callers too."""
    original = evaluator_module.simple_evaluate
    if getattr(original, "_eglr_patched", False):
        return

    @functools.wraps(original)
    def simple_evaluate(*args, **kwargs):
        model = kwargs.get("model", args[0] if args else None)
        tasks = kwargs.get("tasks")
        ours = _is_ours(model)
        if not ours and not _names_our_tasks(tasks):
            return original(*args, **kwargs)
        from eglr_harness.harness.output import check_output_path, install_user_error_hook

        # first: Ctrl-C during the imports below (torch: seconds) is one line too; another model's signals its own
        install_user_error_hook(interrupts=_is_project_model(model), hint=resume_hint)
        from eglr_harness.data.loading import check_local_data
        from eglr_harness.harness.preflight import check_run_args, check_run_tasks

        hf_run = model == MODEL_NAME or type(model).__name__ == "EglrHFLM"
        tracker = kwargs.get("evaluation_tracker")
        if tracker is not None:  # its folder named and its files saved as an eglr run's
            tracker.general_config_tracker._eglr_tasks = True
        if ours:
            check_output_path(getattr(tracker, "output_path", None))
            _refuse_use_cache(model, kwargs.get("use_cache"))
        metadata = kwargs.get("metadata")
        tasks = tasks if isinstance(tasks, (list, tuple)) else [tasks]
        data_dir = metadata.get("eglr_data_dir") if isinstance(metadata, dict) else None  # as the tasks read it
        if hf_run:  # everything that can be known before the model loads (harness/preflight.py)
            model_args = kwargs.get("model_args") if model == MODEL_NAME else None
            eglr_args = check_run_args(model_args, gen_kwargs=kwargs.get("gen_kwargs"), limit=kwargs.get("limit"),
                                       passed=_passed_to_model(kwargs.get))
            check_run_tasks(eglr_args, tasks, log_samples=kwargs.get("log_samples"),
                            output_path=getattr(tracker, "output_path", None), data_dir=data_dir)
        else:
            check_local_data(tasks, data_dir)  # before the model loads
        if hf_run and kwargs.get("gen_kwargs"):  # lm-eval warns about do_sample whenever --gen_kwargs is given
            logging.getLogger("lm_eval.eglr_hf").info(
                "eglr-hf: lm-eval's warning \"Ensure 'do_sample=True' for non-greedy decoding\" does not apply: "
                "eglr-hf sets do_sample per cell of the pool (cells with T > 0 draw from their own seeded streams).")
        return original(*args, **kwargs)

    simple_evaluate._eglr_patched = True
    evaluator_module.simple_evaluate = simple_evaluate


def _refuse_use_cache(model, use_cache) -> None:
    """lm-eval's ``--use_cache`` would answer a pool's repeats of one (context, gen_kwargs) with one rollout: refused
    for either of our models, the one place for a command line (eglr-hf's ``set_cache_hook`` refuses a cache handed
    to a model built by hand)."""
    if use_cache:
        from eglr_harness.core.errors import RunArgError
        from eglr_harness.core.model_args import use_cache_refusal

        if not isinstance(model, str):  # a model object lm-eval was handed
            model = VLLM_MODEL_NAME if type(model).__name__ == "EglrVLLM" else MODEL_NAME
        raise RunArgError(use_cache_refusal(model))


def _passed_to_model(get) -> dict:
    """What lm-eval hands a model beside its model args (``create_from_arg_string``'s additional config)."""
    return {name: get(name) for name in ("device", "batch_size", "max_batch_size")}


# ------------------------------------------------------------------ EvaluatorConfig.process_tasks
def patch_task_lookup(config_module) -> None:
    """An eglr run's model args, ``--output_path`` (and ``rollout_cache`` folder) checked before lm-eval indexes
    its tasks; lm-eval's "Tasks not found: x" with the closest task names (``aime_eglr_sc`` -> ``aime24_eglr_sc``)."""
    config_cls = config_module.EvaluatorConfig
    if getattr(config_cls, "_eglr_patched", False):
        return
    original = config_cls.process_tasks

    @functools.wraps(original)
    def process_tasks(self, *args, **kwargs):
        model = getattr(self, "model", None)
        from eglr_harness.harness.output import check_output_path, install_user_error_hook

        install_user_error_hook(hint=resume_hint)  # first: Ctrl-C during preflight's torch import is one line too
        from eglr_harness.harness.preflight import check_run_args, check_run_tasks

        check_output_path(getattr(self, "output_path", None))  # as lm-eval's CLI makes the tracker, before the rest
        eglr_args = None
        if model in OUR_MODELS:
            _refuse_use_cache(model, getattr(self, "use_cache", None))
        if model == MODEL_NAME:  # before lm-eval indexes every task (~10 s): the run's own arguments
            eglr_args = check_run_args(getattr(self, "model_args", None), gen_kwargs=getattr(self, "gen_kwargs", None),
                                       limit=getattr(self, "limit", None),
                                       passed=_passed_to_model(lambda name: getattr(self, name, None)))
        if model == MODEL_NAME:  # lm-eval says nothing while it indexes every task (tens of seconds on a CPU)
            logging.getLogger("lm_eval.eglr_hf").info("eglr-hf: arguments checked; lm-eval is indexing its tasks ...")
        try:
            manager = original(self, *args, **kwargs)
        except ValueError as err:
            message = str(err)
            if not message.startswith("Tasks not found: ") or _last_task_manager() is None:
                raise
            from eglr_harness.core.errors import RunArgError
            from eglr_harness.core.model_args import close_task_names

            missing = message.removeprefix("Tasks not found: ").split(", ")
            hints = [f"{name} -> did you mean {', '.join(close)}?"
                     for name, close in close_task_names(missing, _last_task_manager().all_tasks).items() if close]
            raise RunArgError("; ".join([f"`--tasks`: {message}", *hints])) from None
        if model == MODEL_NAME:  # the tasks are known now; the model is not loaded yet
            metadata = getattr(self, "metadata", None)
            check_run_tasks(eglr_args, self.tasks, log_samples=getattr(self, "log_samples", False),
                            output_path=getattr(self, "output_path", None),
                            data_dir=metadata.get("eglr_data_dir") if isinstance(metadata, dict) else None)
        return manager

    config_cls.process_tasks = _ForOurRuns(original, process_tasks, lambda config: _is_ours(config.model))
    config_cls._eglr_patched = True


def _check_local_data_first(cli_args) -> None:
    """The local data files of the eglr tasks of a command line (``cli_args``: its parsed flags), read before lm-eval
    imports torch (minutes on a busy CPU), where ``EGLR_DATA_DIR`` names the folder and no ``--metadata`` might name
    another; otherwise the data are checked with the run's other task checks (``check_run_tasks``)."""
    from eglr_harness.data.loading import check_local_data, data_dir_from_env

    tasks = getattr(cli_args, "tasks", None) or []
    if getattr(cli_args, "metadata", None) or data_dir_from_env() is None:
        return
    written = [tasks] if isinstance(tasks, str) else [t for t in tasks if isinstance(t, str)]
    check_local_data([name.strip() for text in written for name in text.split(",") if name.strip()])


# ------------------------------------------------------------------ HarnessCLI.execute (exit status)
USER_ERROR_STATUS = 2  # a refusal's exit status in every command of the project (docs/lm-eval.md#exit-status)


def patch_cli_exit_status(cli_module) -> None:
    """The ``lm_eval`` command ends an uncaught exception with exit status 1, ours included; a ``UserError`` (only
    the project raises one) ends it with :data:`USER_ERROR_STATUS` after its one line, as in the ``eglr-*``
    commands, so that one refusal has one status whichever command meets it. Only for a command line that names one
    of the project's models: any other run's ``execute``, and its traceback, is lm-eval's own (``_ForOurRuns``)."""
    cli_cls = cli_module.HarnessCLI
    if getattr(cli_cls, "_eglr_patched", False):
        return
    original = cli_cls.execute

    def execute(self, *args, **kwargs):
        try:
            _check_local_data_first(args[0] if args else kwargs.get("args"))  # before lm-eval imports torch
            return original(self, *args, **kwargs)
        except Exception as err:
            from eglr_harness.core.errors import UserError

            if not isinstance(err, UserError):
                raise
            from eglr_harness.harness.output import say_user_error

            say_user_error(err)
            raise SystemExit(USER_ERROR_STATUS) from None

    cli_cls.execute = _ForOurRuns(original, execute, lambda cli: _command_line_names_our_model(sys.argv[1:]))
    cli_cls._eglr_patched = True


def _command_line_names_our_model(argv: list[str]) -> bool:
    """Whether ``argv`` names one of :data:`OUR_MODELS` (``--model eglr-hf``, ``--model=eglr-vllm``): read when
    ``execute`` is looked up, before the CLI has parsed anything it could tell."""
    return command_line_names_model(argv, OUR_MODELS)


def command_line_names_model(argv: list[str], models: tuple[str, ...] = PROJECT_MODELS) -> bool:
    """Whether the ``lm_eval`` command line ``argv`` (without the program) names one of ``models`` as its
    ``--model``."""
    return command_line_model(argv) in models


def command_line_model(argv: list[str]) -> str | None:
    """The ``--model`` of the ``lm_eval`` command line ``argv`` (``--model eglr-hf`` or ``--model=eglr-hf``; the first
    counts), None where it names none."""
    for i, arg in enumerate(argv):
        if arg == "--model" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--model="):
            return arg.split("=", 1)[1]
    return None


RESUME_HINT = "Add rollout_cache=DIR to --model_args to keep finished rollouts, so that a rerun resumes."


def resume_hint(argv: list[str]) -> str | None:
    """For an interrupted ``lm_eval`` run of eglr-hf or eglr-vllm with no rollout store: how to make a rerun resume
    (:data:`RESUME_HINT`); None for any other command line."""
    if not command_line_names_model(argv, OUR_MODELS):
        return None
    model_args = next((arg.split("=", 1)[1] if arg.startswith("--model_args=") else argv[i + 1]
                       for i, arg in enumerate(argv)
                       if arg.startswith("--model_args=") or (arg == "--model_args" and i + 1 < len(argv))), "")
    return None if "rollout_cache" in model_args else RESUME_HINT


# The lm-eval attributes the hooks rebind, each kept as ``__wrapped__`` (why: the module docstring).
PATCHED = (
    "lm_eval.tasks.manager.TaskManager.__init__",  # task indexing: our task folder in every include_path
    "lm_eval.loggers.evaluation_tracker.GeneralConfigTracker.log_experiment_args",  # run folder named after the model
    "lm_eval.loggers.evaluation_tracker.EvaluationTracker.save_results_aggregated",  # written whole or failing
    "lm_eval.loggers.evaluation_tracker.EvaluationTracker.save_results_samples",  # written whole or failing
    "lm_eval.evaluator.simple_evaluate",  # an eglr run checked before the model loads
    "lm_eval.config.evaluate_config.EvaluatorConfig.process_tasks",  # the same before task indexing; close names
    "lm_eval._cli.harness.HarnessCLI.execute",  # our refusals exit 2, as in the eglr-* commands
)

# lm-eval module -> what runs right after lm-eval imports it (harness/autoload.py)
POST_IMPORT = {
    "lm_eval.api.registry": register_models,
    "lm_eval.tasks.manager": index_our_tasks,
    "lm_eval.loggers.evaluation_tracker": patch_tracker,
    "lm_eval.evaluator": patch_fail_fast,
    "lm_eval.config.evaluate_config": patch_task_lookup,
    "lm_eval._cli.harness": patch_cli_exit_status,
}
