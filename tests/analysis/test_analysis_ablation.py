"""The ablation: eglr-sweep's plan and resume (fake executor), the metric and the report section."""

from __future__ import annotations

import shlex
from pathlib import Path

from helpers import lmeval_fakes
import pytest

from eglr_harness.analysis import build_report, load_grid
from eglr_harness.analysis.metrics.ablation import ablation
from eglr_harness.analysis.metrics.intervals import wilson_interval
from eglr_harness.commands import sweep as sweep_command
from eglr_harness.leaderboard import sweep
from eglr_harness.run.model_names import parse_model_args
from eglr_harness.run.settings import RunSettings

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)

TASK = "toy_eglr"


def _eglr(alpha=0.2, k_max=3, rho_gated=50):
    block = lmeval_fakes.eglr_block(gated=rho_gated, task=TASK, cells={"L=4,T=0.0": {"tokens": 1000}})
    block["settings"] = {**block["settings"], "alpha": alpha, "k_max": k_max}
    return block


def _one_rollout_run(path, solved: set[int], n=10, limit=None, **settings):
    docs = {d: [{"repeat": 0, "L": 4, "T": 0.0, "cycle": 0, "answer": f"g{d}" if d in solved else "x",
                 "correct": int(d in solved), "cluster": 0}] for d in range(n)}
    lmeval_fakes.write_run(path, task=TASK, docs=docs, eglr=_eglr(**settings), limit=limit)


def test_ablation_axes_default_and_intervals(tmp_path):
    _one_rollout_run(tmp_path / "default", set(range(5)))
    _one_rollout_run(tmp_path / "a01", set(range(6)), alpha=0.1)
    _one_rollout_run(tmp_path / "a09", set(range(1)), alpha=0.9, rho_gated=90)
    _one_rollout_run(tmp_path / "k1", set(range(4)), k_max=1)
    grid = load_grid([tmp_path / "default", tmp_path / "a01", tmp_path / "a09", tmp_path / "k1"])
    result = ablation(grid.parts, grid.task)
    assert set(result.axes) == {"alpha", "k_max"}
    assert result.default["alpha"] == 0.2 and result.default["k_max"] == 3
    alpha = result.axes["alpha"]
    assert [p.value for p in alpha] == [0.1, 0.2, 0.9]
    assert [p.correct for p in alpha] == [6, 5, 1] and [p.is_default for p in alpha] == [False, True, False]
    assert (alpha[2].low, alpha[2].high) == pytest.approx(wilson_interval(1, 10))
    assert alpha[2].rho == pytest.approx(0.09)
    assert (alpha[0].gained, alpha[0].lost, alpha[2].gained, alpha[2].lost) == (1, 0, 0, 4)
    assert alpha[2].vs_default[0] == pytest.approx(-0.4) and alpha[1].vs_default is None
    assert [p.value for p in result.axes["k_max"]] == [1, 3]


def _fractional_run(path, correct_of: dict[int, int], rollouts=4, with_head=None, **settings):
    """A run with ``rollouts`` rollouts a problem, ``correct_of[d]`` of them correct (settings: config.eglr's;
    with_head: its stats' flop_ratio_with_head, absent when None)."""
    docs = {d: [{"repeat": r, "L": 4, "T": 0.7, "cycle": r, "answer": "g" if r < c else "x", "correct": int(r < c),
                 "cluster": 0} for r in range(rollouts)] for d, c in correct_of.items()}
    block = _eglr()
    block["settings"] = {**block["settings"], **settings}
    if with_head is not None:
        block["stats"]["total"]["flop_ratio_with_head"] = with_head
    lmeval_fakes.write_run(path, task=TASK, docs=docs, eglr=block)


