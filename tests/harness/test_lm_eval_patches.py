"""Each lm-eval attribute the autoload hook rebinds (``harness/lm_eval_patches.py``, ``harness/output.py``) is
rebound because lm-eval 0.4.13 does something we must work around; these tests pin that something in
lm-eval's own code (the original, reached through ``__wrapped__``). When one fails after an lm-eval
upgrade, lm-eval changed what the patch relies on or works around: drop or rewrite that patch.
"""

from __future__ import annotations

import inspect
import logging

import pytest
from lm_eval import evaluator
from lm_eval._cli.harness import HarnessCLI
from lm_eval.config.evaluate_config import EvaluatorConfig
from lm_eval.loggers import evaluation_tracker
from lm_eval.tasks.manager import TaskManager

from eglr_harness.harness import lm_eval_patches

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)

Tracker = evaluation_tracker.EvaluationTracker


def original(function):
    """lm-eval's own function under our patch (every patch keeps it as ``__wrapped__``)."""
    assert hasattr(function, "__wrapped__"), f"{function.__qualname__} is not patched (autoload off?)"
    return function.__wrapped__


def test_every_patched_attribute_keeps_lm_evals_original():
    patched = [TaskManager.__init__, evaluation_tracker.GeneralConfigTracker.log_experiment_args,
               Tracker.save_results_aggregated, Tracker.save_results_samples, evaluator.simple_evaluate,
               EvaluatorConfig.process_tasks, HarnessCLI.execute]
    assert len(patched) == len(lm_eval_patches.PATCHED)  # the list in lm_eval_patches is the whole list
    for function in patched:
        assert original(function).__module__.startswith("lm_eval.")


# ------------------------------------------------------------------ TaskManager.__init__ (task indexing)
def test_task_manager_takes_include_path_and_has_no_plugin_discovery():
    """The patch puts our task folder first in ``include_path`` (lm-eval 0.4.13 discovers no task plugins)
    and keeps the manager for the close names of a task not found (``all_tasks``)."""
    params = inspect.signature(original(TaskManager.__init__)).parameters
    assert "include_path" in params and params["include_path"].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert "all_tasks" in vars(TaskManager)
    assert "entry_points" not in inspect.getsource(TaskManager)  # a plugin group would make the patch redundant


# ------------------------------------------------------------------ GeneralConfigTracker.log_experiment_args
GGUF_ARGS = "gguf_file=x/SmolLM2-135M-Instruct.Q4_1.gguf"


def test_run_folder_comes_from_get_model_name():
    """The patch names an eglr run's folder after the model; it works only while lm-eval derives the folder
    (``model_name_sanitized``) in ``log_experiment_args`` from ``_get_model_name(model_args)``, with no hook."""
    config_tracker = evaluation_tracker.GeneralConfigTracker
    source = inspect.getsource(original(config_tracker.log_experiment_args))
    assert "GeneralConfigTracker._get_model_name(model_args)" in source
    assert "self.model_name_sanitized = sanitize_model_name(self.model_name)" in source
    tracker = config_tracker()
    tracker.log_experiment_args(model_source="eglr-hf", model_args=GGUF_ARGS,
                                system_instruction=None, chat_template=None, fewshot_as_multiturn=False)
    assert tracker.model_name_sanitized == "SmolLM2-135M-Instruct.Q4_1"  # ours; lm-eval's would be a path


def test_another_models_run_folder_is_lm_evals():
    """``gguf_file`` is an argument of lm-eval's own ``hf`` model too: its run keeps lm-eval's name."""
    config_tracker = evaluation_tracker.GeneralConfigTracker
    tracker = config_tracker()
    tracker.log_experiment_args(model_source="hf", model_args=f"pretrained=org/smol,{GGUF_ARGS}",
                                system_instruction=None, chat_template=None, fewshot_as_multiturn=False)
    assert tracker.model_name_sanitized == "org__smol"


# ------------------------------------------------------------------ EvaluationTracker (harness/output.py)
def test_tracker_does_not_check_its_output_path(tmp_path):
    """An eglr run's ``--output_path`` is checked for writing before the model loads (``process_tasks``,
    ``simple_evaluate``); lm-eval's tracker, left as it is, takes any path."""
    assert not hasattr(Tracker.__init__, "__wrapped__")
    blocked = tmp_path / "a_file"
    blocked.write_text("")
    tracker = Tracker(output_path=str(blocked / "out"))  # no error: the check is still needed
    assert tracker.output_path == str(blocked / "out")


