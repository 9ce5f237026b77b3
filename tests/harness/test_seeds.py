"""``seeds=``: the whole pool repeated under seed, seed + 1, ...; each rollout labelled with its seed, nothing
collapsed, a killed run resumed from the rollout store, a bad value refused in one line before the load."""

from __future__ import annotations

from helpers.inputs import CONTEXTS, requests_for
import pytest
from lm_eval.models.huggingface import HFLM

from eglr_harness.decoding.continuous.engine import ContinuousEngine
from eglr_harness.harness.model import EglrHFLM

GREEDY = {"until": ["\n\n"], "max_gen_toks": 8, "do_sample": False}


def _lm(llama_dir, **args):
    return EglrHFLM(pretrained=llama_dir, device="cpu", dtype="float32", batch_size=4, tau_h=0.0, **args)


def test_seeds_repeat_the_whole_pool_each_rollout_labelled_and_resumed(llama_dir, tmp_path, monkeypatch):
    store = str(tmp_path / "store")
    first = _lm(llama_dir, L=0, T="0.5|0.9", seeds=3, rollout_cache=store)
    out = first.generate_until(requests_for(CONTEXTS[:2], GREEDY, repeats=6))
    doc = out[:6]
    assert [(o.L, o.T, o.seed, o.cycle) for o in doc] == [
        (0, 0.5, 1333, 0), (0, 0.9, 1333, 0), (0, 0.5, 1334, 0), (0, 0.9, 1334, 0), (0, 0.5, 1335, 0),
        (0, 0.9, 1335, 0)]
    # the first seed is the run without seeds= (the same rollouts, the same store keys); another seed draws anew
    plain = _lm(llama_dir, L=0, T="0.5|0.9").generate_until(requests_for(CONTEXTS[:2], GREEDY, repeats=2))
    assert [str(o) for o in plain] == [str(doc[0]), str(doc[1]), str(out[6]), str(out[7])]
    assert plain[0].seed is None
    assert len({str(o) for o in out[::2]}) > 1  # T = 0.5 under three seeds, two documents: not one text
    # issue 55 (a surviving mutant): seed 1334's store key was seed 1333's, and its texts 1333's; cell by cell
    # each seed draws its own (the texts of a tiny random model at T >= 0.5 never coincide here)
    assert all(str(doc[i]) != str(doc[i + 2]) != str(doc[i + 4]) != str(doc[i]) for i in range(2))
    assert first.get_model_info()["eglr"]["settings"]["seeds"] == 3

    # killed and rerun with one more seed: only the new seed's rollouts are decoded
    decoded = []
    original = ContinuousEngine.run

    def counting(self, requests, *args, **kwargs):
        decoded.extend(requests)
        return original(self, requests, *args, **kwargs)

    monkeypatch.setattr(ContinuousEngine, "run", counting)
    again = _lm(llama_dir, L=0, T="0.5|0.9", seeds=4, rollout_cache=store)
    more = again.generate_until(requests_for(CONTEXTS[:2], GREEDY, repeats=8))
    assert [str(o) for o in more[:6]] == [str(o) for o in doc]
    assert len(decoded) == 4 and {o.seed for o in more[6:8]} == {1336}  # 2 cells x 2 documents


def test_a_deterministic_cell_is_decoded_once_but_labelled_under_every_seed(llama_dir):
    out = _lm(llama_dir, L=2, T=0, seeds=2).generate_until(requests_for(CONTEXTS[:1], GREEDY, repeats=2))
    assert [(o.L, o.seed) for o in out] == [(2, 1333), (2, 1334)] and out[0] == out[1]


def test_a_pool_under_seeds_larger_than_the_repeats_names_the_task_to_use(llama_dir):
    lm = _lm(llama_dir, L="1-4", seeds=3)
    with pytest.raises(ValueError, match=r"under 3 seeds has 12 configs .* only 10 time"):
        lm.generate_until(requests_for(CONTEXTS[:1], GREEDY, repeats=10))


@pytest.mark.parametrize("value", [0, -2, "abc", "2.5", "0|1|2"])
def test_a_bad_seeds_value_is_one_line_before_the_load(monkeypatch, value):
    def loaded(*args, **kwargs):
        raise AssertionError("HFLM.__init__ ran: the model would have been loaded")

    monkeypatch.setattr(HFLM, "__init__", loaded)
    with pytest.raises(ValueError) as err:
        EglrHFLM(model_config="smollm2-135m-instruct", seeds=value)
    message = str(err.value)
    assert message.startswith(f"`seeds`={value!r} is not allowed; allowed: an int in 1..10000") and "\n" not in message
