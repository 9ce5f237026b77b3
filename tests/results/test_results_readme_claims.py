"""The claims results/README.md makes about the Qwen2.5-Coder-1.5B runs (issue 68, item 5) say what their numbers
carry, and each figure is the one its report or run holds:

- the 100-problem report (``gsm8k_sc/report_100``): the L rollouts against greedy at the same T = 0, per rollout
  (``resampling.csv``), not only against the T = 0.7 samples; the L pool's oracle against as many rollouts drawn at
  random from the grid (``intervals.csv``), a yardstick at the pool's budget; the disagreement slices rollout against
  rollout (``disagreement_*.csv``), no side the oracle of ten samples;
- the exit rules on 30 problems (``rules/report_30`` and its runs): the same count, not the same problems, and which
  points the committed ``rules/run.sh`` decoded.

Each check builds the sentence, or the table row, from the committed file and looks for it in the README (its lines
joined, so that a wrapped sentence is one): a rerun that moves a figure, or an edit of the README, fails here.
"""

from __future__ import annotations

import csv
import json
from itertools import combinations
from math import comb
from pathlib import Path

from helpers.markdown_tables import markdown_table
from helpers.run_scripts import script_commands
import pytest

from eglr_harness.analysis.load import load_parts, read_samples
from eglr_harness.analysis.sections.rules import rule_point
from eglr_harness.core.run_format import samples_files

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README); about two seconds

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "results" / "README.md"
QWEN = ROOT / "results" / "qwen2.5-coder-1.5b-instruct"
REPORT_100 = QWEN / "gsm8k_sc" / "report_100"
RULES = QWEN / "rules"
NUMBERS = {3: "three", 4: "four", 5: "Five", 7: "Seven", 9: "nine", 10: "ten"}


def _readme() -> str:
    """The README with its lines joined: a sentence wrapped over lines reads as one."""
    return " ".join(README.read_text(encoding="utf-8").split())


