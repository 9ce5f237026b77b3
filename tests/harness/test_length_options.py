"""What the checks of length options promise (generation_options.py, harness/preflight.py; issue 38).

Each of lm-eval's names for the length limit (``normalize_gen_kwargs`` turns every one into
``max_gen_toks``) is an int >= 1, whoever gives it, and must leave the prompt room in the model's
``max_length``; the check names the option as written, its value and where it came from.
"""

from __future__ import annotations

import math

import pytest
from lm_eval.models.utils import normalize_gen_kwargs

from eglr_harness.core.errors import GenerationOptionError
from eglr_harness.core.generation_options import check_generation_options
from eglr_harness.harness.preflight import _check_length

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)

# lm-eval 0.4.13's names for the limit, in its priority order (normalize_gen_kwargs' docstring)
LENGTH_OPTIONS = ("max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens")


@pytest.mark.parametrize("name", LENGTH_OPTIONS)
def test_every_length_option_is_one_lm_eval_reads_as_the_limit(name):
    assert normalize_gen_kwargs({name: 7, "do_sample": False})["max_gen_toks"] == 7


@pytest.mark.parametrize("name", LENGTH_OPTIONS)
@pytest.mark.parametrize("value, shown", [(0, "0"), (-1, "-1"), (2.5, "2.5"), ("16", "'16'"), (True, "true"),
                                          (math.nan, "nan"), (math.inf, "inf")])
def test_a_length_option_that_is_not_an_int_of_at_least_one_is_refused(name, value, shown):
    with pytest.raises(GenerationOptionError) as info:
        check_generation_options({name: value}, "--gen_kwargs")
    assert str(info.value) == f"`{name}`={shown} (--gen_kwargs) is not allowed; allowed: an int >= 1, at most 2**53."


@pytest.mark.parametrize("name", LENGTH_OPTIONS)
@pytest.mark.parametrize("value", [1, 16, 16.0, None])
def test_a_length_option_of_at_least_one_passes(name, value):
    check_generation_options({name: value}, "--gen_kwargs")


@pytest.mark.parametrize("name", LENGTH_OPTIONS)
def test_a_length_option_must_leave_the_prompt_room_in_max_length(name):
    _check_length({name: 8191}, "--gen_kwargs", 8192)
    _check_length({name: 10**9}, "--gen_kwargs", None)  # max_length not known before the load: checked after it
    for value in (8192, 10**9):
        with pytest.raises(GenerationOptionError) as info:
            _check_length({name: value}, "generation_kwargs of task t", 8192)
        assert str(info.value).startswith(f"`{name}`={value} (generation_kwargs of task t) leaves no room for the "
                                          "prompt in the model's max_length=8192; allowed: 1..8191")
