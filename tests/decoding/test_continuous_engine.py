"""The continuous engine (refinement folded into the batch, continuous batching) against the naive
uncached reference (eglr_harness/decoding/naive_reference.py) and against transformers' own ``generate``."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from helpers import continuous_checks as checks
from helpers.inputs import CharTokenizer, random_prompts
from helpers.tiny_models import TINY_ARCHS, build_tiny_model

from eglr_harness.core.config import EglrConfig
from eglr_harness.decoding.continuous.engine import ContinuousEngine
from eglr_harness.decoding.contract import Request
from eglr_harness.decoding.naive_reference import naive_eglr_greedy, naive_eglr_sampled
from eglr_harness.decoding.stats import EglrStats

VOCAB, LAYERS, EOS, PAD = checks.VOCAB, checks.LAYERS, checks.EOS, checks.PAD
MAX_NEW, TAU_KL, KL_MARGIN, LENGTHS = checks.MAX_NEW, checks.TAU_KL, checks.KL_MARGIN, checks.LENGTHS
_run, _median_entropy = checks.run, checks.median_entropy
ARCHS = (*TINY_ARCHS, "gemma3")


@pytest.fixture(scope="module", params=ARCHS)
def model(request):
    return build_tiny_model(request.param, vocab_size=VOCAB, num_layers=LAYERS, seed=1)


@pytest.mark.parametrize("L", [1, 2, LAYERS])
@pytest.mark.parametrize("gate", ["always", "median"])
def test_greedy_tokens_and_iterations_match_naive_reference(model, L, gate):
    checks.greedy_tokens_and_iterations_match_naive_reference(model, L, gate)


def test_plain_decoding_equals_generate_token_for_token(model):
    """L=0 (and a gate that never fires) is transformers' greedy generate, each prompt alone."""
    checks.plain_decoding_equals_generate_token_for_token(model)


def test_sampled_rows_match_naive_reference_draw_for_draw(model):
    prompts = random_prompts(5, lengths=LENGTHS[:4], vocab=VOCAB)
    settings = dict(L=2, alpha=0.2, k_max=3, tau_kl=TAU_KL, tau_h=0.0)
    config = EglrConfig(T=0.7, top_k=20, top_p=0.9, **settings)
    seeds = [1000 + i for i in range(len(prompts))]
    outcomes = _run(model, prompts, [config] * len(prompts), seeds=seeds)
    for prompt, seed, outcome in zip(prompts, seeds, outcomes):
        ref_tokens, _, _ = naive_eglr_sampled(
            model, prompt, max_new_tokens=MAX_NEW, eos_ids={EOS}, temperature=0.7, top_k=20, top_p=0.9,
            seed=seed, **settings)
        assert outcome.tokens == ref_tokens


def test_a_row_does_not_depend_on_its_neighbours():
    """Cells of different L and T share the running batch; each row equals its request decoded alone."""
    model = build_tiny_model("llama", vocab_size=VOCAB, num_layers=LAYERS, seed=2)
    prompts = random_prompts(7, lengths=LENGTHS, vocab=VOCAB)
    configs = [EglrConfig(L=0), EglrConfig(L=1, tau_h=0.0, tau_kl=TAU_KL), EglrConfig(L=4, tau_h=0.0, tau_kl=TAU_KL),
               EglrConfig(L=2, T=0.8, tau_h=0.0, tau_kl=TAU_KL), EglrConfig(L=0, T=1.0),
               EglrConfig(L=3, alpha=0.5, tau_h=0.0, tau_kl=TAU_KL)]
    seeds = [7 * i + 1 for i in range(len(prompts))]
    together = _run(model, prompts, configs, max_batch=3, seeds=seeds)
    for i, (prompt, config) in enumerate(zip(prompts, configs)):
        alone = _run(model, [prompt], [config], max_batch=1, seeds=[seeds[i]])[0]
        assert together[i].tokens == alone.tokens
        assert together[i].iterations == alone.iterations


