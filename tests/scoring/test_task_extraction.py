"""Answer extraction: parametrised tables of real-looking model outputs -> extracted answer."""

from __future__ import annotations

import pytest

from eglr_harness.scoring.extraction import extract_answer, final_boxed, last_boxed, match_braces, narrow_answer

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)

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
    # Fallback without a box: the math span or the last number, not the sentence
    ("Final Answer: The largest $n$ is 34.", "math", "34"),
    ("Final Answer: The final answer is $[2,5)$. I hope it is correct.", "math", "[2,5)"),
    ("The final answer is therefore 5.", "math", "5"),
    ("The answer is \\frac{\\pi}{2} radians.", "math", "\\frac{\\pi}{2}"),
    ("So the answer is $\\frac{1}{2}$ cup of flour.", "math", "\\frac{1}{2}"),
    ("The final answer is 5 \\text{ cm}^2.", "math", "5"),
    ("The answer is the fraction \\frac{3}{4}.", "math", "\\frac{3}{4}"),
    ("The final answer is $-2$ and $1$.", "math", "-2, 1"),
    ("The answer is Evelyn.", "math", "Evelyn"),
    ("The final answer is $x \\in [-2,7]$. I hope it is correct.", "math", "x \\in [-2,7]"),
    ("Thus the final answer is given above.", "math", None),
    ("Final Answer: The largest $n$ is 34.", "number", "34"),
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


# Several boxes that together give the final answer are read as their list (math-verify's rule:
# less than 10 characters apart, or less than 70 with and/or/,/; between them).
MULTI_BOX = [
    ("So $x = \\boxed{-2} \\quad\\text{and}\\quad \\boxed{1}$.", "-2, 1"),
    ("The solutions are $x = \\boxed{2}$ and $x = \\boxed{3}$.", "2, 3"),
    ("The pairs are $\\boxed{(1,2)}$, $\\boxed{(3,4)}$, $\\boxed{(5,6)}$, and $\\boxed{(7,8)}$.",
     "(1,2), (3,4), (5,6), (7,8)"),
    ("\\boxed{32}, \\boxed{349}", "32, 349"),  # joined with ", ": a list, never the number 32,349
    ("$\\boxed{5}$ and $\\boxed{5}$", "5"),  # a repeated box counts once
    ("\\boxed{\\boxed{5}}", "5"),  # nested: the inner box alone
    # boxes far apart, or without a separator, are separate attempts: the last one wins
    ("First $\\boxed{3}$ then we fix it: $\\boxed{4}$", "4"),
    ("We get \\boxed{3}. Checking the second case carefully we instead obtain the value \\boxed{4}", "4"),
    ("\\boxed{1} " + "x" * 80 + ", \\boxed{2}", "2"),
]


@pytest.mark.parametrize("text, expected", MULTI_BOX)
def test_several_boxes_are_one_list(text, expected):
    assert final_boxed(text) == expected
    assert extract_answer(text, "math") == expected


# Box or phrase: the box wins, except a "final answer" phrase written after the last box.
BOX_OR_PHRASE = [
    ("$\\boxed{5}$.\n\nFinal Answer: The final answer is $6$. I hope it is correct.", "6"),
    ("$\\boxed{5}$. The final answer is $5$.", "5"),
    ("$\\boxed{5}$.\n\nSo the answer is $6$.", "5"),  # "the answer is" does not override a box
    ("$\\boxed{5}$.\n\nAnswer: 6", "5"),
    ("$\\boxed{5}$. The final answer is boxed above.", "5"),  # a phrase without an answer
    ("The final answer is $\\boxed{7}$.", "7"),  # the phrase before the box: the box
]


@pytest.mark.parametrize("text, expected", BOX_OR_PHRASE)
def test_box_or_later_final_answer_phrase(text, expected):
    assert extract_answer(text, "math") == expected


@pytest.mark.parametrize("sentence, expected", [
    ("The largest $n$ is 34", "34"),
    ("$5$ apples", "5"),
    ("$-2$ and $1$", "-2, 1"),
    ("x = 5", "x = 5"),
    ("\\text{(C)}", "\\text{(C)}"),
    ("below", "below"),  # a one-word text answer cannot be told from a stray word
    ("boxed above", None),
])
def test_narrow_answer(sentence, expected):
    assert narrow_answer(sentence) == expected