def test_exit_rules_are_an_axis_with_paired_wilcoxon_beside_the_sign_test(tmp_path):
    from eglr_harness.analysis.metrics.intervals import sign_test_p, wilcoxon_signed_rank

    # per problem, correct rollouts of 4: kl (the default point) and latent at a threshold of its own
    kl = {0: 1, 1: 2, 2: 0, 3: 4, 4: 3, 5: 2}
    latent = {0: 3, 1: 2, 2: 2, 3: 3, 4: 4, 5: 4}
    _fractional_run(tmp_path / "kl", kl)
    _fractional_run(tmp_path / "latent", latent, with_head=1.25, stop="latent", tau_latent=0.05)
    grid = load_grid([tmp_path / "kl", tmp_path / "latent"])
    result = ablation(grid.parts, grid.task)
    assert set(result.axes) == {"stop"} and result.default["stop"] == "kl"
    point = next(p for p in result.axes["stop"] if not p.is_default)
    assert point.value == "latent 0.05"
    assert point.flop_ratio_with_head == 1.25 and result.axes["stop"][0].flop_ratio_with_head is None
    # differences 0.5, 0, 0.5, -0.25, 0.25, 0.5: five problems moved (effective n 5), four up, one down
    diffs = [(latent[d] - kl[d]) / 4 for d in sorted(kl)]
    assert (point.gained, point.lost, point.n_effective) == (4, 1, 5)
    assert point.sign_p == pytest.approx(sign_test_p(4, 1))
    assert point.wilcoxon_p == pytest.approx(wilcoxon_signed_rank(diffs).p)
    # by hand: |d| 0.25, 0.25, 0.5, 0.5, 0.5 -> ranks 1.5, 1.5, 4, 4, 4; W- = 1.5 (the -0.25)
    assert wilcoxon_signed_rank(diffs).w_minus == 1.5
    out = build_report([tmp_path / "kl", tmp_path / "latent"], tmp_path / "rep", sections=("ablation",))
    text = (out / "report.md").read_text()
    assert "### stop" in text and "latent 0.05" in text and "(n = 5)" in text and "| 1.250 |" in text
    assert "wilcoxon_p,n_effective" in (out / "ablation.csv").read_text().splitlines()[0]


def test_another_seed_is_an_axis_beside_the_rules(tmp_path):
    """The re-sampling yardstick: kl under a second seed is paired with kl as latent is."""
    kl = {0: 1, 1: 2, 2: 0, 3: 4, 4: 3, 5: 2}
    _fractional_run(tmp_path / "kl", kl)
    _fractional_run(tmp_path / "kl_seed", {0: 2, 1: 2, 2: 1, 3: 3, 4: 3, 5: 2}, seed=1334)
    _fractional_run(tmp_path / "latent", {0: 3, 1: 2, 2: 2, 3: 3, 4: 4, 5: 4}, stop="latent")
    grid = load_grid([tmp_path / "kl", tmp_path / "kl_seed", tmp_path / "latent"])
    result = ablation(grid.parts, grid.task)
    assert set(result.axes) == {"stop", "seed"} and result.default["seed"] == 1333
    other_seed = next(p for p in result.axes["seed"] if not p.is_default)
    assert other_seed.value == 1334 and (other_seed.gained, other_seed.lost, other_seed.n_effective) == (2, 1, 3)
    assert [p.value for p in result.axes["stop"]] == ["kl", "latent"]
    sweep_plan = sweep.plan_sweep("model_config=smollm2-135m-instruct,L=4", "eglr_demo",
                                  [sweep.parse_axis("seed=1333-1335")], Path("o"))
    assert [p.name for p in sweep_plan] == ["default", "seed_1334", "seed_1335"]


def test_ablation_report_and_silence_without_a_sweep(tmp_path):
    _one_rollout_run(tmp_path / "default", set(range(5)))
    _one_rollout_run(tmp_path / "a05", set(range(2)), alpha=0.5)
    out = build_report([tmp_path / "default", tmp_path / "a05"], tmp_path / "rep", sections=("runs", "ablation"))
    text = (out / "report.md").read_text()
    assert "## Ablation" in text and "0.2 (default)" in text and (out / "ablation_alpha.png").is_file()
    assert (out / "ablation.csv").read_text().splitlines()[0].startswith("axis,value,default")
    single = build_report([tmp_path / "default"], tmp_path / "rep1")
    text = (single / "report.md").read_text()
    assert "Ablation" not in text and not (single / "ablation.csv").exists()


