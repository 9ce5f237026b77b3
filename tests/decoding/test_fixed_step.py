"""The fixed-shape step: today's engine equals the engine before the rework token for token
(greedy, every tiny family), compiled equals eager, buckets, NaN rows."""

from __future__ import annotations

import json

import pytest
from helpers.legacy_fixture import FIXTURE, cases, engine_run, run_case

LEGACY = json.loads(FIXTURE.read_text())


@pytest.mark.parametrize("case", list(cases()), ids=lambda c: c[0])
def test_greedy_tokens_equal_the_engine_before_the_rework(case):
    name, arch, seed, settings, max_batch, headroom = case
    assert run_case(arch, seed, settings, max_batch, headroom, engine_run) == LEGACY[name]


# ---------------------------------------------------------------- compiled == eager

import torch  # noqa: E402
from helpers.inputs import random_prompts  # noqa: E402
from helpers.tiny_models import build_tiny_model  # noqa: E402

from eglr_harness.core.config import EglrConfig  # noqa: E402
from eglr_harness.decoding.continuous.engine import ContinuousEngine  # noqa: E402
from eglr_harness.decoding.continuous.kv_slots import SPARE_COLUMNS  # noqa: E402
from eglr_harness.decoding.continuous.step_key import length_bucket  # noqa: E402
from eglr_harness.decoding.continuous.step_state import READ_FIELDS, SlotState, StepInvariants  # noqa: E402
from eglr_harness.decoding.contract import Request  # noqa: E402
from eglr_harness.decoding.naive_reference import gumbel, naive_eglr_greedy  # noqa: E402

VOCAB, LAYERS, EOS = 96, 4, 2
TAU_KL = 4.4e-4
MIXED = [EglrConfig(L=2, tau_h=0.0, tau_kl=TAU_KL), EglrConfig(L=0),
         EglrConfig(L=4, T=0.7, top_k=20, top_p=0.9, tau_h=0.0, tau_kl=TAU_KL), EglrConfig(L=1, tau_h=0.0,
                                                                                           tau_kl=TAU_KL),
         EglrConfig(L=0, T=1.0, top_k=0)]


def _requests(configs, lengths=(9, 3, 17, 5, 7), new=6, seed=0):
    prompts = random_prompts(seed, lengths=lengths[:len(configs)], vocab=VOCAB)
    return [Request(tuple(p), c, new, seed=11 + i) for i, (p, c) in enumerate(zip(prompts, configs))]


def _compile_available(backend: str) -> str | None:
    """None when ``torch.compile`` works here with ``backend``, else why not."""
    try:
        torch._dynamo.reset()
        torch.compile(lambda x: x * 2 + 1, fullgraph=True, backend=backend)(torch.ones(2))
        return None
    except Exception as error:  # no C++ compiler, unsupported Python, ...
        return f"torch.compile({backend!r}) is not available here: {type(error).__name__}: {error}"


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral", "gemma2", "gemma3"])
def test_the_step_traces_whole_and_gives_the_eager_tokens(arch):
    """fullgraph=True: any graph break raises. The eager backend traces with dynamo without code
    generation (quick); the inductor test below generates code."""
    reason = _compile_available("eager")
    if reason:
        pytest.skip(reason)
    model = build_tiny_model(arch, vocab_size=VOCAB, num_layers=LAYERS, seed=1)
    requests = _requests(MIXED)
    eager = ContinuousEngine(model, max_batch=2, eos_token_ids=[EOS]).run(requests)
    torch._dynamo.reset()
    traced = ContinuousEngine(model, max_batch=2, eos_token_ids=[EOS], compile=True,
                              compile_backend="eager").run(requests)
    assert [o.tokens for o in traced] == [o.tokens for o in eager]
    assert [o.token_iterations for o in traced] == [o.token_iterations for o in eager]


def test_the_inductor_compiled_step_gives_the_eager_tokens():
    """One request (refining, sampled) so that few buckets compile: about a minute on one CPU thread."""
    reason = _compile_available("inductor")
    if reason:
        pytest.skip(reason)
    model = build_tiny_model("llama", vocab_size=VOCAB, num_layers=LAYERS, seed=1)
    requests = _requests([EglrConfig(L=2, T=0.8, top_k=10, tau_h=0.0, tau_kl=TAU_KL)], new=4)
    eager = ContinuousEngine(model, max_batch=1, eos_token_ids=[EOS]).run(requests)
    torch._dynamo.reset()
    compiled = ContinuousEngine(model, max_batch=1, eos_token_ids=[EOS], compile=True).run(requests)
    assert [o.tokens for o in compiled] == [o.tokens for o in eager]
    assert [o.token_iterations for o in compiled] == [o.token_iterations for o in eager]
    assert compiled[0].logprobs == pytest.approx(eager[0].logprobs, abs=1e-5)


