"""Runs of other models as baselines: lm-eval's ``hf`` (greedy, beam search), ``eglr-baseline`` (lm-eval's ``hf``
with beams that finish), any model that is not EGLR's. Their rollouts carry no cell (L, T); a report reads each one's
first rollout per problem (it decodes one; repeats of a deterministic run are copies), its beam count, and whether it
can be trusted as a baseline at all.

A run is **refused** as a baseline (named with the reason in every section that would show it; never paired, never a
point of accuracy against compute) when:

- its ``num_beams`` gen kwarg is no beam count (``'abc'``, ``4.0``, ``-3``, ``true``): it would be read as greedy;
- it is lm-eval's stock ``hf`` model (``config.model`` ``hf``, or its aliases ``hf-auto``, ``huggingface``) with
  ``num_beams`` > 1 at ``config.batch_size`` other than 1 (``"auto"`` too): lm-eval sizes its stop-sequence criteria
  to the batch's prompts, transformers' beam search applies them to the flattened beam rows, and once a few beams of
  one prompt emit the stop string every prompt of the batch is marked done, so answers are cut short;
- any first rollout has ``finish`` ``"cut"`` (eglr-baseline's record that an answer ended early without a stop
  string, EOS or its token limit).

Nothing here reads files.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from eglr_harness.analysis.load.rollouts import RolloutRow, doc_ranges
from eglr_harness.analysis.load.runs import RunInfo

__all__ = ["STOCK_HF", "HF_BEAM_BATCH", "beam_count", "first_rollouts", "cut_docs", "batch_of_one",
           "baseline_refusal"]

STOCK_HF = ("hf", "hf-auto", "huggingface")  # lm-eval 0.4.13's names of its HFLM (@register_model)
HF_BEAM_BATCH = ("lm-eval's hf cuts beams at batch > 1; rerun at --batch_size 1 or with --model eglr-baseline, "
                 "docs/baselines.md")
_CUT = "cut"  # a rollout's `finish` when its decoding ended for no reason of its own (core/rollout.py FINISHES)
_DIGITS = re.compile(r"[0-9]+")


def beam_count(gen_kwargs: Mapping) -> tuple[int | None, str | None]:
    """``(num_beams, None)`` from a run's gen kwargs (None when not given), or ``(None, why)`` when the value is no
    beam count: an int >= 1, or a string of ASCII digits as older lm-eval kept the command line's text (``True``,
    ``4.0``, ``-3``, ``'abc'`` are not)."""
    raw = gen_kwargs.get("num_beams")
    if raw is None:
        return None, None
    if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 1:
        return raw, None
    if isinstance(raw, str) and _DIGITS.fullmatch(raw.strip()) and int(raw) >= 1:
        return int(raw), None
    return None, f"num_beams={str(raw)!r} is not a beam count (allowed: an int >= 1)"


def first_rollouts(rows: Iterable[RolloutRow]) -> dict[int, RolloutRow]:
    """problem -> its first rollout (lowest repeat), problems ascending."""
    first: dict[int, RolloutRow] = {}
    for row in sorted(rows, key=lambda r: (r.doc_id, r.repeat)):
        first.setdefault(row.doc_id, row)
    return first


def cut_docs(first: Mapping[int, RolloutRow]) -> list[int]:
    """The problems whose first rollout was cut (``finish`` ``"cut"``), ascending."""
    return sorted(doc for doc, row in first.items() if row.finish == _CUT)


def batch_of_one(batch_size) -> bool:
    """Whether lm-eval's ``config.batch_size`` is 1 (stored as ``1`` or ``"1"``); ``"auto"`` and a missing one are
    not known to be."""
    return not isinstance(batch_size, bool) and str(batch_size).strip() == "1"


def baseline_refusal(info: RunInfo, rows: Sequence[RolloutRow]) -> str | None:
    """Why the run of ``info`` (its rollouts ``rows``) is no baseline (module docstring; several reasons joined with
    "; "), or None when it is one."""
    reasons = []
    beams, error = beam_count(info.gen_kwargs)
    if error:
        reasons.append(error)
    if info.model_source in STOCK_HF and beams is not None and beams > 1 and not batch_of_one(info.batch_size):
        reasons.append(f"num_beams {beams} at batch_size {str(info.batch_size)!r}: {HF_BEAM_BATCH}")
    cut = cut_docs(first_rollouts(rows))
    if cut:
        reasons.append(f"{len(cut)} answer{'s' if len(cut) > 1 else ''} cut before their limit without a stop "
                       f"string or EOS: docs {doc_ranges(cut)}")
    return "; ".join(reasons) or None