def test_plan_one_axis_at_a_time():
    points = sweep.plan_sweep("model_config=smollm2-135m-instruct,L=4", "eglr_demo",
                              [sweep.parse_axis("alpha=0.1,0.2,0.5"), sweep.parse_axis("k_max=1-3")], Path("o"),
                              rollout_cache="o/rollouts")
    assert [p.name for p in points] == ["default", "alpha_0.1", "alpha_0.5", "k_max_1", "k_max_2"]
    args = parse_model_args(points[1].run.model_args)
    assert args["alpha"] == "0.1" and args["rollout_cache"] == "o/rollouts" and "k_max" not in args


def test_plan_the_exit_rules_and_one_rules_thresholds():
    rules = sweep.plan_sweep("model_config=smollm2-135m-instruct,L=4,k_max=4", "eglr_demo",
                             [sweep.parse_axis("stop=kl,latent,accel")], Path("o"))
    assert [p.name for p in rules] == ["default", "stop_latent", "stop_accel"]
    assert parse_model_args(rules[1].run.model_args)["stop"] == "latent"
    latent = sweep.plan_sweep("model_config=smollm2-135m-instruct,L=4,stop=latent", "eglr_demo",
                              [sweep.parse_axis("tau_latent=0.01,0.03,0.1")], Path("o"))
    assert [p.name for p in latent] == ["default", "tau_latent_0.01", "tau_latent_0.1"]  # 0.03: the default
    assert parse_model_args(latent[2].run.model_args)["stop"] == "latent"
    with pytest.raises(ValueError, match="`stop`='kld' is not allowed"):
        sweep.parse_axis("stop=latent,kld")
    with pytest.raises(ValueError, match="`tau_margin`=1.5 is not allowed"):
        sweep.parse_axis("tau_margin=0.5,1.5")


@pytest.mark.parametrize("spec", ["beta=1", "alpha", "k_max=1.5", "k_max=3-1", "alpha="])
def test_bad_axis_is_refused(spec):
    with pytest.raises(ValueError):
        sweep.parse_axis(spec)


def test_axis_in_model_args_is_refused():
    with pytest.raises(ValueError, match="both in --model_args"):
        sweep.plan_sweep("pretrained=x,alpha=0.3", "t", [sweep.parse_axis("alpha=0.1,0.2")], Path("o"))


@pytest.mark.parametrize("name", ["alpha", "k_max", "tau_kl", "tau_h"])
def test_model_arg_lists_name_the_sweep_command(name):
    with pytest.raises(ValueError, match="eglr-sweep --sweep " + name):
        RunSettings.from_args({}, **{name: "1|2"})


def test_sweep_runs_resumes_and_reports(tmp_path, capsys):
    calls = []
    accuracy = {"default": 5, "alpha_0.5": 2, "k_max_1": 4}

    def fake_lm_eval(argv):  # writes what lm_eval would, from the command line it was given
        calls.append(argv)
        out = Path(argv[argv.index("--output_path") + 1])
        args = parse_model_args(argv[argv.index("--model_args") + 1])
        assert "--metadata" in argv and "--apply_chat_template" in argv
        settings = {k: t(args[k]) for k, t in (("alpha", float), ("k_max", int)) if k in args}
        limit = float(argv[argv.index("--limit") + 1])
        _one_rollout_run(out, set(range(accuracy[out.name])), limit=limit, **settings)
        return 0

    argv = shlex.split(
        f"--model_args pretrained=x --tasks {TASK} --sweep alpha=0.2,0.5 --sweep k_max=1,3 --limit 10 "
        f"--apply_chat_template --metadata '{{\"n\": 10}}' --output_dir {tmp_path / 'sw'}"
    )
    assert sweep_command.main(argv, executor=fake_lm_eval) == 0
    assert [Path(c[c.index("--output_path") + 1]).name for c in calls] == ["default", "alpha_0.5", "k_max_1"]
    text = (tmp_path / "sw" / "report" / "report.md").read_text()
    assert "### alpha" in text and "### k_max" in text
    calls.clear()
    assert sweep_command.main(argv, executor=fake_lm_eval) == 0 and calls == []  # resume: all finished
    # the defaults moved (k_max=2 for every point): nothing made with k_max=3 is reused
    argv2 = [*argv[: argv.index("--sweep")], "--sweep", "alpha=0.2,0.5", *argv[argv.index("--limit"):]]
    argv2[argv2.index("pretrained=x")] = "pretrained=x,k_max=2"
    assert sweep_command.main(argv2, executor=fake_lm_eval) == 0
    assert [Path(c[c.index("--output_path") + 1]).name for c in calls] == ["default", "alpha_0.5"]


