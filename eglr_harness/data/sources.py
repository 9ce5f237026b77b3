"""The six benchmarks: where each lives (hub / local folder) and how its rows map to our schema.

Internal schema of one problem (every task sees only these fields)::

    {"id": str, "problem": str, "answer": str, "answer_format": "math" | "number",
     "metadata": {"source": str, "solution": str | None, "subject": str | None,
                  "level": str | None, "original_answer": str}}

``answer`` is the gold final answer (LaTeX for math, a plain integer for GSM8K/AMC/AIME);
``answer_format`` selects the extraction fallbacks (``number`` also takes ``#### X`` and the last
number of a response). Field names differ between copies of a dataset (the hub's and the local
ones), so each benchmark accepts any row that has one of the problem fields and one of the
answer fields listed in :data:`BENCHMARKS`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from eglr_harness.scoring.extraction import final_boxed


@dataclass(frozen=True)
class BenchmarkSource:
    """Where a benchmark lives and which row fields hold what.

    Attributes:
        name: our name (task prefix, local folder name).
        hub_path, hub_config, split: the Hugging Face dataset a user would download.
        answer_format: ``math`` or ``number`` (extraction fallbacks).
        problem_fields: candidate names of the problem statement, first present wins.
        answer_fields: candidate names of the gold answer field.
        solution_fields: candidate names of a worked solution (gold = its final boxed answer,
            read as model outputs are, :func:`~eglr_harness.scoring.extraction.final_boxed`,
            when no answer field is present).
        id_fields: candidate names of a stable id (else the row index).
        gold_rule: how the raw gold becomes ``answer``: ``latex`` (as is), ``gsm8k`` (text after
            ``####``, commas removed) or ``integer`` (``27.0`` / ``025`` -> ``27`` / ``25``).
    """

    name: str
    hub_path: str
    hub_config: str | None
    split: str
    answer_format: str
    problem_fields: tuple[str, ...] = ("problem", "question", "Problem", "Question")
    answer_fields: tuple[str, ...] = ("answer", "Answer", "final_answer", "expected_answer")
    solution_fields: tuple[str, ...] = ("solution", "Solution")
    id_fields: tuple[str, ...] = ("unique_id", "id", "idx", "problem_idx", "ID")
    gold_rule: str = "latex"


BENCHMARKS: dict[str, BenchmarkSource] = {
    "gsm8k": BenchmarkSource(
        "gsm8k", "openai/gsm8k", "main", "test", "number", gold_rule="gsm8k", solution_fields=()
    ),
    "math500": BenchmarkSource("math500", "HuggingFaceH4/MATH-500", None, "test", "math"),
    "minerva_math": BenchmarkSource(
        "minerva_math", "math-ai/minervamath", None, "test", "math",
        # The local copy has no answer field: the gold is the solution's final \boxed{}.
        answer_fields=("answer", "final_answer"),
    ),
    "amc23": BenchmarkSource("amc23", "math-ai/amc23", None, "test", "math", gold_rule="integer"),
    "aime24": BenchmarkSource("aime24", "math-ai/aime24", None, "test", "math", gold_rule="integer"),
    "aime25": BenchmarkSource("aime25", "math-ai/aime25", None, "test", "math", gold_rule="integer"),
}

_GSM8K_GOLD = re.compile(r"####\s*(.+?)\s*$", re.DOTALL)


def benchmark(name: str) -> BenchmarkSource:
    """The :class:`BenchmarkSource` called ``name``; ``ValueError`` naming the choices otherwise."""
    if name not in BENCHMARKS:
        raise ValueError(f"`benchmark`={name!r} is unknown; allowed: {', '.join(BENCHMARKS)} (or 'demo').")
    return BENCHMARKS[name]


def _first(row: dict, names: tuple[str, ...]):
    for name in names:
        value = row.get(name)
        if value is not None and str(value).strip() != "":
            return name, value
    return None, None


def _integer_gold(raw) -> str:
    """``27.0`` -> ``27``, ``"025"`` -> ``25``; anything not integral is kept as written."""
    text = str(raw).strip()
    try:
        value = Fraction(text)
    except (ValueError, ZeroDivisionError):
        return text
    return str(value.numerator) if value.denominator == 1 else text


def _gold(source: BenchmarkSource, row: dict) -> tuple[str | None, str | None]:
    """(gold answer, the raw value it came from) or (None, None) when the row has neither."""
    _, raw = _first(row, source.answer_fields)
    if raw is not None:
        if source.gold_rule == "gsm8k":
            m = _GSM8K_GOLD.search(str(raw))
            if m is None:
                return None, str(raw)
            return m.group(1).replace(",", "").strip(), str(raw)
        if source.gold_rule == "integer":
            return _integer_gold(raw), str(raw)
        # Stray "$" inside a LaTeX gold (Minerva #72: "...+$ $\\dot{x}_{0}...") are typesetting debris.
        return re.sub(r"(?<!\\)\$", "", str(raw)).strip(), str(raw)
    _, solution = _first(row, source.solution_fields)
    if solution is not None:
        boxed = final_boxed(str(solution))
        if boxed is None:
            return None, None
        return re.sub(r"(?<!\\)\$", "", boxed).strip(), boxed
    return None, None


def expected_fields(source: BenchmarkSource) -> str:
    """Human-readable description of the accepted row layouts (for error messages)."""
    answer = " | ".join(source.answer_fields)
    if source.solution_fields:
        answer += " | " + " | ".join(source.solution_fields) + " (with \\boxed{})"
    if source.gold_rule == "gsm8k":
        answer += " (ending in '#### <number>')"
    return f"a problem field ({' | '.join(source.problem_fields)}) and a gold answer ({answer})"


def to_schema(source: BenchmarkSource, row: dict, index: int, where: str) -> dict:
    """Map one raw row to the internal schema; ``ValueError`` naming ``where`` (the file and its
    1-based line, or the dataset and its 1-based row) and the expected fields. ``index`` (0-based)
    is the id of a row without an id field."""
    _, problem = _first(row, source.problem_fields)
    gold, raw_gold = _gold(source, row)
    if problem is None or not gold:
        raise ValueError(
            f"{where}: a row of {source.name!r} with fields {sorted(row)}; expected "
            f"{expected_fields(source)}."
        )
    id_name, row_id = _first(row, source.id_fields)
    _, solution = _first(row, source.solution_fields)
    if source.gold_rule == "gsm8k":
        solution = raw_gold  # GSM8K's answer field is the worked solution
    _, subject = _first(row, ("subject", "type"))
    _, level = _first(row, ("level",))
    return {
        "id": f"{source.name}-{row_id if id_name else index}",
        "problem": str(problem),
        "answer": gold,
        "answer_format": source.answer_format,
        "metadata": {
            "source": source.name,
            "solution": None if solution is None else str(solution),
            "subject": None if subject is None else str(subject),
            "level": None if level is None else str(level),
            "original_answer": str(raw_gold),
        },
    }
