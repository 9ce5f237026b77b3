"""Gold self-check on the real benchmark data (../shared/data).

The reference solution (MATH-500, Minerva, GSM8K) or the raw gold answer in a box (AMC23, AIME)
is fed in as the model output: every one must score correct (measured: 100% on all six), and a
perturbed gold must score wrong. No exceptions (tasks/README.md lists the cases fixed on the way).
"""

from __future__ import annotations

import re

import pytest

from eglr_harness.data import load_problems
from eglr_harness.scoring.equivalence import is_equivalent
from eglr_harness.scoring.extraction import extract_answer
from eglr_harness.scoring.normalize import parse_number

BENCHMARKS = ("gsm8k", "math500", "minerva_math", "amc23", "aime24", "aime25")
FROM_SOLUTION = {"gsm8k", "math500", "minerva_math"}


def perturb(gold: str) -> str:
    """A wrong answer close to ``gold``: number + 1, fraction (a+1)/b, else first integer + 1."""
    number = parse_number(gold)
    if number is not None:
        value = number.value
        if value.denominator != 1:
            return f"\\frac{{{value.numerator + 1}}}{{{value.denominator}}}"
        return str(value.numerator + 1)
    m = re.search(r"\d+", gold)
    if m:
        return gold[: m.start()] + str(int(m.group()) + 1) + gold[m.end():]
    return gold + "+1"


def model_output(problem: dict) -> str:
    if problem["metadata"]["source"] in FROM_SOLUTION:
        return problem["metadata"]["solution"]
    raw = problem["metadata"]["original_answer"]
    return f"Adding up the cases gives the result.\nSo the answer is $\\boxed{{{raw}}}$."


@pytest.fixture(scope="module")
def problems(shared_data_dir):
    return {name: load_problems(name, data_dir=shared_data_dir) for name in BENCHMARKS}


@pytest.mark.parametrize("name", BENCHMARKS)
def test_reference_scores_correct(name, problems):
    rows = problems[name]
    failures = [
        (p["id"], p["answer"], answer)
        for p in rows
        if not is_equivalent(p["answer"], answer := extract_answer(model_output(p), p["answer_format"]))
    ]
    assert not failures, f"{name}: {len(failures)} of {len(rows)} wrong: {failures[:10]}"


@pytest.mark.parametrize("name", BENCHMARKS)
def test_final_answer_phrase_without_box(name, problems):
    rows = problems[name]
    wrong = [p["id"] for p in rows
             if not is_equivalent(p["answer"], extract_answer(
                 f"Let me think.\nThe final answer is ${p['answer']}$. I hope it is correct.", p["answer_format"]))]
    assert not wrong


@pytest.mark.parametrize("name", BENCHMARKS)
def test_perturbed_gold_scores_wrong(name, problems):
    accepted = [(p["id"], p["answer"], perturb(p["answer"])) for p in problems[name]
                if is_equivalent(p["answer"], perturb(p["answer"]))]
    assert not accepted
