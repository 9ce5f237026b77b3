"""The exit rules of refinement (``stop=``): their signals and stop steps against hand-computed values,
and each rule in both eglr-hf engines against the naive reference (eglr_harness/decoding/naive_reference.py),
which writes every rule again from its definition."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from helpers.inputs import random_prompts
from helpers.tiny_models import build_tiny_model

from eglr_harness.core.config import STOP_RULES, EglrConfig
from eglr_harness.decoding import functional as fn
from eglr_harness.decoding.continuous.engine import ContinuousEngine
from eglr_harness.decoding.contract import Request
from eglr_harness.decoding.hook.generate import eglr_generate
from eglr_harness.decoding.naive_reference import naive_eglr_greedy
from eglr_harness.decoding.stats import EglrStats

VOCAB, LAYERS, EOS, PAD = 96, 4, 2, 0
MAX_NEW = 8
K_MAX = 4  # accel's two-hit check can end a refinement at k = 3 at the earliest: k_max 4 lets it
MARGIN = 1e-3  # every observed signal stays this far (relative) from the threshold
NOISE = 2e-6  # and this far (absolute): fp32 sums over V or D differ by ~1e-7 between two implementations


# ---------------------------------------------------------------- the signals, by hand
def test_each_rules_signal_is_its_definition_on_hand_made_values():
    h_prev2, h_prev, h = torch.tensor([[0.0, 0.0]]), torch.tensor([[3.0, 0.0]]), torch.tensor([[3.0, 4.0]])
    # ||h - h_prev|| / ||h|| = ||(0, 4)|| / 5
    assert fn.exit_signal("latent", hidden=h, hidden_prev=h_prev).tolist() == pytest.approx([0.8])
    # ||(h - h_prev) - (h_prev - h_prev2)|| / ||h|| = ||(0, 4) - (3, 0)|| / 5 = 5 / 5
    assert fn.exit_signal("accel", hidden=h, hidden_prev=h_prev, hidden_prev2=h_prev2).tolist() == pytest.approx([1.0])
    logp = torch.tensor([[0.5, 0.3, 0.2]]).log()
    assert fn.exit_signal("margin", logp=logp).tolist() == pytest.approx([0.2])
    certain = torch.tensor([[1.0 - 1e-7, 1e-7 / 2, 1e-7 / 2]]).log()
    uniform = torch.full((1, 3), 1 / 3).log()
    # |H(p_k) - H(p_k-1)|: from ln 3 nats down to (nearly) 0
    assert fn.exit_signal("entropy", logp=certain, logp_prev=uniform).tolist() == pytest.approx([math.log(3)], abs=1e-5)
    # KL(p_k || p_k-1) = sum p_k log(p_k / p_k-1) = ln 3 - H(p_k)
    assert fn.exit_signal("kl", logp=certain, logp_prev=uniform).tolist() == pytest.approx([math.log(3)], abs=1e-5)


def _stop_step(rule: str, signals: list[float], threshold: float, k_max: int) -> int:
    """k* of one row fed ``signals`` (one per iteration) through the engines' own rule functions."""
    streak = torch.zeros(1, dtype=torch.long)
    for k, value in enumerate(signals[:k_max], start=1):
        streak = fn.hit_streak(fn.exit_hit(rule, torch.tensor([value]), threshold, k), streak)
        if fn.exit_done(rule, streak, k, k_max).item():
            return k
    raise AssertionError("the budget must end the refinement")


@pytest.mark.parametrize("rule, signals, threshold, expected", [
    ("kl", [1e-2, 1e-3, 1e-4, 1e-5], 5e-4, 3),  # the first KL below tau_kl
    ("kl", [5e-4, 4.9e-4], 5e-4, 2),  # a KL equal to tau_kl goes on (strictly below exits)
    ("latent", [0.2, 0.1, 0.02, 0.01], 0.03, 3),
    ("entropy", [0.5, 5e-4, 0.0, 0.0], 1e-3, 2),
    ("margin", [0.1, 0.4, 0.6, 0.9], 0.5, 3),  # margin exits above its threshold
    ("margin", [0.5, 0.5, 0.5, 0.5], 0.5, 4),  # at it: goes on to the budget
    # accel's signal at k = 1 is ignored (no second difference), then two hits in a row end it:
    ("accel", [0.0, 0.01, 0.05, 0.01, 0.02, 0.0], 0.03, 5),
    ("accel", [0.0, 0.01, 0.01, 0.5], 0.03, 3),
    ("accel", [0.0, 0.01, 0.05, 0.01], 0.03, 4),  # a single hit at the budget: the budget ends it
    ("latent", [float("nan"), 1.0, 1.0, 1.0], 0.03, 1),  # NaN ends it (non_finite reports it)
])
def test_stop_steps_match_hand_computed_values(rule, signals, threshold, expected):
    assert _stop_step(rule, signals, threshold, k_max=len(signals)) == expected


