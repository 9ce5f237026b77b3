"""Per-rollout signals (eglr_harness/core/signals.py), the aggregators beside the vote
(eglr_harness/core/votes.py) and the tasks' signal metrics (``wmaj@B``, ``rollouts[i]["signals"]``)."""

from __future__ import annotations

import math
import re

import pytest

from eglr_harness.core import votes
from eglr_harness.core.signals import HIGHER_IS_BETTER, RECORDED_SIGNALS, SIGNALS, confidence, rollout_signals
from eglr_harness.scoring import doc_scores as metrics


def test_rollout_signals_values():
    s = rollout_signals(
        entropies=[0.5, 3.0, 1.0, 2.5],
        logprobs=[-0.1, -2.0, -0.3, -1.0],
        iterations=[0, 3, 0, 1],
        final_kl=[9.0, 1e-4, 9.0, 2e-3],  # read at gated tokens only
    )
    assert set(s) == set(RECORDED_SIGNALS)
    assert s["mean_entropy"] == pytest.approx(7.0 / 4)
    assert s["max_entropy"] == 3.0
    assert s["mean_logprob"] == pytest.approx(-3.4 / 4)
    assert s["gated_fraction"] == 0.5
    assert s["mean_iterations"] == 2.0
    assert s["mean_final_kl"] == pytest.approx((1e-4 + 2e-3) / 2)
    assert s["tokens"] == 4


def test_rollout_signals_without_gated_tokens_and_empty():
    s = rollout_signals([1.0, 2.0], [-0.5, -0.5], [0, 0], [0.0, 0.0])
    assert s["gated_fraction"] == 0.0 and s["mean_iterations"] is None and s["mean_final_kl"] is None
    empty = rollout_signals([], [], [], [])
    assert empty["tokens"] == 0 and empty["mean_entropy"] is None and empty["gated_fraction"] is None


@pytest.mark.parametrize("bad", [
    dict(entropies=[1.0], logprobs=[], iterations=[0], final_kl=[0.0]),
    dict(entropies=[1.0], logprobs=[-math.inf], iterations=[0], final_kl=[0.0]),
    dict(entropies=[1.0], logprobs=[-1.0], iterations=[-1], final_kl=[0.0]),
])
def test_rollout_signals_refuses_bad_arrays(bad):
    with pytest.raises(ValueError):
        rollout_signals(**bad)


def test_final_kl_is_read_at_gated_tokens_only():
    s = rollout_signals([1.0, 2.0], [-0.5, -0.5], [0, 2], [math.nan, 0.25])
    assert s["mean_final_kl"] == 0.25
    with pytest.raises(ValueError):
        rollout_signals([1.0], [-0.5], [1], [math.nan])


def test_every_signal_has_a_direction():
    assert set(HIGHER_IS_BETTER) == set(SIGNALS)


def test_confidence_is_geometric_mean_probability():
    assert confidence({"mean_logprob": math.log(0.5)}) == pytest.approx(0.5)
    assert confidence(None) is None and confidence({"mean_logprob": None}) is None


def test_weighted_majority_outweighs_count_and_keeps_tie_rule():
    assert votes.weighted_majority(["a", "b", "b"], [3.0, 1.0, 1.0]) == 0  # weight beats count
    assert votes.weighted_majority(["a", "b", "b"], [1.0, 1.0, 1.0]) == 1  # equal weights: plain majority
    assert votes.weighted_majority(["a", "b"], [1.0, 1.0]) == 0  # tie: the earlier label
    assert votes.weighted_majority([None, "b"], [9.0, 0.1]) == 1  # no answer never votes
    assert votes.weighted_majority([None], [1.0]) is None
    with pytest.raises(ValueError):
        votes.weighted_majority(["a"], [-1.0])


def test_top_fraction_and_best_scored():
    assert votes.top_fraction([0.1, 0.9, 0.5, 0.9], 0.5) == [1, 3]
    assert votes.top_fraction([0.1, 0.2, 0.3], 0.1) == [2]  # at least one
    assert votes.best_scored([None, 0.2, 0.7, 0.7]) == 2
    assert votes.best_scored([None]) is None


def _fake_meta(signals_by_text):
    def meta(response):
        return {"L": 1, "T": 0.0, "cycle": 0, "signals": signals_by_text.get(str(response))}
    return meta


def test_score_document_logs_signals_and_weighted_vote(monkeypatch):
    # three wrong "3" with low confidence against one right "4" with high confidence
    sig = {"3": {"mean_logprob": math.log(0.1)}, "4": {"mean_logprob": math.log(0.9)}}
    monkeypatch.setattr(metrics, "rollout_meta", _fake_meta(sig))
    out = metrics.score_document("4", ["3", "3", "4", "3"])
    assert [r["signals"] for r in out["rollouts"]] == [sig["3"], sig["3"], sig["4"], sig["3"]]
    assert out["maj@4"] == 0  # the plain vote picks "3"
    assert out["wmaj@4"] == 1  # 0.9 > 3 x 0.1
    assert out["wmaj@4_top10"] == 1  # the single most confident rollout


def test_score_document_without_signals_has_no_weighted_vote(monkeypatch):
    monkeypatch.setattr(metrics, "rollout_meta", _fake_meta({"3": {"mean_logprob": -1.0}}))
    out = metrics.score_document("4", ["3", "4"])  # "4" has no signals
    assert "wmaj@2" not in out and out["rollouts"][1]["signals"] is None


def test_one_rollout_has_no_weighted_vote(monkeypatch):
    monkeypatch.setattr(metrics, "rollout_meta", _fake_meta({"4": {"mean_logprob": -1.0}}))
    out = metrics.score_document("4", ["4"])  # a one-rollout task: its vote is its acc
    assert "wmaj@1" not in out and out["rollouts"][0]["signals"] == {"mean_logprob": -1.0}


@pytest.mark.parametrize(("template", "repeats"), [("_eglr_sc_yaml", 10), ("_eglr_lxt_yaml", 121)])
def test_every_metric_a_document_gets_is_declared_in_the_yaml(template, repeats):
    """lm-eval warns "No aggregation function defined" for a metric missing from metric_list (wmaj@10 on
    every pool run, issue 28)."""
    from pathlib import Path

    yaml_text = (Path(__file__).resolve().parents[2] / "tasks" / template).read_text()
    declared = set(re.findall(r"\{metric: \"?([^\",}]+)\"?,", yaml_text))
    from eglr_harness.core.rollout import RolloutText

    cells = [(i // 11, (i % 11) / 10) for i in range(121)] if repeats == 121 else [(i + 1, 0.0) for i in range(repeats)]
    answers = [RolloutText("4", L=L, T=T, cycle=0, signals={"mean_logprob": -1.0}) for L, T in cells]
    kwargs = {"sub_pools": metrics.GRID_SUB_POOLS} if repeats == 121 else {}
    out = metrics.score_document("4", answers, **kwargs)
    assert set(out) - declared == set()