def _csv(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _signed(value: float, digits: int = 1) -> str:
    """``+2.7`` / ``−1.5``: the README's signs (a minus sign, not a hyphen)."""
    return f"{value:+.{digits}f}".replace("-", "−")


def _stale(what: str) -> str:
    return (f"{REPORT_100.relative_to(ROOT)} has no {what}: it predates the report code, regenerate it with the "
            "command tests/analysis/test_committed_reports.py names")


def _difference_rows() -> dict[str, list[str]]:
    """The 100-problem section's table of paired differences: label -> value, CI, better A / B, p."""
    rows = markdown_table(README.read_text(encoding="utf-8"), "| difference | value (problems of 100) |")
    return {cells[0]: cells[1:] for cells in rows[1:]}


# ---- the 100-problem report ----------------------------------------------------------------------------------------


def test_the_L_rollouts_against_greedy_at_the_same_temperature():
    """The claim "depth gives better single answers" compared T = 0 with T = 0.7 samples; the README sets the L rollouts
    against greedy (T = 0 too) as resampling.csv does, and calls it unresolved while the interval holds 0."""
    rows = {(r["pool_a"], r["pool_b"], r["measure"]): r for r in _csv(REPORT_100 / "resampling.csv")}
    assert ("L", "greedy", "accuracy") in rows, _stale("row L pool − greedy in resampling.csv")
    row = rows[("L", "greedy", "accuracy")]
    diff, low, high = (100 * float(row[k]) for k in ("diff", "diff_low", "diff_high"))
    a, b = (f"{100 * float(row[k]):.1f} %" for k in ("a", "b"))
    better, worse = int(row["better_a"]), int(row["better_b"])
    sign_p, wilcoxon_p = f"{float(row['sign_test_p']):.2g}", f"{float(row['wilcoxon_p']):.2g}"
    ci = f"{_signed(low)} … {_signed(high)}"
    text = _readme()
    assert low < 0 < high and "Whether depth gives better single answers is not resolved" in text
    assert (f"against greedy, at the same T = 0, the L rollouts gain {_signed(diff)} points (CI {ci}, better on "
            f"{better} problems and worse on {worse}, Wilcoxon p = {wilcoxon_p})") in text  # the summary
    assert (f"the L rollouts gain {_signed(diff)} points ({a} against {b}, CI {ci}, better on {better} problems and "
            f"worse on {worse}, sign test p = {sign_p}, Wilcoxon p = {wilcoxon_p})") in text  # the 100-problem section
    assert "Whether depth makes better single answers is not resolved" in text
    assert _difference_rows()["accuracy per rollout, L pool − greedy"] == [
        f"{_signed(diff)} points ({a} against {b})", f"{ci} points", f"{better} / {worse} ({row['n_effective']})",
        f"Wilcoxon {wilcoxon_p}"]


def test_the_random_yardstick_draws_as_many_rollouts_as_the_pool_holds():
    """The L pool against ten rollouts drawn at random from the grid's, the seed cell's ten samples ten of them (ten
    random cells of the twelve mostly held that cell: more than ten rollouts)."""
    cells = _csv(REPORT_100 / "cell_accuracy.csv")
    docs = int(cells[0]["docs"])
    rollouts = sum(int(c["rollouts"]) for c in cells) // docs  # per problem: greedy, ten L cells, ten seeds
    several = [c for c in cells if int(c["rollouts"]) > docs]
    assert (rollouts, len(cells), len(several)) == (21, 12, 1)
    intervals = {r["quantity"]: r for r in _csv(REPORT_100 / "intervals.csv")}
    text, table = _readme(), _difference_rows()
    for pool, who in (("L", "the L pool reaches"), ("T", "the samples")):
        name = f"oracle: {pool} pool − 10 random grid rollouts"
        assert name in intervals, _stale(f"row {name!r} in intervals.csv")
        row = intervals[name]
        estimate, low, high = float(row["estimate"]), 100 * float(row["ci_low"]), 100 * float(row["ci_high"])
        ci = f"{_signed(low)} … {_signed(high)}"
        assert table[f"oracle_{pool} − 10 random rollouts of the grid's {rollouts} (expected)"][:2] == [
            _signed(estimate), ci]
        if pool == "L":
            assert estimate < 0 and high < 0
            assert (f"{who} {abs(estimate):.1f} problems fewer than ten rollouts drawn at random from the grid's "
                    f"{rollouts} (CI {ci})") in text
            summary = f"and {abs(estimate):.1f} fewer than ten rollouts drawn at random from the grid's {rollouts}"
            assert f"{summary} (CI {ci})" in text
        else:
            assert f"{who} {abs(estimate):.1f} more (CI {ci})" in text
    holding = comb(len(cells), 10) - comb(len(cells) - 1, 10)  # 10-cell draws that hold the seed cell
    assert f"drawn as 10 of the {len(cells)} cells, {holding} of the {comb(len(cells), 10)} draws held the seed " \
           "cell's ten samples" in text


def _mean_disagreement(name: str) -> tuple[float, list[str]]:
    """A slice's mean (a square slice over its unordered pairs of distinct rows, T-vs-L over every entry) and its
    row labels."""
    rows = _csv(REPORT_100 / f"disagreement_{name}.csv")
    labels = [r["row \\ col"] for r in rows]
    values = [[int(v) for k, v in r.items() if k != "row \\ col"] for r in rows]
    if name == "T_vs_L":
        pooled = [v for row in values for v in row]
    else:
        pooled = [values[i][j] for i, j in combinations(range(len(values)), 2)]
    return sum(pooled) / len(pooled), labels


def test_the_disagreement_is_rollout_against_rollout():
    """T-vs-L once set the oracle of ten samples against single L rollouts (27.5); each sample is now a row."""
    T_rows = [r["row \\ col"] for r in _csv(REPORT_100 / "disagreement_T_vs_T.csv")]
    assert T_rows == [f"L=0,T=0.7,seed={s}" for s in range(1333, 1343)], _stale("row per sample in the slices")
    (LL, _), (TT, _), (TL, TL_rows) = (_mean_disagreement(n) for n in ("L_vs_L", "T_vs_T", "T_vs_L"))
    assert TL_rows == T_rows  # T-vs-L's rows: the same ten samples
    assert (f"two L configurations disagree on {LL:.1f} problems on average, an L rollout and a sample on {TL:.1f}, "
            f"two samples on {TT:.1f} (L-vs-L, T-vs-L, T-vs-T; each of the ten samples a rollout of its own, not "
            "their oracle)") in _readme()


# ---- the exit rules on 30 problems ---------------------------------------------------------------------------------


def _label(rule: str, threshold: float) -> str:
    """The README's name of a point: kl's thresholds as powers of ten (``kl at 5e-3``), the others' as decimals."""
    if rule == "kl":
        mantissa, exponent = f"{threshold:.0e}".split("e")
        return f"kl at {mantissa}e{int(exponent)}"
    return f"{rule} at {threshold:g}" if rule != "accel" else "accel"


def _points() -> dict[str, tuple[str, frozenset[int]]]:
    """run folder -> (the README's name of its point, the problems it solves), as the report's rules section reads
    them (:func:`rule_point`), in the order of its table (kl first, then by rule and threshold)."""
    _, parts, _ = load_parts(sorted(p for p in (RULES / "runs_30").iterdir() if p.is_dir()), "gsm8k_eglr_sc")
    points = sorted(((part.info.path.relative_to(RULES / "runs_30").parts[0], rule_point(part)) for part in parts),
                    key=lambda fp: (fp[1].rule != "kl", fp[1].rule, fp[1].threshold))
    return {folder: (_label(p.rule, p.threshold), frozenset(d for d, a in p.per_doc.items() if a))
            for folder, p in points}


def _names(labels: list[str]) -> str:
    return ", ".join(labels[:-1]) + f" and {labels[-1]}" if len(labels) > 1 else labels[0]


def test_the_exit_rules_table_matches_rules_csv():
    rows = markdown_table(README.read_text(encoding="utf-8"),
                          "| rule | threshold: k̄, FLOP ratio with the LM head (sooner exit → later) |")
    quoted = {cells[0]: cells[1:] for cells in rows[1:]}
    points = _csv(RULES / "report_30" / "rules.csv")
    assert set(quoted) == {p["rule"] for p in points}
    for p in points:
        many = sum(q["rule"] == p["rule"] for q in points) > 1
        assert quoted[p["rule"]][1] == (f"{p['correct']} each" if many else p["correct"])
        # "5e-2: 1.04, 1.008 · 5e-3: ..." -> the threshold's own k̄ and FLOP ratio with the head
        by_threshold = {float(part.split(":")[0].split()[0]): part.split(": ", 1)[1]
                        for part in quoted[p["rule"]][0].split(" · ")}
        cell = f"{float(p['mean_iterations']):.2f}, {float(p['flop_ratio_with_head']):.3f}"
        assert by_threshold[float(p["threshold"])].startswith(cell), (p["rule"], p["threshold"], cell)


def test_the_exit_rules_solve_the_same_count_not_the_same_problems():
    points = _points()
    counts = {len(solved) for _, solved in points.values()}
    assert counts == {16}
    groups: dict[frozenset[int], list[str]] = {}
    for label, solved in points.values():
        groups.setdefault(solved, []).append(label)
    assert len(groups) == 2, groups  # what the sentences below describe
    common, other = sorted(groups, key=lambda s: -len(groups[s]))
    (lost,), (gained,) = common - other, other - common
    text = _readme()
    same, moved = NUMBERS[len(groups[common])], groups[other]
    assert (f"16 of 30 at every point, but it changes which: the same count, different problems. {same} points solve "
            f"the same 16; {_names(moved)} solve doc_id {gained} instead of doc_id {lost}") in text
    assert (f"16 of 30, but not the same problems ({NUMBERS[len(moved)]} of the {NUMBERS[len(points)]} points solve "
            f"doc_id {gained} instead of doc_id {lost})") in text  # the summary


def test_the_exit_rules_texts_against_kl_at_the_papers_threshold():
    """Which points write kl at 5e-4's very texts, and on how many problems the others differ from them."""
    def responses(folder: str) -> dict[int, object]:
        (samples,) = samples_files(RULES / "runs_30" / folder, recursive=True)
        return {s["doc_id"]: s["resps"] for s in read_samples(samples)}

    points = _points()
    default = responses("default")
    differ = {folder: sum(r != default[d] for d, r in responses(folder).items()) for folder in points}
    same = sorted(points[f][0] for f, n in differ.items() if n == 0 and f != "default")
    moved = {f: n for f, n in differ.items() if n}
    unchanged = [points[f][0] for f in moved if points[f][1] == points["default"][1]]
    assert (same, unchanged) == (["accel", "latent at 0.01", "margin at 0.2", "margin at 0.5", "margin at 0.8"],
                                 ["latent at 0.03"])  # the README's order of them, below
    assert (f"{NUMBERS[len(same)]} points write the very texts of kl at 5e-4 (latent at 0.01, margin at 0.2, 0.5 and "
            f"0.8, accel); the other {NUMBERS[len(moved)]} differ from them on {min(moved.values())}-"
            f"{max(moved.values())} problems, {unchanged[0]} without changing a result") in _readme()


def test_which_exit_rule_points_the_committed_script_decoded():
    """Each run's results JSON records the rollout store it was decoded through: only kl at 5e-4's is the one
    rules/run.sh passes; the other nine, the shared store of an earlier pass, with the same settings otherwise."""
    (sweep,) = script_commands(RULES / "run.sh", "eglr-sweep")
    script_store = sweep[sweep.index("--rollout_cache") + 1]
    recorded = {}
    for results in sorted((RULES / "runs_30").glob("*/*/results_*.json")):
        config = json.loads(results.read_text(encoding="utf-8"))["config"]
        args = dict(config["model_args"])
        recorded[results.parent.parent.name] = (args.pop("rollout_cache"), str(config["batch_size"]), args)
    by_script = sorted(f for f, (store, _, _) in recorded.items() if store == script_store)
    shared = {store for f, (store, _, _) in recorded.items() if f not in by_script}
    assert by_script == ["default"] and len(shared) == 1 and len(recorded) == 10
    assert {batch for _, batch, _ in recorded.values()} == {"30"}
    settings = {json.dumps({k: v for k, v in args.items() if k not in ("stop",) and not k.startswith("tau_")},
                           sort_keys=True) for _, _, args in recorded.values()}
    assert len(settings) == 1  # the same model, L, T and precision at every point: only the rule differs
    (store,) = shared
    text = _readme()
    assert (f"Only kl at 5e-4 (`runs_30/default`): its results record `rollout_cache={script_store}`, the store "
            f"`rules/run.sh` passes. The other {NUMBERS[len(recorded) - 1]} record the shared store, "
            f"`rollout_cache={store}`") in text
    assert "they were not rerun with the committed script" in text


def _p(value: str) -> str:
    """A sign-test p as the README writes it: two significant digits (``0.179565`` -> ``0.18``)."""
    return f"{float(f'{float(value):.2g}'):g}"


def test_the_sc_t_gain_over_greedy_states_its_ties():
    """SC_T − greedy: its tie count and the worst case quoted beside the first-seen figure, as intervals.csv has
    them."""
    rows = {r["quantity"]: r for r in _csv(REPORT_100 / "intervals.csv")}
    if "ties_a" not in rows["SC: T pool − greedy"]:
        pytest.fail(_stale("tie columns in intervals.csv"))
    t, lpool = rows["SC: T pool − greedy"], rows["SC: L pool − greedy"]
    low, high = (round(100 * float(t[k])) for k in ("against_a_ci_low", "against_a_ci_high"))
    sentence = (f"but {t['ties_a']} of SC_T's {t['docs']} votes are ties, and with every tie against SC_T it is "
                f"{_signed(int(t['against_a_estimate']), 0)} (CI {_signed(low, 0)} … {_signed(high, 0)}, "
                f"p = {_p(t['against_a_sign_p'])})")
    assert sentence in _readme()
    assert (f"EGLR-SC_L − greedy is {_signed(int(lpool['estimate']), 0)} (CI −3 … +7, p = {_p(lpool['sign_p'])}; "
            f"{lpool['ties_a']} ties: {_signed(int(lpool['against_a_estimate']), 0)} … "
            f"{_signed(int(lpool['for_a_estimate']), 0)})") in _readme()


def test_the_withdrawn_beam_run_is_cut_as_the_readme_says_and_refused_by_its_report():
    """The README's count of beam answers without a final answer is the committed run's, and the committed report
    names that run as no baseline (never paired)."""
    (samples,) = samples_files(QWEN / "beam" / "beam10_30", recursive=True)
    lines = list(read_samples(samples))
    unboxed = sorted(line["doc_id"] for line in lines if "\\boxed{" not in line["resps"][0][0])
    listed = ", ".join(map(str, unboxed))
    assert f"{len(unboxed)} of the {len(lines)} answers have no `\\boxed{{}}` (docs {listed};" in _readme()
    report = (QWEN / "beam" / "report_30" / "report.md").read_text(encoding="utf-8")
    assert "beam10_30" in report and "lm-eval's hf cuts beams at batch > 1" in report
    assert "Beam-10 (hf) −" not in report and "− Beam-10 (hf)" not in report  # paired with nothing


def test_the_leaderboards_beam_row_quotes_its_measured_compute_and_its_finishes():
    """SmolLM2's leaderboard: Beam-4's FLOP ratios in the README are the measured ones of leaderboard_cells.csv, and
    the finishes and search tokens the README counts are those of the committed beam and greedy samples."""
    board = ROOT / "results" / "smollm2-135m-instruct" / "leaderboard"
    cells = {(r["method"], r["benchmark"]): r for r in _csv(board / "leaderboard_cells.csv")}
    ratios = [cells[("beam4", b)] for b in ("gsm8k", "math500")]
    assert all(r["compute_basis"] == "measured" for r in ratios)
    quoted = " / ".join(f"{float(r['flop_ratio_vs_greedy']):.2f}×" for r in ratios)
    assert f"| Beam-4 | 1.0 | 0.0 | {quoted} (measured) |" in README.read_text(encoding="utf-8")

    def first_rollouts(benchmark: str, run: str) -> list[dict]:
        (samples,) = samples_files(board / benchmark / run, recursive=True)
        return [line["rollouts"][0] for line in read_samples(samples)]

    beam, greedy = first_rollouts("gsm8k", "beam4"), first_rollouts("gsm8k", "greedy")
    math_beam = first_rollouts("math500", "beam4")
    count = lambda rows, finish: sum(r["finish"] == finish for r in rows)  # noqa: E731
    assert count(beam, "cut") == count(math_beam, "cut") == 0
    text = _readme()
    assert (f"GSM8K Beam-4: {count(beam, 'eos')} ended at the end of sequence, {count(beam, 'length')} at the 256 "
            f"tokens; MATH-500: {count(math_beam, 'eos')} and {count(math_beam, 'length')})") in text
    mean = lambda rows: sum(r["search_tokens"] for r in rows) / len(rows)  # noqa: E731
    assert f"{mean(beam):.1f} tokens per GSM8K problem over its four beams against greedy's {mean(greedy):.1f}" in text
