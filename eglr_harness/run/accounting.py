"""Per-cell compute accounting of a run, and the count of rollouts that were reused instead of decoded.

Rollouts repeated within the run (and rollouts stored before the store kept accounting) carry no
accounting, so the results say per cell how many there were (``reused_rollouts``): the compute
figures cover the rest. A rollout the store keeps with its accounting counts as decoded
(``harness/decode.py``), so a resumed run reports an uninterrupted one's per-rollout figures (tokens, gated tokens,
rho, the iterations, ``flop_ratio``, ``flop_ratio_with_head``, ``head_projections``) exactly. The per-decode
figures (:func:`per_decode_figures`: ``steps``, ``p_step_gated``, ``wall_time_s``, and ``batched_flop_ratio`` with
the hook engine) count a batch's work, shared out among the rollouts it decoded: they follow the batches as they
ran, and a resumed run batches the rollouts left in other company, so at ``batch_size`` > 1 they differ in
general. At ``batch_size=1`` every batch is one rollout and they are equal too (but the wall time, a clock).
Each rollout carries the record its engine emitted (``decoding/stats.RolloutAccount``, with the engine's own
count of the batch figures it took part in) into the rollout store as it finishes (``rollout_accounts``),
its ``shares`` replaced by its share of its engine run's figures when the run ends
(``EngineRunAccounts.share_out``, ``share_batch``). The records of one run, resumed runs and the store all
add up here (``RunAccounts``) into ``config.eglr.stats``; no engine's way of stepping is known here.
tau_h calibration (a greedy run on the task's first prompts) is accounted apart, per task, with
the number of prompts and token entropies the threshold came from: it is not part of the pool, so
it is in neither the cells nor the total; the pool's greedy rollouts that it decoded count as reused.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict

from eglr_harness.core.cell import Cell
from eglr_harness.core.distributed import Gather, local_gather
from eglr_harness.decoding.stats import SHARED_FIGURES, EglrStats, RolloutAccount


# figures of config.eglr.stats that count batches, not rollouts (module docstring): a resumed run's differ
PER_DECODE_FIGURES = ("steps", "p_step_gated", "wall_time_s")
# also per decode under engine=hook: a gated step refines every row from its first to its last gated row, k_max times
_PER_DECODE_WITH_HOOK = ("batched_flop_ratio",)


def per_decode_figures(engine: str) -> tuple[str, ...]:
    """The figures of ``config.eglr.stats`` (total, cells) that depend on how the rollouts were batched, for a run of
    ``engine`` (``config.eglr.engine``: ``continuous``, ``hook``, ``vllm``, ``mixed``; ``hf`` in older runs): a
    resumed run reports an uninterrupted one's other figures exactly, these only at ``batch_size=1`` (module
    docstring). Raises ``ValueError`` for another engine name."""
    engines = ("continuous", "hook", "hf", "vllm", "mixed")
    if engine not in engines:
        raise ValueError(f"`engine`={engine!r} is not allowed; allowed: {', '.join(engines)}.")
    return PER_DECODE_FIGURES + (_PER_DECODE_WITH_HOOK if engine in ("hook", "hf", "mixed") else ())


class RunAccounts:
    """``Cell -> EglrStats`` plus ``Cell -> reused rollouts``, mergeable across ranks."""

    def __init__(self, num_layers: int, head_layers: float = 0.0):
        """head_layers: one LM-head projection in decoder layers (``ModelParts.head_layers``; 0: not counted)."""
        self.num_layers, self.head_layers = num_layers, head_layers

        def new_stats() -> EglrStats:
            return EglrStats(num_layers=num_layers, head_layers=head_layers)

        self.stats: dict[Cell, EglrStats] = defaultdict(new_stats)
        self.reused: Counter = Counter()
        self.calibration: dict[str, EglrStats] = defaultdict(new_stats)
        self.calibration_source: dict[str, dict] = {}  # task -> {"prompts", "entropy_tokens", "cached"}

    def stats_for(self, cell: Cell) -> EglrStats:
        return self.stats[cell]

    def calibration_for(self, task: str) -> EglrStats:
        return self.calibration[task]

    def gathered(self, gather: Gather = local_gather) -> "RunAccounts":
        """The accounts of all ranks together (call on every rank: it is a collective step)."""
        merged = RunAccounts(self.num_layers, self.head_layers)
        for stats, reused, calibration in gather((dict(self.stats), dict(self.reused), dict(self.calibration))):
            for cell, part in stats.items():
                merged.stats[cell].merge(part)
            merged.reused.update(reused)
            for task, part in calibration.items():
                merged.calibration[task].merge(part)
        merged.calibration_source = dict(self.calibration_source)  # the same on every rank
        return merged

    def summary(self) -> dict:
        """``config.eglr.stats`` of the results JSON (docs/run-format.md)."""
        total = EglrStats(num_layers=self.num_layers, head_layers=self.head_layers)
        for part in self.stats.values():
            total.merge(part)
        return {
            "total": total.summary(),
            "cells": {cell.label: part.summary() for cell, part in sorted(self.stats.items())},
            "reused_rollouts": {
                "total": sum(self.reused.values()),
                "cells": {cell.label: n for cell, n in sorted(self.reused.items())},
            },
            "calibration": {
                str(task): {**source, "compute": self.calibration[task].summary() if task in self.calibration else None}
                for task, source in sorted(self.calibration_source.items(), key=lambda item: str(item[0]))
            },
        }


def rollout_accounts(account: RolloutAccount, *, calibration: bool, wall_time_s: float) -> dict:
    """A finished rollout's record as the rollout store keeps it (``RolloutAccount.to_json``): the one its engine
    emitted (``Outcome.account``, its own part of the batch figures as ``shares``), marked ``calibration`` where
    tau_h calibration decoded it, with the time since the previous rollout of its engine run finished."""
    shares = {**account.own_shares(), "wall_time_s": wall_time_s}
    return dataclasses.replace(account, shares=shares, calibration=calibration).to_json()


def restored_account(record: dict) -> RolloutAccount:
    """A stored rollout's record (``RolloutAccount.from_json``: older stores' forms read too)."""
    return RolloutAccount.from_json(record["accounting"])


def share_batch(batch: EglrStats, accounts: list[RolloutAccount]) -> list[dict]:
    """Each rollout's share of ``batch``'s figures (``SHARED_FIGURES``; the rollouts are the ones the batch
    decoded): rows by tokens, refinement passes by refinement layer evaluations, steps and time by all layer
    evaluations. The shares sum to ``batch``'s figures."""
    n = max(batch.num_layers, 1)
    tokens = [a.tokens for a in accounts]
    refine = [a.refine_layer_evals for a in accounts]
    work = [n * t + e for t, e in zip(tokens, refine)]

    def split(total, weights):
        whole = sum(weights)
        return [total * w / whole if whole else total / len(weights) for w in weights]

    parts = {"computed_rows": split(batch.computed_rows, tokens),
             "computed_refine_layer_evals": split(batch.computed_refine_layer_evals, refine),
             **{name: split(getattr(batch, name), work) for name in ("steps", "gated_steps", "wall_time_s")}}
    return [{name: parts[name][i] for name in SHARED_FIGURES} for i in range(len(accounts))]