# ---------------------------------------------------------------- rows on their own
def test_a_sampled_row_is_the_same_alone_in_another_slot_and_another_batch():
    model = build_tiny_model("qwen2", vocab_size=VOCAB, num_layers=LAYERS, seed=2)
    requests = _requests(MIXED, new=8, seed=3)
    target = 2  # L=4, T=0.7: refines and samples
    together = ContinuousEngine(model, max_batch=3, eos_token_ids=[EOS]).run(requests)
    again = ContinuousEngine(model, max_batch=3, eos_token_ids=[EOS]).run(requests)
    assert [o.tokens for o in together] == [o.tokens for o in again]  # reproducible
    alone = ContinuousEngine(model, max_batch=1, eos_token_ids=[EOS]).run([requests[target]])[0]
    # the longest prompt comes first: a longer neighbour moves the row to another slot
    longer = Request(tuple(range(3, 40)), EglrConfig(L=1, T=1.0, tau_h=0.0), 8, seed=99)
    moved = ContinuousEngine(model, max_batch=4, eos_token_ids=[EOS]).run([longer, requests[target], *requests[:2]])[1]
    assert together[target].tokens == alone.tokens == moved.tokens
    assert together[target].token_iterations == alone.token_iterations == moved.token_iterations


# ---------------------------------------------------------------- per-token signals
def test_per_token_logprobs_kls_and_iterations_follow_the_reference():
    model = build_tiny_model("llama", vocab_size=VOCAB, num_layers=LAYERS, seed=1)
    prompts = random_prompts(0, lengths=(9, 3, 17), vocab=VOCAB)
    settings = dict(L=2, alpha=0.2, k_max=3, tau_kl=TAU_KL, tau_h=0.0)
    outcomes = ContinuousEngine(model, max_batch=2, eos_token_ids=[EOS]).run(
        [Request(tuple(p), EglrConfig(**settings), 8) for p in prompts])
    for prompt, outcome in zip(prompts, outcomes):
        kls, ks = [], []
        tokens, logits, _ = naive_eglr_greedy(model, prompt, max_new_tokens=8, eos_ids={EOS}, kl_sink=kls,
                                              iterations_sink=ks, **settings)
        assert outcome.tokens == tokens
        assert outcome.token_iterations == ks
        expected = [float(torch.log_softmax(z, -1)[t]) for z, t in zip(logits, tokens)]
        assert outcome.logprobs == pytest.approx(expected, abs=1e-4)
        last_kls, at = [], 0
        for k in ks:  # the KL of each token's last iteration
            last_kls.append(kls[at + k - 1] if k else 0.0)
            at += k
        assert outcome.final_kls == pytest.approx(last_kls, rel=0.05, abs=1e-6)  # cached vs uncached KLs
        assert len(outcome.entropies) == len(outcome.tokens)


# ---------------------------------------------------------------- defects of the earlier engine
def test_non_finite_logits_raise_on_plain_rows():
    model = build_tiny_model("llama", vocab_size=VOCAB, num_layers=LAYERS, seed=5)
    with torch.no_grad():
        model.get_output_embeddings().weight[7, 0] = float("nan")
    with pytest.raises(FloatingPointError, match="non-finite logits"):
        ContinuousEngine(model, max_batch=2).run(_requests([EglrConfig(L=0)]))


def test_a_nan_kl_raises():
    """A refining row whose KL is NaN is flagged in the step's read (the host raises on it)."""
    model = build_tiny_model("llama", vocab_size=VOCAB, num_layers=LAYERS, seed=5)
    engine = ContinuousEngine(model, max_batch=2)
    invariants = StepInvariants.of([EglrConfig(L=2, tau_h=0.0)], LAYERS, VOCAB, None)
    state = SlotState.allocate(2, 32, VOCAB, torch.float32, torch.device("cpu"))
    state.logp_prev[1] = float("nan")
    from eglr_harness.decoding.continuous.fixed_step import settle

    read = settle(engine.stack, invariants, state, torch.tensor([0, 1]), 2, torch.randn(2, 32), torch.randn(2, VOCAB))
    assert read[:, READ_FIELDS.index("nan")].tolist() == [0.0, 1.0]


