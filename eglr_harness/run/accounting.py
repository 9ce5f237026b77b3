"""Per-cell compute accounting of a run, and the count of rollouts that were reused instead of decoded.

Rollouts repeated within the run (and rollouts stored before the store kept accounting) carry no
accounting, so the results say per cell how many there were (``reused_rollouts``): the compute
figures cover the rest. A rollout the store keeps with its accounting counts as decoded
(``harness/decode.py``), so a resumed run reports the figures of an uninterrupted one.
Each rollout carries its own accounting into the rollout store as it finishes (``rollout_accounts``,
``row_shares``), replaced by its share of its engine run's figures when the run ends
(``EngineRunAccounts.share_out``).
tau_h calibration (a greedy run on the task's first prompts) is accounted apart, per task, with
the number of prompts and token entropies the threshold came from: it is not part of the pool, so
it is in neither the cells nor the total; the pool's greedy rollouts that it decoded count as reused.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from eglr_harness.core.cell import Cell
from eglr_harness.core.distributed import Gather, local_gather
from eglr_harness.decoding.stats import EglrStats, batch_shares, rollout_accounting


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


def row_shares(accounting: dict, engine: str | None, k_max: int) -> dict:
    """A rollout's own part of the batch figures (``BATCH_FIELDS`` of ``decoding/stats.py``): the steps
    its row took part in and the refinement it ran, counted as its engine counts a row (from
    ``rollout_accounting``; ``wall_time_s`` is left to the caller).

    What a rollout carries into the rollout store as soon as it finishes, until its engine run ends and
    replaces it with its share of the run's figures (``batch_shares``): a run killed in between, or a
    second process reading the store meanwhile, then counts every rollout it reuses. The continuous
    engine steps a row once per emitted token after the prompt's pass and once per refinement
    iteration, and its refining passes hold the refining rows only; ``generate`` (engine=hook) steps a
    row once per token and refines the gated rows of a step ``k_max`` times. For a run of one row at a
    time (``batch_size=1``) these are the batch figures exactly; with more rows a step is shared, so
    they count the steps a row took part in as if it had run alone.
    """
    tokens, L = accounting["tokens"], accounting["L"]
    iterations = {int(k): int(n) for k, n in accounting["iterations"].items()}
    gated, passes = sum(iterations.values()), sum(k * n for k, n in iterations.items())
    if engine == "continuous":
        return {"steps": max(tokens - 1, 0) + passes, "gated_steps": passes, "row_steps": tokens,
                "batched_refine_layer_evals": L * passes, "wall_time_s": 0.0}
    return {"steps": tokens, "gated_steps": gated, "row_steps": tokens,
            "batched_refine_layer_evals": L * k_max * gated, "wall_time_s": 0.0}


def rollout_accounts(tokens, iterations, config, engine: str | None, *, calibration: bool, wall_time_s: float) -> dict:
    """A finished rollout's accounting as the rollout store keeps it: its own figures
    (``decoding/stats.rollout_accounting``), marked ``calibration`` where tau_h calibration decoded it, and its
    ``shares`` (``row_shares``, with the time since the previous rollout of its engine run finished) until
    its engine run ends. tokens: the rollout's token ids; iterations: its gated tokens' iteration counts."""
    accounting = rollout_accounting(len(tokens), iterations, config.L, config.stop_rule.head_per_iteration)
    if calibration:
        accounting["calibration"] = True
    accounting["shares"] = {**row_shares(accounting, engine, config.k_max), "wall_time_s": wall_time_s}
    return accounting


def restored_accounting(record: dict, k_max: int) -> dict:
    """A stored rollout's accounting, with its own shares where it was stored before rollouts carried them."""
    accounting = record["accounting"]
    if accounting.get("shares") is None:
        accounting = {**accounting, "shares": row_shares(accounting, record.get("engine"), k_max)}
    return accounting


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
            shares = batch_shares(self.by_config[config], [found[k]["accounting"] for k in members])
            for key, share in zip(members, shares):
                found[key]["accounting"]["shares"] = share
                updated[key] = found[key]
        return updated
