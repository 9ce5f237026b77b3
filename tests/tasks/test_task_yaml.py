"""Every task YAML loads through lm-eval's TaskManager; the README's pool table matches pool.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers.markdown_tables import markdown_table

from eglr_harness.core.config import DEFAULT_L
from eglr_harness.core.specs import parse_L_spec, parse_T_spec
from eglr_harness.run.pool import resolve_pool, task_axes

TASKS_DIR = Path(__file__).resolve().parents[2] / "tasks"
BENCHES = ("gsm8k", "math500", "minerva_math", "amc23", "aime24", "aime25")
VARIANTS = {"": 1, "_sc": 10, "_lxt": 121}
ALL_TASKS = [f"{b}_eglr{v}" for b in BENCHES for v in VARIANTS] + ["eglr_demo", "eglr_demo_sc", "eglr_demo_lxt"]
GROUPS = {"eglr_math": "", "eglr_math_sc": "_sc", "eglr_math_lxt": "_lxt"}


@pytest.fixture(scope="module")
def loaded(task_manager):
    return task_manager.load(list(GROUPS) + ["eglr_demo", "eglr_demo_sc", "eglr_demo_lxt"])


def test_every_task_and_group_is_indexed(task_manager):
    assert set(ALL_TASKS) <= set(task_manager.all_subtasks)
    assert set(GROUPS) <= set(task_manager.all_groups)


def test_every_task_loads_with_local_data(loaded):
    tasks = loaded["tasks"]
    assert set(tasks) == set(ALL_TASKS)
    for name, task in tasks.items():
        repeats = {"eglr_demo": 1, "eglr_demo_sc": 10,
                   "eglr_demo_lxt": 121}.get(name) or VARIANTS[name.split("_eglr")[1]]
        assert task.config.repeats == repeats, name
        doc = task.eval_docs[0]
        prompt = task.doc_to_text(doc)
        assert prompt.startswith(doc["problem"].strip())
        assert prompt.endswith("Please reason step by step, and put your final answer within \\boxed{}.")
        assert task.doc_to_target(doc) == doc["answer"]
        kwargs = task.config.generation_kwargs
        assert kwargs["max_gen_toks"] == (256 if name.startswith("eglr_demo") else 3072), name
        assert kwargs["do_sample"] is False
        assert "<|im_end|>" in kwargs["until"] and "<|eot_id|>" in kwargs["until"]
        assert [f.name for f in task._filters][0] == "pool"


def test_counts_carry_no_better_direction(loaded):
    # lm-eval's table draws an arrow for True/False; the number of rollouts scored is neither better nor worse
    for name, task in loaded["tasks"].items():
        directions = task.higher_is_better()
        assert directions["rollouts"] is None, name
        assert directions["acc"] is True, name


def test_pool_keys_per_variant(loaded):
    for name, task in loaded["tasks"].items():
        axes = task_axes(task.config.generation_kwargs)
        if name.endswith("_sc"):
            assert axes["eglr_L"] == tuple(range(1, 11)) and axes["eglr_T"] == (0.0,)
            assert axes["eglr_budget_T"] == tuple(round(0.1 * i, 6) for i in range(1, 11))
        elif name.endswith("_lxt"):
            assert axes["eglr_L"] == tuple(range(11)) and len(axes["eglr_T"]) == 11
        else:
            assert all(v is None for v in axes.values()), name


def test_groups(loaded):
    for group, variant in GROUPS.items():
        children = [t.task_name for t in loaded["groups"][group].get_all_tasks()]
        assert children == [f"{b}_eglr{variant}" for b in BENCHES]


def test_templates_share_generation_settings():
    """generation_kwargs are copied whole (YAML includes merge shallowly): the copies must agree."""
    from lm_eval.tasks._yaml_loader import load_yaml

    def settings(path):
        kwargs = load_yaml(path, resolve_func=False)["generation_kwargs"]
        return {k: v for k, v in kwargs.items() if not k.startswith("eglr_")}, \
               {k: v for k, v in kwargs.items() if k.startswith("eglr_")}

    base, _ = settings(TASKS_DIR / "_eglr_base_yaml")
    sc_plain, sc_pool = settings(TASKS_DIR / "_eglr_sc_yaml")
    lxt_plain, _ = settings(TASKS_DIR / "_eglr_lxt_yaml")
    assert sc_plain == base and lxt_plain == base
    demo_plain, demo_pool = settings(TASKS_DIR / "demo" / "eglr_demo.yaml")
    demo_sc_plain, demo_sc_pool = settings(TASKS_DIR / "demo" / "eglr_demo_sc.yaml")
    assert demo_plain == demo_sc_plain == {**base, "max_gen_toks": 256}
    assert demo_pool == {} and demo_sc_pool == sc_pool


def test_demo_runs_without_data_dir(monkeypatch):
    from lm_eval.tasks import TaskManager

    monkeypatch.delenv("EGLR_DATA_DIR", raising=False)
    tasks = TaskManager(include_path=str(TASKS_DIR), include_defaults=False).load(["eglr_demo"])["tasks"]
    assert len(tasks["eglr_demo"].eval_docs) == 50


def test_demo_size_from_metadata():
    from lm_eval.tasks import TaskManager

    tm = TaskManager(include_path=str(TASKS_DIR), include_defaults=False, metadata={"eglr_demo_n": 12})
    assert len(tm.load(["eglr_demo"])["tasks"]["eglr_demo"].eval_docs) == 12


def test_demo_levels_from_metadata():
    from lm_eval.tasks import TaskManager

    tm = TaskManager(include_path=str(TASKS_DIR), include_defaults=False,
                     metadata={"eglr_demo_n": 4, "eglr_demo_levels": "2,4"})
    docs = tm.load(["eglr_demo_lxt"])["tasks"]["eglr_demo_lxt"].eval_docs
    assert [d["id"] for d in docs] == ["demo-1333-0001", "demo-1333-0003", "demo-1333-0006", "demo-1333-0008"]
    with pytest.raises(ValueError, match="`demo_levels`='9'"):
        TaskManager(include_path=str(TASKS_DIR), include_defaults=False,
                    metadata={"eglr_demo_levels": "9"}).load(["eglr_demo"])


# --------------------------------------------------------------------------- README pool table

def _readme_pool_rows():
    table = markdown_table((TASKS_DIR / "README.md").read_text(), "| task | `--model_args` | L axis | T axis | cells |")
    rows = [[cell.strip("`") for cell in cells] for cells in table[1:]]  # after the header
    assert len(rows) >= 8
    return rows


def _model_args(text: str) -> dict:
    if text == "(none)":
        return {}
    return dict(part.split("=", 1) for part in text.split(","))


@pytest.mark.parametrize("row", _readme_pool_rows(), ids=lambda r: f"{r[0]}[{r[1]}]")
def test_readme_pool_table_matches_pool_rule(row, task_manager):
    task_name, args_text, L_text, T_text, cells = row
    task = task_manager.load([task_name])["tasks"][task_name]
    args = _model_args(args_text)
    kwargs = dict(
        user_L=parse_L_spec(args["L"]) if "L" in args else None,
        user_T=parse_T_spec(args["T"]) if "T" in args else None,
        task=task_axes(task.config.generation_kwargs),
        default_L=DEFAULT_L, default_T=0.0, repeats=task.config.repeats, task_name=task_name,
    )
    if cells == "error":
        with pytest.raises(ValueError, match=task_name):
            resolve_pool(**kwargs)
        return
    plan = resolve_pool(**kwargs)
    expected = tuple((L, T) for L in parse_L_spec(L_text) for T in parse_T_spec(T_text))
    assert plan.cells == expected
    assert len(plan.cells) == int(cells)


# --------------------------------------------------------------------------- import weight

def test_registry_module_is_light():
    probe = (
        "import sys\n"
        "import eglr_harness.harness.registry\n"
        "heavy = [m for m in ('torch', 'math_verify', 'sympy', 'transformers', 'datasets') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"heavy imports: {out.stdout}"


def test_registry_survives_import_from_the_registry_hook():
    """The lead's autoload will import our registry right after lm_eval.api.registry is imported,
    possibly while lm_eval.api.metrics is itself importing it; lm-eval's built-ins must survive."""
    probe = (
        "import importlib, eglr_harness.harness.autoload as a\n"
        "a.install()\n"
        "orig = a.POST_IMPORT['lm_eval.api.registry']\n"
        "def hook(m):\n"
        "    orig(m); importlib.import_module('eglr_harness.harness.registry')\n"
        "a.POST_IMPORT['lm_eval.api.registry'] = hook\n"
        "import lm_eval.api.metrics\n"
        "from lm_eval.api.registry import get_aggregation, get_filter, get_metric\n"
        "assert get_aggregation('mean') is not None and get_aggregation('eglr_best_cfg_acc') is not None\n"
        "assert get_filter('eglr_extract_answer') and get_metric('exact_match') and get_metric('eglr_exact_match')\n"
        "from lm_eval.api.registry import get_metric_aggregation\n"
        "assert get_metric_aggregation('eglr_exact_match') is lm_eval.api.metrics.mean\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env={**__import__('os').environ, "EGLR_AUTOLOAD": "1"})
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]