def test_accounting_counts_what_ran(model):
    prompts = random_prompts(4, lengths=LENGTHS, vocab=VOCAB)
    config = EglrConfig(L=2, tau_h=0.0, tau_kl=TAU_KL, k_max=3)
    stats = {}
    outcomes = _run(model, prompts, [config] * len(prompts),
                    stats_for=lambda c: stats.setdefault(c, EglrStats()))
    summary = stats[config].summary()
    generated = sum(len(o.tokens) for o in outcomes)
    assert summary["tokens"] == generated
    assert summary["gated_tokens"] == generated  # tau_h = 0 gates every token
    iterations = sum((o.iterations for o in outcomes), Counter())
    assert summary["iteration_hist"] == {str(k): iterations[k] for k in sorted(iterations)}
    expected = 1 + 2 * sum(k * c for k, c in iterations.items()) / (LAYERS * generated)
    assert summary["flop_ratio"] == pytest.approx(expected)
    assert summary["batched_flop_ratio"] == pytest.approx(expected)  # no row is computed and discarded
    assert 0 < summary["p_step_gated"] <= 1


def test_recorded_entropies_are_the_plain_pass_entropies():
    model = build_tiny_model("qwen2", vocab_size=VOCAB, num_layers=LAYERS, seed=3)
    prompt = random_prompts(8, lengths=(6,), vocab=VOCAB)[0]
    outcome = _run(model, [prompt], [EglrConfig(L=0)])[0]
    seq, expected = list(prompt), []
    for token in outcome.tokens:
        with torch.no_grad():
            logits = model(torch.tensor([seq])).logits[0, -1].float()
        logp = torch.log_softmax(logits, -1)
        expected.append(float(-(logp.exp() * logp).sum()))
        seq.append(token)
    assert outcome.entropies == pytest.approx(expected, abs=1e-5)


