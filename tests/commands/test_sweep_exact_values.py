"""eglr-sweep writes each swept value exactly, one folder per point, and checks each point as eglr-hf would
(issue 71, item 3): values the child reads back as other numbers, two points in one folder, a seed range past
2**53 and a negative seed were each wrong before."""

from __future__ import annotations

import shlex
from pathlib import Path

from helpers import lmeval_fakes
import pytest

from eglr_harness.commands import sweep as sweep_command
from eglr_harness.leaderboard import sweep

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)

TASK = "toy_eglr"
PRESET = "model_config=smollm2-135m-instruct,L=4"


def _child_value(point: sweep.SweepPoint, name: str):
    """The value eglr-hf's child reads for ``name``: lm-eval's reading of the model-args text."""
    from lm_eval.utils import simple_parse_args_string  # noqa: PLC0415

    return simple_parse_args_string(point.run.model_args)[name]


@pytest.mark.parametrize("spec, axis, value", [
    ("alpha=0.1234567", "alpha", 0.1234567),
    ("tau_kl=0.000123456789", "tau_kl", 0.000123456789),
    ("tau_h=1.23456789", "tau_h", 1.23456789),
    ("tau_latent=0.1+0.2", None, None),  # not a number: refused
])
def test_a_swept_value_reaches_the_run_exactly(spec, axis, value):
    if axis is None:
        with pytest.raises(ValueError, match="allowed"):
            sweep.parse_axis(spec)
        return
    points = sweep.plan_sweep(PRESET, "eglr_demo", [sweep.parse_axis(spec)], Path("o"))
    (moved,) = [p for p in points if p.changes]
    assert float(_child_value(moved, axis)) == value  # was 0.123457: never reused, "failed (no results file)"
    assert dict(moved.expected)[axis] == value


def test_close_values_get_their_own_folders():
    points = sweep.plan_sweep(PRESET, "eglr_demo", [sweep.parse_axis("alpha=0.1,0.1000001")], Path("o"))
    names = [p.name for p in points]
    assert names == ["default", "alpha_0.1", "alpha_0.1000001"]  # was alpha_0.1 twice
    assert len({p.run.output_path for p in points}) == len(points)


def test_labels_keep_the_short_names_of_earlier_sweeps():
    """A value whose short form reads back exactly keeps it, so that an earlier sweep's folders are reused."""
    assert [sweep._label(v) for v in (0.1, 5e-4, 1.0, 1e-5, 3, float("inf"), 2.5e15)] == [
        "0.1", "0.0005", "1", "1e-05", "3", "inf", "2.5e+15"]
    for value in (0.1234567, 2**53 - 1.0, 1 / 3, 5e-324):
        assert float(sweep._label(value)) == value


@pytest.mark.parametrize("spec, message", [
    ("tau_h=9007199254740993", "`tau_h`=9007199254740993 is not allowed"),  # was handed on, above 2**53
    ("alpha=9007199254740993", "`alpha`=9007199254740993 is not allowed"),
    ("seed=9007199254740993", "`seed`=9007199254740993 is not allowed"),
])
def test_a_value_above_2_53_is_refused_as_eglr_hf_refuses_it(spec, message):
    with pytest.raises(ValueError, match=message.replace("*", r"\*")):
        sweep.parse_axis(spec)


def test_a_seed_whose_last_repeat_passes_2_53_is_refused_before_anything_runs():
    with pytest.raises(ValueError, match=r"`seed`=9007199254740992 with `seeds`=2 is not allowed"):
        sweep.plan_sweep(PRESET + ",seeds=2", "eglr_demo", [sweep.parse_axis("seed=9007199254740992")], Path("o"))
    points = sweep.plan_sweep(PRESET + ",seeds=2", "eglr_demo", [sweep.parse_axis("seed=9007199254740991")],
                              Path("o"))
    assert [p.name for p in points] == ["default", "seed_9007199254740991"]


@pytest.mark.parametrize("spec, seeds", [
    ("seed=-5", (-5,)),  # was refused: negative seeds are allowed
    ("seed=-5,7", (-5, 7)),
    ("seed=-3--1", (-3, -2, -1)),
    ("seed=-1-1", (-1, 0, 1)),
    ("seed=+2", (2,)),
])
def test_negative_seeds_and_their_ranges(spec, seeds):
    assert sweep.parse_axis(spec) == ("seed", seeds)


def test_a_cli_sweep_of_a_refused_point_is_one_line(tmp_path, capsys):
    calls = []
    argv = shlex.split(f"--model_args pretrained=x,seeds=2 --tasks {TASK} --sweep seed=9007199254740992 "
                       f"--output_dir {tmp_path / 'sw'}")
    assert sweep_command.main(argv, executor=lambda a: calls.append(a) or 0) == 2
    err = capsys.readouterr().err.strip()
    assert not calls and len(err.splitlines()) == 1 and "`seeds`=2" in err, err


def test_an_exact_value_is_reused_on_the_rerun(tmp_path):
    calls = []

    def fake_lm_eval(argv):  # writes the run with the settings as the child read them
        calls.append(argv)
        from lm_eval.utils import simple_parse_args_string  # noqa: PLC0415

        out = Path(argv[argv.index("--output_path") + 1])
        args = simple_parse_args_string(argv[argv.index("--model_args") + 1])
        block = lmeval_fakes.eglr_block(gated=50, task=TASK, cells={"L=4,T=0.0": {"tokens": 1000}})
        block["settings"] = {**block["settings"], **({"alpha": float(args["alpha"])} if "alpha" in args else {})}
        docs = {d: [{"repeat": 0, "L": 4, "T": 0.0, "cycle": 0, "answer": "x", "correct": 0, "cluster": 0}]
                for d in range(3)}
        lmeval_fakes.write_run(out, task=TASK, docs=docs, eglr=block)
        return 0

    argv = shlex.split(f"--model_args pretrained=x --tasks {TASK} --sweep alpha=0.1234567 --no_report "
                       f"--output_dir {tmp_path / 'sw'}")
    assert sweep_command.main(argv, executor=fake_lm_eval) == 0  # was 1: "alpha_0.123457 failed (no results file)"
    calls.clear()
    assert sweep_command.main(argv, executor=fake_lm_eval) == 0 and calls == []  # reused, not decoded again
