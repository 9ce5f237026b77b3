"""generate's logits processors in the continuous engine: the same tokens as ``generate`` (the hf
engine, ``eglr_generate``) applying them, greedy and sampled, L in {0, 2, N}; the gate still reads
the raw distribution; settings it does not apply are refused by name."""

from __future__ import annotations

import pytest
import torch
from helpers.inputs import random_prompts
from helpers.tiny_models import build_tiny_model

from eglr_harness.core.config import EglrConfig
from eglr_harness.core.errors import GenerationOptionError
from eglr_harness.decoding.continuous.engine import ContinuousEngine
from eglr_harness.decoding.contract import Request
from eglr_harness.decoding.hook.generate import eglr_generate
from eglr_harness.decoding.processors import LogitsOptions
from eglr_harness.decoding.sampling import row_seed

VOCAB, LAYERS, EOS, PAD = 96, 4, 2, 0
NEW = 12
TAU_KL = 4.4e-4
SALT = "unit"


@pytest.fixture(scope="module")
def model():
    # sharpened: repeated tokens are likely, so a penalty or an n-gram ban changes the text
    return build_tiny_model("qwen2", vocab_size=VOCAB, num_layers=LAYERS, seed=3, sharpen=40.0)


def _hf(model, prompt, config, seed, options, eos=EOS):
    """The hf engine: generate with EGLR hooks, the processors built by generate itself."""
    ids = torch.tensor([prompt])
    sampled = dict(do_sample=True, temperature=config.T, top_k=config.top_k, top_p=config.top_p) if config.sampled \
        else dict(do_sample=False)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, pad_token_id=PAD,
                         eos_token_id=eos, custom_generate=eglr_generate, eglr_config=config, seed_salt=SALT,
                         **sampled, **options)
    tokens = out[0, len(prompt):].tolist()
    return tokens[:tokens.index(eos) + 1] if eos in tokens else tokens


def _continuous(model, prompts, configs, options, max_batch=2, eos=EOS):
    requests = [Request(tuple(p), c, NEW, seed=row_seed(c.seed, SALT, list(p)) if c.sampled else None, options=options)
                for p, c in zip(prompts, configs)]
    return [o.tokens for o in ContinuousEngine(model, max_batch=max_batch, eos_token_ids=[eos]).run(requests)]


def _greedy_tokens(model, prompt):
    return _continuous(model, [prompt], [EglrConfig(L=0)], {})[0]


PROCESSORS = {
    "repetition_penalty": lambda first: {"repetition_penalty": 1.8},
    "no_repeat_ngram_size": lambda first: {"no_repeat_ngram_size": 2},
    "min_new_tokens": lambda first: {"min_new_tokens": 6},
    "min_length": lambda first: {"min_length": 14},
    "suppress_tokens": lambda first: {"suppress_tokens": first[:3]},
    "begin_suppress_tokens": lambda first: {"begin_suppress_tokens": first[:1]},
    "min_p": lambda first: {"min_p": 0.2},
    "all": lambda first: {"repetition_penalty": 1.05, "no_repeat_ngram_size": 3, "min_new_tokens": 3,
                          "suppress_tokens": first[1:2], "begin_suppress_tokens": first[:1]},
}


@pytest.mark.parametrize("L", [0, 2, LAYERS])
@pytest.mark.parametrize("T", [0.0, 0.8])
@pytest.mark.parametrize("name", list(PROCESSORS))
def test_each_processor_gives_generates_tokens(model, name, T, L):
    prompts = random_prompts(4, lengths=(8, 8, 8), vocab=VOCAB)
    first = _greedy_tokens(model, prompts[0])
    options = PROCESSORS[name](first)
    eos = first[2]  # a token greedy decoding emits early: EOS bans bite, rows end at different times
    config = EglrConfig(L=L, T=T, tau_h=0.0 if L else float("inf"), tau_kl=TAU_KL, top_k=20, top_p=0.95)
    got = _continuous(model, prompts, [config] * len(prompts), options, eos=eos)
    for prompt, tokens in zip(prompts, got):
        seed = row_seed(config.seed, SALT, list(prompt))
        assert tokens == _hf(model, prompt, config, seed, options, eos=eos), f"{name}: continuous != generate"
    if (name == "min_p") == (T > 0):  # greedy (min_p: sampled) rows must change, or this proves nothing
        plain = _continuous(model, prompts, [config] * len(prompts), {}, eos=eos)
        assert got != plain, f"{name} changed no token: pick settings that bite"


