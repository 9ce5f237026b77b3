"""Issue 49's report sections against hand-computed values: the exit rules at a matched FLOP ratio (each rule
paired with the kl point of the nearest cost) and the re-sampling check (L pool, T pool, seed pool at an equal
number of rollouts), from synthetic lm-eval runs written by lm-eval's own tracker."""

from __future__ import annotations

import csv

from helpers import lmeval_fakes
import pytest

from eglr_harness.analysis import build_report, load_grid
from eglr_harness.analysis.sections.resampling import resampling_check
from eglr_harness.analysis.sections.rules import compare_rules

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)

TASK = "toy_eglr"


def _rule_run(path, solved: set[int], *, cost: float, n=8, **settings):
    """One rollout per problem (L=4, T=0) on ``n`` problems, ``solved`` right; config.eglr with ``settings``
    (stop, thresholds) and ``cost`` as its flop_ratio_with_head."""
    docs = {d: [{"repeat": 0, "L": 4, "T": 0.0, "cycle": 0, "answer": f"g{d}" if d in solved else "x",
                 "correct": int(d in solved), "cluster": 0}] for d in range(n)}
    block = lmeval_fakes.eglr_block(task=TASK, flop_ratio=1.05, cells={"L=4,T=0.0": {"tokens": 1000}})
    block["settings"] = {**block["settings"], **settings}
    block["stats"]["total"]["flop_ratio_with_head"] = cost
    lmeval_fakes.write_run(path, task=TASK, docs=docs, eglr=block)


def _rules_runs(tmp_path):
    _rule_run(tmp_path / "kl_5e-4", {0, 1, 5}, cost=1.30, tau_kl=5e-4)
    _rule_run(tmp_path / "kl_5e-3", {0, 1}, cost=1.20, tau_kl=5e-3)
    _rule_run(tmp_path / "kl_5e-2", {0, 1, 5}, cost=1.10, tau_kl=5e-2)
    _rule_run(tmp_path / "latent", {0, 1, 2, 3, 4}, cost=1.12, stop="latent", tau_latent=0.03)
    _rule_run(tmp_path / "margin", {1}, cost=1.26, stop="margin", tau_margin=0.5)
    return [tmp_path / n for n in ("kl_5e-4", "kl_5e-3", "kl_5e-2", "latent", "margin")]


def test_each_rule_is_paired_with_the_kl_point_of_the_nearest_flop_ratio(tmp_path):
    grid = load_grid(_rules_runs(tmp_path))
    result = compare_rules(grid.parts)
    assert result.cost_name == "flop_ratio_with_head"
    assert [(p.rule, p.threshold) for p in result.points] == [
        ("kl", 5e-4), ("kl", 5e-3), ("kl", 5e-2), ("latent", 0.03), ("margin", 0.5)]
    latent, margin = result.matched
    # latent costs 1.12: kl at 5e-2 (1.10) is nearest, not 5e-3 (1.20)
    assert latent.kl.threshold == 5e-2 and latent.cost_gap == pytest.approx(0.02)
    d = latent.difference
    # latent solves {0..4}, kl 5e-2 {0, 1, 5}: +1 on problems 2, 3, 4, −1 on 5, over 8 problems
    assert (d.problems, d.better_a, d.better_b, d.n_effective) == (8, 3, 1, 4)
    assert d.mean == pytest.approx(2 / 8)
    assert d.sign_p == pytest.approx(10 / 16)  # 2 · (C(4,0) + C(4,1)) / 2^4
    # four tied |d| = 1 share rank 2.5: W+ = 7.5 needs three plus signs, P = 5/16 a tail, two-sided 10/16
    assert d.wilcoxon_p == pytest.approx(10 / 16)
    # margin costs 1.26: kl at 5e-4 (1.30, gap 0.04) beats 5e-3 (1.20, gap 0.06)
    assert margin.kl.threshold == 5e-4 and margin.cost_gap == pytest.approx(-0.04)
    assert (margin.difference.better_a, margin.difference.better_b) == (0, 2)
    assert margin.difference.mean == pytest.approx(-2 / 8)


