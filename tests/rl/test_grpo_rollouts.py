"""GRPO with EGLR pools (eglr_harness/rl/rollouts.py): TRL's GRPOTrainer trained with the L×T pool as its groups.

A tiny random Llama with SmolLM2's tokenizer whose unembedding favours the digit tokens, so that its
completions hold numbers: the gold answer of each prompt is the greedy L=0 answer that eglr-hf gives,
and the groups' rewards differ (the sampled cells write other numbers), so that GRPO has a gradient.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

trl = pytest.importorskip("trl", reason="TRL is the optional extra: pip install '.[rl]' (CI installs it)")

from helpers.tiny_models import build_tiny_model  # noqa: E402

from eglr_harness.core.cell import Cell  # noqa: E402
from eglr_harness.decoding.naive_reference import naive_eglr_greedy  # noqa: E402
from eglr_harness.rl.rollouts import EglrRollout, grpo_trainer, math_reward  # noqa: E402
from eglr_harness.scoring.equivalence import is_equivalent  # noqa: E402
from eglr_harness.scoring.extraction import extract_answer  # noqa: E402

POOL = dict(L="0|2", T="0|0.7", tau_h=0.0)  # tau_h=0: every token of an L=2 cell refines
CELLS = [Cell(0, 0.0), Cell(0, 0.7), Cell(2, 0.0), Cell(2, 0.7)]
MAX_NEW = 8
QUESTIONS = ["What is 3 + 4?", "How many legs do 2 cats have?", "What is 10 - 7?"]
DIGITS = [str(d) for d in range(10)]


def _messages(question):
    return [{"role": "user", "content": question}]


@pytest.fixture(scope="module")
def digit_model_dir(tmp_path_factory, smollm2_tokenizer_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    model = build_tiny_model("llama", vocab_size=len(tokenizer), num_layers=4, pad_token_id=tokenizer.pad_token_id,
                             bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    with torch.no_grad():  # digits' logits spread 3x wider than the rest: completions hold numbers
        model.get_output_embeddings().weight[tokenizer.convert_tokens_to_ids(DIGITS)] *= 3
    out = tmp_path_factory.mktemp("digit_llama")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _eglr_hf_texts(pretrained, tokenizer, repeats):
    """What eglr-hf decodes for QUESTIONS (chat template applied), ``repeats`` rollouts each, by cell."""
    from helpers.inputs import requests_for

    from eglr_harness.harness.model import EglrHFLM

    lm = EglrHFLM(pretrained=pretrained, tokenizer=tokenizer, batch_size=8, device="cpu", **POOL)
    contexts = [lm.apply_chat_template(_messages(q)) for q in QUESTIONS]
    gen_kwargs = EglrRollout(**POOL).gen_kwargs_for(MAX_NEW)
    texts = lm.generate_until(requests_for(contexts, gen_kwargs, repeats=repeats))
    return {q: texts[i * repeats:(i + 1) * repeats] for i, q in enumerate(QUESTIONS)}


@pytest.fixture(scope="module")
def trained(digit_model_dir):
    """Two GRPO steps with the pool as the group; every rollout call, reward call and weight snapshot kept."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(digit_model_dir)
    reference = _eglr_hf_texts(str(digit_model_dir), None, repeats=len(CELLS))
    gold = {q: extract_answer(texts[0], "number") for q, texts in reference.items()}  # cell L=0,T=0
    assert all(gold.values()), f"the digit model wrote no number: {reference}"
    assert len({tuple(texts) for texts in reference.values()}) == len(QUESTIONS)  # the prompt matters
    dataset = Dataset.from_list([{"prompt": _messages(q), "answer": gold[q], "answer_format": "number"}
                                 for q in QUESTIONS])

    policy = AutoModelForCausalLM.from_pretrained(digit_model_dir)
    initial = {k: v.clone() for k, v in policy.state_dict().items()}
    calls, rewards = [], []

    class RecordedRollout(EglrRollout):
        def __call__(self, prompts, trainer):
            weights = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
            out = super().__call__(prompts, trainer)
            calls.append({"prompts": list(prompts), "out": out, "step": trainer.state.global_step, "weights": weights})
            return out

    rollout = RecordedRollout(**POOL, batch_size=8)

    def graded(completions, answer, **kwargs):
        values = math_reward(completions, answer, **kwargs)
        rewards.append({"completions": list(completions), "answer": list(answer), "rewards": values,
                        "L": list(kwargs["L"]), "T": list(kwargs["T"])})
        return values

    args = trl.GRPOConfig(output_dir=str(digit_model_dir / "grpo"), per_device_train_batch_size=2 * len(CELLS),
                          num_generations=len(CELLS), max_completion_length=MAX_NEW, max_steps=2, learning_rate=0.05,
                          use_cpu=True, report_to=[], logging_steps=1, save_strategy="no", beta=0.0, seed=0)
    trainer = grpo_trainer(rollout, args=args, model=policy, reward_funcs=[graded], train_dataset=dataset,
                           processing_class=tokenizer)
    trainer.train()
    return {"trainer": trainer, "reference": reference, "gold": gold, "initial": initial, "tokenizer": tokenizer,
            "calls": calls, "rewards": rewards, "dir": digit_model_dir}