@pytest.mark.parametrize("L", [0, 2, LAYERS])
def test_the_models_generation_config_is_applied_as_generate_applies_it(L):
    """Qwen2.5-Instruct ships repetition_penalty 1.05: the engine takes it from the generation config."""
    model = build_tiny_model("qwen2", vocab_size=VOCAB, num_layers=LAYERS, seed=3, sharpen=40.0)
    prompts = random_prompts(6, lengths=(5, 11, 8), vocab=VOCAB)
    config = EglrConfig(L=L, tau_h=0.0 if L else float("inf"), tau_kl=TAU_KL)
    before = _continuous(model, prompts, [config] * 3, {})
    model.generation_config.repetition_penalty = 1.8
    model.generation_config.no_repeat_ngram_size = 2
    after = _continuous(model, prompts, [config] * 3, {})
    assert after != before
    for prompt, tokens in zip(prompts, after):
        assert tokens == _hf(model, prompt, config, None, {})
    # a request's own option overrides the generation config, as in generate
    off = _continuous(model, prompts, [config] * 3, {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0})
    assert off == before


def test_the_gate_and_signals_read_the_raw_distribution(model):
    """A penalty changes the emitted token, not the entropy the gate reads nor the logprob recorded."""
    prompt = random_prompts(8, lengths=(9,), vocab=VOCAB)[0]
    engine = ContinuousEngine(model, max_batch=1, eos_token_ids=[])
    plain = engine.run([Request(tuple(prompt), EglrConfig(L=0), 1)])[0]
    penalised = engine.run([Request(tuple(prompt), EglrConfig(L=0), 1, options={"suppress_tokens": plain.tokens})])[0]
    assert penalised.tokens != plain.tokens
    assert penalised.entropies == plain.entropies
    # the recorded log-probability is the emitted token's under the raw distribution
    assert penalised.logprobs[0] < plain.logprobs[0]


def test_settings_it_does_not_apply_are_refused_by_name(model):
    engine = ContinuousEngine(model, max_batch=1, eos_token_ids=[EOS])
    for options, named in (({"num_beams": 4}, "num_beams=4"), ({"typical_p": 0.5}, "typical_p=0.5"),
                           ({"epsilon_cutoff": 0.1}, "epsilon_cutoff=0.1")):
        request = Request((5, 6, 7), EglrConfig(L=0), 3, options=options)
        assert named in engine.unsupported(request)
        with pytest.raises(ValueError, match=named) as err:
            engine.run([request])
        assert "engine=hook" in str(err.value)
    model.generation_config.bad_words_ids = [[5]]
    try:
        with pytest.raises(ValueError, match="bad_words_ids"):
            engine.run([Request((5, 6, 7), EglrConfig(L=0), 3)])
    finally:
        model.generation_config.bad_words_ids = None


@pytest.mark.parametrize("options, message", [
    ({"repetition_penalty": 0.0}, "`repetition_penalty`=0.0 .*allowed: a float > 0"),
    ({"repetition_penalty": -1}, "`repetition_penalty`=-1 "),
    ({"no_repeat_ngram_size": -2}, "`no_repeat_ngram_size`=-2 .*allowed: an int >= 0"),
    ({"min_p": 1.5}, "`min_p`=1.5 .*allowed: a float in \\[0, 1\\]"), ({"suppress_tokens": [-3]}, "suppress_tokens"),
    ({"typical_p": 0.0}, "`typical_p`=0.0 "), ({"num_beams": 0}, "`num_beams`=0 "), ({"frobnicate": 1},
                                                                                     "`frobnicate`=1 "),
])
def test_an_invalid_value_is_an_error_never_a_reason_to_fall_back(model, options, message):
    """Issue 35: ``unsupported`` (what engine=auto falls back on) raises for an invalid value instead of
    returning it as a reason, so engine=auto never hands it to engine=hook to fail there, or to be ignored."""
    with pytest.raises(GenerationOptionError, match=message):
        LogitsOptions.resolve(None, options)
    engine = ContinuousEngine(model, max_batch=1, eos_token_ids=[EOS])
    request = Request((5, 6, 7), EglrConfig(L=0), 3, options=options)
    with pytest.raises(GenerationOptionError, match=message):
        engine.unsupported(request)
    with pytest.raises(GenerationOptionError, match=message):
        engine.run([request])


