"""A model argument's path through the code: ``EglrHFLM.__init__``'s kwargs followed from the constructor's start to
the load (lm-eval's ``HFLM.__init__``), counted as docs/architecture.md ("A model argument's path") counts it, and held
to its target; eglr's own args named in both models' signatures; the one key=value parser reads as lm-eval's."""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path

import pytest
from lm_eval.models.huggingface import HFLM

import eglr_harness
from eglr_harness.core.model_args import EGLR_ARGS, VLLM_ARGS

PACKAGE = Path(eglr_harness.__file__).resolve().parent
# the layers, lowest first (tests/test_layers.py)
LAYERS = [{"core"}, {"decoding"}, {"run"}, {"scoring"}, {"data"}, {"analysis"}, {"verify", "leaderboard", "vllm"},
          {"harness"}, {"rl"}, {"commands"}]
RANK = {folder: rank for rank, layer in enumerate(LAYERS) for folder in layer}
# a value's one reader: one stay, not followed inside (its rules, not the arguments' path)
LEAVES = {"read_model_arg", "check_load_values", "check_tau_h", "parse_L_spec", "parse_T_spec", "parse_tau_h",
          "check_layer_span", "check_pretrained_path", "EglrConfig.__post_init__", "load_preset"}
# what carries no argument: not counted (logging set-up, the error context, resource folders, the import hook)
SKIP = {"_follow_lm_eval_logging", "model_arg_errors"}
SKIP_FILES = {"core/resources.py", "harness/autoload.py"}
MAX_STAYS, MAX_CLIMBS = 24, 6  # the target (docs/architecture.md)


class _Loaded(Exception):
    pass


def follow(model_args: dict) -> list[tuple[str, str]]:
    """The package's function bodies ``EglrHFLM(**model_args)`` enters before the load, in call order, as
    ``(file, qualified name)``; a leaf's inside and the skipped ones are left out (module constants)."""
    from eglr_harness.harness.model import EglrHFLM

    calls, stack = [], []

    def profile(frame, event, arg):
        if event == "return":
            if stack:
                stack.pop()
            return
        if event != "call":
            return
        code = frame.f_code
        ours = code.co_filename.startswith(str(PACKAGE))
        rel = Path(code.co_filename).relative_to(PACKAGE).as_posix() if ours else None
        if (ours and "LEAF" not in stack and not code.co_name.startswith("<") and code.co_qualname not in SKIP
                and rel not in SKIP_FILES):
            calls.append((rel, code.co_qualname))
            stack.append("LEAF" if code.co_qualname in LEAVES else rel)
        else:
            stack.append(None)

    def loaded(self, *args, **kwargs):
        raise _Loaded

    original = HFLM.__init__
    HFLM.__init__ = loaded
    sys.setprofile(profile)
    try:
        EglrHFLM(**model_args)
    except _Loaded:
        pass
    finally:
        sys.setprofile(None)
        HFLM.__init__ = original
    return calls


def counted(calls: list[tuple[str, str]]) -> dict[str, int]:
    """stays: function bodies entered (each once); files; climbs: steps of the path (in call order) from a lower
    layer back up to a higher one; returns: steps into a file the path had left."""
    layer = lambda rel: RANK[rel.split("/")[0]]  # noqa: E731
    climbs = returns = 0
    seen: set[str] = set()
    for (before, _), (now, _) in zip([(None, None), *calls], calls):
        if before is not None and layer(now) > layer(before):
            climbs += 1
        if before is not None and now != before and now in seen:
            returns += 1
        seen.add(now)
    return {"stays": len(set(calls)), "files": len({f for f, _ in calls}), "climbs": climbs, "returns": returns}


@pytest.fixture
def preset_of_tiny_model(tiny_model_dir, tmp_path):
    preset = tmp_path / "tiny.yaml"
    preset.write_text(f"model_args:\n  pretrained: {tiny_model_dir('llama', 4)}\n  dtype: float32\n"
                      "eglr:\n  alpha: 0.5\n  L: 2\ntau_h:\n  default: 1.0\n")
    return str(preset)


def test_a_model_arguments_path_to_the_load_stays_within_its_target(preset_of_tiny_model):
    args = {"model_config": preset_of_tiny_model, "L": "1|4", "T": 0, "k_max": 2, "engine": "hook",
            "max_length": 512, "device": "cpu", "batch_size": 2}  # device, batch_size: as lm-eval's CLI hands them
    follow(args)  # a second construction, as in a CLI run after its checks: the model's config read is cached
    calls = follow(args)
    figures = counted(calls)
    path = " > ".join(f"{f}:{n}" for f, n in calls)
    assert figures["stays"] <= MAX_STAYS and figures["climbs"] <= MAX_CLIMBS, (figures, path)
    entered = [name for _, name in calls]
    for once in ("resolve_run_args", "load_preset", "check_load_values", "EglrArgs.for_hf", "RunSettings.of"):
        assert entered.count(once) == 1, (once, path)  # the preset loaded, the load values read, the args built once


def _keyword_only(function) -> set[str]:
    return {name for name, p in inspect.signature(function).parameters.items() if p.kind == p.KEYWORD_ONLY}


def test_both_models_name_eglrs_own_args_and_pass_the_rest_through():
    from eglr_harness.harness.model import EglrHFLM

    assert _keyword_only(EglrHFLM.__init__) == set(EGLR_ARGS)
    tree = ast.parse((PACKAGE / "harness" / "vllm_model.py").read_text())  # read, not imported: vLLM is optional
    init = next(node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == "__init__")
    assert {a.arg for a in init.args.kwonlyargs} == set(VLLM_ARGS) and init.args.kwarg is not None


@pytest.mark.parametrize("text", ["pretrained=a/b,L=1|4,T=0.5,k_max=4", "a=true,b=None,c='7',d=1e3,e=-2", "x=y=z,,w",
                                  ""])
def test_the_one_parser_reads_as_lm_eval_reads(text):
    from lm_eval.utils import simple_parse_args_string

    from eglr_harness.harness.gen_options import parse_args_string

    assert parse_args_string(text) == simple_parse_args_string(text)