def test_refinement_done_is_the_kl_rule_with_one_hit():
    kl = torch.tensor([1e-5, 1e-2, float("nan"), 1e-2])
    k = torch.tensor([1, 1, 1, 3])
    streak = fn.hit_streak(fn.exit_hit("kl", kl, 1e-3, k), 0)
    assert fn.refinement_done(kl, 1e-3, k, 3).tolist() == fn.exit_done("kl", streak, k, 3).tolist()


# ---------------------------------------------------------------- a bad rule or threshold, before the load
@pytest.mark.parametrize("args, message", [
    (dict(stop="kld"), "`stop`='kld' is not allowed; allowed: kl, latent, accel, margin, entropy."),
    (dict(stop="margin", tau_margin=1.5), "`tau_margin`=1.5 is not allowed; allowed: a float in [0, 1]."),
    (dict(tau_latent=-0.1), "`tau_latent`=-0.1 is not allowed; allowed: a finite float in [0, 2**53]."),
    (dict(tau_entropy="abc"), "`tau_entropy`='abc' is not allowed"),
])
def test_a_bad_rule_or_threshold_is_one_line(args, message):
    from eglr_harness.run.settings import RunSettings

    with pytest.raises(ValueError) as err:
        RunSettings.from_args({}, **args)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_a_preset_names_a_rule_and_a_model_arg_overrides_it(tmp_path):
    from eglr_harness.run.presets import load_preset
    from eglr_harness.run.settings import RunSettings

    path = tmp_path / "rules.yaml"
    path.write_text("eglr:\n  stop: latent\n  tau_latent: 0.05\n  k_max: 4\n")
    preset = load_preset(str(path))
    assert RunSettings.from_args(preset).base.stop_threshold == 0.05
    assert RunSettings.from_args(preset, stop="margin").base.stop_rule.name == "margin"  # model args > preset
    path.write_text("eglr:\n  stopp: latent\n")
    with pytest.raises(ValueError, match="unknown eglr keys"):
        load_preset(str(path))


@pytest.mark.parametrize("rule", ["latent", "accel"])
def test_a_nan_exit_projection_raises_under_the_rules_without_a_head_per_iteration(monkeypatch, rule):
    """latent and accel read no distribution before the exit: a NaN there must still stop decoding."""
    from eglr_harness.decoding.hook.refiner import EglrRefiner

    project = EglrRefiner._project

    def nan_project(self, hidden, head_device, out_device):
        raw, logp = project(self, hidden, head_device, out_device)
        return torch.full_like(raw, torch.nan), torch.full_like(logp, torch.nan)

    monkeypatch.setattr(EglrRefiner, "_project", nan_project)
    model = build_tiny_model("llama", vocab_size=VOCAB, num_layers=LAYERS, seed=1)
    ids = torch.tensor([_prompts()[0]])
    with pytest.raises(FloatingPointError, match="non-finite logits"):
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False, pad_token_id=PAD,
                       custom_generate=eglr_generate, eglr_config=EglrConfig(L=2, k_max=K_MAX, tau_h=0.0, stop=rule))


def test_a_kl_config_keys_as_before_and_another_rule_names_its_own_threshold():
    assert set(EglrConfig().as_dict()) == {"L", "T", "alpha", "k_max", "tau_kl", "tau_h", "top_k", "top_p", "seed"}
    latent = EglrConfig(stop="latent", tau_latent=0.05, tau_margin=0.9).as_dict()
    assert latent["stop"] == "latent" and latent["tau_latent"] == 0.05 and "tau_margin" not in latent


# ---------------------------------------------------------------- both engines against the naive reference
@pytest.fixture(scope="module", params=("llama", "gemma2"))
def model(request):
    return build_tiny_model(request.param, vocab_size=VOCAB, num_layers=LAYERS, seed=1)


def _prompts():
    return random_prompts(0, lengths=(9, 3, 12, 5), vocab=VOCAB)


