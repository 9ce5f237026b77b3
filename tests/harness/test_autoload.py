"""The stock lm_eval finds eglr-hf and our tasks without flags, and only when asked to."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata

import pytest

from eglr_harness.core.resources import tasks_dir


def _python(code: str, **env) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env={**os.environ, **env}, cwd="/")
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip()


def test_interpreter_start_imports_no_torch_and_installs_the_hook():
    out = _python("import sys; print('torch' in sys.modules, 'transformers' in sys.modules, "
                  "'eglr_harness.harness.autoload' in sys.modules)")
    assert out == "False False True"


def test_stock_registry_resolves_eglr_hf_lazily():
    out = _python("from lm_eval.api.registry import get_model; import sys; "
                  "print('eglr_harness.harness.model' in sys.modules); print(get_model('eglr-hf').__name__)")
    assert out.splitlines() == ["False", "EglrHFLM"]


def test_task_manager_indexes_our_tasks_without_include_path():
    out = _python("from lm_eval.tasks import TaskManager; import json; tm = TaskManager(); "
                  "print(json.dumps([str(p) for p in tm.include_path]))")
    assert str(tasks_dir()) in json.loads(out)


def test_autoload_can_be_switched_off():
    out = _python("from lm_eval.api.registry import model_registry; print('eglr-hf' in model_registry)",
                  EGLR_AUTOLOAD="0")
    assert out == "False"


def test_entry_point_for_newer_lm_eval_is_declared():
    eps = metadata.entry_points(group="lm_eval.models")
    assert {ep.name: ep.value for ep in eps}.get("eglr-hf") == "eglr_harness.harness.model:EglrHFLM"


def test_regular_install_ships_tasks_presets_and_pth():
    dist = metadata.distribution("eglr-harness")
    direct = dist.read_text("direct_url.json")
    if direct and json.loads(direct).get("dir_info", {}).get("editable"):
        pytest.skip("editable install: resources come from the source tree (CI installs a regular wheel)")
    files = {str(f) for f in dist.files}
    assert "eglr_harness_autoload.pth" in files
    assert any(f.startswith("eglr_harness/_resources/tasks/") and f.endswith(".yaml") for f in files)
    assert any(f.startswith("eglr_harness/_resources/model_configs/") for f in files)
    assert "_resources" in str(tasks_dir())


def test_stock_models_stay_available_beside_ours():
    out = _python("from lm_eval.api.registry import get_model; print(get_model('hf').__name__, "
                  "get_model('eglr-hf').__name__)")
    assert out == "HFLM EglrHFLM"


def test_our_filters_are_registered_for_task_yamls():
    out = _python("from lm_eval.api.registry import filter_registry; print(' '.join(filter_registry.keys()))")
    assert {"eglr_extract_answer", "eglr_majority_vote", "eglr_oracle"} <= set(out.split())


@pytest.mark.parametrize("argv0, installed", [("/venv/lib/python3.11/site-packages/lm_eval/__main__.py", True),
                                              ("/venv/bin/lm_eval", True), ("/home/me/my_script.py", False)])
def test_the_lm_eval_command_gets_its_interrupt_line_before_lm_eval_imports_torch(monkeypatch, argv0, installed):
    """Issue 55, item 18: Ctrl-C in lm_eval's first ~15 s (importing torch, before any eglr code ran) printed a
    36-48-line traceback. The hook goes in when lm-eval imports its first module that the project patches."""
    import signal
    import sys

    from eglr_harness.harness import autoload

    monkeypatch.setattr(sys, "argv", [argv0, "run"])
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        autoload._PostImportFinder().find_spec("lm_eval.api.registry", None)
        assert getattr(sys.excepthook, "_eglr_user_errors", False) is installed
    finally:
        signal.signal(signal.SIGTERM, previous)
