"""Progress moves with tokens (issue 47): both engines say each step's emitted tokens while they decode, before any
rollout ends, and they add up to the tokens of the outcomes; the bar in tokens is full exactly when the last
rollout ends, and shows tokens/s."""

from __future__ import annotations

import io
import re

import pytest
from helpers.continuous_checks import EOS, LENGTHS, VOCAB
from helpers.inputs import random_prompts
from helpers.tiny_models import build_tiny_model

from eglr_harness.core.config import EglrConfig
from eglr_harness.core.progress import RolloutProgress, counting_tokens, listening, tokens_emitted
from eglr_harness.decoding.contract import Request

MAX_NEW = 12


@pytest.fixture(scope="module")
def model():
    return build_tiny_model("llama", vocab_size=VOCAB, num_layers=4)


def _engine(kind, model):
    if kind == "continuous":
        from eglr_harness.decoding.continuous.engine import ContinuousEngine

        return ContinuousEngine(model, max_batch=2, eos_token_ids=[EOS])
    from eglr_harness.decoding.hook.engine import HookEngine

    return HookEngine(model, batch_size=3, pad_token_id=0)


@pytest.mark.parametrize("kind", ["continuous", "hook"])
def test_each_engine_counts_its_tokens_as_it_emits_them(model, kind):
    prompts = random_prompts(0, lengths=LENGTHS, vocab=VOCAB)
    lengths = [3, MAX_NEW, 5, MAX_NEW, 1, 7]  # rows end at different steps
    requests = [Request(tuple(p), EglrConfig(L=2, tau_h=0.0), n) for p, n in zip(prompts, lengths)]
    events = []
    with counting_tokens(lambda n: events.append(("tokens", n))):
        outcomes = _engine(kind, model).run(requests, on_finish=lambda i, o: events.append(("finished", i)))
    counted = [n for what, n in events if what == "tokens"]
    assert sum(counted) == sum(len(o.tokens) for o in outcomes) > len(requests)
    first_end = next(k for k, (what, _) in enumerate(events) if what == "finished")
    assert sum(n for what, n in events[:first_end] if what == "tokens") >= 1  # moved before any rollout ended
    assert len(counted) > len(requests)  # step by step, not rollout by rollout
    assert not listening()


def test_the_token_bar_is_full_when_the_last_rollout_ends_and_shows_tokens_per_second():
    out = io.StringIO()
    bar = RolloutProgress([10, 10, 4], desc="eglr-hf generation", file=out)
    with counting_tokens(bar.tokens):
        tokens_emitted(3)
        bar.rollout_ended(4, 3)  # ended one token early: its unused budget is done work too
        tokens_emitted(8)
        assert bar.bar.n == 12 and "rollouts 1/3" in str(bar.bar)
        bar.rollout_ended(10, 6)
        bar.rollout_ended(10, 2)
    assert bar.bar.n == bar.bar.total == 24 and "rollouts 3/3" in str(bar.bar) and "tok/s" in str(bar.bar)
    bar.close()
    tokens_emitted(5)  # no listener: nothing happens
    assert bar.bar.n == 24


def test_start_up_says_what_it_is_doing(tiny_lm, caplog):
    """The load (a GGUF's de-quantisation took 75 s in silence) is announced before it starts and timed after."""
    with caplog.at_level("INFO", logger="eglr_harness"):
        tiny_lm()
    said = [r.getMessage() for r in caplog.records if r.name.startswith("eglr_harness")]
    loading = next(i for i, m in enumerate(said)  # what loads, how and where (issue 55, item 20)
                   if m.startswith("eglr-hf: loading ") and "(weights, tokenizer; dtype float32, device cpu) ..." in m)
    loaded = next(i for i, m in enumerate(said) if m.startswith("eglr-hf: model loaded in "))
    assert loading < loaded and "building engine=" in said[loaded]


def test_the_token_bar_counts_whole_tokens():
    """Issue 55, item 20: the bar read "4.00/4.10k" (tqdm's unit_scale on a count of tokens)."""
    bar = RolloutProgress([4000, 100], desc="eglr-hf generation", file=io.StringIO())
    with counting_tokens(bar.tokens):
        tokens_emitted(4)
    # the count field alone ("| n/total ["): the rate beside it may print ".00" by chance
    assert re.search(r"\| (\S+)/(\S+) \[", str(bar.bar)).groups() == ("4", "4100"), str(bar.bar)
    bar.close()
