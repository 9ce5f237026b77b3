"""The parts of eglr_harness/rl/rollouts.py that need no TRL: pools from tasks, the math reward, the tasks' prompts."""

from __future__ import annotations

import pytest

from eglr_harness.core.cell import Cell
from eglr_harness.core.specs import parse_T_spec
from eglr_harness.rl.rollouts import EglrRollout, math_reward


def test_a_task_pool_follows_the_pool_rule_and_the_tasks_generation_kwargs():
    sc = EglrRollout(task="gsm8k_eglr_sc", tau_h=1.0)
    assert sc.cells == tuple(Cell(L, 0.0) for L in range(1, 11))
    assert "<|im_end|>" in sc.gen_kwargs["until"]
    assert sc.gen_kwargs_for(64)["max_gen_toks"] == 64
    pinned = EglrRollout(task="gsm8k_eglr_sc", L=4, tau_h=1.0)  # the budget moves to the task's T axis
    assert pinned.cells == tuple(Cell(4, T) for T in parse_T_spec("0.1-1.0:0.1"))
    grid = EglrRollout(task="gsm8k_eglr_lxt", L="0|2|4", T="0|0.7", tau_h=1.0)
    assert grid.cells == tuple(Cell(L, T) for L in (0, 2, 4) for T in (0.0, 0.7))


def test_tau_h_comes_from_the_preset_for_the_task():
    rollout = EglrRollout(model_config="smollm2-135m-instruct", task="gsm8k_eglr", L="0|4", T=0)
    assert rollout.tau_h == 2.5  # the preset's gsm8k value
    with pytest.raises(ValueError, match="`tau_h`='auto' is not allowed"):
        EglrRollout(model_config="smollm2-135m-instruct", L="0|4", T=0)  # no task: no preset value


def test_an_unknown_task_is_refused_naming_it():
    with pytest.raises(ValueError, match="`task`='gsm8k_eglr_xx' is not an eglr task"):
        EglrRollout(task="gsm8k_eglr_xx", tau_h=1.0)


@pytest.mark.parametrize("completion, gold, fmt, reward", [
    ("So the total is \\boxed{18}.", "18", "number", 1.0),
    ("She makes 9 * 2 = 18 dollars.\n#### 18", "18", "number", 1.0),
    ("The answer is 17.", "18", "number", 0.0),
    ("no number here", "18", "number", 0.0),
    ("Therefore $\\boxed{\\frac{1}{2}}$", "0.5", "math", 1.0),
    ("Therefore $\\boxed{\\frac{\\sqrt{3}}{3}}$", "\\frac{1}{\\sqrt{3}}", "math", 1.0),
    ("Therefore $\\boxed{x = 5}$", "6", "math", 0.0),
    ([{"role": "assistant", "content": "It is \\boxed{3}"}], "3", "number", 1.0),  # TRL's chat completions
])
def test_math_reward_is_the_tasks_grader(completion, gold, fmt, reward):
    assert math_reward([completion], [gold], answer_format=[fmt]) == [reward]


def test_math_reward_logs_the_mean_reward_per_cell():
    logged = {}
    rewards = math_reward(["\\boxed{1}", "\\boxed{2}", "\\boxed{1}", "\\boxed{1}"], ["1"] * 4,
                          L=[0, 0, 2, 2], T=[0.0, 0.7, 0.0, 0.7], log_metric=logged.__setitem__)
    assert rewards == [1.0, 0.0, 1.0, 1.0]
    assert logged == {"eglr/reward/L=0,T=0.0": 1.0, "eglr/reward/L=0,T=0.7": 0.0, "eglr/reward/L=2,T=0.0": 1.0,
                      "eglr/reward/L=2,T=0.7": 1.0}


@pytest.mark.slow  # 39 s here: lm-eval indexes all of its own tasks (TaskManager() with the defaults)
def test_task_prompts_are_the_chat_turns_lm_eval_renders(shared_data_dir, llama_dir):
    """Rendered by HFLM's chat template, a row's turns are the context lm-eval builds under --apply_chat_template."""
    from lm_eval.tasks import TaskManager

    from eglr_harness.harness.model import EglrHFLM
    from eglr_harness.harness.task_source import task_problems

    lm = EglrHFLM(pretrained=llama_dir, batch_size=1, device="cpu", L=0)
    rows = task_problems("gsm8k_eglr", limit=3)
    task = TaskManager().load_task_or_group("gsm8k_eglr")["gsm8k_eglr"]
    task.build_all_requests(limit=3, apply_chat_template=True, chat_template=lm.apply_chat_template)
    contexts = {inst.doc_id: inst.args[0] for inst in task.instances}
    assert [lm.apply_chat_template(row["prompt"]) for row in rows] == [contexts[i] for i in range(3)]
    docs = list(task.eval_docs)[:3]
    assert [row["answer"] for row in rows] == [doc["answer"] for doc in docs]
    assert {row["answer_format"] for row in rows} == {"number"}


def test_trainable_drops_the_gguf_mark_and_refuses_real_quantization():
    from types import SimpleNamespace

    from helpers.tiny_models import build_tiny_model

    from eglr_harness.rl.rollouts import trainable

    def marked(method):
        model = build_tiny_model("llama")
        model.hf_quantizer = SimpleNamespace(quantization_config=SimpleNamespace(quant_method=method))
        model.is_quantized, model.quantization_method = True, method
        model.config.quantization_config = {"quant_method": method}
        return model

    model = trainable(marked("gguf"))  # GGUF weights are dequantised on load: floats, trainable
    assert model.hf_quantizer is None and model.is_quantized is False and not hasattr(model.config,
                                                                                      "quantization_config")
    with pytest.raises(ValueError, match=r"the model is quantized \(bitsandbytes\)"):
        trainable(marked("bitsandbytes"))