def test_steps_read_kv_widths_that_grow_and_shrink_by_buckets_of_storage_grown_by_buckets():
    """Eager steps: the storage starts at the longest prompt and grows by buckets with the rows (never per
    token); each step reads a bucket of columns that grows and shrinks with the live rows."""
    model = build_tiny_model("mistral", vocab_size=VOCAB, num_layers=LAYERS, seed=1)
    long = Request(tuple(range(3, 40)), EglrConfig(L=0), 12)  # 37 positions + 12
    short = [Request((5, 6, 7), EglrConfig(L=0), 20)] * 2
    engine = ContinuousEngine(model, max_batch=2, eos_token_ids=[], kv_bucket=4)
    widths, capacities = [], []
    step = engine.step_fn

    def recording(stack, key, state, cache, advancing, refining):
        widths.append(cache.width)
        capacities.append((cache.capacity, cache.keys[0].shape[2], state.history.shape[1]))
        return step(stack, key, state, cache, advancing, refining)
    engine.step_fn = recording
    outcomes = engine.run([long, *short])
    buckets = {length_bucket(n, 4) for n in range(1, 200)}
    assert widths and set(widths) <= buckets
    assert max(widths) == length_bucket(37 + 12 + 1, 4) > length_bucket(37 + 3, 4)  # the long row's newest column
    assert widths[-1] < max(widths)  # narrower once the long row left
    assert len(set(widths)) < 10
    assert capacities[0][0] == length_bucket(37 + 3, 4)  # the longest prompt's bucket at first
    # storage (and its one spare column, ``kv_slots.SPARE_COLUMNS``) and history hold every step
    assert all(c == k - SPARE_COLUMNS == h >= w for (c, k, h), w in zip(capacities, widths))
    assert len({c for c, _, _ in capacities}) == 2  # grown once, by a bucket
    assert [len(o.tokens) for o in outcomes] == [12, 20, 20]
    assert [length_bucket(n, 128) for n in (1, 128, 129, 192, 193, 257, 400)] == [128, 128, 192, 192, 256, 384, 512]


# ---------------------------------------------------------------- the sampler
def test_the_hash_noise_follows_the_spec_in_python_integers():
    from eglr_harness.decoding.sampling import gumbel_noise, row_keys

    seeds = [0, 1, 1333, 2**40 + 7, 2**63 - 1]
    tokens = torch.tensor([[0, 1, 95, 50_000]] * len(seeds))
    # every noise value is finite, the largest u included (its 24-bit form rounded to 1.0 in fp32: inf)
    many = gumbel_noise(row_keys(torch.arange(64), torch.zeros(64, dtype=torch.long)),
                        torch.arange(65_536).expand(64, -1))
    assert torch.isfinite(many).all()
    from eglr_harness.decoding import sampling
    top = sampling._mix  # a hash whose bits are all ones gives the largest u
    try:
        sampling._mix = lambda x: x * 0 + 0xFFFFFFFF
        assert torch.isfinite(gumbel_noise(torch.tensor([1]), torch.tensor([[3]]))).all()
    finally:
        sampling._mix = top
    for n in (0, 1, 4095):
        noise = gumbel_noise(row_keys(torch.tensor(seeds), torch.full((len(seeds),), n)), tokens)
        expected = [[float(gumbel(s, n, int(v))) for v in row] for s, row in zip(seeds, tokens)]
        assert noise.tolist() == expected


def test_per_row_warpers_equal_transformers_warpers():
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    from eglr_harness.decoding.sampling import draw, sample_rows

    g = torch.Generator().manual_seed(0)
    scores = torch.randn(6, 200, generator=g) * 3
    settings = [(0.7, 20, 0.9), (1.0, 0, 1.0), (1.3, 5, 1.0), (0.5, 0, 0.8), (1.0, 50, 0.5), (2.0, 1, 0.95)]
    temperature = torch.tensor([s[0] for s in settings])
    top_k = torch.tensor([s[1] for s in settings])
    top_p = torch.tensor([s[2] for s in settings])
    seeds = torch.arange(6) * 1_000_003
    for n in range(30):
        counters = torch.full((6,), n)
        ours = sample_rows(scores, temperature, top_k, top_p, seeds, counters, 200)
        for r, (t, k, p) in enumerate(settings):
            row = scores[r:r + 1]
            row = TemperatureLogitsWarper(t)(None, row) if t != 1.0 else row
            row = TopKLogitsWarper(k)(None, row) if k else row
            row = TopPLogitsWarper(p)(None, row) if p < 1.0 else row
            assert int(ours[r]) == int(draw(row, seeds[r:r + 1], counters[r:r + 1])[0])


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
@pytest.mark.parametrize("k_max", [1, 2])
def test_the_iteration_budget_ends_refinement_as_in_the_reference(arch, k_max):
    """tau_kl = 0: the KL exit (almost) never fires, so k_max ends every refinement (the KL exit
    tests above exit early and never reach the budget)."""
    model = build_tiny_model(arch, vocab_size=VOCAB, num_layers=LAYERS, seed=1)
    prompts = random_prompts(4, lengths=(9, 3, 12), vocab=VOCAB)
    settings = dict(L=2, alpha=0.2, k_max=k_max, tau_kl=0.0, tau_h=0.0)
    outcomes = ContinuousEngine(model, max_batch=2, eos_token_ids=[EOS]).run(
        [Request(tuple(p), EglrConfig(**settings), 6) for p in prompts])
    for prompt, outcome in zip(prompts, outcomes):
        ks = []
        tokens, _, _ = naive_eglr_greedy(model, prompt, max_new_tokens=6, eos_ids={EOS}, iterations_sink=ks, **settings)
        assert outcome.tokens == tokens
        assert outcome.token_iterations == ks
        assert max(ks) == k_max