def test_an_invalid_value_of_the_models_generation_config_is_an_error(model):
    engine = ContinuousEngine(model, max_batch=1, eos_token_ids=[EOS])
    model.generation_config.repetition_penalty = 0.0
    try:
        with pytest.raises(GenerationOptionError, match="`repetition_penalty`=0.0 \\(the model's generation_config\\)"):
            engine.unsupported(Request((5, 6, 7), EglrConfig(L=0), 3))
    finally:
        model.generation_config.repetition_penalty = None


def test_one_ngram_size_per_run(model):
    engine = ContinuousEngine(model, max_batch=2, eos_token_ids=[EOS])
    requests = [Request((5, 6, 7), EglrConfig(L=0), 3, options={"no_repeat_ngram_size": n}) for n in (2, 3)]
    with pytest.raises(ValueError, match="one value per engine run"):
        engine.run(requests)


@pytest.mark.parametrize("generated", [0, 1, 2, 3, 5])
def test_the_step_processors_equal_transformers_processors_row_by_row(generated):
    """``fixed_step.process`` on scores with negative logits, rows of several prompt lengths, at the
    boundaries of min_new_tokens / min_length / begin_suppress: transformers' processors, row by row."""
    from transformers import (
        MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor, NoRepeatNGramLogitsProcessor,
        RepetitionPenaltyLogitsProcessor, SuppressTokensAtBeginLogitsProcessor, SuppressTokensLogitsProcessor,
    )

    from eglr_harness.decoding.continuous.fixed_step import process
    from eglr_harness.decoding.continuous.step_state import SlotState, StepInvariants

    vocab, eos = 12, 3
    g = torch.Generator().manual_seed(generated)
    rows = [torch.randint(0, vocab, (n + generated,), generator=g).tolist() for n in (4, 6, 9)]  # prompt + generated
    options = LogitsOptions(repetition_penalty=1.3, no_repeat_ngram_size=2, min_new_tokens=3, min_length=8,
                            suppress_tokens=(5,), begin_suppress_tokens=(7, eos))
    configs = [EglrConfig(L=0)] * len(rows)
    invariants = StepInvariants.of(configs, LAYERS, vocab, None, [options] * len(rows))
    state = SlotState.allocate(len(rows), 8, vocab, torch.float32, "cpu", processors=invariants.processors,
                               eos_token_ids=[eos], history_width=32)
    prompts = [tuple(r[:len(r) - generated]) for r in rows]
    state.admit(list(range(len(rows))), configs, [None] * len(rows), prompts, [options] * len(rows))
    for slot, row in enumerate(rows):  # the generated tokens, as settle records them
        state.seen[slot, row] = True
        state.history[slot, :len(row)] = torch.tensor(row)
        state.position[slot], state.drawn[slot] = len(row) - 1, generated
    scores = torch.randn(len(rows), vocab, generator=g) * 3  # negative and positive logits
    got = process(invariants, state, torch.arange(len(rows)), scores.clone())
    for slot, (row, prompt) in enumerate(zip(rows, prompts)):
        hf = [RepetitionPenaltyLogitsProcessor(1.3), NoRepeatNGramLogitsProcessor(2),
              MinLengthLogitsProcessor(8, [eos]), MinNewTokensLengthLogitsProcessor(len(prompt), 3, [eos]),
              SuppressTokensLogitsProcessor([5]), SuppressTokensAtBeginLogitsProcessor([7, eos], len(prompt))]
        expected, ids = scores[slot:slot + 1].clone(), torch.tensor([row])
        for processor in hf:
            expected = processor(ids, expected)
        torch.testing.assert_close(got[slot:slot + 1], expected, rtol=0, atol=0)


# ---------------------------------------------------------------- issue 35, part 5: the processors' subtle errors
def _entropy(logits: torch.Tensor) -> float:
    logp = torch.log_softmax(logits.float(), dim=-1)
    return float(-(logp.exp() * logp).sum())


