"""Each format's input against its documented form: step splitting, the text around the steps, and
the positions where scores are read (the models' cards; eglr_harness/verify/formats.py)."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from eglr_harness.verify import formats
from eglr_harness.verify.spec import parse_spec

SOLUTION = "First, 2 + 3 = 5.\n\nThen 5 * 2 = 10.\n\n\n\nSo the answer is \\boxed{10}. "


def test_steps_split_on_blank_lines():
    assert formats.split_steps(SOLUTION) == ["First, 2 + 3 = 5.", "Then 5 * 2 = 10.", "So the answer is \\boxed{10}."]
    assert formats.split_steps("one line\nsecond line") == ["one line\nsecond line"]
    assert formats.split_steps("   ") == [""]


def test_qwen_prm_messages_are_the_cards(tiny_verifier):
    messages = formats.qwen_prm_messages("What is 2+3?", SOLUTION + "<extra_0>")
    assert messages == [
        {"role": "system", "content": "Please reason step by step, and put your final answer within \\boxed{}."},
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": "First, 2 + 3 = 5.<extra_0>Then 5 * 2 = 10.<extra_0>So the answer is "
                                         "\\boxed{10}.<extra_0>"},
    ]
    tok = AutoTokenizer.from_pretrained(tiny_verifier("qwen-prm"))
    enc = formats.encode_qwen_prm(tok, "What is 2+3?", SOLUTION)
    tag = tok.convert_tokens_to_ids("<extra_0>")
    assert [enc.input_ids[p] for p in enc.positions] == [tag] * 3
    assert enc.positions == tuple(i for i, t in enumerate(enc.input_ids) if t == tag)
    # the text before each tag is the step
    text = tok.decode(enc.input_ids[: enc.positions[0]])
    assert text.endswith("First, 2 + 3 = 5.")


def test_shepherd_text_and_tags(tiny_verifier):
    assert formats.shepherd_text("Q?", SOLUTION) == (
        "Q? Step 1: First, 2 + 3 = 5. ки\nStep 2: Then 5 * 2 = 10. ки\nStep 3: So the answer is \\boxed{10}. ки")
    # a tag inside the rollout is removed: tags sit only where steps end
    assert formats.shepherd_text("Q?", "a ки b") == "Q? Step 1: a  b ки"
    tok = AutoTokenizer.from_pretrained(tiny_verifier("shepherd"))
    enc = formats.encode_shepherd(tok, "Q?", SOLUTION)
    tag = tok.convert_tokens_to_ids("ки")
    assert len(enc.positions) == 3 and all(enc.input_ids[p] == tag for p in enc.positions)
    plus, minus = formats.shepherd_candidates(tok)
    assert tok.decode([plus]).strip() == "+" and tok.decode([minus]).strip() == "-"


def test_shepherd_refuses_a_tokenizer_without_the_tag(smollm2_tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)  # ки is several tokens here
    with pytest.raises(ValueError, match="expected one"):
        formats.encode_shepherd(tok, "Q?", SOLUTION)


def test_value_head_is_skyworks_prepare_input(smollm2_tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    enc = formats.encode_value_head(tok, "Q?", "line one\n\nline two\n")
    nl = tok.encode("\n", add_special_tokens=False)[-1]
    e = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    want = e((tok.bos_token or "") + "Q?\n") + e("line one") + [nl] + e("line two") + [nl]
    assert list(enc.input_ids) == want
    assert list(enc.positions) == [len(e((tok.bos_token or "") + "Q?\n") + e("line one")), len(want) - 1]


def test_certainty_positions_predict_the_rollout(smollm2_tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    enc = formats.encode_certainty(tok, "<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n", "It is 5.")
    completion = tok.encode("It is 5.", add_special_tokens=False)
    assert [enc.input_ids[p + 1] for p in enc.positions] == completion


def test_p_true_asks_in_the_chat_template(smollm2_tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    enc = formats.encode_p_true(tok, "What is 2+3?", "It is 5.")
    text = tok.decode(enc.input_ids)
    assert "Question: What is 2+3?\nProposed answer: It is 5.\nIs the proposed answer true or false?" in text
    assert text.endswith("<|im_start|>assistant\n") and enc.positions == (len(enc.input_ids) - 1,)


@pytest.mark.parametrize("bad", ["prm:/x", "qwen-prm", "qwen-prm:", "self:judge", "orm :", "", "shepherd/x"])
def test_bad_specs_are_refused(bad):
    with pytest.raises(ValueError, match="allowed"):
        parse_spec(bad)


def test_good_specs():
    assert parse_spec("qwen-prm:/m/prm").key == "qwen-prm:/m/prm"
    assert parse_spec("self:p_true").is_self and parse_spec("self:certainty").target == "certainty"


def test_two_verifiers_on_the_same_weights_keep_two_scores():
    """Issue 55 (a surviving mutant of the round before): a score's key left out the verifier spec, so two
    verifiers of one model shared each other's scores."""
    from eglr_harness.verify.store import score_key

    same = ("fp", "float32", "question", "prompt", "solution")
    assert score_key("self:p_true", *same) != score_key("qwen-prm:/models/prm", *same)
    assert score_key("self:p_true", *same) == score_key("self:p_true", *same)