def test_each_group_is_the_pool_in_order(trained):
    assert len(trained["calls"]) == 2  # one generation per optimizer step
    for call in trained["calls"]:
        prompts, out = call["prompts"], call["out"]
        assert len(prompts) == 2 * len(CELLS) and all(len(out[k]) == len(prompts) for k in out)
        for start in range(0, len(prompts), len(CELLS)):
            assert all(p == prompts[start] for p in prompts[start:start + len(CELLS)])  # TRL's group layout
        assert [Cell.of(L, T) for L, T in zip(out["L"], out["T"])] == CELLS * 2
        assert [g > 0 for g in out["gated"]] == [c.L > 0 for c in CELLS] * 2
        assert out["gated"] == [len(ids) if L > 0 else 0 for ids, L in zip(out["completion_ids"], out["L"])]
        assert all(s["tokens"] == len(ids) for s, ids in zip(out["signals"], out["completion_ids"]))


def _question(prompt):
    return prompt[-1]["content"]


def test_completions_are_what_eglr_hf_decodes_from_the_weights_of_that_step(trained):
    from transformers import AutoModelForCausalLM

    tokenizer = trained["tokenizer"]
    first, second = trained["calls"]
    assert first["step"] == 0 and second["step"] == 1
    assert all(torch.equal(first["weights"][k], v) for k, v in trained["initial"].items())
    for j, prompt in enumerate(first["prompts"]):
        text = first["out"]["eglr_text"][j]
        assert text == trained["reference"][_question(prompt)][j % len(CELLS)]
        ids = first["out"]["completion_ids"][j]
        assert tokenizer.decode(ids).startswith(text) and len(ids) == MAX_NEW
        prompt_text = tokenizer.decode(first["out"]["prompt_ids"][j])
        assert prompt_text == tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)

    # step 1 decodes with the weights after the first update, and its sampled cells draw eglr-hf's cycle 1
    assert any(not torch.equal(second["weights"][k], v) for k, v in trained["initial"].items())
    model = AutoModelForCausalLM.from_pretrained(trained["dir"])
    model.load_state_dict(second["weights"])
    later = _eglr_hf_texts(model, tokenizer, repeats=2 * len(CELLS))
    for j, prompt in enumerate(second["prompts"]):
        assert second["out"]["eglr_text"][j] == later[_question(prompt)][len(CELLS) + j % len(CELLS)]