def test_a_penalty_that_moves_the_entropy_across_tau_h_does_not_move_the_gate(model):
    """The gate, the KL exit and the signals read the raw distribution: with tau_h between a token's raw
    entropy and its entropy after the repetition penalty, the token is gated as the raw entropy says, its
    recorded entropy and log-probability are the raw ones, and the whole decode is generate's."""
    from eglr_harness.decoding.processors import penalize_repeats

    penalty, found = 1.8, None
    for seed in range(40):  # a prompt whose first token's entropy the penalty moves by > 0.05 nats
        prompt = random_prompts(seed, lengths=(9,), vocab=VOCAB)[0]
        with torch.no_grad():
            logits = model(torch.tensor([prompt])).logits[0, -1]
        seen = torch.zeros(1, VOCAB, dtype=torch.bool)
        seen[0, prompt] = True
        raw = _entropy(logits)
        penalised = _entropy(penalize_repeats(logits.float()[None], seen, torch.tensor([penalty]))[0])
        if abs(penalised - raw) > 0.05:
            found = prompt, raw, penalised
            break
    assert found is not None, "no prompt where the penalty moves the entropy: the test would prove nothing"
    prompt, raw, penalised = found
    tau_h = (raw + penalised) / 2
    config = EglrConfig(L=2, tau_h=tau_h, tau_kl=TAU_KL)
    options = {"repetition_penalty": penalty}
    got = ContinuousEngine(model, max_batch=1,
                           eos_token_ids=[]).run([Request(tuple(prompt), config, NEW, options=options)])[0]
    assert got.entropies[0] == pytest.approx(raw, abs=1e-5)
    assert (got.token_iterations[0] > 0) == (raw > tau_h), "the gate read the penalised distribution"
    # the log-probability recorded is the emitted token's under the raw (refined when gated) distribution
    plain = ContinuousEngine(model, max_batch=1, eos_token_ids=[]).run([Request(tuple(prompt), config, NEW)])[0]
    if got.tokens[0] == plain.tokens[0]:
        assert got.logprobs[0] == pytest.approx(plain.logprobs[0], abs=1e-5)
    assert got.tokens == _hf(model, prompt, config, None, options, eos=-1)


@pytest.mark.parametrize("name", ["repetition_penalty", "no_repeat_ngram_size", "min_new_tokens", "min_length",
                                  "suppress_tokens", "begin_suppress_tokens", "min_p"])
def test_each_processor_of_the_models_generation_config_is_applied(name):
    """What the model's generation_config sets, and no request overrides, is applied as generate applies it."""
    model = build_tiny_model("qwen2", vocab_size=VOCAB, num_layers=LAYERS, seed=3, sharpen=40.0)
    prompts = random_prompts(4, lengths=(8, 8, 8), vocab=VOCAB)
    first = _greedy_tokens(model, prompts[0])
    eos = first[2]
    T = 0.8 if name == "min_p" else 0.0
    config = EglrConfig(L=2, T=T, tau_h=0.0, tau_kl=TAU_KL, top_k=20, top_p=0.95)
    plain = _continuous(model, prompts, [config] * 3, {}, eos=eos)
    for key, value in PROCESSORS[name](first).items():
        setattr(model.generation_config, key, value)
    got = _continuous(model, prompts, [config] * 3, {}, eos=eos)
    assert got != plain, f"the generation config's {name} changed no token"
    for prompt, tokens in zip(prompts, got):
        seed = row_seed(config.seed, SALT, list(prompt)) if T else None
        assert tokens == _hf(model, prompt, config, seed, {}, eos=eos)


def test_the_ngram_ban_reaches_only_the_rows_that_ask_for_it(model):
    """Rows of one batch with and without no_repeat_ngram_size: each decodes as it does alone."""
    prompts = random_prompts(4, lengths=(8, 8, 8, 8), vocab=VOCAB)
    config = EglrConfig(L=2, tau_h=0.0, tau_kl=TAU_KL)
    ban = {"no_repeat_ngram_size": 2}
    alone_plain = [_continuous(model, [p], [config], {}, max_batch=1, eos=-1)[0] for p in prompts]
    alone_banned = [_continuous(model, [p], [config], ban, max_batch=1, eos=-1)[0] for p in prompts]
    assert alone_plain != alone_banned, "the ban changed no row: pick prompts whose text repeats"
    requests = [Request(tuple(p), config, NEW, options=ban if i % 2 else {}) for i, p in enumerate(prompts)]
    together = [o.tokens for o in ContinuousEngine(model, max_batch=4, eos_token_ids=[]).run(requests)]
    assert together == [alone_banned[i] if i % 2 else alone_plain[i] for i in range(len(prompts))]
    assert any(alone_plain[i] != alone_banned[i] for i in range(0, len(prompts), 2)), \
        "no row without the ban repeats an n-gram: a leaking ban would change nothing"