class EngineRunAccounts:
    """One engine run's figures, per config apart (``stats_for``, handed to ``Engine.run``), added to the
    run's accounts when it ends (``merge``) and shared out among its rollouts (``share_out``).

    run_stats_for: the run's accounts of a config (``RunAccounts.stats_for`` of its cell, or calibration's).
    """

    def __init__(self, run_stats_for):
        self.run_stats_for = run_stats_for
        self.by_config: dict = {}

    def stats_for(self, config) -> EglrStats:
        if config not in self.by_config:
            into = self.run_stats_for(config)
            self.by_config[config] = EglrStats(num_layers=into.num_layers, head_layers=into.head_layers)
        return self.by_config[config]

    def merge(self) -> None:
        for config, part in self.by_config.items():
            self.run_stats_for(config).merge(part)

    def share_out(self, keys: list[str], found: dict, config_of: dict) -> dict:
        """Give each finished rollout among ``keys`` (``found``: key -> record) its share of its config's figures
        (``config_of``: key -> config); returns the records updated."""
        members_of: dict = {}
        for key in dict.fromkeys(keys):
            record = found.get(key)
            if record is not None and "accounting" in record:
                members_of.setdefault(config_of.get(key), []).append(key)
        updated = {}
        for config, members in members_of.items():
            if config not in self.by_config:
                continue
            accounts = [restored_account(found[k]) for k in members]
            for key, account, share in zip(members, accounts, share_batch(self.by_config[config], accounts)):
                found[key]["accounting"] = account.with_shares(share).to_json()
                updated[key] = found[key]
        return updated
