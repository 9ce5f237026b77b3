"""Answer extraction: parametrised tables of real-looking model outputs -> extracted answer."""

from __future__ import annotations

import pytest

from eglr_harness.scoring.extraction import extract_answer, last_boxed, match_braces

# (model output, mode, expected answer); None = invalid.
CASES = [
    # Qwen2.5-Math style
    ("The sum is $2+3=5$, so the answer is $\\boxed{5}$.", "math", "5"),
    ("Therefore the point is $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}$.", "math",
     "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("\\[\\boxed{\\begin{pmatrix} -1 \\\\ 2 \\end{pmatrix}}\\]", "math", "\\begin{pmatrix} -1 \\\\ 2 \\end{pmatrix}"),
    ("First $\\boxed{3}$ then we fix it: $\\boxed{4}$", "math", "4"),
    ("So $x \\in \\boxed{(-\\infty, 0]}$.", "math", "(-\\infty, 0]"),
    ("The set is $\\boxed{\\{1,2\\}}$", "math", "\\{1,2\\}"),
    ("The answer is \\fbox{12}.", "math", "12"),
    ("$\\framebox{204}$ minutes", "math", "204"),
    ("so we get \\boxed 7 as the answer", "math", "7"),
    ("\\boxed{\\text{(C)}}", "math", "\\text{(C)}"),
    ("\\boxed{\\frac{1}{2}} and later \\boxed{\\frac{3}{", "math", "\\frac{1}{2}"),  # truncated last box
    ("\\boxed{}", "math", None),  # empty box is no answer
    # Llama-3 / Mistral style
    ("Step 3: add.\nThe final answer is: $\\boxed{18}$. I hope it is correct.", "math", "18"),
    ("The final answer is $18$. I hope it is correct.", "math", "18"),
    ("The final answer is $\\$18.90$.", "math", "\\$18.90"),
    ("The final answer is 42.", "math", "42"),
    ("Answer: \\frac{3}{4}", "math", "\\frac{3}{4}"),
    ("So the answer is 7 apples. Good.", "number", "7"),
    ("We add them: the answer: 13 + 99 = 140.\nSo she has 140.", "number", "140"),
    ("The final answer is $\\$1,250$.", "number", "1250"),
    # no answer at all
    ("I am not sure how to solve this.", "math", None),
    ("We have 3 apples and 4 pears.", "math", None),  # math mode has no last-number fallback
    ("", "math", None),
    # GSM8K number mode
    ("Janet sells 16 - 3 - 4 = 9 eggs.\nShe makes 9 * 2 = $18.\n#### 18", "number", "18"),
    ("#### 1,234", "number", "1234"),
    ("So she has 3 + 4 = 7 apples left.", "number", "7"),
    ("The total is $70,000.", "number", "70000"),
    ("It drops to -5 degrees.", "number", "-5"),
    ("The answer is below.\nIt is 12.", "number", "12"),
    ("He pays 3.50 dollars.", "number", "3.50"),
    ("No numbers here.", "number", None),
]


@pytest.mark.parametrize("text, mode, expected", CASES)
def test_extract_answer(text, mode, expected):
    assert extract_answer(text, mode) == expected


def test_unknown_mode_names_the_allowed_ones():
    with pytest.raises(ValueError, match="math, number"):
        extract_answer("x", "latex")


def test_escaped_braces_do_not_count():
    text = "\\boxed{\\{1,2\\}}"
    pairs = match_braces(text)
    assert pairs == {6: len(text) - 1}
    assert last_boxed(text) == "\\{1,2\\}"


def test_row_separator_then_brace():
    # "\\" is a control symbol; the following "{" opens a group.
    assert last_boxed("\\boxed{a \\\\{b}}") == "a \\\\{b}"
