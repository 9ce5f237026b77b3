"""The engine off its first path: per-row stop strings, caches and attention implementations,
devices, memory that does not grow with the context, host-device syncs, and the one config."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.inputs import ENGINE_PAD, ENGINE_VOCAB, CharTokenizer
from helpers.inputs import left_pad as _left_pad
from helpers.inputs import random_prompts as _prompts
from helpers.tiny_models import build_tiny_model
from torch.utils._python_dispatch import TorchDispatchMode

from eglr_harness.core.config import EglrConfig
from eglr_harness.decoding.hook import refiner as refiner_module
from eglr_harness.decoding.hook.generate import _FinishedRowsTracker, eglr_generate
from eglr_harness.decoding.hook.refiner import _Attended, _ReplayCache, current_slot
from eglr_harness.decoding.naive_reference import naive_eglr_greedy
from eglr_harness.decoding.stats import EglrStats

VOCAB, LAYERS, PAD, EOS = ENGINE_VOCAB, 4, ENGINE_PAD, 2
MAX_NEW = 10
TAU_KL = 3e-4  # off the KL knife-edge of these tiny models (see test_engine_vs_naive.py)


def _generate(model, prompts, max_new=MAX_NEW, **kwargs):
    ids, mask = _left_pad(prompts)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False, pad_token_id=PAD,
                         eos_token_id=EOS, custom_generate=eglr_generate, output_scores=True,
                         return_dict_in_generate=True, **kwargs)
    return out.sequences[:, ids.shape[1]:], torch.stack(out.scores, dim=1)  # (B, steps), (B, steps, V)


def _trim(tokens: list[int]) -> list[int]:
    return tokens[: tokens.index(EOS) + 1] if EOS in tokens else tokens


# ------------------------------------------------------------------ 11.5 caches and attention
def _model(arch, attention, **overrides):
    model = build_tiny_model(arch, vocab_size=VOCAB, num_layers=LAYERS, seed=1, **overrides)
    model.config._attn_implementation = attention
    return model


EXACT_SETTINGS = [
    # (arch, attention, model overrides, generate kwargs)
    ("llama", "sdpa", {}, {}),
    ("llama", "eager", {}, {}),
    ("llama", "sdpa", {}, {"cache_implementation": "static"}),
    ("llama", "eager", {}, {"cache_implementation": "static"}),
    ("qwen2", "sdpa", {}, {"cache_implementation": "static"}),
    ("mistral", "sdpa", {"sliding_window": 6}, {}),  # every layer slides; the window fills while decoding
    ("mistral", "sdpa", {"sliding_window": 6}, {"cache_implementation": "static"}),
    ("gemma2", "eager", {}, {"cache_implementation": "static"}),  # hybrid: sliding and full layers
    ("gemma2", "eager", {"sliding_window": 6}, {}),
    ("gemma2", "eager", {"sliding_window": 6}, {"cache_implementation": "static"}),
]


@pytest.mark.parametrize("arch,attention,overrides,gen", EXACT_SETTINGS,
                         ids=lambda v: v if isinstance(v, str) else ",".join(f"{k}={x}" for k, x in v.items()) or "-")
def test_every_supported_cache_and_attention_is_exact(arch, attention, overrides, gen):
    model = _model(arch, attention, **overrides)
    prompts = _prompts(7)
    settings = dict(L=2, alpha=0.2, k_max=3, tau_kl=TAU_KL, tau_h=0.0)
    tokens, scores = _generate(model, prompts, **settings, **gen)
    plain_tokens, plain_scores = _generate(model, prompts, L=0, **gen)
    assert not torch.allclose(scores[:, 0], plain_scores[:, 0])  # refinement ran
    for r, prompt in enumerate(prompts):
        ref_tokens, ref_logits, gated = naive_eglr_greedy(model, prompt, max_new_tokens=MAX_NEW, eos_ids={EOS},
                                                          **settings)
        assert all(gated)
        assert _trim(tokens[r].tolist()) == ref_tokens, f"row {r} diverged from the naive reference"
        for step, ref in enumerate(ref_logits):
            torch.testing.assert_close(scores[r, step], ref, atol=2e-4, rtol=1e-4)


def _refused(model, match, **gen):
    calls = []
    handle = model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(ValueError, match=match) as info:
            _generate(model, _prompts(1), L=2, tau_h=0.0, **gen)
    finally:
        handle.remove()
    assert calls == [], "refused only after generation started"
    assert "supports attn_implementation in ('eager', 'sdpa')" in str(info.value)  # names what is supported
    assert "'static'" in str(info.value)
    return info.value


@pytest.mark.parametrize("attention", ["flex_attention", "flash_attention_2", "flash_attention_3", "paged|sdpa"])
def test_unsupported_attention_is_refused_before_generation(attention):
    _refused(_model("llama", attention), rf"attn_implementation='{attention.replace('|', '[|]')}'")


def test_unsupported_caches_are_refused_before_generation():
    from transformers import DynamicCache, QuantizedCache

    from eglr_harness.decoding.cache_kwarg import CACHE_KWARG

    model = _model("llama", "sdpa")
    try:
        fp8 = QuantizedCache(backend="fp8", config=model.config)
    except ValueError:  # a release without the fp8 backend (5.19, the declared floor, has none): nothing to refuse
        fp8 = None
    if fp8 is not None:
        _refused(model, rf"{CACHE_KWARG}=QuantizedCache .*cache layer Fp8QuantizedLayer", **{CACHE_KWARG: fp8})
    offloaded = DynamicCache(config=model.config)
    offloaded.offloading = True  # what cache_implementation='offloaded' builds (its streams need CUDA)
    _refused(model, rf"{CACHE_KWARG}=DynamicCache \(an offloaded cache\)", **{CACHE_KWARG: offloaded})
    _refused(model, r"needs the KV cache \(use_cache=False", use_cache=False)


def test_any_setting_works_without_refinement():
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    AttentionInterface.register("eglr_test_attention", sdpa_attention_forward)  # a user's own kernel
    model = _model("llama", "eglr_test_attention")
    _refused(model, r"attn_implementation='eglr_test_attention'")
    ids, mask = _left_pad(_prompts(1))
    for kwargs in (dict(L=0), dict(L=2, tau_h=math.inf)):
        model.generate(ids, attention_mask=mask, max_new_tokens=2, do_sample=False, pad_token_id=PAD,
                       custom_generate=eglr_generate, **kwargs)


def test_refinement_decodes_eagerly_where_transformers_would_compile(monkeypatch):
    from transformers import CompileConfig

    model = _model("llama", "sdpa")
    verdicts = []
    original = type(model)._valid_auto_compile_criteria

    def spy(self, model_kwargs, generation_config):
        verdicts.append(original(self, model_kwargs, generation_config))
        return False  # never compile here, whatever the verdict

    monkeypatch.setattr(type(model), "_valid_auto_compile_criteria", spy)
    compile_config = CompileConfig()
    compile_config._compile_all_devices = True  # transformers' own switch to compile on a CPU too
    forced = dict(cache_implementation="static", compile_config=compile_config)
    _generate(model, _prompts(1), max_new=2, L=0, **forced)
    assert verdicts and all(verdicts)  # the forward would be compiled without refinement ...
    verdicts.clear()
    _generate(model, _prompts(1), max_new=2, L=2, tau_h=0.0, **forced)
    assert verdicts and not any(verdicts)  # ... and is not with it: the hooks need the eager pass


def test_replay_overwrites_the_slot_of_position_t_and_restores_it():
    from transformers import StaticCache

    model = _model("llama", "sdpa")
    cache = StaticCache(config=model.config, max_cache_len=12)
    layer = cache.layers[0]
    keys, values = cache.update(torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8), 0)
    slot = current_slot(layer, keys)
    assert keys.shape[-2] == 12 and int(slot) == 4  # the static buffer: position t is slot 4, not the last
    before_k, before_v = keys.clone(), values.clone()
    replay = _ReplayCache({0: _Attended(keys, values, slot)}, 1, 2)
    new_k, new_v = torch.full((1, 2, 1, 8), 7.0), torch.full((1, 2, 1, 8), 9.0)
    k, v = replay.update(new_k, new_v, 0)
    assert k.data_ptr() == keys[1:2].data_ptr()  # a view of rows 1:2, no copy
    assert torch.equal(k[:, :, 4:5], new_k) and torch.equal(v[:, :, 4:5], new_v)
    assert torch.equal(keys[0], before_k[0]) and torch.equal(keys[1, :, :4], before_k[1, :, :4])
    replay.restore()
    assert torch.equal(keys, before_k) and torch.equal(values, before_v)


# ------------------------------------------------------------------ 11.6 devices
def test_replay_moves_what_it_writes_to_the_device_of_what_it_indexes():
    """The cache of a layer may live elsewhere than the refined state (split device_map); meta stands in."""
    keys, values = torch.empty(3, 2, 6, 4, device="meta"), torch.empty(3, 2, 6, 4, device="meta")
    replay = _ReplayCache({5: _Attended(keys, values, torch.tensor([2], device="meta"))}, 0, 2)
    k, v = replay.update(torch.randn(2, 2, 1, 4), torch.randn(2, 2, 1, 4), 5)  # refined K/V on the CPU
    assert k.device.type == "meta" and k.shape == (2, 2, 6, 4)
    replay = _ReplayCache({5: _Attended(keys, values, 3)}, 1, 3)
    assert replay.update(torch.randn(2, 2, 1, 4), torch.randn(2, 2, 1, 4), 5)[0].device.type == "meta"
    replay.restore()
    counters = refiner_module._Counters(k_max=3)
    counters.add_step(torch.ones(3, dtype=torch.bool, device="meta"))
    counters.add_step(torch.ones(3, dtype=torch.bool))  # the next step's mask on another device
    counters.add_refinement(torch.tensor([1, 0, 3], device="meta"), pass_rows=3)
    counters.add_refinement(torch.tensor([2, 2]), pass_rows=2)
    counters.add_nan(torch.zeros(3, device="meta"))
    counters.add_nan(torch.zeros(3))
    assert counters.tokens.device.type == "meta" and counters.histogram.shape == (4,)


# ------------------------------------------------------------------ 11.4 per-row stop strings
class _CharTokenizer(CharTokenizer):
    """The shared one-character-per-id tokenizer over this file's vocabulary; id -1 (what its ``__call__`` gives
    for any text) converts to a string no output contains."""

    def __init__(self):
        super().__init__(VOCAB)

    def _convert_id_to_token(self, index):
        return "abcdef" if index == -1 else self.CHARS[index]


def test_stop_string_criterion_ignores_matches_that_reach_into_the_prompt():
    tok = _CharTokenizer()
    criterion = __import__("transformers").StopStringCriteria(tokenizer=tok, stop_strings=[tok.CHARS[5] + tok.CHARS[6]])
    tracker = _FinishedRowsTracker(__import__("transformers").StoppingCriteriaList([]), criterion, prompt_len=3)
    ids = torch.tensor([[9, 9, 5, 6], [9, 9, 9, 5]])  # row 0: the stop string straddles prompt and output
    assert tracker(ids, None).tolist() == [False, False]
    assert tracker.finished.tolist() == [False, False]
    assert tracker(torch.cat([ids, torch.tensor([[9], [6]])], dim=1), None).tolist() == [False, False]
    assert tracker.finished.tolist() == [False, True]  # row 1 wrote it; generate was not told


def test_a_row_that_emits_a_stop_string_is_neither_refined_nor_counted_nor_recorded_after_it():
    model = _model("llama", "sdpa")
    tok = _CharTokenizer()
    prompts = _prompts(11)
    settings = dict(L=2, alpha=0.2, k_max=3, tau_kl=TAU_KL, tau_h=0.0)
    free, _ = _generate(model, prompts, **settings)
    rows = [_trim(r.tolist()) for r in free]
    # stop on a token row 0 emits first at step >= 2: rows end where they first emit it (or at EOS / the limit)
    first = next(j for j in range(2, len(rows[0])) if rows[0][j] not in rows[0][:j])
    stop_token = rows[0][first]
    ends = [r.index(stop_token) + 1 if stop_token in r else len(r) for r in rows]
    assert ends[0] == first + 1 < len(rows[0])

    stats = EglrStats()
    tokens, scores = _generate(model, prompts, **settings, eglr_stats=stats,
                               eglr_stop_strings=[tok.CHARS[stop_token]], eglr_tokenizer=tok)
    for r, end in enumerate(ends):
        assert tokens[r, :end].tolist() == rows[r][:end]  # what the row says up to its stop is unchanged
    # after its stop, row 0's logits are the plain model's: not refined
    ids, _ = _left_pad(prompts)
    for step in range(ends[0], scores.shape[1]):
        seq = prompts[0] + tokens[0, :step].tolist()
        with torch.no_grad():
            plain = model(torch.tensor([seq])).logits[0, -1]
        torch.testing.assert_close(scores[0, step], plain, atol=1e-4, rtol=1e-4)
    summary = stats.summary()
    assert summary["tokens"] == sum(ends)  # nor counted
    assert summary["gated_tokens"] == sum(ends)  # tau_h = 0 gates every counted token
    assert sum(summary["iteration_hist"].values()) == sum(ends)

    outcomes = []
    _generate(model, prompts, L=0, eglr_outcomes=outcomes, eglr_stop_strings=[tok.CHARS[stop_token]],
              eglr_tokenizer=tok)
    plain_rows = [_trim(r.tolist()) for r in _generate(model, prompts, L=0)[0]]
    plain_ends = [r.index(stop_token) + 1 if stop_token in r else len(r) for r in plain_rows]
    assert [len(o.entropies) for o in outcomes] == plain_ends  # nor recorded for calibration
    assert [o.tokens for o in outcomes] == [r[:end] for r, end in zip(plain_rows, plain_ends)]
    assert [o.finish for o in outcomes] == ["stop" if stop_token in r else "eos" if EOS in r else "length"
                                            for r in plain_rows]


def test_stop_strings_need_a_tokenizer_and_a_list():
    model = _model("llama", "sdpa")
    with pytest.raises(ValueError, match="needs `eglr_tokenizer`"):
        _generate(model, _prompts(1), L=0, eglr_stop_strings=["x"])
    with pytest.raises(ValueError, match=r"`eglr_stop_strings`='x' is not allowed; allowed: a list of strings"):
        _generate(model, _prompts(1), L=0, eglr_stop_strings="x", eglr_tokenizer=_CharTokenizer())


# ------------------------------------------------------------------ 13 one config
def test_one_config_object_or_the_loose_settings_not_both():
    model = _model("qwen2", "sdpa")
    prompts = _prompts(2)
    loose, loose_scores = _generate(model, prompts, L=2, tau_h=0.5, k_max=2, alpha=0.3, tau_kl=TAU_KL)
    config = EglrConfig(L=2, T=0.0, tau_h=0.5, k_max=2, alpha=0.3, tau_kl=TAU_KL)
    one, one_scores = _generate(model, prompts, eglr_config=config)
    assert torch.equal(loose, one) and torch.equal(loose_scores, one_scores)
    with pytest.raises(ValueError, match=r"got eglr_config and the loose settings \['L', 'tau_h'\]; pass one"):
        _generate(model, prompts, eglr_config=config, L=2, tau_h=0.5)
    with pytest.raises(ValueError, match=r"eglr_config.T=0.7 but generate decodes greedily"):
        _generate(model, prompts, eglr_config=EglrConfig(L=2, T=0.7, tau_h=0.5))
    with pytest.raises(ValueError, match=r"`L`=5 exceeds the model's 4 decoder layers"):
        _generate(model, prompts, eglr_config=EglrConfig(L=5, T=0.0))


# ------------------------------------------------------------------ 11.11 host-device syncs
class _HostReads(TorchDispatchMode):
    """Counts the operations that make the host wait for the device (on a GPU: a sync each)."""

    SYNCING = {"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.masked_select.default",
               "aten.is_nonzero.default"}

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if name in self.SYNCING:
            self.count += 1
        elif name.startswith("aten.index.Tensor") and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or ())):
            self.count += 1  # boolean-mask indexing: its size depends on the data
        return func(*args, **(kwargs or {}))


def _count_host_reads(monkeypatch, run) -> int:
    reads = _HostReads()
    for name in ("tolist", "cpu", "numpy"):  # not dispatched as ops on a CPU tensor: count them here
        original = getattr(torch.Tensor, name)

        def counted(self, *a, _original=original, **k):
            reads.count += 1
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    with reads:
        run()
    monkeypatch.undo()
    return reads.count


@pytest.mark.parametrize("L,tau_h", [(0, math.inf), (2, 0.0), (2, math.inf)])
def test_at_most_one_host_read_per_decoding_step(monkeypatch, L, tau_h):
    model = _model("llama", "sdpa")
    ids, mask = _left_pad(_prompts(3))
    steps = 8
    common = dict(attention_mask=mask, max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                  pad_token_id=PAD)
    stock = _count_host_reads(monkeypatch, lambda: model.generate(ids, **common))
    stats = EglrStats()
    eglr = _count_host_reads(monkeypatch, lambda: model.generate(ids, custom_generate=eglr_generate, L=L,
                                                                 tau_h=tau_h, eglr_stats=stats, **common))
    assert stats.steps == steps
    per_step = 1 if (L > 0 and tau_h < math.inf) else 0  # which rows are gated
    once_per_batch = 1  # the counters, read when the generate call ends
    assert eglr - stock <= per_step * steps + once_per_batch, f"{eglr - stock} host reads for {steps} steps"


def test_counters_read_once_per_batch_give_the_same_summary():
    model = _model("llama", "sdpa")
    prompts = _prompts(5)
    stats = EglrStats()
    tokens, _ = _generate(model, prompts, L=2, tau_h=0.0, k_max=3, eglr_stats=stats)
    generated = sum(len(_trim(r.tolist())) for r in tokens)
    summary = stats.summary()
    assert summary["tokens"] == summary["gated_tokens"] == generated and summary["rho"] == 1.0
    assert sum(summary["iteration_hist"].values()) == generated
    assert summary["flop_ratio"] == pytest.approx(1 + summary["mean_iterations"] * 2 / LAYERS)
    assert stats.steps == MAX_NEW and stats.computed_rows == MAX_NEW * len(prompts)


# ------------------------------------------------------------------ 11.10 memory
class _Allocations(TorchDispatchMode):
    """Sum of the bytes of new (non-view, not in-place) tensors made while the refiner refines."""

    def __init__(self, refiner_ref):
        super().__init__()
        self.refiner_ref, self.bytes = refiner_ref, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        refiner = self.refiner_ref[0] if self.refiner_ref else None
        if refiner is not None and refiner._refining:
            inputs = {t.untyped_storage().data_ptr() for t in _tensors(args) if t.device.type != "meta"}
            for t in _tensors(out if isinstance(out, (tuple, list)) else (out,)):
                if t.untyped_storage().data_ptr() not in inputs:
                    self.bytes += t.numel() * t.element_size()
        return out


def _tensors(values):
    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (tuple, list)):
            yield from _tensors(v)


def test_refinement_allocates_nothing_that_grows_with_the_context(monkeypatch):
    model = _model("llama", "sdpa")
    refiners: list = []
    original_enter = refiner_module.EglrRefiner.__enter__

    def enter(self):
        refiners[:] = [self]
        return original_enter(self)

    monkeypatch.setattr(refiner_module.EglrRefiner, "__enter__", enter)
    made = {}
    for context in (32, 256):
        prompt = torch.randint(3, VOCAB, (1, context), generator=torch.Generator().manual_seed(0))
        tracker = _Allocations(refiners)
        with tracker:
            model.generate(prompt, max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=PAD,
                           custom_generate=eglr_generate, L=3, tau_h=0.0)
        made[context] = tracker.bytes
    assert made[32] > 0
    assert made[256] == made[32], f"refinement allocated {made} bytes at contexts 32 and 256"


# ------------------------------------------------------------------ the KL-exit freeze
def test_a_row_stays_frozen_at_its_kl_exit_when_a_later_kl_rises(monkeypatch):
    # The tiny models' KLs shrink at every iteration, so no exit ever meets a later, larger KL there.
    # Script the KLs instead (one value per iteration, for every row): above tau_kl, below it (the
    # exit: k* = 2), then above it again for the iterations that still run.
    model = _model("llama", "sdpa")
    prompts = _prompts(12)
    settings = dict(L=2, alpha=0.2, tau_kl=0.5, tau_h=0.0)
    def scripted(values):
        calls = []

        def signal(rule, *, logp, **others):  # the exit rule's signal: the KL of stop=kl
            value = values[len(calls) % len(values)]
            calls.append(value)
            return torch.full(logp.shape[:1], value, device=logp.device)

        return signal

    monkeypatch.setattr(refiner_module, "exit_signal", scripted([1.0, 0.0, 1.0, 1.0]))
    stats = EglrStats()
    tokens, scores = _generate(model, prompts, k_max=4, eglr_stats=stats, **settings)
    monkeypatch.setattr(refiner_module, "exit_signal", scripted([1.0, 0.0]))
    exit_tokens, exit_scores = _generate(model, prompts, k_max=2, **settings)
    generated = sum(len(_trim(r.tolist())) for r in tokens)
    assert stats.summary()["iteration_hist"] == {"2": generated}  # every token exits at k = 2, none resumes
    assert torch.equal(tokens, exit_tokens)
    torch.testing.assert_close(scores, exit_scores, atol=0, rtol=0)  # the exit iteration's logits
