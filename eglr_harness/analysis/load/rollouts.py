"""One task's samples file of one run -> its rollout rows (:class:`RolloutRow`, docs/run-format.md)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from eglr_harness.analysis.load.files import SAMPLE_LINE
from eglr_harness.cell import T_DECIMALS, Cell
from eglr_harness.jsonl import iter_jsonl

__all__ = ["RolloutRow", "TaskSamples", "rollouts_of_sample", "read_task_samples"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RolloutRow:
    """One repeat of one document, as the analysis reads it (not :class:`eglr_harness.rollout.Rollout`,
    the generated text). ``vote`` is the label it votes with: its answer until :func:`build_grid`
    labels the document's votes (:func:`vote_labels`); None never votes."""

    doc_id: int
    repeat: int
    L: int | None
    T: float | None
    cycle: int | None
    answer: str | None
    correct: int
    cluster: int | None = None
    vote: object = None
    signals: Mapping | None = field(default=None, compare=False)  # eglr_harness.signals dict; None: not recorded

    def __post_init__(self) -> None:
        if self.vote is None and self.answer is not None:
            object.__setattr__(self, "vote", self.answer)

    @property
    def cell(self) -> Cell | None:
        """``Cell(L, T)`` or None for a rollout from a model without EGLR metadata."""
        return None if self.L is None or self.T is None else Cell.of(self.L, self.T)


@dataclass(frozen=True)
class TaskSamples:
    """The rollouts of one task in one run, for one lm-eval filter.

    Attributes:
        path: the samples file.
        filter: the lm-eval filter whose lines were read.
        rollouts: all rows, in file order then repeat order.
        doc_hashes: doc_id -> lm-eval's ``doc_hash`` (to check that merged runs share documents).
        other_filters: filters present in the file but not read.
        has_clusters: every rollout with an answer carries the task's cluster id.
    """

    path: Path
    filter: str | None
    rollouts: tuple[RolloutRow, ...]
    doc_hashes: dict[int, str]
    other_filters: tuple[str, ...] = ()
    has_clusters: bool = False

    @property
    def doc_ids(self) -> tuple[int, ...]:
        return tuple(self.doc_hashes)


def _rollout(item, doc_id: int, index: int, where: str) -> RolloutRow:
    if not isinstance(item, dict) or "correct" not in item:
        raise ValueError(
            f"{where}: doc {doc_id} rollout #{index} is {item!r}; expected a dict with keys "
            "repeat, L, T, cycle, answer, correct (docs/run-format.md)."
        )
    L, T, cycle, answer, cluster = (item.get(k) for k in ("L", "T", "cycle", "answer", "cluster"))
    return RolloutRow(
        doc_id=doc_id,
        repeat=int(item.get("repeat", index)),
        L=None if L is None else int(L),
        T=None if T is None else round(float(T), T_DECIMALS),
        cycle=None if cycle is None else int(cycle),
        answer=None if answer is None else str(answer),
        correct=1 if item["correct"] else 0,
        cluster=None if cluster is None or answer is None else int(cluster),
        signals=item.get("signals") if isinstance(item.get("signals"), Mapping) else None,
    )


def rollouts_of_sample(sample: dict, *, where: str = "sample") -> list[RolloutRow]:
    """The rollout rows of one ``samples_*.jsonl`` line.

    Reads the ``rollouts`` key (or ``best_cfg_acc``, whose per-document value is the same list).
    Raises ``ValueError`` when neither holds a list: the run did not use an eglr task.
    """
    doc_id = sample.get("doc_id")
    items = sample.get("rollouts")
    if not isinstance(items, list):
        items = sample.get("best_cfg_acc")
    if doc_id is None or not isinstance(items, list):
        raise ValueError(
            f"{where}: doc {doc_id!r} has no `rollouts` list; the analysis needs the samples of an "
            "eglr task (e.g. gsm8k_eglr_lxt) logged with --log_samples (docs/run-format.md)."
        )
    return [_rollout(item, int(doc_id), i, where) for i, item in enumerate(items)]


def read_task_samples(path: Path, filter_name: str | None = None) -> TaskSamples:
    """Read one task's samples file.

    lm-eval writes one line per (document, filter). ``filter_name`` picks the filter; by default
    the first filter in the file is used (logged when the file has several).
    """
    rows: list[RolloutRow] = []
    hashes: dict[int, str] = {}
    filters: list[str] = []
    chosen = filter_name
    for line, sample in iter_jsonl(path, SAMPLE_LINE):
        filt = sample.get("filter")
        if filt not in filters:
            filters.append(filt)
        if chosen is None:
            chosen = filt
        if filt != chosen:
            continue
        where = f"{path}:{line}"
        try:
            doc_id = int(sample["doc_id"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{where}: `doc_id` is {sample.get('doc_id')!r}; expected an int (an lm-eval "
                             "samples line).") from None
        if doc_id in hashes:
            raise ValueError(f"{where}: doc {doc_id} appears twice for filter {chosen!r}; is the file corrupt?")
        hashes[doc_id] = str(sample.get("doc_hash", ""))
        rows.extend(rollouts_of_sample(sample, where=where))
    if not filters:
        raise ValueError(f"{path}: no document lines (an empty samples file: was the run stopped before it "
                         "saved them?); rerun the task with --log_samples or leave this run out.")
    if filter_name is not None and filter_name not in filters:
        raise ValueError(f"{path}: filter {filter_name!r} not found; filters in this file: {filters}.")
    others = tuple(f for f in filters if f != chosen)
    if others:
        logger.info("%s: using filter %r (also present: %s)", path, chosen, list(others))
    answered = [r for r in rows if r.answer is not None]
    return TaskSamples(
        path=Path(path),
        filter=chosen,
        rollouts=tuple(rows),
        doc_hashes=hashes,
        other_filters=others,
        has_clusters=bool(answered) and all(r.cluster is not None for r in answered),
    )
