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


def test_the_entry_points_a_newer_lm_eval_reads_are_the_hooks_models():
    """pyproject.toml's `lm_eval.models` group (lm-eval after 0.4.13 reads it) names what the hook registers on
    0.4.13."""
    from eglr_harness.harness.lm_eval_patches import MODELS

    ours = {ep.name: ep.value for ep in metadata.entry_points(group="lm_eval.models")
            if ep.value.startswith("eglr_harness.")}
    assert ours == MODELS


def _fresh_registry_module(**attrs):
    from types import SimpleNamespace

    from lm_eval.api.registry import Registry

    return SimpleNamespace(model_registry=Registry("model"), **attrs)


def test_lm_eval_0_4_13_has_no_entry_point_loader_so_the_hook_registers_each_model_once():
    import lm_eval.api.registry as installed

    from eglr_harness.harness.lm_eval_patches import MODELS, reads_model_entry_points, register_models

    assert not reads_model_entry_points(installed)  # an lm-eval that reads the group: the hook must step aside
    module = _fresh_registry_module()
    register_models(module)
    register_models(module)  # idempotent
    assert {name: module.model_registry._objs[name] for name in MODELS} == MODELS


def test_where_lm_eval_reads_the_entry_points_the_hook_registers_no_model():
    """lm-eval's main branch (`load_plugins(group, registry)`) registers each entry point itself (its registry
    refuses a name registered twice under two placeholders): one registration either way."""
    from eglr_harness.harness.lm_eval_patches import MODELS, register_models

    def load_plugins(group, registry):  # the shape of lm-eval's loader: an entry point's name and itself
        for ep in metadata.entry_points(group=group):
            registry.register(ep.name, target=ep)
        return [ep.name for ep in metadata.entry_points(group=group)]

    module = _fresh_registry_module(load_plugins=load_plugins)
    register_models(module)
    assert not set(MODELS) & set(module.model_registry.keys())
    assert set(MODELS) <= set(load_plugins("lm_eval.models", module.model_registry))
    assert {name: module.model_registry._objs[name].value for name in MODELS} == MODELS


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


@pytest.mark.parametrize("argv, installed", [
    (["/venv/lib/python3.11/site-packages/lm_eval/__main__.py", "run", "--model", "eglr-hf"], True),
    (["/venv/bin/lm_eval", "--model=eglr-baseline"], True),
    (["/venv/bin/lm_eval", "--model", "hf"], False),  # another model's signals are lm-eval's own
    (["/home/me/my_script.py", "--model", "eglr-hf"], False)])
def test_the_lm_eval_command_gets_its_interrupt_line_before_lm_eval_imports_torch(monkeypatch, argv, installed):
    """Ctrl-C in lm_eval's first ~15 s (importing torch, before any eglr code ran) printed a 36-48-line traceback.
    The hook goes in when lm-eval imports its first module that the project patches, for a run of the project's
    models only."""
    import signal
    import sys

    from eglr_harness.harness import autoload

    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as a fresh process has it, whatever ran before here
    try:
        autoload._PostImportFinder().find_spec("lm_eval.api.registry", None)
        assert bool(getattr(sys.excepthook, "_eglr_user_errors", None)) is installed
        assert (signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL) is installed
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_installing_asks_for_no_extra_that_a_dependency_does_not_provide():
    """`pip install .` warned "latex2sympy2-extended 1.11.0 does not provide the extra 'antlr4_11_0'": math-verify's
    antlr4-11-0 extra names its dependency's extra in a spelling pip 23 does not match. Every extra the project asks
    for, and every extra those extras ask for in turn, is one the package lists, spelt as it lists it."""
    from packaging.requirements import Requirement

    def asked(dist: str, extras: set[str]) -> list[Requirement]:
        marker_env = [{"extra": extra} for extra in extras] or [{"extra": ""}]
        return [req for req in map(Requirement, metadata.requires(dist) or [])
                if req.marker is None or any(req.marker.evaluate(env) for env in marker_env)]

    seen, todo = set(), [("eglr-harness", frozenset())]
    while todo:
        dist, extras = todo.pop()
        for req in asked(dist, set(extras)):
            if not req.extras or (req.name, frozenset(req.extras)) in seen:
                continue
            seen.add((req.name, frozenset(req.extras)))
            provided = set(metadata.metadata(req.name).get_all("Provides-Extra") or [])
            assert set(req.extras) <= provided, f"{dist} asks {req.name} for {req.extras}; it provides {provided}"
            todo.append((req.name, frozenset(req.extras)))