def test_rules_section_writes_the_figure_and_both_tables(tmp_path):
    out = build_report(_rules_runs(tmp_path), tmp_path / "report", sections=("runs", "rules"))
    assert (out / "rules_flop.png").stat().st_size > 0
    with open(out / "rules_matched.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["rule"], float(r["kl_tau_kl"])) for r in rows] == [("latent", 0.05), ("margin", 0.0005)]
    assert float(rows[0]["diff"]) == pytest.approx(0.25) and int(rows[0]["n_effective"]) == 4
    text = (out / "report.md").read_text()
    assert "## Exit rules at equal compute" in text and "rules_flop.png" in text
    assert "| latent 0.03 | kl 0.05 | +0.0200 | +25.0 (" in text


def _pool_run(path, docs_correct: dict[int, list[int]], cells: list[tuple[int, float]], seeds=None):
    """One run: per problem, the rollouts of ``cells`` (one each) or, with ``seeds``, of one cell under each
    seed; ``docs_correct[d]``: each rollout's correctness. Wrong answers differ from each other (w<i>), so a
    vote is right only when the right answers are the largest group."""
    docs = {}
    for d, correct in docs_correct.items():
        rows = []
        for i, ok in enumerate(correct):
            L, T = cells[0] if seeds else cells[i]
            row = {"repeat": i, "L": L, "T": T, "cycle": 0, "answer": f"g{d}" if ok else f"w{i}", "correct": ok}
            if seeds:
                row["seed"] = seeds[i]
            rows.append(row)
        docs[d] = rows
    lmeval_fakes.write_run(path, task=TASK, docs=docs, eglr=lmeval_fakes.eglr_block(task=TASK))


def _resampling_runs(tmp_path):
    L_cells = [(1, 0.0), (2, 0.0), (3, 0.0)]
    T_cells = [(0, 0.3), (0, 0.6), (0, 0.9), (0, 1.0)]  # four cells: cut to B = 3 (T = 1.0's right answer is out)
    # five problems; the seed pool is T = 0.6 under seeds 1333..1335: its first seed is the T pool's own rollout
    L = {0: [1, 0, 0], 1: [1, 1, 0], 2: [1, 1, 1], 3: [0, 0, 0], 4: [0, 0, 0]}
    T = {0: [0, 1, 0, 0], 1: [0, 0, 0, 0], 2: [0, 0, 0, 0], 3: [0, 1, 0, 0], 4: [0, 0, 0, 1]}
    seed = {0: [1, 1, 0], 1: [0, 0, 0], 2: [0, 0, 0], 3: [1, 1, 1], 4: [0, 1, 0]}
    _pool_run(tmp_path / "lpool", L, L_cells)
    _pool_run(tmp_path / "tpool", T, T_cells)
    _pool_run(tmp_path / "seedpool", {d: [T[d][1], *c[1:]] for d, c in seed.items()}, [(0, 0.6)],
              seeds=[1333, 1334, 1335])
    return [tmp_path / "lpool", tmp_path / "tpool", tmp_path / "seedpool"]


def test_resampling_check_compares_depth_with_seed_diversity_per_problem(tmp_path):
    grid = load_grid(_resampling_runs(tmp_path))
    result = resampling_check(grid)
    assert (result.B, result.problems, result.seeds) == (3, 5, (1333, 1334, 1335))
    # seed pool per problem: [T's 0.6 rollout, seed 1334, seed 1335] = [1,1,0], [0,0,0], [0,0,0], [1,1,1], [0,1,0]
    pools = result.pools
    assert (pools["L"].oracle, pools["T"].oracle, pools["seed"].oracle) == (3, 2, 3)
    # votes: L right on 1 (2 of 3), 2 (3 of 3) and 0 (three answers, groups of one: the tie goes to the first
    # rollout, a right one); seed on 0 and 3, not on 4 (groups of one, the first rollout wrong)
    assert (pools["L"].vote, pools["T"].vote, pools["seed"].vote) == (3, 0, 2)
    oracle = result.differences[("L", "seed", "oracle")]
    # L solves {0,1,2}, seed {0,3,4}: L better on 1, 2; seed on 3, 4
    assert (oracle.better_a, oracle.better_b, oracle.mean) == (2, 2, 0.0)
    assert oracle.sign_p == 1.0
    acc = result.differences[("L", "seed", "accuracy")]
    # per problem (right of 3): L 1,2,3,0,0 against seed 2,0,0,3,1 -> differences −1,+2,+3,−3,−1 (thirds)
    assert acc.mean == pytest.approx((-1 + 2 + 3 - 3 - 1) / 3 / 5)
    # |d| ranks: 1,1 -> 1.5 each; 2 -> 3; 3,3 -> 4.5 each: W+ = 3 + 4.5 = 7.5 of 15, the centre: p = 1
    assert (acc.n_effective, acc.wilcoxon_p) == (5, pytest.approx(1.0))
    t_vs_seed = result.differences[("T", "seed", "oracle")]
    assert (t_vs_seed.better_a, t_vs_seed.better_b) == (0, 1)  # T reaches {0, 3}, seed {0, 3, 4}


def test_resampling_section_in_the_report(tmp_path):
    out = build_report(_resampling_runs(tmp_path), tmp_path / "report", sections=("runs", "resampling"))
    text = (out / "report.md").read_text()
    assert "## Re-sampling check: depth diversity against seed diversity" in text
    assert "By the oracle, the L pool and the seed pool are not distinguishable at B = 3: +0.0 problems of 5" in text
    with open(out / "resampling.csv") as f:
        rows = {(r["pool_a"], r["pool_b"], r["measure"]): r for r in csv.DictReader(f)}
    assert rows[("L", "seed", "vote")]["a"] == "3" and rows[("L", "seed", "vote")]["b"] == "2"


def test_without_a_T_pool_the_check_sets_depth_against_seeds_alone(tmp_path):
    """An L pool beside a seed pool and no T pool (the Qwen runs: EGLR-SC_L and ten T = 0.7 samples): the seed
    pool's one sampled cell is not a T pool, and the check compares L with seed (it was silent: B = 1)."""
    lpool, _, seedpool = _resampling_runs(tmp_path)
    result = resampling_check(load_grid([lpool, seedpool]))
    assert (result.B, result.problems, sorted(result.pools)) == (3, 5, ["L", "seed"])
    assert {(a, b) for a, b, _ in result.differences} == {("L", "seed")}
    oracle = result.differences[("L", "seed", "oracle")]
    assert (oracle.better_a, oracle.better_b) == (2, 2)  # the same per-problem figures as with the T pool beside
    out = build_report([lpool, seedpool], tmp_path / "report", sections=("runs", "resampling"))
    assert "L pool − seed pool" in (out / "report.md").read_text()


def test_no_resampling_section_without_a_seed_pool(tmp_path):
    runs = _resampling_runs(tmp_path)[:2]
    assert resampling_check(load_grid(runs)) is None


def test_eglr_sweep_rules_runs_the_grid_resumes_and_reports(tmp_path):
    """``eglr-sweep --rules`` (the console entry, lm_eval replaced by a writer of what it would write): one run
    per (rule, threshold) of the built-in grid, the rules section of the report, and a rerun runs nothing."""
    import shlex
    from pathlib import Path

    from eglr_harness.commands import sweep as sweep_command
    from eglr_harness.core.config import STOP_RULES
    from eglr_harness.leaderboard.sweep import RULES_GRID
    from eglr_harness.run.model_names import parse_model_args

    calls = []

    def fake_lm_eval(argv):
        calls.append(argv)
        out = Path(argv[argv.index("--output_path") + 1])
        args = parse_model_args(argv[argv.index("--model_args") + 1])
        rule = STOP_RULES[args.get("stop", "kl")]
        threshold = float(args.get(rule.threshold_arg, rule.default))
        settings = {rule.threshold_arg: threshold, **({"stop": rule.name} if rule.name != "kl" else {})}
        _rule_run(out, set(range(len(calls) % 5)), cost=1.0 + threshold, **settings)
        return 0

    argv = shlex.split(f"--model_args pretrained=x,L=4 --tasks {TASK} --rules --rule margin=0.3 "
                       f"--output_dir {tmp_path / 'sw'}")
    assert sweep_command.main(argv, executor=fake_lm_eval) == 0
    names = [Path(c[c.index("--output_path") + 1]).name for c in calls]
    assert names[:3] == ["default", "tau_kl_0.005", "tau_kl_0.05"] and names[-1] == "stop_entropy_0.1"
    assert "stop_margin_0.3" in names and "stop_margin_0.5" not in names  # --rule replaced margin's grid
    assert len(names) == sum(len(v) for v in RULES_GRID.values()) - 2  # margin: 1 value instead of 3
    report = tmp_path / "sw" / "report"
    assert "## Exit rules at equal compute" in (report / "report.md").read_text()
    assert (report / "rules_flop.png").is_file()
    calls.clear()
    assert sweep_command.main(argv, executor=fake_lm_eval) == 0 and calls == []  # resumed: all finished
    assert sweep_command.main(shlex.split(f"--model_args pretrained=x --tasks {TASK} --rule margin=2 "
                                          f"--output_dir {tmp_path / 'sw2'}"), executor=fake_lm_eval) == 2
    assert calls == []


def test_where_the_grid_holds_greedy_each_pool_is_set_against_it_by_accuracy(tmp_path):
    """Greedy (L = 0, T = 0) beside the pools: each pool's right / B against greedy's right / 1, paired per problem
    (issue 68: "L pool − seed pool" moves the temperature too; "L pool − greedy" is depth alone at T = 0). Greedy is
    right on problem 2 only."""
    runs = _resampling_runs(tmp_path)
    _pool_run(tmp_path / "greedy", {0: [0], 1: [0], 2: [1], 3: [0], 4: [0]}, [(0, 0.0)])
    result = resampling_check(load_grid([*runs, tmp_path / "greedy"]))
    assert (result.greedy.oracle, result.greedy.vote, result.greedy.accuracy) == (1, 1, 0.2)
    assert {(a, b, m) for a, b, m in result.differences if b == "greedy"} == {
        ("L", "greedy", "accuracy"), ("T", "greedy", "accuracy"), ("seed", "greedy", "accuracy")}
    # L right 1, 2, 3, 0, 0 of 3 against greedy 0, 0, 1, 0, 0 of 1: +1/3, +2/3, 0, 0, 0
    L = result.differences[("L", "greedy", "accuracy")]
    assert (L.mean, L.better_a, L.better_b, L.n_effective) == (pytest.approx(0.2), 2, 0, 2)
    assert (L.sign_p, L.wilcoxon_p) == (0.5, pytest.approx(0.5))  # two positive ranks of two: W+ = 3, 2 · 1/4
    # the T pool cut to B = 3 (T = 0.3, 0.6, 0.9): 0, 0, 0, 1, 0 right -> -1 on problem 2, +1/3 on 0 and 3
    T = result.differences[("T", "greedy", "accuracy")]
    assert (T.mean, T.better_a, T.better_b) == (pytest.approx(-1 / 15), 2, 1)
    seed = result.differences[("seed", "greedy", "accuracy")]  # 2, 0, 0, 3, 1 of 3: +2/3, 0, -1, +1, +1/3
    assert (seed.mean, seed.better_a, seed.better_b) == (pytest.approx(0.2), 3, 1)
    out = build_report([*runs, tmp_path / "greedy"], tmp_path / "report", sections=("runs", "resampling"))
    with open(out / "resampling.csv") as f:
        rows = {(r["pool_a"], r["pool_b"], r["measure"]): r for r in csv.DictReader(f)}
    assert (rows[("L", "greedy", "accuracy")]["a"], rows[("L", "greedy", "accuracy")]["b"]) == ("0.4", "0.2")
    text = (out / "report.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| L pool − greedy | accuracy | "))
    assert row.startswith("| L pool − greedy | accuracy | +1.0 (") and row.endswith("| 2 / 0 | 0.5 | 0.5 (n = 2) |")
    assert "| greedy (L=0, T=0): 1 rollout | 1 | 1 | 20.0 |" in text
    assert "Re-sampling check against greedy" in text  # its Definitions
    # without greedy, no greedy row (the runs of test_resampling_check_compares_depth_with_seed_diversity_per_problem)
    assert resampling_check(load_grid(runs)).greedy is None