@pytest.mark.parametrize("save", ["aggregated", "samples"])
def test_tracker_swallows_a_failed_write(tmp_path, caplog, save):
    """The save patches write whole files or fail the run; lm-eval's own log a warning and go on."""
    blocked = tmp_path / "a_file"
    blocked.write_text("")
    tracker = Tracker(output_path=str(blocked / "out"))
    tracker.general_config_tracker.model_name_sanitized = "m"
    tracker.date_id = "d"
    with caplog.at_level(logging.INFO):
        if save == "aggregated":
            original(Tracker.save_results_aggregated)(tracker, results={"results": {}}, samples=None)
        else:
            original(Tracker.save_results_samples)(tracker, task_name="t", samples=[])
    assert not (blocked / "out").exists()  # nothing written, nothing raised
    if save == "aggregated":
        assert "Could not save results aggregated" in caplog.text
    params = inspect.signature(original(getattr(Tracker, f"save_results_{save}"))).parameters
    assert list(params)[1:] == (["results", "samples"] if save == "aggregated" else ["task_name", "samples"])


# ------------------------------------------------------------------ simple_evaluate
def test_simple_evaluate_takes_what_the_preflight_reads():
    """The patch checks an eglr-hf run's arguments and tasks before ``simple_evaluate`` loads the model,
    reading these keywords; lm-eval 0.4.13 loads the model before it builds the tasks."""
    simple_evaluate = original(evaluator.simple_evaluate)
    params = inspect.signature(simple_evaluate).parameters
    assert {"model", "model_args", "tasks", "gen_kwargs", "limit", "use_cache", "log_samples",
            "evaluation_tracker", "metadata", "device", "batch_size", "max_batch_size"} <= set(params)
    source = inspect.getsource(simple_evaluate)
    assert source.index("create_from_arg_string") < source.index("task_manager.load(tasks)")  # the model first


# ------------------------------------------------------------------ EvaluatorConfig.process_tasks
def test_process_tasks_says_tasks_not_found_without_close_names():
    """The patch checks eglr-hf's arguments before lm-eval indexes its tasks, and adds the close task names
    to lm-eval's "Tasks not found" error, which it recognises by that text."""
    process_tasks = original(EvaluatorConfig.process_tasks)
    assert list(inspect.signature(process_tasks).parameters)[:1] == ["self"]
    source = inspect.getsource(process_tasks)
    assert "raise ValueError(f\"Tasks not found: {missing}\")" in source  # the message, after the indexing
    assert 'missing = ", ".join(task_missing)' in source  # the patch splits the names at ", "
    assert source.index("TaskManager(") < source.index("Tasks not found: ")


# ------------------------------------------------------------------ HarnessCLI.execute (exit status)
def test_the_cli_lets_every_exception_through():
    """lm-eval's command catches nothing (so Python ends it with exit status 1, ours included): the patch gives our
    refusals the status 2 of the eglr-* commands."""
    source = inspect.getsource(original(HarnessCLI.execute))
    assert "except" not in source and "exit" not in source, source


_OURS_DROPPED = ": Custom kwargs can be passed to `--metadata`"


def test_lm_evals_metadata_hint_is_dropped_for_our_tasks_only(caplog):
    """lm-eval warns "Custom kwargs can be passed to `--metadata`" on every run of a task that builds its dataset in
    Python (each of ours): the warning and its wording are lm-eval's; the project drops it for its own tasks."""
    import lm_eval.api.task as task_module

    from eglr_harness.core.resources import task_names

    source = inspect.getsource(task_module.ConfigurableTask.download)
    assert 'eval_logger.warning(\n                f"{self.config.task}' + _OURS_DROPPED in source
    logger = logging.getLogger("lm_eval.api.task")
    ours = next(iter(task_names()))
    with caplog.at_level(logging.WARNING, logger="lm_eval.api.task"):
        for task in (ours, "someone_elses_task"):
            logger.warning(f"{task}: Custom kwargs can be passed to `--metadata` in console (as json string) or to "
                           "the TaskManager.\nFor example --metadata='{\"max_seq_lengths\":[4096, 8192]}'.")
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["someone_elses_task"]
