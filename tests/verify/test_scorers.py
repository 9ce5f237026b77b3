"""Tiny random verifiers of each format: the step scores eglr-verify reads, against a plain forward
pass and softmax written here from the formats' documented inputs (not through formats.py)."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import (AutoModelForCausalLM, AutoModelForSequenceClassification, AutoModelForTokenClassification,
                          AutoTokenizer)

from eglr_harness.verify.scorers import Item, load_scorer
from eglr_harness.verify.spec import parse_spec

QUESTION = "What is 2 + 3, doubled?"
SOLUTION = "First, 2 + 3 = 5.\n\nThen 5 * 2 = 10.\n\nSo the answer is \\boxed{10}."
STEPS = ["First, 2 + 3 = 5.", "Then 5 * 2 = 10.", "So the answer is \\boxed{10}."]
OTHER = "The sum is 5.\n\nSo \\boxed{5}."  # a shorter solution: the batch is padded


def _score(spec: str, items, **kw):
    scorer = load_scorer(parse_spec(spec), device="cpu", dtype="float32", **kw)
    return scorer.score([scorer.encode(it) for it in items])


def _items(*solutions):
    return [Item(QUESTION, "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n", s) for s in solutions]


def test_qwen_prm_reads_the_positive_label_at_extra_0(tiny_verifier):
    folder = tiny_verifier("qwen-prm")
    got = _score(f"qwen-prm:{folder}", _items(SOLUTION, OTHER))
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForTokenClassification.from_pretrained(folder).eval()
    messages = [{"role": "system",
                 "content": "Please reason step by step, and put your final answer within \\boxed{}."},
                {"role": "user", "content": QUESTION},
                {"role": "assistant", "content": "<extra_0>".join(STEPS) + "<extra_0>"}]
    ids = torch.tensor([tok.encode(tok.apply_chat_template(messages, tokenize=False))])
    with torch.no_grad():
        probs = torch.softmax(model(input_ids=ids).logits[0], dim=-1)
    want = probs[ids[0] == tok.convert_tokens_to_ids("<extra_0>")][:, 1].tolist()
    assert len(got[0]) == 3 and got[0] == pytest.approx(want, abs=1e-5)
    assert len(got[1]) == 2 and len(set(round(x, 6) for x in got[0])) == 3  # the steps differ


def test_shepherd_reads_p_plus_at_the_tag(tiny_verifier):
    folder = tiny_verifier("shepherd")
    got = _score(f"shepherd:{folder}", _items(SOLUTION, OTHER))
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    text = f"{QUESTION} Step 1: {STEPS[0]} ки\nStep 2: {STEPS[1]} ки\nStep 3: {STEPS[2]} ки"
    ids = torch.tensor([tok.encode(text)])
    plus, minus = tok.encode("+ -", add_special_tokens=False)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    at = ids[0] == tok.convert_tokens_to_ids("ки")
    want = torch.softmax(logits[at][:, [plus, minus]], dim=-1)[:, 0].tolist()
    assert len(want) == 3 and got[0] == pytest.approx(want, abs=1e-5)


def test_value_head_reads_a_sigmoid_at_each_line_end(tiny_verifier):
    folder = tiny_verifier("value-head")
    got = _score(f"value-head:{folder}", _items(SOLUTION, OTHER))
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForTokenClassification.from_pretrained(folder).eval()
    e = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    nl = e("\n")[-1]
    ids, ends = e(tok.bos_token + QUESTION + "\n"), []
    for line in STEPS:  # the solution's non-empty lines
        ids += e(line) + [nl]
        ends.append(len(ids) - 1)
    with torch.no_grad():
        values = model(input_ids=torch.tensor([ids])).logits[0, :, 0]
    want = [1 / (1 + math.exp(-float(values[i]))) for i in ends]
    assert got[0] == pytest.approx(want, abs=1e-5)


def test_orm_is_one_sigmoid_per_solution_padding_or_not(tiny_verifier):
    folder = tiny_verifier("orm")
    got = _score(f"orm:{folder}", _items(SOLUTION, OTHER))
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    want = []
    for solution in (SOLUTION, OTHER):  # one at a time: no padding
        text = tok.apply_chat_template([{"role": "user", "content": QUESTION},
                                        {"role": "assistant", "content": solution}], tokenize=False)
        with torch.no_grad():
            want.append(torch.sigmoid(model(input_ids=torch.tensor([tok.encode(text, add_special_tokens=False)]))
                                      .logits[0, 0]).item())
    assert [g[0] for g in got] == pytest.approx(want, abs=1e-5) and len(got[0]) == 1


def test_self_p_true_and_certainty(tiny_verifier):
    folder = tiny_verifier("self")
    items = _items(SOLUTION, OTHER, "")
    p_true = _score("self:p_true", items, model_args={"pretrained": str(folder)})
    certainty = _score("self:certainty", items, model_args={"pretrained": str(folder)})
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    true_id = tok.encode("True", add_special_tokens=False)[0]
    for item, got_p, got_c in zip(items, p_true, certainty):
        question = (f"Question: {QUESTION}\nProposed answer: {item.solution.strip()}\n"
                    "Is the proposed answer true or false? Answer with one word: True or False.")
        text = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                       add_generation_prompt=True)
        with torch.no_grad():
            last = model(input_ids=torch.tensor([tok.encode(text, add_special_tokens=False)])).logits[0, -1]
        assert got_p == pytest.approx([torch.softmax(last, -1)[true_id].item()], abs=1e-6)
        prompt = tok.encode(item.prompt, add_special_tokens=False)
        rollout = tok.encode(item.solution, add_special_tokens=False)
        if not rollout:
            assert got_c == [0.0]
            continue
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + rollout])).logits[0]
        kls = []
        for t in range(len(rollout)):  # KL(U || p) of the distribution that produced rollout token t
            p = torch.softmax(logits[len(prompt) - 1 + t].double(), -1)
            u = torch.full_like(p, 1 / p.numel())
            kls.append(float((u * (u / p).log()).sum()))
        assert got_c == pytest.approx([sum(kls) / len(kls)], rel=1e-4)


def test_a_verifier_whose_head_has_the_wrong_labels_is_refused(tiny_verifier):
    with pytest.raises(ValueError, match="labels"):
        load_scorer(parse_spec(f"qwen-prm:{tiny_verifier('value-head')}"), device="cpu", dtype="float32")