def _naive(model, prompts, config: EglrConfig, logits=None):
    """Tokens, k* per emitted token and every compared signal of the naive reference, prompt by prompt;
    ``logits``: a list that receives each prompt's emitted logits (steps, V)."""
    rows, ks, signals = [], [], []
    for prompt in prompts:
        its: list[int] = []
        tokens, emitted, _ = naive_eglr_greedy(
            model, prompt, L=config.L, alpha=config.alpha, k_max=config.k_max, tau_kl=config.tau_kl,
            tau_h=config.tau_h, max_new_tokens=MAX_NEW, eos_ids={EOS}, kl_sink=signals, iterations_sink=its,
            stop=config.stop, tau_stop=config.stop_threshold)
        rows.append(tokens)
        ks.append(its)
        if logits is not None:
            logits.append(torch.stack(emitted))
    return rows, ks, signals


def _threshold(model, prompts, rule: str) -> float:
    """A threshold that makes some tokens exit early, at more than one k, clear of every signal the run
    with it compares: the first quantile of the signals seen without exits that passes."""
    never = {"margin": 1.0}.get(rule, 0.0)  # a threshold no signal meets: every token runs to k_max
    probe = EglrConfig(L=2, k_max=K_MAX, tau_h=0.0, stop=rule, **{STOP_RULES[rule].threshold_arg: never})
    seen = sorted(v for v in _naive(model, prompts, probe)[2] if v == v and v > 50 * NOISE)
    assert len(seen) > 10, f"too few {rule} signals above the float noise to place a threshold"
    for q in (0.5, 0.4, 0.6, 0.3, 0.7, 0.2, 0.8, 0.1, 0.9):
        i = int(q * (len(seen) - 1))
        candidate = (seen[i] + seen[i + 1]) / 2
        config = EglrConfig(L=2, k_max=K_MAX, tau_h=0.0, stop=rule, **{STOP_RULES[rule].threshold_arg: candidate})
        _, ks, signals = _naive(model, prompts, config)
        clear = min((abs(v - candidate) for v in signals), default=1.0) > max(MARGIN * candidate, NOISE)
        flat = [k for row in ks for k in row]
        if clear and any(0 < k < K_MAX for k in flat) and len(set(flat) - {0}) > 1:
            return candidate
    pytest.fail(f"no threshold of {rule} clear of the observed signals with early and late exits")


def _hook(model, prompts, config: EglrConfig):
    """Tokens, k* histogram and each emitted token's log-probability, prompt by prompt."""
    rows, hist, logprobs = [], Counter(), []
    for prompt in prompts:  # one prompt a call: no padding, as the naive reference decodes
        stats = EglrStats()
        ids = torch.tensor([prompt])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW, do_sample=False,
                             pad_token_id=PAD, eos_token_id=EOS, custom_generate=eglr_generate, eglr_config=config,
                             eglr_stats=stats, output_scores=True, return_dict_in_generate=True)
        tokens = out.sequences[0, len(prompt):].tolist()
        tokens = tokens[: tokens.index(EOS) + 1] if EOS in tokens else tokens
        rows.append(tokens)
        scores = torch.log_softmax(torch.stack(out.scores)[:, 0].float(), -1)  # (steps, V)
        logprobs.append([float(scores[i, t]) for i, t in enumerate(tokens)])
        hist.update({int(k): n for k, n in stats.summary()["iteration_hist"].items()})
    return rows, hist, logprobs


def _continuous(model, prompts, config: EglrConfig):
    outcomes = ContinuousEngine(model, max_batch=2, eos_token_ids=[EOS]).run(
        [Request(tuple(p), config, MAX_NEW) for p in prompts])
    hist = Counter()
    for outcome in outcomes:
        hist.update(outcome.iterations)
    return [o.tokens for o in outcomes], hist, [list(o.logprobs) for o in outcomes]


@pytest.mark.parametrize("rule", list(STOP_RULES))
def test_each_rule_is_exact_against_the_naive_reference_in_both_engines(model, rule):
    prompts = _prompts()
    tau = _threshold(model, prompts, rule)
    config = EglrConfig(L=2, k_max=K_MAX, tau_h=0.0, stop=rule, **{STOP_RULES[rule].threshold_arg: tau})
    ref_logits: list[torch.Tensor] = []
    ref_rows, ref_ks, _ = _naive(model, prompts, config, logits=ref_logits)
    ref_hist = Counter(k for row in ref_ks for k in row if k > 0)
    assert min(ref_hist) < K_MAX, "the threshold must end some refinement before k_max"
    # the emitted distribution is the exit iteration's: the log-probability of each emitted token
    ref_logprobs = [[float(torch.log_softmax(lg[i], -1)[t]) for i, t in enumerate(row)]
                    for lg, row in zip(ref_logits, ref_rows)]
    for engine in (_hook, _continuous):
        rows, hist, logprobs = engine(model, prompts, config)
        assert rows == ref_rows, f"{engine.__name__} diverged from the naive reference under stop={rule}"
        assert hist == ref_hist, f"{engine.__name__}'s iterations differ from the naive reference under stop={rule}"
        for got, ref in zip(logprobs, ref_logprobs):
            assert got == pytest.approx(ref, abs=2e-5), f"{engine.__name__} emitted another iteration's distribution"


