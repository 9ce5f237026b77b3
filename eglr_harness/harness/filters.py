"""lm-eval filters over a document's repeats; each keeps the input order and the RolloutText metadata.

Compose them in a task's ``filter_list`` (registered names in parentheses)::

    filter_list:
      - name: maj4_first4            # majority over the first 4 configs
        filter:
          - function: take_first_k   # lm-eval's own; slicing keeps RolloutText objects
            k: 4
          - function: eglr_extract_answer
          - function: eglr_majority_vote

(the task's ``process_results`` then sees one answer per document: ``acc,maj4_first4`` is the
majority-of-4 accuracy; without the vote step it would see 4 and report ``maj@4,...``).

- :class:`ExtractAnswerFilter` (``eglr_extract_answer``) — text -> final answer; ``""`` = invalid.
- :class:`SelectCellsFilter` (``eglr_select_cells``) — keep the repeats of a sub-pool of (L, T) cells.
- :class:`MajorityVoteFilter` (``eglr_majority_vote``) — ``[winning answer]`` (needs extracted answers).
- :class:`OracleFilter` (``eglr_oracle``) — ``[a correct answer]`` if any repeat is correct.

Filters that pick or rewrite answers return them through :func:`~eglr_harness.core.rollout.with_meta`,
so the process_results step still sees each repeat's (L, T, cycle).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from lm_eval.api.filter import Filter

from eglr_harness.core.rollout import rollout_meta, with_meta
from eglr_harness.scoring.doc_scores import CellSelector, answer_or_none, majority_index
from eglr_harness.scoring.equivalence import DEFAULT_TIMEOUT_S, is_equivalent
from eglr_harness.scoring.extraction import ANSWER_MODES, extract_answer

logger = logging.getLogger(__name__)

MODE_FIELD = "answer_format"  # doc field that names the extraction mode (see eglr_harness.data)


def _per_doc(resps: Iterable, docs: list, fn) -> list:
    """Apply ``fn(list_of_responses, doc)`` per document; a bare string counts as one response."""
    out = []
    for doc_resps, doc in zip(resps, docs):
        if isinstance(doc_resps, str):
            result = fn([doc_resps], doc)
            out.append(result[0] if result else "")
        else:
            out.append(fn(list(doc_resps), doc))
    return out


class ExtractAnswerFilter(Filter):
    """Replace every response by its extracted final answer (``""`` when there is none).

    Args:
        mode: ``"auto"`` (default: the document's ``answer_format`` field, else ``"math"``),
            ``"math"`` or ``"number"`` (see :func:`~eglr_harness.scoring.extraction.extract_answer`).
    """

    def __init__(self, mode: str = "auto", **kwargs) -> None:
        if mode != "auto" and mode not in ANSWER_MODES:
            raise ValueError(f"eglr_extract_answer: `mode`={mode!r}; allowed: auto, {', '.join(ANSWER_MODES)}.")
        self.mode = mode
        super().__init__(**kwargs)

    def apply(self, resps, docs):
        def extract(responses, doc):
            mode = self.mode if self.mode != "auto" else (doc or {}).get(MODE_FIELD) or "math"
            return [with_meta(extract_answer(r, mode) or "", r) for r in responses]

        return _per_doc(resps, docs, extract)


class SelectCellsFilter(Filter):
    """Keep only the repeats decoded with a cell of ``L`` × ``T`` (spec syntax of ``eglr_harness.core.specs``).

    Either axis may be left out (= any value). Responses without (L, T) metadata (models other
    than eglr-hf) cannot be selected: they are passed through unchanged, with a warning.
    """

    def __init__(self, L=None, T=None, **kwargs) -> None:
        self.selector = CellSelector(L, T, name="eglr_select_cells")
        super().__init__(**kwargs)

    def apply(self, resps, docs):
        def select(responses, doc):
            keep = self.selector.select([rollout_meta(r) for r in responses])
            return [responses[i] for i in keep]

        return _per_doc(resps, docs, select)


class MajorityVoteFilter(Filter):
    """``[majority answer]`` per document (equivalence clusters; ties -> earliest; ``[""]`` if none).

    Expects extracted answers (put ``eglr_extract_answer`` before it).
    """

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S, **kwargs) -> None:
        self.timeout_s = float(timeout_s)
        super().__init__(**kwargs)

    def apply(self, resps, docs):
        def vote(responses, doc):
            answers = [answer_or_none(r) for r in responses]
            winner = majority_index(answers, lambda a, b: is_equivalent(a, b, timeout_s=self.timeout_s))
            if winner is None:
                return [with_meta("", responses[0])] if responses else [""]
            return [responses[winner]]

        return _per_doc(resps, docs, vote)


class OracleFilter(Filter):
    """``[first correct answer]`` per document, else ``[first valid answer]``, else ``[""]``.

    Expects extracted answers. Args: ``gold_field`` (default ``"answer"``), the document field
    holding the reference answer.
    """

    def __init__(self, gold_field: str = "answer", timeout_s: float = DEFAULT_TIMEOUT_S, **kwargs) -> None:
        self.gold_field = gold_field
        self.timeout_s = float(timeout_s)
        super().__init__(**kwargs)

    def apply(self, resps, docs):
        def oracle(responses, doc):
            if self.gold_field not in doc:
                raise ValueError(
                    f"eglr_oracle: `gold_field`={self.gold_field!r} is not a field of the document; "
                    f"fields: {sorted(doc)}."
                )
            gold = str(doc[self.gold_field])
            answers = [answer_or_none(r) for r in responses]
            for r, a in zip(responses, answers):
                if a is not None and is_equivalent(gold, a, timeout_s=self.timeout_s):
                    return [r]
            for r, a in zip(responses, answers):
                if a is not None:
                    return [r]
            return [with_meta("", responses[0])] if responses else [""]

        return _per_doc(resps, docs, oracle)
