"""lm-eval's own math tasks keep working beside ours in one environment (issue 12, item 8).

lm-eval's ``minerva_math`` / ``leaderboard_math`` utils assert ``antlr4-python3-runtime`` 4.11 at
import (sympy's ``parse_latex`` needs that runtime); the project pins it, and math-verify's LaTeX
parser (which our equivalence uses) ships a parser for 4.11 too.
"""

from __future__ import annotations

import importlib
from importlib.metadata import version

import pytest

from eglr_harness.scoring.equivalence import is_equivalent

SOLUTION = "Half of the cake is left, so the answer is $\\boxed{\\frac{1}{2}}$."
OUTPUT = "Half of it remains.\nFinal Answer: The final answer is $\\frac{1}{2}$. I hope it is correct."
WRONG = "A third of it remains.\nFinal Answer: The final answer is $\\frac{1}{3}$. I hope it is correct."


def test_antlr_runtime_is_the_one_lm_eval_math_tasks_need():
    assert version("antlr4-python3-runtime").startswith("4.11")


def test_lm_eval_minerva_math_scores_an_answer():
    minerva = importlib.import_module("lm_eval.tasks.minerva_math.utils")  # asserts antlr 4.11
    doc = {"problem": "What fraction of the cake is left?", "solution": SOLUTION, "answer": "\\frac{1}{2}"}
    assert minerva.process_results(doc, [OUTPUT]) == {"exact_match": 1, "math_verify": 1}
    assert minerva.process_results(doc, [WRONG]) == {"exact_match": 0, "math_verify": 0}
    assert minerva.is_equiv("\\frac{1}{2}", "0.5")  # sympy's parse_latex on the 4.11 runtime


@pytest.mark.parametrize("gold, pred, verdict", [
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi/2)", True),
    ("\\frac{\\sqrt{3}}{3}", "\\frac{1}{\\sqrt{3}}", True),
    ("x^3+3x-6", "-6 + 3x + x^3", True),
    ("x^3+3x-6", "x^3+3x-7", False),
])
def test_our_latex_equivalence_on_the_same_runtime(gold, pred, verdict):
    assert is_equivalent(gold, pred) is verdict
