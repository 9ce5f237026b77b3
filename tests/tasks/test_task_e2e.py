"""End-to-end lm-eval runs of the eglr tasks: stock `hf` on a tiny model, and a fake eglr model.

The fake model returns :class:`~eglr_harness.core.rollout.RolloutText` objects with the cell the pool rule
assigns to each repeat, as eglr-hf does; it checks that (L, T, cycle) reach the logged samples
and that the sub-pool filters and aggregations compute the paper's numbers.
"""

from __future__ import annotations

import json

import pytest

from eglr_harness.core.config import DEFAULT_L
from eglr_harness.core.rollout import RolloutText
from eglr_harness.run.pool import resolve_pool, task_axes


@pytest.fixture
def one_torch_thread():
    """On the small CI machines OpenMP's thread hand-off costs more than these tiny matmuls."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_hf_tiny_model_gsm8k_and_math500_sc(tiny_model_dir, task_manager, tmp_path, one_torch_thread):
    import lm_eval
    from lm_eval.loggers import EvaluationTracker

    tracker = EvaluationTracker(output_path=str(tmp_path))
    results = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={tiny_model_dir('llama')},dtype=float32,device=cpu",
        tasks=["gsm8k_eglr", "math500_eglr_sc"],
        limit=2,
        # `hf` passes generation kwargs to transformers, which rejects eglr-hf's pool keys.
        gen_kwargs={"max_gen_toks": 16, "eglr_L": None, "eglr_T": None, "eglr_budget_T": None},
        apply_chat_template=True,
        task_manager=task_manager,
        log_samples=True,
        bootstrap_iters=0,
        batch_size=16,
        evaluation_tracker=tracker,
    )
    res = results["results"]
    assert set(res["gsm8k_eglr"]) >= {"acc,pool", "maj@1,pool", "oracle@1,pool", "pass@1,pool",
                                       "best_cfg_acc,pool", "rollouts,pool"}
    assert set(res["math500_eglr_sc"]) >= {"maj@10,pool", "oracle@10,pool", "pass@1,pool", "pass@10,pool",
                                           "best_cfg_acc,pool"}
    assert res["math500_eglr_sc"]["rollouts,pool"] == 2 * 10  # a count: 2 documents x 10 rollouts
    sample = results["samples"]["math500_eglr_sc"][0]
    assert len(sample["resps"][0]) == 10 and len(sample["rollouts"]) == 10
    assert all(r["L"] is None and r["T"] is None and r["cycle"] is None for r in sample["rollouts"])
    assert [r["repeat"] for r in sample["rollouts"]] == list(range(10))

    # what lands on disk is plain JSON with the contract's keys
    tracker.save_results_aggregated(results=results, samples=results["samples"])
    for task in ("gsm8k_eglr", "math500_eglr_sc"):
        tracker.save_results_samples(task_name=task, samples=results["samples"][task])
    files = list(tmp_path.rglob("samples_math500_eglr_sc_*.jsonl"))
    assert len(files) == 1
    line = json.loads(files[0].read_text().splitlines()[0])
    assert {"rollouts", "acc", "maj@10", "oracle@10", "pass@1", "pass@10", "best_cfg_acc", "target"} <= set(line)


def test_eglr_hf_tiny_model_gsm8k_and_math500_sc(tiny_model_dir, task_manager, tmp_path, one_torch_thread, monkeypatch):
    """The real eglr-hf through lm-eval's evaluator: each repeat's cell reaches the samples."""
    import lm_eval

    monkeypatch.setenv("EGLR_CACHE_DIR", str(tmp_path / "cache"))
    results = lm_eval.simple_evaluate(
        model="eglr-hf",
        model_args=f"pretrained={tiny_model_dir('llama', num_layers=10)},dtype=float32,device=cpu,tau_h=0.5",
        tasks=["gsm8k_eglr", "math500_eglr_sc"],
        limit=2,
        gen_kwargs={"max_gen_toks": 8},
        apply_chat_template=True,
        task_manager=task_manager,
        log_samples=True,
        bootstrap_iters=0,
        batch_size=16,
    )
    for sample in results["samples"]["math500_eglr_sc"]:
        assert [(r["L"], r["T"], r["cycle"]) for r in sample["rollouts"]] == [(L, 0.0, 0) for L in range(1, 11)]
    for sample in results["samples"]["gsm8k_eglr"]:
        assert [(r["L"], r["T"]) for r in sample["rollouts"]] == [(DEFAULT_L, 0.0)]
    eglr = results["config"]["eglr"]
    assert set(eglr["stats"]["cells"]) == {f"L={L},T=0.0" for L in range(1, 11)}
    assert eglr["tau_h"] == {"gsm8k_eglr": 0.5, "math500_eglr_sc": 0.5}
    assert results["results"]["math500_eglr_sc"]["rollouts,pool"] == 2 * 10


class FakeEglrLM:
    """Minimal eglr-hf stand-in: resolves each request's pool, answers by cell.

    Cells with an even L answer correctly; odd L give distinct wrong numbers; L = 0 at T > 0
    gives no answer at all.
    """

    def __new__(cls, *args, **kwargs):
        from lm_eval.api.model import LM

        class _Fake(LM):
            def __init__(self, user_L=None):
                super().__init__()
                self.user_L = user_L

            def generate_until(self, requests, disable_tqdm=False):
                seen: dict[int, int] = {}
                out = []
                for req in requests:
                    repeat = seen.get(id(req), 0)
                    seen[id(req)] = repeat + 1
                    plan = resolve_pool(
                        user_L=self.user_L, user_T=None, task=task_axes(req.args[1]),
                        default_L=DEFAULT_L, default_T=0.0, repeats=req.repeats,
                    )
                    (L, T), cycle = plan.cell_for_repeat(repeat)
                    gold = req.doc["answer"]
                    if L == 0 and T > 0:
                        text = "I give up."
                    elif L % 2 == 0:
                        text = f"Step by step... so the answer is $\\boxed{{{gold}}}$."
                    else:
                        text = f"So the answer is $\\boxed{{{1000 + L}}}$."
                    out.append(RolloutText(text, L=L, T=T, cycle=cycle))
                return out

            def loglikelihood(self, requests):
                raise NotImplementedError

            def loglikelihood_rolling(self, requests):
                raise NotImplementedError

        return _Fake(*args, **kwargs)


def _run(task, task_manager, **kwargs):
    import lm_eval

    return lm_eval.simple_evaluate(
        model=FakeEglrLM(**kwargs), tasks=[task], limit=2, task_manager=task_manager,
        log_samples=True, bootstrap_iters=0,
    )


def test_fake_eglr_sc_pool_metadata_and_metrics(task_manager):
    out = _run("math500_eglr_sc", task_manager)
    res = out["results"]["math500_eglr_sc"]
    # L 1..10 at T 0: L=2,4,...,10 right (5 of 10, one cluster); five distinct wrong answers ->
    # the majority is right. acc = one rollout's accuracy over the pool.
    assert res["acc,pool"] == 0.5 and res["pass@1,pool"] == 0.5
    assert res["maj@10,pool"] == 1 and res["oracle@10,pool"] == 1 and res["pass@10,pool"] == 1
    assert res["best_cfg_acc,pool"] == 1.0
    assert res["rollouts,pool"] == 20
    rollouts = out["samples"]["math500_eglr_sc"][0]["rollouts"]
    assert [(r["L"], r["T"], r["cycle"]) for r in rollouts] == [(L, 0.0, 0) for L in range(1, 11)]


def test_fake_eglr_sc_with_L_pinned_moves_budget_to_T(task_manager):
    out = _run("math500_eglr_sc", task_manager, user_L=(4,))
    rollouts = out["samples"]["math500_eglr_sc"][0]["rollouts"]
    assert [(r["L"], r["T"]) for r in rollouts] == [(4, round(0.1 * i, 6)) for i in range(1, 11)]
    assert out["results"]["math500_eglr_sc"]["acc,pool"] == 1.0


def test_fake_eglr_lxt_sub_pools(task_manager):
    out = _run("aime25_eglr_lxt", task_manager)
    res = out["results"]["aime25_eglr_lxt"]
    # one filter: every response is logged once per document
    assert {k.split(",")[1] for k in res if "," in k} == {"pool"}
    assert len(out["samples"]["aime25_eglr_lxt"]) == 2
    # whole grid: L even (0,2,..,10) right except L=0 at T>0 (no answer): 6*11 - 10 = 56 of 121
    assert res["acc,pool"] == pytest.approx(56 / 121)
    assert res["maj@121,pool"] == 1 and res["oracle@121,pool"] == 1
    assert res["rollouts,pool"] == 2 * 121 and res["best_cfg_acc,pool"] == 1.0
    # L_only: L 1..10 at T 0 -> 5 right of 10, majority right
    assert res["acc_L_only,pool"] == 0.5 and res["maj@10_L_only,pool"] == 1
    # T_only: L 0 at T 0.1..1.0 -> no answers at all
    assert res["acc_T_only,pool"] == 0 and res["maj@10_T_only,pool"] == 0 and res["oracle@10_T_only,pool"] == 0
    # joint: L 1..10 x T 0.1..1.0 -> half right
    assert res["acc_joint,pool"] == 0.5 and res["maj@100_joint,pool"] == 1 and res["oracle@100_joint,pool"] == 1


def test_console_table_lines_stay_short(task_manager):
    """lm-eval's printed table (make_table) has no line of 200 characters or more, grid task included."""
    from lm_eval.utils import make_table

    out = _run("aime25_eglr_lxt", task_manager)
    lines = make_table(out).splitlines()
    assert len(lines) > 10
    assert max(len(line) for line in lines) < 200, max(lines, key=len)
