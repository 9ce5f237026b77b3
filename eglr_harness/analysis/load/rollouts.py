"""One task's samples file of one run -> its rollout rows (:class:`RolloutRow`, docs/run-format.md)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from eglr_harness.core.cell import T_DECIMALS, Cell
from eglr_harness.core.errors import FileFormatError
from eglr_harness.core.run_format import check_rollout, read_samples_file

__all__ = ["RolloutRow", "TaskSamples", "rollouts_of_sample", "read_task_samples", "doc_ranges"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RolloutRow:
    """One repeat of one document, as the analysis reads it (not :class:`eglr_harness.core.rollout.RolloutText`,
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
    signals: Mapping | None = field(default=None, compare=False)  # eglr_harness.core.signals dict; None: not recorded
    seed: int | None = None  # the seed of the rollout's repeat of the pool (``seeds=``); None: the run's base seed
    # eglr-baseline's answers (docs/run-format.md): how it ended ("stop", "eos", "length", "cut") and the tokens its
    # decoding evaluated, summed over beams; None where the run records none (every other model)
    finish: str | None = field(default=None, compare=False)
    search_tokens: int | None = field(default=None, compare=False)

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


def _row(item: dict, doc_id: int, index: int) -> RolloutRow:
    """A checked rollout dict (:func:`eglr_harness.core.run_format.check_rollout`) as a row."""
    L, T, cycle, answer, cluster = (item.get(k) for k in ("L", "T", "cycle", "answer", "cluster"))
    return RolloutRow(
        doc_id=doc_id,
        repeat=item.get("repeat", index),
        L=L,
        T=None if T is None else round(float(T), T_DECIMALS),
        cycle=cycle,
        answer=answer,
        correct=int(item["correct"]),
        cluster=None if answer is None else cluster,
        signals=item.get("signals"),
        seed=item.get("seed"),
        finish=item.get("finish"),
        search_tokens=item.get("search_tokens"),
    )


def doc_ranges(doc_ids) -> str:
    """Document ids as runs of consecutive ids, ascending: ``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"``."""
    spans: list[list[int]] = []
    for doc in sorted(set(doc_ids)):
        if spans and doc == spans[-1][1] + 1:
            spans[-1][1] = doc
        else:
            spans.append([doc, doc])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def rollouts_of_sample(sample: dict, *, where: str = "sample") -> list[RolloutRow]:
    """The rollout rows of one ``samples_*.jsonl`` line (``where``: its ``file:line`` for messages).

    Reads the ``rollouts`` key (or ``best_cfg_acc``, whose per-document value was the same list in
    older runs), each rollout checked by :func:`eglr_harness.core.run_format.check_rollout`. Raises
    ``FileFormatError`` (a ``ValueError``) when there is no such list or a rollout is not allowed.
    """
    doc_id = sample.get("doc_id")
    items = sample.get("rollouts")
    if items is None and isinstance(sample.get("best_cfg_acc"), list):
        items = sample["best_cfg_acc"]
    if not isinstance(doc_id, int) or isinstance(doc_id, bool) or not isinstance(items, list):
        raise FileFormatError(
            f"{where}: doc {doc_id!r} has no `rollouts` list; the analysis needs the samples of an "
            "eglr task (e.g. gsm8k_eglr_lxt) logged with --log_samples (docs/run-format.md)."
        )
    return [_row(check_rollout(item, where, doc_id, i), doc_id, i) for i, item in enumerate(items)]


def read_task_samples(path: Path, filter_name: str | None = None) -> TaskSamples:
    """Read one task's samples file, every line and rollout checked
    (:func:`eglr_harness.core.run_format.read_samples_file`).

    lm-eval writes one line per (document, filter). ``filter_name`` picks the filter; by default
    the first filter in the file is used (logged when the file has several).
    """
    checked = read_samples_file(path, filter_name)
    rows = [_row(item, line.doc_id, i) for line in checked.lines for i, item in enumerate(line.rollouts)]
    hashes = {line.doc_id: str(line.sample.get("doc_hash", "")) for line in checked.lines}
    chosen, others = checked.filter, checked.other_filters
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