def test_rewards_come_from_the_grader_and_the_weights_move(trained):
    calls = trained["rewards"]
    assert len(calls) == 2
    for call in calls:
        expected = [float(is_equivalent(gold, extract_answer(text[-1]["content"], "number")))
                    for text, gold in zip(call["completions"], call["answer"])]
        assert call["rewards"] == expected
    # step 0: the gold is the L=0,T=0 cell's answer; the sampled cells wrote other numbers (a spread: a gradient)
    first = calls[0]
    assert [r for r, L, T in zip(first["rewards"], first["L"], first["T"]) if (L, T) == (0, 0.0)] == [1.0, 1.0]
    assert 0.0 in first["rewards"]
    history = [h for h in trained["trainer"].state.log_history if "loss" in h]
    assert len(history) == 2 and all(math.isfinite(h["loss"]) for h in history)
    assert "eglr/reward/L=0,T=0.0" in history[0] and history[0]["eglr/reward/L=0,T=0.0"] == 1.0
    final = trained["trainer"].model.state_dict()
    assert any(not torch.equal(final[k], v) for k, v in trained["initial"].items())


def test_logprobs_are_the_decoding_distribution_at_temperature_one(trained):
    """At ungated tokens (L=0) the trainer's own log-probabilities at T=1 (not at the cell's T); at gated
    tokens those of the refined distribution, from the naive uncached reference."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(trained["dir"]).eval()
    out = trained["calls"][0]["out"]
    for j in range(len(CELLS)):  # the first group
        prompt, completion, logprobs = out["prompt_ids"][j], out["completion_ids"][j], torch.tensor(out["logprobs"][j])
        cell = Cell.of(out["L"][j], out["T"][j])
        with torch.no_grad():
            logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1:-1].float()
        plain = torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]
        if cell.L == 0:
            torch.testing.assert_close(logprobs, plain, atol=1e-4, rtol=0)
            if cell.sampled:
                at_T = torch.log_softmax(logits / cell.T, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]
                assert not torch.allclose(logprobs, at_T, atol=1e-2)
        elif not cell.sampled:
            tokens, emitted, gated = naive_eglr_greedy(model, prompt, L=cell.L, alpha=0.2, k_max=3, tau_kl=5e-4,
                                                       tau_h=0.0, max_new_tokens=MAX_NEW, eos_ids=[])
            assert tokens == completion and all(gated)
            refined = torch.stack([torch.log_softmax(e, -1)[t] for e, t in zip(emitted, tokens)])
            torch.testing.assert_close(logprobs, refined, atol=1e-4, rtol=0)
            assert not torch.allclose(logprobs, plain, atol=1e-3)


def test_a_pool_other_than_the_group_is_refused_before_training(digit_model_dir):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(digit_model_dir)
    policy = AutoModelForCausalLM.from_pretrained(digit_model_dir)
    initial = {k: v.clone() for k, v in policy.state_dict().items()}
    dataset = Dataset.from_list([{"prompt": _messages(q), "answer": "1"} for q in QUESTIONS])
    args = trl.GRPOConfig(output_dir=str(digit_model_dir / "refused"), per_device_train_batch_size=6, num_generations=3,
                          max_completion_length=MAX_NEW, max_steps=1, use_cpu=True, report_to=[], save_strategy="no")
    rollout = EglrRollout(**POOL)
    with pytest.raises(ValueError, match=r"`num_generations`=3 but the EGLR pool has 4 cells .*num_generations=4"):
        grpo_trainer(rollout, args=args, model=policy, reward_funcs=[math_reward], train_dataset=dataset,
                     processing_class=tokenizer)
    trainer = trl.GRPOTrainer(model=policy, args=args, reward_funcs=[math_reward], train_dataset=dataset,
                              processing_class=tokenizer, rollout_func=rollout)
    with pytest.raises(ValueError, match=r"`num_generations`=3 but the EGLR pool has 4 cells"):
        trainer.train()  # used without grpo_trainer: refused at the first rollout, before any update
    assert all(torch.equal(policy.state_dict()[k], v) for k, v in initial.items())


def test_settings_the_rollouts_cannot_honour_are_refused():
    with pytest.raises(ValueError, match="`tau_h`='auto' is not allowed"):
        EglrRollout(L="0|2", T=0)
    EglrRollout(L=0, T="0|0.7")  # nothing refines: no tau_h needed
    with pytest.raises(ValueError, match="`use_vllm`=True is not allowed"):
        EglrRollout.check_args(SimpleNamespace(use_vllm=True))  # GRPOConfig's field, read by name
    with pytest.raises(ValueError, match="`L`"):
        EglrRollout(L="x", tau_h=1.0)  # eglr-hf's own spec check


def test_grpo_run_writes_steps_rollouts_and_summary(digit_model_dir, shared_data_dir, tmp_path):
    """The committed run's command on the tiny model: one step per group, records per step and per completion."""
    import json

    from eglr_harness.commands.grpo import main

    out = tmp_path / "grpo"
    main(["--model_args", f"pretrained={digit_model_dir},device=cpu", "--task", "gsm8k_eglr", "--doc_ids", "1,3",
          "--group", "lxt:L=0|2,T=0|0.7,tau_h=0", "--group", "t_only:L=0,T=0|0.3|0.6|0.9", "--steps", "1",
          "--prompts_per_step", "1", "--max_completion_length", "4", "--output_dir", str(out)])
    for name in ("lxt", "t_only"):
        steps = [json.loads(line) for line in (out / name / "steps.jsonl").read_text().splitlines()]
        rows = [json.loads(line) for line in (out / name / "rollouts.jsonl").read_text().splitlines()]
        assert len(steps) == 1 and math.isfinite(steps[0]["loss"])
        assert len(rows) == 4 and {r["doc_id"] for r in rows} <= {1, 3} and all(r["tokens"] <= 4 for r in rows)
        assert [r["reward"] for r in rows] == [
            float(is_equivalent(r["gold"], extract_answer(r["text"], "number"))) for r in rows]
    lxt_rows = [json.loads(line) for line in (out / "lxt" / "rollouts.jsonl").read_text().splitlines()]
    assert [(r["L"], r["T"]) for r in lxt_rows] == [(0, 0.0), (0, 0.7), (2, 0.0), (2, 0.7)]
    summary = (out / "summary.md").read_text()
    assert "| L=2,T=0.7 | 1 |" in summary and "## t_only: L×T = L=0,T=0.0, L=0,T=0.3" in summary


