"""Per-document metrics, majority rule, aggregations and filters on literal inputs."""

from __future__ import annotations

from collections import Counter

import pytest

import eglr_harness.harness.registry as reg
from eglr_harness.core.rollout import RolloutText, rollout_meta
from eglr_harness.harness.filters import ExtractAnswerFilter, MajorityVoteFilter, OracleFilter, SelectCellsFilter
from eglr_harness.scoring.doc_scores import (
    CellSelector, best_cfg_acc, cell_accuracies, cluster_answers, majority_index, pass_at_k, rollout_count,
    score_document, vote_scores,
)


def R(text, L, T, cycle=0):
    return RolloutText(text, L=L, T=T, cycle=cycle)


# --------------------------------------------------------------------------- majority rule

@pytest.mark.parametrize("answers, winner", [
    (["1", "2", "2"], 1),
    (["2", "1", "1", "2"], 0),                 # tie: the cluster that appeared first wins
    (["1", "2", "1", "2"], 0),
    ([None, None, "3"], 2),                    # invalid answers never vote
    ([None, None], None),
    ([], None),
    (["0.5", "\\frac{1}{2}", "1/2", "3"], 0),  # clustered by equivalence, not by string
    (["3", "\\frac12", "0.5", "3"], 0),         # 2 vs 2: "3" came first
    (["7", None, None, "8", "8"], 3),          # None is not a cluster of 2
])
def test_majority_index(answers, winner):
    assert majority_index(answers) == winner


def test_clusters_keep_order_of_first_appearance():
    assert cluster_answers(["5", "6", "5.0", None, "6"]) == [[0, 2], [1, 4]]


# --------------------------------------------------------------------------- score_document

def test_score_document_keys_and_values():
    responses = [R("3", 1, 0.0), R("4", 2, 0.0), R("", 3, 0.0), R("4.0", 4, 0.0)]
    out = score_document("4", responses)
    assert out["acc"] == 0.5 and out["pass@1"] == 0.5  # one rollout's accuracy, over the 4
    assert out["pass@4"] == 1
    assert out["maj@4"] == 1 and out["oracle@4"] == 1
    assert out["best_cfg_acc"] == {"L=1,T=0.0": 0.0, "L=2,T=0.0": 1.0, "L=3,T=0.0": 0.0, "L=4,T=0.0": 1.0}
    assert out["rollouts"][2] == {"repeat": 2, "L": 3, "T": 0.0, "cycle": 0, "answer": None, "correct": 0,
                                  "cluster": None, "signals": None}
    assert [r["correct"] for r in out["rollouts"]] == [0, 1, 0, 1]
    assert [r["cluster"] for r in out["rollouts"]] == [0, 1, None, 1]


def test_score_document_plain_strings_have_null_metadata():
    out = score_document("7", ["7", "x"])
    assert out["rollouts"][0] == {"repeat": 0, "L": None, "T": None, "cycle": None, "answer": "7", "correct": 1,
                                  "cluster": 0, "signals": None}
    assert out["maj@2"] == 1  # 1 vs 1: the first wins


# (gold, answers in repeat order, expected cluster per rollout): clusters by equivalence, numbered
# in order of first appearance; null for no answer.
CLUSTER_CASES = [
    ("\\frac{1}{2}", ["\\dfrac12", None, "3", "0.5", "\\frac{1}{2}", "3"], [0, None, 1, 0, 0, 1]),
    ("3", ["3", "4", "4", "3"], [0, 1, 1, 0]),  # tie 2-2: the earlier cluster (0) wins
    ("5", ["7", "5", "5"], [0, 1, 1]),
    ("5", ["", None], [None, None]),
]


@pytest.mark.parametrize("gold, answers, clusters", CLUSTER_CASES)
def test_rollouts_carry_their_cluster_and_maj_follows_it(gold, answers, clusters):
    out = score_document(gold, answers)
    rollouts = out["rollouts"]
    assert [r["cluster"] for r in rollouts] == clusters
    # The vote redone from the logged clusters alone (no equivalence check) gives maj@B.
    sizes = Counter(r["cluster"] for r in rollouts if r["cluster"] is not None)
    if not sizes:
        assert out[f"maj@{len(answers)}"] == 0
        return
    winner = min(sizes, key=lambda k: (-sizes[k], k))  # largest; ties -> first appearance
    first = next(r for r in rollouts if r["cluster"] == winner)
    assert out[f"maj@{len(answers)}"] == first["correct"]
    # All members of a cluster agree on correctness.
    for k in sizes:
        assert len({r["correct"] for r in rollouts if r["cluster"] == k}) == 1