def test_unsupported_models_and_bad_requests_are_refused():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=2)).eval()
    with pytest.raises(ValueError, match="model_type='gpt2'.*engine=hook"):
        ContinuousEngine(gpt2, max_batch=2)
    model = build_tiny_model("llama", vocab_size=VOCAB, num_layers=LAYERS)
    with pytest.raises(ValueError, match="max_batch"):
        ContinuousEngine(model, max_batch=0)
    engine = ContinuousEngine(model, max_batch=2)
    with pytest.raises(AssertionError, match="L=5 > 4 layers"):  # an invariant: the pool checked it
        engine.run([Request((5, 6), EglrConfig(L=5), 4)])
    with pytest.raises(ValueError, match="needs its row `seed`"):
        Request((5, 6), EglrConfig(L=1, T=0.5), 4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        Request((5, 6), EglrConfig(L=1), 0)
    with pytest.raises(ValueError, match="tokenizer"):
        engine.run([Request((5, 6), EglrConfig(L=1), 4, stop_strings=("\n",))])


def test_tied_embeddings_are_the_models_own():
    """A model whose unembedding is its embedding matrix decodes exactly as the reference does."""
    model = build_tiny_model("qwen2", vocab_size=VOCAB, num_layers=LAYERS, seed=4, tie_word_embeddings=True)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    prompts = random_prompts(9, lengths=LENGTHS[:3], vocab=VOCAB)
    settings = dict(L=2, alpha=0.2, k_max=3, tau_kl=TAU_KL, tau_h=0.0)
    outcomes = _run(model, prompts, [EglrConfig(**settings)] * len(prompts))
    for prompt, outcome in zip(prompts, outcomes):
        assert outcome.tokens == naive_eglr_greedy(model, prompt, max_new_tokens=MAX_NEW, eos_ids={EOS}, **settings)[0]


def test_non_finite_logits_raise():
    model = build_tiny_model("llama", vocab_size=VOCAB, num_layers=LAYERS, seed=5)
    with torch.no_grad():
        model.get_output_embeddings().weight[7, 0] = float("nan")
    with pytest.raises(FloatingPointError, match="non-finite logits"):
        _run(model, random_prompts(1, lengths=(4,), vocab=VOCAB), [EglrConfig(L=2, tau_h=0.0)])


def test_refining_rows_ride_along_without_taking_an_advancing_place():
    """With refine headroom, max_batch rows keep advancing while others refine: fewer steps for the
    same rollouts than when a refining row holds one of the max_batch places."""
    model = build_tiny_model("llama", vocab_size=VOCAB, num_layers=LAYERS, seed=6)
    prompts = random_prompts(11, lengths=(5, 8, 3, 9, 6, 4, 7, 5, 8, 6, 3, 9), vocab=VOCAB)
    config = EglrConfig(L=2, tau_h=0.0, tau_kl=TAU_KL)
    requests = [Request(tuple(p), config, MAX_NEW) for p in prompts]
    runs = {}
    for headroom in (0.0, 0.5):
        stats = {}
        engine = ContinuousEngine(model, max_batch=4, eos_token_ids=[EOS], refine_headroom=headroom)
        outcomes = engine.run(requests, stats_for=lambda c: stats.setdefault(c, EglrStats()))
        runs[headroom] = ([o.tokens for o in outcomes], stats[config].steps)
    assert runs[0.5][0] == runs[0.0][0]
    assert runs[0.5][1] < runs[0.0][1]
    with pytest.raises(ValueError, match="refine_headroom"):
        ContinuousEngine(model, max_batch=4, refine_headroom=2.0)


@pytest.mark.parametrize("ends", ["length", "eos_and_stop"])
def test_overlapped_reads_change_nothing_but_when_the_host_reads(ends):
    """At L=0 the engine reads a step's result after it launched the next step (the scheduler's overlapped reads):
    a row that ended by EOS or a stop string at step n runs step n + 1, whose result is discarded, and its slot is
    given away one step later. The rollouts (tokens, finishes, log-probabilities, entropies) and their accounting
    are those of reading every step before the next; so are the run's steps when rows end by length only (a row
    leaves its slot when its last step is launched). Greedy and sampled rows, shared prompts, more requests than
    slots."""
    model = build_tiny_model("llama", vocab_size=VOCAB, num_layers=LAYERS, seed=1)
    tokenizer = CharTokenizer(VOCAB)
    prompts = random_prompts(5, lengths=(9, 3, 17, 5, 12, 7), vocab=VOCAB)
    prompts += [prompts[1], prompts[1], prompts[4]]  # rows of one prompt: a holder's K/V copied, its slot kept
    configs = [EglrConfig(L=0), EglrConfig(L=0, T=0.8, top_k=20)]

    def requests(stop):
        return [Request(tuple(p), configs[i % 2], 12 - i, seed=3 + i, stop_strings=(stop,) if stop and i % 3 == 0
                        else ()) for i, p in enumerate(prompts)]

    first = ContinuousEngine(model, max_batch=3).run(requests(None))
    eos, stop = ([first[1].tokens[2]], tokenizer.CHARS[first[0].tokens[3]]) if ends != "length" else ([], None)
    results = {}
    for overlap in (True, False):
        stats = {}
        engine = ContinuousEngine(model, max_batch=3, eos_token_ids=eos, tokenizer=tokenizer, overlap_reads=overlap)
        outcomes = engine.run(requests(stop), stats_for=lambda c: stats.setdefault(c, EglrStats()))
        figures = {c: {k: v for k, v in s.summary().items() if k != "wall_time_s"} for c, s in stats.items()}
        results[overlap] = [(o.tokens, o.finish, o.logprobs, o.entropies, o.account) for o in outcomes], figures
    assert results[True][0] == results[False][0]
    finishes = {o[1] for o in results[True][0]}
    assert finishes == ({"length"} if ends == "length" else {"length", "eos", "stop"})
    if ends == "length":
        assert results[True][1] == results[False][1]
    else:  # the steps of the run may differ (later admissions), not what the rows emitted
        for config, figures in results[True][1].items():
            per_step = ("steps", "p_step_gated")
            assert {k: v for k, v in figures.items() if k not in per_step} == {
                k: v for k, v in results[False][1][config].items() if k not in per_step}