# ---------------------------------------------------------------- honest compute
@pytest.mark.parametrize("rule", ["kl", "latent", "margin", "accel"])
def test_the_accounting_counts_the_lm_head_projections_each_rule_makes(model, rule):
    prompts = _prompts()
    config = EglrConfig(L=2, k_max=K_MAX, tau_h=0.0, stop=rule)
    layer = sum(p.numel() for p in model.model.layers[0].parameters())
    head_layers = VOCAB * model.config.hidden_size / layer  # the unembedding's weights over one layer's
    for engine in ("hook", "continuous"):
        stats = EglrStats()
        if engine == "hook":
            for prompt in prompts:
                ids = torch.tensor([prompt])
                model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW, do_sample=False,
                               pad_token_id=PAD, eos_token_id=EOS, custom_generate=eglr_generate, eglr_config=config,
                               eglr_stats=stats)
        else:
            ContinuousEngine(model, max_batch=2, eos_token_ids=[EOS]).run(
                [Request(tuple(p), config, MAX_NEW) for p in prompts], stats_for=lambda c: stats)
        summary = stats.summary()
        hist = {int(k): n for k, n in summary["iteration_hist"].items()}
        per_iteration = rule in ("kl", "margin")  # a distribution at every iteration; latent, accel: one at the exit
        expected = sum(k * n for k, n in hist.items()) if per_iteration else sum(hist.values())
        assert summary["head_projections"] == expected, engine
        assert summary["head_layers"] == pytest.approx(head_layers, abs=1e-4)
        n, tokens, h = LAYERS, summary["tokens"], stats.head_layers
        by_hand = ((n + h) * tokens + 2 * sum(k * c for k, c in hist.items()) + h * expected) / ((n + h) * tokens)
        assert summary["flop_ratio_with_head"] == pytest.approx(by_hand)
        assert summary["flop_ratio"] == pytest.approx(1 + 2 * sum(k * c for k, c in hist.items()) / (n * tokens))


@pytest.mark.parametrize("rule", list(STOP_RULES))
def test_each_rules_functions_trace_whole(rule):
    """A rule's functions as the continuous step calls them (the rule a Python string, the thresholds,
    iterations and streaks tensors) under torch.compile(fullgraph=True): no graph break, no host read,
    so a CUDA graph can record the step; the values are the eager ones."""
    try:
        torch._dynamo.reset()
        torch.compile(lambda x: x * 2 + 1, fullgraph=True, backend="eager")(torch.ones(2))
    except Exception as error:  # noqa: BLE001 -- no compiler here: nothing to test
        pytest.skip(f"torch.compile is not available here: {type(error).__name__}: {error}")

    def step(logp, logp_prev, hidden, hidden_prev, hidden_prev2, threshold, iterations, streak, k_max):
        signal = fn.exit_signal(rule, logp=logp, logp_prev=logp_prev, hidden=hidden, hidden_prev=hidden_prev,
                                hidden_prev2=hidden_prev2)
        streak = fn.hit_streak(fn.exit_hit(rule, signal, threshold, iterations), streak)
        return signal, streak, fn.exit_done(rule, streak, iterations, k_max)

    g = torch.Generator().manual_seed(0)
    rows = 6
    inputs = (torch.log_softmax(torch.randn(rows, VOCAB, generator=g), -1),
              torch.log_softmax(torch.randn(rows, VOCAB, generator=g), -1),
              *(torch.randn(rows, 16, generator=g) for _ in range(3)),
              torch.full((rows,), STOP_RULES[rule].default, dtype=torch.float64),
              torch.tensor([1, 2, 3, 2, 4, 1]), torch.tensor([0, 1, 0, 1, 1, 0]), torch.full((rows,), 4))
    eager = step(*inputs)
    traced = torch.compile(step, fullgraph=True, backend="eager")(*inputs)
    for a, b in zip(traced, eager):
        assert torch.equal(a, b)
