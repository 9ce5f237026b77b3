"""eglr-baseline: beams end at their own stop string, never at a batch-mate's (lm-eval's hf ends them there at batch
> 1), and each answer says how it ended and what its search cost."""

from __future__ import annotations

import pytest
from helpers.tiny_models import build_tiny_model

from eglr_harness.core.rollout import BaselineText, rollout_meta, with_meta
from eglr_harness.harness.baseline_model import answer_finish

PROMPTS = ["The cat sat on", "Numbers: 1 2 3", "Hello world, this is", "A B C D E"]
MAX_NEW = 24
BEAMS = 3


def _decode(ids):
    return "".join(chr(ord("a") + i) if i < 26 else "|" for i in ids)  # token i -> a letter; 26+ -> '|'


@pytest.mark.unit
@pytest.mark.parametrize(("tokens", "expected"), [
    ([0, 1, 2, 25, 3, 9], ("stop", 4)),  # 'z' at the 4th token: the shortest prefix holding it
    ([0, 1, 99, 5, 5], ("eos", 3)),  # 99 = end of sequence, counted
    ([0, 25, 99], ("stop", 2)),  # a stop string before the end of sequence wins
    ([0, 1, 2, 3], ("length", 4)),  # the budget filled
    ([0, 1, 7, 7], ("cut", 2)),  # 7 = padding, not counted: ended early with no reason of its own
    ([0, 1], ("cut", 2)),
])
def test_answer_finish(tokens, expected):
    assert answer_finish(tokens, _decode, ["z"], {99}, 7, 4) == expected


@pytest.mark.unit
def test_baseline_text_keeps_its_finish_through_filters_and_pickling():
    import pickle

    text = BaselineText("x = 4", finish="eos", search_tokens=40)
    assert rollout_meta(text) == {"L": None, "T": None, "cycle": None, "finish": "eos", "search_tokens": 40}
    rewritten = with_meta("4", text)
    assert isinstance(rewritten, BaselineText) and (rewritten.finish, rewritten.search_tokens) == ("eos", 40)
    back = pickle.loads(pickle.dumps(text))
    assert (str(back), back.finish, back.search_tokens) == ("x = 4", "eos", 40)
    with pytest.raises(ValueError, match="`finish`='early' is not allowed"):
        BaselineText("x", finish="early", search_tokens=1)


@pytest.fixture(scope="module")
def sharp_tiny_dir(tmp_path_factory, smollm2_tokenizer_dir):
    """A 2-layer random Llama sharp enough that its beams agree for a while (SmolLM2's tokenizer)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    model = build_tiny_model("llama", vocab_size=len(tokenizer), num_layers=2, sharpen=30.0,
                             pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                             eos_token_id=tokenizer.eos_token_id)
    out = tmp_path_factory.mktemp("sharp_tiny")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


def _requests(until, num_beams=BEAMS):
    from lm_eval.api.instance import Instance

    kwargs = {"until": until, "do_sample": False, "num_beams": num_beams, "max_gen_toks": MAX_NEW}
    return [Instance("generate_until", {}, (p, dict(kwargs)), i) for i, p in enumerate(PROMPTS)]


def _answers(lm, until, batch_size, num_beams=BEAMS):
    lm.batch_size_per_gpu = batch_size
    return lm.generate_until(_requests(until, num_beams))


def test_beams_end_at_their_own_stop_where_lm_evals_hf_ends_them_at_a_batch_mates(sharp_tiny_dir):
    """The stop string is chosen so that lm-eval's hf, at batch 4, cuts another prompt's answer short (the
    precondition: it fails loudly if the tiny model stops showing lm-eval's behaviour); eglr-baseline's answers
    are then the same at batch 4 as at batch 1, none cut, and each charged num_beams x its search's steps."""
    from lm_eval.models.huggingface import HFLM

    from eglr_harness.harness.baseline_model import BaselineHFLM

    stock = HFLM(pretrained=sharp_tiny_dir, batch_size=1, device="cpu")
    free = _answers(stock, [], 1)  # no stop string: every answer runs its budget
    cut_by, cut_short = None, []
    for answer in free:  # a word from early in one answer: the stop string that ends that prompt early
        for word in answer.split()[:3]:
            stop = [word]
            alone, together = _answers(stock, stop, 1), _answers(stock, stop, 4)
            cut_short = [i for i, (a, b) in enumerate(zip(alone, together)) if len(b) < len(a)]
            if cut_short:
                cut_by = stop
                break
        if cut_by:
            break
    assert cut_by, "no stop string made lm-eval's hf cut a batch-mate's beams on this tiny model: pick other prompts"

    baseline = BaselineHFLM(pretrained=sharp_tiny_dir, batch_size=1, device="cpu")
    alone, together = _answers(baseline, cut_by, 1), _answers(baseline, cut_by, 4)
    assert [str(a) for a in together] == [str(a) for a in alone]
    assert all(isinstance(a, BaselineText) for a in together)
    assert [a.finish for a in together].count("cut") == 0
    assert {a.finish for a in together} <= {"stop", "eos", "length"}
    for answer in together:  # a whole number of search steps, each over every beam, at most the budget's
        assert answer.search_tokens % BEAMS == 0 and 0 < answer.search_tokens <= BEAMS * MAX_NEW
    assert all(cut_by[0] not in a for a in together)  # lm-eval's post-processing still strips the stop string
    stock_cut = _answers(stock, cut_by, 4)
    assert all(len(together[i]) > len(stock_cut[i]) for i in cut_short)  # what hf cut, this model decoded on


def test_greedy_answers_are_hfs_with_their_own_tokens_as_cost(sharp_tiny_dir):
    """Greedy (one row per prompt) is batched as hf batches it: the same texts, each costing its own tokens."""
    from lm_eval.models.huggingface import HFLM

    from eglr_harness.harness.baseline_model import BaselineHFLM

    stock = HFLM(pretrained=sharp_tiny_dir, batch_size=4, device="cpu")
    free = _answers(stock, [], 4, num_beams=1)
    stop = [free[1].split()[1]]  # ends the second prompt early, the others run on
    expected = _answers(stock, stop, 4, num_beams=1)
    baseline = BaselineHFLM(pretrained=sharp_tiny_dir, batch_size=4, device="cpu")
    got = _answers(baseline, stop, 4, num_beams=1)
    assert [str(a) for a in got] == expected
    assert got[1].finish == "stop" and got[1].search_tokens < MAX_NEW
    assert all(a.finish in {"stop", "length"} for a in got)
    assert all(a.search_tokens == MAX_NEW for a in got if a.finish == "length")
