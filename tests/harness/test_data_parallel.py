"""eglr-hf under data parallel: two real processes (torch.distributed, gloo, CPU).

tau_h=auto must be one value per task, computed from the task's first ``calib_limit`` documents
whatever the world size; and every rank must make the same collective calls, also a rank whose
rollouts are all done already (else the other rank waits forever in HFLM's batch-size all-gather).
"""

from __future__ import annotations

import multiprocessing
import socket
from datetime import timedelta

import pytest
import torch
from helpers.inputs import CONTEXTS as BASE_CONTEXTS

from eglr_harness.run.calibration import calibration_prompts, pooled_threshold

CONTEXTS = [*BASE_CONTEXTS, "The three primary colours are", "Water boils at"]
GEN = {"until": ["\n\n"], "max_gen_toks": 10, "do_sample": False}
WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init(rank: int, port: int) -> None:
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                         world_size=WORLD, timeout=timedelta(seconds=60))


def _spawn(target, *args) -> list:
    """Run ``target(rank, port, queue, *args)`` in two processes; return what each put, by rank."""
    ctx = multiprocessing.get_context("spawn")
    queue, port = ctx.Queue(), _free_port()
    procs = [ctx.Process(target=target, args=(rank, port, queue, *args)) for rank in range(WORLD)]
    for p in procs:
        p.start()
    results = {}
    try:
        for _ in procs:
            rank, value = queue.get(timeout=240)
            results[rank] = value
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    errors = [v for v in results.values() if isinstance(v, str) and v.startswith("ERROR")]
    assert not errors, errors[0]
    return [results[r] for r in range(WORLD)]


# ----------------------------------------------------------------- the cross-rank steps alone
def _shard_calibration(rank, port, queue, limit):
    try:
        _init(rank, port)
        from eglr_harness.core.distributed import process_gather

        gather = process_gather(WORLD)
        docs = [(d, f"prompt {d}") for d in range(rank, 9, WORLD)]  # lm-eval shards documents round robin
        chosen = calibration_prompts(docs, limit, gather)
        mine = [d for d, _c in chosen if d % WORLD == rank]
        entropies = [0.1 * d + 0.01 * k for d in mine for k in range(d + 1)]  # d + 1 "tokens" per document
        queue.put((rank, (chosen, pooled_threshold(entropies, gather))))
    except Exception as err:  # noqa: BLE001 -- reported to the parent
        queue.put((rank, f"ERROR {err!r}"))
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def test_calibration_uses_the_first_documents_whatever_the_world_size():
    limit = 5
    per_rank = _spawn(_shard_calibration, limit)
    assert per_rank[0] == per_rank[1]  # identical on every rank
    chosen, (tau, tokens) = per_rank[0]
    assert chosen == [(d, f"prompt {d}") for d in range(limit)]  # the first documents, not a shard
    single = [0.1 * d + 0.01 * k for d in range(limit) for k in range(d + 1)]
    assert (tau, tokens) == pooled_threshold(single)
    assert calibration_prompts([(d, f"prompt {d}") for d in range(9)], limit) == chosen


# ----------------------------------------------------------------- the adapter on two ranks
def _adapter_rank(rank, port, queue, model_dir, store_dir):
    try:
        _init(rank, port)
        from lm_eval.api.instance import Instance
        from lm_eval.models.huggingface import HFLM

        from eglr_harness.core.distributed import process_gather
        from eglr_harness.harness.model import EglrHFLM

        lm = EglrHFLM(pretrained=model_dir, device="cpu", dtype="float32", batch_size="auto", L=2, tau_h="auto",
                      calib_limit=3, rollout_cache=f"{store_dir}/rank{rank}")  # accelerate gives each rank its file
        lm._rank, lm._world_size = rank, WORLD  # as accelerate would set them (before the model is built)
        lm.runner.rank, lm.runner.gather = rank, process_gather(WORLD)

        def detect_batch_size(self, requests=None, pos=0):  # HFLM's detection all-gathers across ranks
            size = torch.tensor([2])
            torch.distributed.all_reduce(size, op=torch.distributed.ReduceOp.MIN)
            return int(size)

        HFLM._detect_batch_size = detect_batch_size

        def requests(doc_ids):
            return [Instance("generate_until", doc={}, arguments=(CONTEXTS[d], dict(GEN)), idx=0,
                             metadata=("dp_task", d, 1)) for d in doc_ids]

        first = lm.generate_until(requests(range(rank, 5, WORLD)))
        # Rank 1 asks again for what it has done; rank 0 has new documents to decode.
        second = lm.generate_until(requests([5, 6] if rank == 0 else list(range(rank, 5, WORLD))))
        queue.put((rank, {"tau_h": lm.tau_h_by_task["dp_task"], "first": list(map(str, first)),
                          "second": list(map(str, second)),
                          "stats_tokens": lm.get_model_info()["eglr"]["stats"]["total"]["tokens"]}))
    except Exception as err:  # noqa: BLE001 -- reported to the parent
        queue.put((rank, f"ERROR {err!r}"))
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_share_one_tau_h_and_survive_unequal_resume_work(llama_dir, tmp_path, monkeypatch):
    from lm_eval.api.instance import Instance

    from eglr_harness.harness.model import EglrHFLM

    monkeypatch.setenv("EGLR_CACHE_DIR", str(tmp_path / "cache"))
    model_dir = llama_dir
    ranks = _spawn(_adapter_rank, model_dir, str(tmp_path / "store"))
    assert ranks[0]["tau_h"] == ranks[1]["tau_h"]
    assert ranks[1]["second"] == ranks[1]["first"]  # all from the run's memo, and no hang on rank 0
    assert ranks[0]["stats_tokens"] == ranks[1]["stats_tokens"] > 0  # accounting gathered from both ranks

    monkeypatch.setenv("EGLR_CACHE_DIR", str(tmp_path / "cache_single"))
    single = EglrHFLM(pretrained=model_dir, device="cpu", dtype="float32", batch_size=2, L=2, tau_h="auto",
                      calib_limit=3)
    reqs = [Instance("generate_until", doc={}, arguments=(CONTEXTS[d], dict(GEN)), idx=0, metadata=("dp_task", d, 1))
            for d in range(5)]
    assert single.calibrate(reqs)["dp_task"] == pytest.approx(ranks[0]["tau_h"], abs=1e-5)
    texts = [str(t) for t in single.generate_until(reqs)]
    assert texts[0::2] == ranks[0]["first"] and texts[1::2] == ranks[1]["first"]