@pytest.mark.parametrize("n, c, k, expected", [
    (10, 0, 1, 0.0), (10, 3, 1, 0.3), (10, 3, 10, 1.0), (10, 0, 10, 0.0),
    (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (121, 56, 121, 1.0), (3, 1, 3, 1.0),
])
def test_pass_at_k_is_the_unbiased_estimator(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


@pytest.mark.parametrize("n, c, k", [(10, 11, 1), (10, 3, 0), (10, 3, 11), (0, 0, 1)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(n, c, k)


def test_rollout_count_aggregation_is_a_number():
    items = [[{"L": 1, "T": 0.0, "correct": 1}, {"L": 2, "T": 0.0, "correct": 0}], [{"L": 1, "T": 0.0, "correct": 0}]]
    assert rollout_count(items) == 3


def test_sub_pools_vote_from_the_pool_clusters():
    # L 1..3 at T 0, then L 0 at T 0.5 and 1.0; the sub-pools are scored from the same clusters.
    responses = [R("5", 1, 0.0), R("6", 2, 0.0), R("6", 3, 0.0), R("5.0", 0, 0.5), R("\\frac{10}{2}", 0, 1.0)]
    sub_pools = {"L_only": CellSelector(L="1-3", T=0), "T_only": CellSelector(L=0, T="0.5,1.0")}
    out = score_document("5", responses, sub_pools=sub_pools)
    assert [r["cluster"] for r in out["rollouts"]] == [0, 1, 1, 0, 0]
    assert out["maj@5"] == 1  # cluster 0 has 3 of 5
    assert out["acc_L_only"] == pytest.approx(1 / 3) and out["maj@3_L_only"] == 0 and out["oracle@3_L_only"] == 1
    assert out["acc_T_only"] == 1.0 and out["maj@2_T_only"] == 1 and out["oracle@2_T_only"] == 1


def test_vote_scores_tie_goes_to_the_earlier_first_member():
    rollouts = [{"cluster": 0, "correct": 0}, {"cluster": 1, "correct": 1}, {"cluster": 1, "correct": 1},
                {"cluster": 0, "correct": 0}]
    assert vote_scores(rollouts, range(4))["maj@4"] == 0  # 2-2: cluster 0 appeared first
    assert vote_scores(rollouts, [3, 0, 1, 2])["maj@4"] == 0  # members in any order: the same
    assert vote_scores(rollouts, [1, 2, 3])["maj@3"] == 1  # 2-1
    # a sub-pool: 1-1, and among its members cluster 1 (repeat 2) comes before cluster 0 (repeat 3),
    # whatever order the members are given in
    assert vote_scores(rollouts, [3, 2])["maj@2"] == 1


def test_score_document_all_invalid():
    out = score_document("7", ["", None])
    assert out == {**out, "acc": 0.0, "maj@2": 0, "oracle@2": 0, "pass@1": 0.0, "pass@2": 0.0}


def test_score_document_single_string_is_one_repeat():
    assert score_document("7", "7")["maj@1"] == 1


# --------------------------------------------------------------------------- aggregations

def _doc(*cells):
    return [{"L": L, "T": T, "correct": c} for L, T, c in cells]


def test_cell_accuracies_average_cycles_within_a_document_first():
    items = [
        _doc((1, 0.0, 1), (2, 0.0, 0), (2, 0.0, 1), (2, 0.0, 1)),  # cell L=2 has 3 cycles: 2/3
        _doc((1, 0.0, 0), (2, 0.0, 1)),
    ]
    acc = cell_accuracies(items)
    assert list(acc) == ["L=1,T=0.0", "L=2,T=0.0"]
    assert acc["L=1,T=0.0"] == 0.5
    assert acc["L=2,T=0.0"] == pytest.approx((2 / 3 + 1) / 2)
    assert best_cfg_acc(items) == pytest.approx(5 / 6)


def test_cell_order_is_L_major():
    items = [_doc((2, 0.1, 1), (0, 0.5, 1), (0, 0.0, 0), (10, 0.0, 1))]
    assert list(cell_accuracies(items)) == ["L=0,T=0.0", "L=0,T=0.5", "L=2,T=0.1", "L=10,T=0.0"]


def test_unknown_cell_for_plain_responses():
    items = [_doc((None, None, 1), (None, None, 0)), _doc((None, None, 1), (None, None, 1))]
    assert cell_accuracies(items) == {"unknown": 0.75}
    assert best_cfg_acc(items) == 0.75
    assert best_cfg_acc([]) == 0.0


# --------------------------------------------------------------------------- filters

DOCS = [{"answer": "4", "answer_format": "math"}, {"answer": "10", "answer_format": "number"}]


def test_extract_filter_keeps_metadata_and_marks_invalid():
    resps = [[R("so \\boxed{4}", 1, 0.0), R("no idea", 2, 0.5, 1)], [R("#### 10", 0, 0.0), "x is 9"]]
    out = ExtractAnswerFilter().apply(resps, DOCS)
    assert out == [["4", ""], ["10", "9"]]
    assert rollout_meta(out[0][1]) == {"L": 2, "T": 0.5, "cycle": 1}
    assert rollout_meta(out[1][1]) is None  # plain strings stay plain


def test_extract_filter_mode_override_and_validation():
    assert ExtractAnswerFilter(mode="math").apply([["x is 9"]], [DOCS[1]]) == [[""]]
    with pytest.raises(ValueError, match="auto, math, number"):
        ExtractAnswerFilter(mode="latex")


def test_extract_filter_accepts_a_bare_string_per_doc():
    assert ExtractAnswerFilter().apply(["\\boxed{4}"], [DOCS[0]]) == ["4"]


def test_select_cells_filter():
    pool = [R("a", L, T) for L in (0, 1, 2) for T in (0.0, 0.1)]
    keep = SelectCellsFilter(L="1-2", T=0).apply([pool], [DOCS[0]])[0]
    assert [(r.L, r.T) for r in keep] == [(1, 0.0), (2, 0.0)]
    keep = SelectCellsFilter(L=0).apply([pool], [DOCS[0]])[0]
    assert [(r.L, r.T) for r in keep] == [(0, 0.0), (0, 0.1)]
    keep = SelectCellsFilter(T="0.1-1.0:0.1").apply([pool], [DOCS[0]])[0]
    assert [r.L for r in keep] == [0, 1, 2]


def test_select_cells_passes_plain_strings_through():
    assert SelectCellsFilter(L=1).apply([["a", "b"]], [DOCS[0]]) == [["a", "b"]]


def test_select_cells_needs_an_axis():
    with pytest.raises(ValueError, match="`L`, `T`"):
        SelectCellsFilter()


def test_majority_and_oracle_filters():
    answers = [[R("3", 1, 0.0), R("5", 2, 0.0), R("5.0", 3, 0.0), R("4", 4, 0.0)]]
    (vote,) = MajorityVoteFilter().apply(answers, [DOCS[0]])
    assert vote == ["5"] and rollout_meta(vote[0]) == {"L": 2, "T": 0.0, "cycle": 0}
    (best,) = OracleFilter().apply(answers, [DOCS[0]])
    assert best == ["4"] and best[0].L == 4
    assert MajorityVoteFilter().apply([["", ""]], [DOCS[0]]) == [[""]]
    assert OracleFilter().apply([["", "7"]], [DOCS[0]]) == [["7"]]
    with pytest.raises(ValueError, match="gold_field"):
        OracleFilter(gold_field="gold").apply([["4"]], [DOCS[0]])


def test_registry_names():
    from lm_eval.api.registry import get_aggregation, get_filter, get_metric

    for name, cls in reg.FILTERS.items():
        assert get_filter(name) is cls
    assert get_aggregation("eglr_best_cfg_acc") is best_cfg_acc
    assert get_aggregation("eglr_rollout_count") is rollout_count
    assert get_aggregation("mean") is not None  # lm-eval's own are still there
    assert get_metric("eglr_exact_match")(references=["4"], predictions=["4.0"]) == 1.0
    assert get_metric("eglr_exact_match")(references=["4"], predictions=[""]) == 0.0
    reg.register_all()  # idempotent
