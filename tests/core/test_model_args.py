"""The one table of eglr's model args (core/model_args.MODEL_ARGS) and its one checker, ``read_model_arg``: every
number read by one rule, whatever the argument; ``engine=hf`` read as ``hook`` with one warning; the docs' table
naming every argument of the code's; run files written with the hook engine's earlier name still read."""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path

import pytest

from eglr_harness.core import model_args
from eglr_harness.core.model_args import EGLR_ARGS, MODEL_ARGS, read_model_arg
from eglr_harness.core.run_format import ROLLOUT_FIELDS

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)

INT_ARGS = [name for name, arg in MODEL_ARGS.items() if arg.kind == "int"]
REAL_ARGS = [name for name, arg in MODEL_ARGS.items() if arg.kind == "real"]
DOCS = Path(__file__).resolve().parents[2] / "docs" / "model-arguments.md"


def test_the_table_is_the_one_list_of_names_and_every_row_says_what_the_docs_need():
    assert EGLR_ARGS == tuple(MODEL_ARGS) and len(set(EGLR_ARGS)) == len(EGLR_ARGS)
    assert INT_ARGS and REAL_ARGS  # the numbers below are read through the rows, not a list of names
    for name, arg in MODEL_ARGS.items():
        assert arg.name == name and arg.allowed and arg.consumer, name


@pytest.mark.parametrize("name", INT_ARGS)
def test_every_int_arg_reads_its_text_and_an_integral_float_and_refuses_a_fraction(name):
    assert read_model_arg(name, "3") == read_model_arg(name, 3.0) == read_model_arg(name, " 3 ") == 3
    assert isinstance(read_model_arg(name, 3.0), int)
    assert read_model_arg(name, "3.0") == read_model_arg(name, "3e0") == 3
    # 2**53 + 1 written as a float is 2**53 once read as one; a full-width digit is no number
    for bad in (2.5, "2.5", True, "abc", None, 2**53 + 1, float("inf"), "9007199254740993.0", float(2**53), "\uff13",
                "1e99999999"):
        with pytest.raises(ValueError) as err:
            read_model_arg(name, bad)
        message = str(err.value)
        assert message.startswith(f"`{name}`={bad!r} is not allowed; allowed: ") and "\n" not in message, message


@pytest.mark.parametrize("name", REAL_ARGS)
def test_every_real_arg_reads_a_float_and_refuses_what_is_not_a_finite_number(name):
    assert read_model_arg(name, "0.5") == read_model_arg(name, 0.5) == 0.5
    assert isinstance(read_model_arg(name, 1), float)  # alpha=1 keys a store as alpha=1.0 did
    for bad in ("abc", True, None, math.nan, math.inf, 10**400):
        with pytest.raises(ValueError, match=re.escape(f"`{name}`={bad!r} is not allowed; allowed: ")):
            read_model_arg(name, bad)


def test_a_setting_that_takes_one_value_refuses_a_list_naming_eglr_sweep():
    with pytest.raises(ValueError, match=r"`alpha`='0\.1\|0\.5' is a list; .*eglr-sweep --sweep alpha="):
        read_model_arg("alpha", "0.1|0.5")
    assert read_model_arg("L", "1|4") == (1, 4)  # L and T are pool axes


def test_engine_hf_is_read_as_hook_with_one_deprecation_warning(caplog):
    model_args._warn_renamed_engine.cache_clear()
    with caplog.at_level(logging.WARNING, logger="eglr_harness.core.model_args"):
        assert [read_model_arg("engine", value) for value in ("hf", " HF ", "hook", "hf")] == ["hook"] * 4
    said = [r.getMessage() for r in caplog.records if "engine=hf" in r.getMessage()]
    assert said == ["eglr-hf: `engine=hf` is now `engine=hook`; hf is accepted for this release only."]
    with pytest.raises(ValueError, match=r"`engine`='fast' is not allowed; allowed: auto, continuous, hook "):
        read_model_arg("engine", "fast")


def test_run_files_naming_the_hook_engine_hf_still_read_and_show_hook():
    engine = ROLLOUT_FIELDS["engine"].check
    assert engine("hf") and engine("hook") and engine("continuous") and engine(None)
    assert not engine("fast") and not engine({}) and not engine(["hook"])
    assert model_args.engine_named("hf") == "hook" and model_args.engine_named("continuous") == "continuous"


def test_the_docs_table_names_every_model_arg_of_the_code():
    text = DOCS.read_text()
    table = text[text.index("| arg | default | meaning |"):text.index("\n\n", text.index("| arg | default |"))]
    documented = {name for row in table.splitlines()[2:] for name in re.findall(r"`(\w+)`", row.split("|")[1])}
    assert set(EGLR_ARGS) <= documented, sorted(set(EGLR_ARGS) - documented)