def test_plain_L0_run_without_tau_h_is_a_point_of_the_L_axis(tmp_path):
    _one_rollout_run(tmp_path / "default", set(range(5)))
    docs = {d: [{"repeat": 0, "L": 0, "T": 0.0, "cycle": 0, "answer": "x", "correct": 0, "cluster": 0}]
            for d in range(10)}
    block = _eglr()
    block["tau_h"] = {}  # an L=0 run calibrates and records no tau_h
    lmeval_fakes.write_run(tmp_path / "L0", task=TASK, docs=docs, eglr=block)
    result = ablation(load_grid([tmp_path / "default", tmp_path / "L0"]).parts, TASK)
    assert [(p.value, p.correct) for p in result.axes["L"]] == [(0, 0), (4, 5)] and not result.off_axis


@pytest.mark.parametrize("args", [
    "--model_args pretrained=x --sweep k_max=0",
    "--model_args pretrained=x --sweep alpha=2",
    "--model_args pretrained=x --sweep alpha=0.1 --sweep tau_h=-1",
    "--model_args pretrained=x,k_max=2.5 --sweep alpha=0.1",
    "--model_args pretrained=x,top_k=2.7 --sweep alpha=0.1",
    "--model_args pretrained=x,seed=1.5 --sweep alpha=0.1",
    "--model_args pretrained=x,seed=abc --sweep alpha=0.1",
    "--model_args pretrained=x,tau_kl=nan --sweep alpha=0.1",
])
@pytest.mark.parametrize("dry_run", [False, True])
def test_a_value_no_run_accepts_is_refused_before_anything_runs(tmp_path, capsys, args, dry_run):
    calls = []
    argv = shlex.split(f"{args} --tasks {TASK} --output_dir {tmp_path / 'sw'}") + (["--dry_run"] if dry_run else [])
    assert sweep_command.main(argv, executor=lambda a: calls.append(a) or 0) == 2  # today: the default point runs first
    out, err = capsys.readouterr()
    assert not calls and not out  # --dry_run printed the invalid commands
    swept = "--model_args pretrained=x " in args  # else the bad value is in --model_args
    name = (args.split()[-1] if swept else args.split(",")[1]).partition("=")[0]
    assert len(err.strip().splitlines()) == 1 and f"`{name}`=" in err and "allowed" in err


def test_a_failed_run_fails_the_sweep_without_a_report(tmp_path, capsys):
    def fake_lm_eval(argv):  # the default point finishes, alpha=0.5 fails
        out = Path(argv[argv.index("--output_path") + 1])
        if out.name == "default":
            _one_rollout_run(out, {1, 2})
        return 0 if out.name == "default" else 1

    argv = shlex.split(f"--model_args pretrained=x --tasks {TASK} --sweep alpha=0.5 --output_dir {tmp_path / 'sw'}")
    assert sweep_command.main(argv, executor=fake_lm_eval) == 1
    assert not (tmp_path / "sw" / "report").exists()  # today: a report of the default point alone
    assert "alpha_0.5" in capsys.readouterr().err


def test_a_device_in_the_model_args_reaches_lm_eval_as_its_flag(tmp_path, capsys):
    """Issue 38: lm-eval passes its own `device` to the model, so one in --model_args was a TypeError in every
    run; the sweep's runs get it as `--device`, as the leaderboard's do."""
    argv = shlex.split(f"--model_args model_config=smollm2-135m-instruct,device=cpu --tasks {TASK} "
                       f"--sweep alpha=0.1 --output_dir {tmp_path / 'sw'} --dry_run")
    assert sweep_command.main(argv, executor=lambda a: 0) == 0
    commands = [shlex.split(line) for line in capsys.readouterr().out.splitlines()]
    assert len(commands) == 2
    for command in commands:
        model_args = command[command.index("--model_args") + 1]
        assert "device" not in model_args and command[command.index("--device") + 1] == "cpu"