def test_a_misspelt_group_is_refused_before_torch_is_imported():
    """`eglr-grpo --group bogus` took ~37 s to refuse on a busy machine: the command imported torch and TRL first."""
    import subprocess
    import sys

    argv = ["--model_args", "model_config=x", "--task", "t", "--group", "bogus", "--output_dir", "o"]
    code = (f"import sys\nfrom eglr_harness.commands import grpo\ntry:\n    grpo.main({argv!r})\n"
            "except SystemExit as stop:\n    print('torch' in sys.modules, stop.code)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.stdout.split() == ["False", "2"], done.stderr
    assert done.stderr.splitlines() == ["eglr-grpo: error: `--group`='bogus' is not allowed; allowed: "
                                        "NAME:KEY=VALUE,... with keys L, T, alpha, k_max, tau_kl, tau_h, top_k, top_p, "
                                        "seed (e.g. 'lxt:L=0|2|4,T=0|0.7')."], done.stderr


def test_a_group_spec_is_checked_naming_the_option():
    from eglr_harness.commands.grpo import parse_group

    assert parse_group("lxt:L=0|2|4,T=0|0.7") == ("lxt", {"L": "0|2|4", "T": "0|0.7"})
    for bad in ("lxt", "lxt:", ":L=1", "lxt:Q=1", "lxt:L"):
        with pytest.raises(ValueError, match=f"`--group`={bad!r} is not allowed"):
            parse_group(bad)


# ---------------------------------------------------------------------------------------------
# issue 38: a GRPO run checks every group and argument before any training, and keeps what it trained


def _grpo_argv(model_dir, out, *groups, extra=()):
    argv = ["--model_args", f"pretrained={model_dir},device=cpu", "--task", "gsm8k_eglr", "--doc_ids", "1",
            "--steps", "1", "--prompts_per_step", "1", "--max_completion_length", "4", "--output_dir", str(out)]
    for group in groups:
        argv += ["--group", group]
    return argv + list(extra)


@pytest.mark.parametrize("groups, extra, message", [
    # a later group's pool: refused before the first group trains
    (["ok:L=0,T=0|0.7", "bad:L=0|2,T=0"], [], "`--group`='bad:L=0|2,T=0': `tau_h`='auto' is not allowed"),
    # issue 47: checked against the layers the model's config declares, before the policy loads
    (["deep:L=0|9,T=0,tau_h=0"], [], "`--group`='deep:L=0|9,T=0,tau_h=0': `L`='0|9': layer span 9 exceeds the "
     "model's 4 decoder layers"),
    (["a:L=0,T=0|0.7", "a:L=0,T=0|0.5"], [], "the name 'a' is taken by an earlier group"),
    (["a/b:L=0,T=0|0.7"], [], "the name 'a/b' is not allowed; allowed: letters, digits, _ . -"),
    (["ok:L=0,T=0|0.7"], ["--steps", "0"], "`--steps`=0 is not allowed; allowed: an int >= 1"),
    (["ok:L=0,T=0|0.7"], ["--prompts_per_step", "0"], "`--prompts_per_step`=0 is not allowed"),
    (["ok:L=0,T=0|0.7"], ["--max_completion_length", "0"], "`--max_completion_length`=0 is not allowed"),
    (["ok:L=0,T=0|0.7"], ["--batch_size", "0"], "`--batch_size`=0 is not allowed"),
    # issue 55, item 9: TRL refused it once the policy had loaded (7 minutes with SmolLM2), then the summary's
    # write hid that refusal
    (["one:L=0,T=0.7"], [], "`--group`='one:L=0,T=0.7': the pool has 1 cell (one completion per problem); allowed: "
     "a pool of at least 2 cells"),
])
def test_grpo_run_checks_every_group_before_training(digit_model_dir, shared_data_dir, tmp_path, monkeypatch, capsys,
                                                     groups, extra, message):
    from eglr_harness.commands import grpo as grpo_run
    from eglr_harness.rl import grpo as rl_grpo  # the training the command calls (imported once its flags pass)

    def trained(*args, **kwargs):
        raise AssertionError("a group trained before the run was checked")

    monkeypatch.setattr(rl_grpo, "run_group", trained)
    monkeypatch.setattr(rl_grpo, "_policy",
                        lambda *a, **k: pytest.fail("the policy loaded before the run was checked"))
    out = tmp_path / "grpo"
    with pytest.raises(SystemExit) as info:
        grpo_run.main(_grpo_argv(digit_model_dir, out, *groups, extra=extra))
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert info.value.code == 2 and len(errors) == 1 and message in errors[0], errors
    assert not out.exists()


def test_grpo_run_refuses_an_output_dir_it_cannot_write_before_training(digit_model_dir, tmp_path, monkeypatch, capsys):
    from eglr_harness.commands import grpo as grpo_run
    from eglr_harness.rl import grpo as rl_grpo  # the training the command calls (imported once its flags pass)

    monkeypatch.setattr(rl_grpo, "run_group", lambda *a, **k: pytest.fail("trained into an unwritable folder"))
    blocker = tmp_path / "file"
    blocker.write_text("a file")
    with pytest.raises(SystemExit):
        grpo_run.main(_grpo_argv(digit_model_dir, blocker / "grpo", "ok:L=0,T=0|0.7"))
    assert f"--output_dir='{blocker / 'grpo'}' is not a folder ({blocker} is a file)" in capsys.readouterr().err


def test_a_partial_grpo_run_keeps_the_groups_that_finished_and_its_summary(digit_model_dir, shared_data_dir, tmp_path,
                                                                           monkeypatch):
    import json

    from eglr_harness.commands import grpo as grpo_run
    from eglr_harness.rl import grpo as rl_grpo  # the training the command calls (imported once its flags pass)

    real = rl_grpo.run_group

    def second_fails(name, *args, **kwargs):
        if name == "second":
            raise RuntimeError("the second group's training broke")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(rl_grpo, "run_group", second_fails)
    out = tmp_path / "grpo"
    with pytest.raises(RuntimeError, match="second group's training broke"):
        grpo_run.main(_grpo_argv(digit_model_dir, out, "first:L=0,T=0|0.7", "second:L=0,T=0|0.5"))
    steps = [json.loads(line) for line in (out / "first" / "steps.jsonl").read_text().splitlines()]
    assert len(steps) == 1 and not (out / "second").exists()
    summary = (out / "summary.md").read_text()
    assert "## first: L×T = L=0,T=0.0, L=0,T=0.7" in summary and "## second" not in summary
    assert "unfinished: group second stopped with an error" in summary


def test_a_group_that_fails_before_writing_anything_shows_its_own_error(digit_model_dir, shared_data_dir, tmp_path,
                                                                         monkeypatch):
    """Issue 55, item 9: the summary was written into a folder that check_writable had removed again, and its
    "cannot be written" replaced the group's own error."""
    from eglr_harness.commands import grpo as grpo_run
    from eglr_harness.rl import grpo as rl_grpo  # the training the command calls (imported once its flags pass)

    def refused(*args, **kwargs):
        raise RuntimeError("TRL refused the group")

    monkeypatch.setattr(rl_grpo, "run_group", refused)
    out = tmp_path / "new" / "grpo"
    with pytest.raises(RuntimeError, match="TRL refused the group"):
        grpo_run.main(_grpo_argv(digit_model_dir, out, "first:L=0,T=0|0.7"))
    assert "unfinished: group first stopped with an error" in (out / "summary.md").read_text()


@pytest.mark.parametrize("kwargs, message", [
    ({"gen_kwargs": {"repetition_penalty": math.nan}}, r"`repetition_penalty`=nan \(gen_kwargs of EglrRollout\)"),
    ({"gen_kwargs": {"repetiton_penalty": 1.1}}, r"`repetiton_penalty`=1\.1 .* is not a generation option"),
    ({"batch_size": 0}, r"`batch_size`=0 is not allowed; allowed: an int >= 1"),
])
def test_eglr_rollout_refuses_bad_settings_when_made(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EglrRollout(L=0, T="0|0.7", **kwargs)


@pytest.mark.parametrize("kwargs, message", [
    ({"L": "0|9", "T": 0, "tau_h": 0.0}, r"`L`='0\|9': layer span 9 exceeds the model's 4 decoder layers"),
    ({"L": 0, "T": "0|0.7", "compile": "reduce-overhead"}, r"`compile`='reduce-overhead' captures CUDA graphs"),
])
def test_grpo_trainer_refuses_a_pool_or_compile_the_model_cannot_run(digit_model_dir, kwargs, message):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rollout = EglrRollout(**kwargs)
    args = trl.GRPOConfig(output_dir=str(digit_model_dir / "refused"), per_device_train_batch_size=2, num_generations=2,
                          max_completion_length=MAX_NEW, max_steps=1, use_cpu=True, report_to=[], save_strategy="no")
    with pytest.raises(ValueError, match=message):
        grpo_trainer(rollout, args=args, model=AutoModelForCausalLM.from_pretrained(digit_model_dir),
                     processing_class=AutoTokenizer.from_pretrained(digit_model_dir), reward_funcs=[math_reward],
                     train_dataset=None)


# ---------------------------------------------------------------------------------------------
# issue 38 wanted 3: the rollout function beyond one process and one group per call (module docstring of rl.py:
# row i of the whole generation batch runs pool cell i mod |pool|; process k's rows start at k * len(prompts))

TWO_CELLS = dict(L=0, T="0|0.7")  # one greedy and one sampled cell: nothing refines, the cycle matters


def _trainer(model, tokenizer, *, process_index=0, group=2, step=0, training=True):
    model.train(training)
    return SimpleNamespace(model=model, processing_class=tokenizer, num_generations=group, num_generations_eval=group,
                           args=SimpleNamespace(use_vllm=False), max_completion_length=MAX_NEW,
                           state=SimpleNamespace(global_step=step),
                           accelerator=SimpleNamespace(process_index=process_index, unwrap_model=lambda m: m))


@pytest.fixture(scope="module")
def policy(digit_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(digit_model_dir), AutoTokenizer.from_pretrained(digit_model_dir)


def test_the_second_process_runs_the_cells_of_its_rows_in_the_whole_batch(policy):
    """Three groups of 2 over two processes (3 rows each): the group of QUESTIONS[1] straddles them."""
    model, tokenizer = policy
    rollout = EglrRollout(**TWO_CELLS, batch_size=8)
    rows = [_messages(q) for q in QUESTIONS for _ in range(2)]
    whole = rollout(rows, _trainer(model, tokenizer, step=1))
    assert [(L, T) for L, T in zip(whole["L"], whole["T"])] == [(0, 0.0), (0, 0.7)] * 3
    first = rollout(rows[:3], _trainer(model, tokenizer, process_index=0, step=1))
    second = rollout(rows[3:], _trainer(model, tokenizer, process_index=1, step=1))
    for part, span in ((first, slice(0, 3)), (second, slice(3, 6))):
        for key in ("L", "T", "eglr_text", "completion_ids"):
            assert part[key] == whole[key][span], key
    assert second["T"] == [0.7, 0.0, 0.7]  # rows 3, 4, 5 of the batch: cells 1, 0, 1
    assert model.training  # the trainer's mode is given back


def test_a_prompt_twice_in_one_batch_shares_its_deterministic_rollout_and_draws_its_sampled_one_per_cycle(policy):
    model, tokenizer = policy
    rollout = EglrRollout(**TWO_CELLS, batch_size=8)
    rows = [_messages(QUESTIONS[0])] * 4  # two groups of one prompt
    out = rollout(rows, _trainer(model, tokenizer, step=0))
    assert out["completion_ids"][0] == out["completion_ids"][2] and out["completion_ids"][1] == out["completion_ids"][3]
    later = rollout(rows, _trainer(model, tokenizer, step=1))
    assert later["completion_ids"][0] == out["completion_ids"][0]  # greedy: the same weights give the same rollout
    assert later["completion_ids"][1] != out["completion_ids"][1]  # sampled: cycle = global step, fresh draws


def test_rows_of_one_group_with_different_prompts_are_refused_on_any_process(policy):
    model, tokenizer = policy
    rollout = EglrRollout(**TWO_CELLS, batch_size=8)
    q0, q1, q2 = (_messages(q) for q in QUESTIONS)
    # process 1's rows are rows 3..5 of the batch: rows 3|4,5 -> row 4 and 5 are one group
    with pytest.raises(ValueError, match="rows 4 and 5 of the generation batch are one GRPO group"):
        rollout([q0, q1, q2], _trainer(model, tokenizer, process_index=1))
    with pytest.raises(ValueError, match="rows 0 and 1 of the generation batch are one GRPO group"):
        rollout([q0, q1, q1, q1], _trainer(model, tokenizer, process_index=0))


def test_evaluation_groups_are_checked_against_num_generations_eval(policy):
    model, tokenizer = policy
    rollout = EglrRollout(**TWO_CELLS, batch_size=8)
    trainer = _trainer(model, tokenizer, training=False)
    trainer.num_generations_eval = 3
    with pytest.raises(ValueError, match=r"`num_generations_eval`=3 but the EGLR pool has 2 cells"):
        rollout([_messages(QUESTIONS[0])] * 3, trainer)
    assert not model.training
