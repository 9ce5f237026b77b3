"""GRPO rollouts take eglr-hf's own model args from the one table (rl/rollouts.ROLLOUT_ARGS), resolve them once, and
hand each step's eglr-hf the same args."""

from __future__ import annotations

import pytest

from eglr_harness.core.model_args import EGLR_ARGS
from eglr_harness.rl.rollouts import ROLLOUT_ARGS, EglrRollout


def test_every_own_arg_but_the_store_is_taken_and_reaches_the_steps_model(monkeypatch):
    assert set(ROLLOUT_ARGS) == set(EGLR_ARGS) - {"rollout_cache"}
    rollout = EglrRollout(L="0|2", T=0, tau_h=1.0, stop="latent", tau_latent=0.05, seeds=2, engine="hook")
    assert (rollout.settings.base.stop, rollout.settings.base.stop_threshold, rollout.settings.seeds) == \
        ("latent", 0.05, 2)
    assert (rollout.engine, rollout.compile) == ("hook", "none")  # GRPO's own compile default
    built = {}

    class FakeHFLM:
        def __init__(self, **kwargs):
            built.update(kwargs)

    import eglr_harness.harness.model as model

    monkeypatch.setattr(model, "EglrHFLM", FakeHFLM)
    rollout._eglr_hf(model="policy", tokenizer="tok")
    assert built == {"pretrained": "policy", "tokenizer": "tok", "batch_size": 16, "L": "0|2", "T": 0, "tau_h": 1.0,
                     "stop": "latent", "tau_latent": 0.05, "seeds": 2, "engine": "hook", "compile": "none"}


def test_a_name_that_is_no_own_arg_is_refused_naming_what_is_allowed():
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['rollout_cache'\]; allowed: .*tau_latent"):
        EglrRollout(L=0, rollout_cache="out/store")
    with pytest.raises(ValueError, match=r"`tau_margin`=2\.0 is not allowed"):
        EglrRollout(L=0, stop="margin", tau_margin=2.0)