# ---------------------------------------------------------------- steps that read less for their refining rows
def test_steps_of_few_rows_gather_their_slots_and_steps_of_refining_rows_only_skip_the_layers_below_join(
        monkeypatch):
    """Two ways a step reads less than the whole batch's K/V and weights: an eager step of at most
    ``GATHER_SHARE`` of the slots attends over its rows' own slots, gathered (the last rows of a batch), and a
    step of refining rows only (A = 0) runs the layers from join on alone. Tokens, iterations and
    log-probabilities are the naive reference's, and those of an engine that never gathers."""
    from eglr_harness.decoding.continuous import fixed_step

    model = build_tiny_model("llama", vocab_size=VOCAB, num_layers=LAYERS, seed=1)
    prompts = random_prompts(4, lengths=(9, 3, 17, 5, 7, 11, 4, 8), vocab=VOCAB)
    settings = dict(L=2, alpha=0.2, k_max=3, tau_kl=TAU_KL, tau_h=0.0)  # join = 2: layers 0, 1 below it
    lengths = (3, 12, 5, 9, 2, 7, 10, 4)  # rows end apart: the last steps run few rows of the 13 slots
    requests = [Request(tuple(p), EglrConfig(**settings), n) for p, n in zip(prompts, lengths)]
    seen = {"gathered": 0, "steps": 0, "without_advancing": 0, "layer_0_in_steps": 0}
    gathers = fixed_step.gathers

    def spy_gathers(layers, rows, slots):
        gathered = gathers(layers, rows, slots)
        seen["gathered"] += gathered and rows > 1  # a gather of one row would keep a wrong order unseen
        return gathered

    def run(engine):
        step_fn = engine.step_fn

        def counting_step(stack, key, *args):
            seen["steps"] += 1
            seen["without_advancing"] += key.advancing == 0
            return step_fn(stack, key, *args)

        engine.step_fn = counting_step
        return engine.run(requests)

    first_layer = model.model.layers[0]
    in_step = {"on": False}
    first_layer.register_forward_pre_hook(lambda *_: seen.__setitem__(
        "layer_0_in_steps", seen["layer_0_in_steps"] + in_step["on"]))
    monkeypatch.setattr(fixed_step, "gathers", spy_gathers)
    decode_step = fixed_step.decode_step

    def flagged(*args, **kwargs):
        in_step["on"] = True
        try:
            return decode_step(*args, **kwargs)
        finally:
            in_step["on"] = False

    monkeypatch.setattr("eglr_harness.decoding.continuous.step_graphs.decode_step", flagged)
    gathered = run(ContinuousEngine(model, max_batch=8, eos_token_ids=[EOS]))
    assert seen["gathered"] > 0 and seen["without_advancing"] > 0
    assert seen["layer_0_in_steps"] == seen["steps"] - seen["without_advancing"]  # A = 0: no layer below join
    monkeypatch.setattr(fixed_step, "GATHER_SHARE", 0.0)
    in_place = run(ContinuousEngine(model, max_batch=8, eos_token_ids=[EOS]))
    for request, a, b in zip(requests, gathered, in_place):
        kls, ks = [], []
        tokens, _, _ = naive_eglr_greedy(model, list(request.prompt), max_new_tokens=request.max_new_tokens,
                                         eos_ids={EOS}, kl_sink=kls, iterations_sink=ks, **settings)
        assert min(abs(kl - TAU_KL) / TAU_KL for kl in kls) > 1e-3, "a KL lies near tau_kl: pick another TAU_KL"
        assert a.tokens == b.tokens == tokens and a.token_iterations == b.token_iterations == ks
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-6)
