"""An outside-style recount of the committed Qwen2.5-Coder-1.5B GSM8K-100 report (issue 68): the figures of
``results/qwen2.5-coder-1.5b-instruct/gsm8k_sc/report_100`` recomputed from the three committed lm-eval samples files
alone (``greedy_100``, ``sc_L_100``, ``sc_T_100``), with a grader, a vote, a sign test, Wilson intervals and a
bootstrap of its own, as a reviewer with no project code would: this module imports nothing from ``eglr_harness``
nor from the tests' helpers, only the standard library.

- Grader: a rollout's answer is its response text's (lm-eval's ``resps``) last complete ``\\boxed{...}``, else the
  text's last number; ``$``, ``\\%``, thousands commas, ``\\text{...}`` units, a leading ``x =`` and ``\\frac{a}{b}``
  are normalised away and the value compared exactly (``Fraction``) with the gold, the doc's ``answer`` (after
  ``####`` when it has one; the sample's ``target`` must agree). A boxed answer that is no plain number (``L - 8``)
  is an answer all the same, keyed by its text without spaces: it votes, and is never correct (doc 23 of the T
  pool: five ``L - 8`` / ``L-8`` outvote four ``8``; told apart by their spaces, SC_T would be 67, not 66).
- Vote (docs/analyses.md, tasks/README.md): the largest group of equal answers wins, ties go to the group whose first
  member came first in the pool's order (the samples line's ``resps`` order), no answer never votes.
- Pools as the report's: greedy = the greedy run's deterministic cell (its 10 repeats are one rollout), the L pool =
  the 10 rollouts of ``sc_L_100`` (L = 1..10 at T = 0), the T pool = the 10 seeded rollouts of ``sc_T_100`` (L = 0,
  T = 0.7); the oracle solves a problem when any rollout of the pool is right; the corners add greedy.
- Intervals as the report's Definitions say: Wilson score intervals for the shares; for a difference A - B the
  discordant problems, the exact two-sided sign test, and a percentile paired bootstrap, 10,000 resamples of the
  problems drawn "with seed 0". The Definitions do not say by what: the report draws them with numpy's
  ``default_rng(0)``, over the problems in doc_id order, and takes numpy's linear percentiles, so the recount writes
  that generator out in the standard library (SeedSequence, PCG64, Lemire's bounded integers: the same draws, no
  numpy) and gets every bound to the CSV's six decimals. In doc_hash order one bound of six moves by a problem.

The figures are read from the report's CSVs (and its Markdown, which must say the same) and each must equal the
recount; the reviewer's own figures (greedy 57, SC_L 59, SC_T 66, oracles 72 / 87) are a cross-check only. Where
this grader and the project's logged per-rollout ``correct`` disagree, the doc ids and answers are named.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import re
from fractions import Fraction
from functools import lru_cache
from pathlib import Path
from statistics import NormalDist

import pytest

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README); the recount takes about a second

REPO = Path(__file__).resolve().parents[2]
RUNS = REPO / "results" / "qwen2.5-coder-1.5b-instruct" / "gsm8k_sc"
REPORT = RUNS / "report_100"
RUN_NAMES = {"greedy": "greedy_100", "L": "sc_L_100", "T": "sc_T_100"}
B = 10  # rollouts per problem in each pool
N_RESAMPLES = 10_000  # the report's bootstrap (its Definitions)
# the outside reviewer's recount (issue 68): a cross-check only, every assertion compares with the report's files
REVIEWER = {"greedy": 57, "SC_L": 59, "SC_T": 66, "oracle_L": 72, "oracle_T": 87}


# ---- reading the samples files (.jsonl or .jsonl.gz) --------------------------------------------------------------

def samples_file(run: Path) -> Path:
    found = sorted(run.glob("*/samples_*.jsonl")) + sorted(run.glob("*/samples_*.jsonl.gz"))
    assert len(found) == 1, f"{run}: expected one samples file (.jsonl or .jsonl.gz), found {found}"
    return found[0]


def read_samples(path: Path) -> list[dict]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def timestamp(name: str) -> str:
    """``samples_<task>_2026-11-29T07-10-01.793575.jsonl`` / ``results_<same>.json`` -> the time stamp."""
    return re.search(r"_(\d{4}-\d\d-\d\dT[\d.-]+?)\.json", name).group(1)


# ---- the grader -----------------------------------------------------------------------------------------------------

NUMBER = r"-?(?:\d+(?:\.\d+)?|\.\d+)"


def boxed_contents(text: str) -> list[str]:
    """The contents of every complete ``\\boxed{...}`` (balanced braces; a box cut off by the token limit is none)."""
    out = []
    for match in re.finditer(r"\\boxed\s*\{", text):
        depth, i = 1, match.end()
        while i < len(text) and depth:
            if text[i] == "\\":
                i += 2  # an escaped character, \{ or \} included
                continue
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            out.append(text[match.end():i - 1])
    return out


def without_thousands_commas(text: str) -> str:
    return re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", text)


def answer_key(boxed: str) -> Fraction | str | None:
    """A boxed answer: its value when it is one number (units, ``$``, ``%``, ``x =`` around it), else its text."""
    s = re.sub(r"\\(?:text|textbf|textnormal|mathrm|mbox)\s*\{([^{}]*)\}", r" \1 ", boxed)
    s = re.sub(r"\\[dt]?frac\s*\{\s*(-?\d+)\s*\}\s*\{\s*(\d+)\s*\}", r"\1/\2", s)
    s = without_thousands_commas(s.replace("{,}", ","))
    for junk in ("\\$", "$", "\\%", "%", "\\!", "\\,", "\\;", "\\ "):
        s = s.replace(junk, " ")
    s = " ".join(s.split())
    number = re.fullmatch(rf"(?:[A-Za-z]\w*\s*=\s*)?({NUMBER})(?:\s*/\s*(\d+))?(?:\s*[A-Za-z][A-Za-z .]*)?", s)
    if number:
        value = Fraction(number.group(1))
        return value / int(number.group(2)) if number.group(2) else value
    return s.replace(" ", "") or None


def extract(response: str) -> Fraction | str | None:
    """The final answer of one response: the last complete box, else the last number of the text, else none."""
    boxes = boxed_contents(response)
    if boxes:
        return answer_key(boxes[-1])
    numbers = re.findall(NUMBER, without_thousands_commas(response))
    return Fraction(numbers[-1]) if numbers else None


def gold(sample: dict) -> Fraction:
    answer = str(sample["doc"]["answer"])
    value = Fraction(without_thousands_commas(answer.split("####")[-1].strip().lstrip("$")))
    target = Fraction(without_thousands_commas(str(sample["target"]).split("####")[-1].strip().lstrip("$")))
    assert value == target, f"doc {sample['doc_id']}: the doc's answer {answer!r} and the target differ"
    return value


def vote(keys: list) -> Fraction | str | None:
    """Majority vote over answers in pool order: the largest group, ties to the group whose first member came first."""
    groups: dict = {}  # answer -> [first position, size]; dicts keep insertion order, so first seen comes first
    for position, key in enumerate(keys):
        if key is not None:
            groups.setdefault(key, [position, 0])[1] += 1
    if not groups:
        return None
    return max(groups, key=lambda k: (groups[k][1], -groups[k][0]))


# ---- the statistics ---------------------------------------------------------------------------------------------

def wilson(successes: int, n: int, level: float = 0.95) -> tuple[float, float]:
    z = NormalDist().inv_cdf(0.5 + level / 2)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def sign_test(only_a: int, only_b: int) -> float:
    """Exact two-sided sign test: each discordant problem falls either way with probability 1/2."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(min(only_a, only_b) + 1)) / 2 ** n)


def seed_sequence_words(entropy: int, n_words: int) -> list[int]:
    """numpy's ``SeedSequence(entropy).generate_state(n_words, uint32)`` (O'Neill's seed_seq hash, a pool of four)."""
    mask, const = 0xFFFFFFFF, [0x43B0D7E5]
    assert 0 <= entropy <= mask, "only a 32-bit seed is written out here"
    words = [entropy]

    def hashmix(value: int) -> int:
        value ^= const[0]
        const[0] = const[0] * 0x931E8875 & mask
        value = value * const[0] & mask
        return value ^ value >> 16

    def mix(x: int, y: int) -> int:
        r = (0xCA01F9DD * x - 0x4973F715 * y) & mask
        return r ^ r >> 16

    pool = [hashmix(words[i] if i < len(words) else 0) for i in range(4)]
    for src in range(4):
        for dst in range(4):
            if src != dst:
                pool[dst] = mix(pool[dst], hashmix(pool[src]))
    out, const_b = [], 0x8B51F9DD
    for i in range(n_words):
        value = pool[i % 4] ^ const_b
        const_b = const_b * 0x58F38DED & mask
        value = value * const_b & mask
        out.append(value ^ value >> 16)
    return out


@lru_cache(maxsize=None)
def bootstrap_draws(seed: int, n: int, n_resamples: int) -> tuple[int, ...]:
    """``numpy.random.default_rng(seed).integers(0, n, size=(n_resamples, n))``, flattened, written out: PCG64
    (128-bit LCG, XSL-RR output; each 64-bit output gives two 32-bit words, low first) seeded from SeedSequence,
    and Lemire's bounded integers on the 32-bit words (rejecting a word whose low product is below 2^32 mod n)."""
    multiplier, m128, m64, m32 = 0x2360ED051FC65DA44385DF649FCCF645, 2 ** 128 - 1, 2 ** 64 - 1, 0xFFFFFFFF
    w = seed_sequence_words(seed, 8)
    seed_words = [w[2 * i] | w[2 * i + 1] << 32 for i in range(4)]
    increment = ((seed_words[2] << 64 | seed_words[3]) << 1 | 1) & m128
    state = (increment + (seed_words[0] << 64 | seed_words[1])) & m128  # PCG's srandom: step from 0, add, step
    state = (state * multiplier + increment) & m128
    threshold = (m32 - (n - 1)) % n
    out, spare = [], None
    while len(out) < n * n_resamples:
        if spare is None:
            state = (state * multiplier + increment) & m128
            rot, x = state >> 122, ((state >> 64) ^ state) & m64
            x = (x >> rot | x << (64 - rot)) & m64
            word, spare = x & m32, x >> 32
        else:
            word, spare = spare, None
        product = word * n
        if (product & m32) >= threshold:
            out.append(product >> 32)
    return tuple(out)


def percentile(ordered: list[float], q: float) -> float:
    """numpy's default (linear) quantile of sorted values."""
    h = q * (len(ordered) - 1)
    i = min(int(h), len(ordered) - 2)
    return ordered[i] + (ordered[i + 1] - ordered[i]) * (h - i)


def bootstrap_interval(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """The report's percentile bootstrap of a mean over problems: N_RESAMPLES resamples of the problems (in doc_id
    order) with the draws of numpy's default_rng(0), the linear percentiles of the resampled means."""
    n = len(values)
    draws = bootstrap_draws(0, n, N_RESAMPLES)
    means = sorted(sum(values[j] for j in draws[r * n:(r + 1) * n]) / n for r in range(N_RESAMPLES))
    return percentile(means, (1 - level) / 2), percentile(means, (1 + level) / 2)


# ---- the recount ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def runs() -> dict[str, list[dict]]:
    missing = [str(folder) for folder in [*(RUNS / name for name in RUN_NAMES.values()), REPORT] if not folder.is_dir()]
    if missing:
        pytest.skip(f"the committed runs are not here: {', '.join(missing)}")
    return load_runs()


@pytest.fixture(scope="module")
def recount(runs) -> dict:
    return recount_runs(runs)


def load_runs() -> dict[str, list[dict]]:
    out = {}
    for pool, name in RUN_NAMES.items():
        samples = sorted(read_samples(samples_file(RUNS / name)), key=lambda s: s["doc_id"])
        assert [s["doc_id"] for s in samples] == list(range(100)), f"{name}: not GSM8K's first 100 problems"
        out[pool] = samples
    return out


def recount_runs(runs: dict[str, list[dict]]) -> dict:
    """Per problem: greedy right, the L and T pools' votes and oracles; per cell: right / rollouts; and every
    rollout where this grader and the logged ``correct`` (or the logged answer's cluster) part."""
    golds = [gold(s) for s in runs["greedy"]]
    for pool in ("L", "T"):
        assert [gold(s) for s in runs[pool]] == golds, f"{RUN_NAMES[pool]} holds other problems than greedy_100"
    verdicts: dict[str, list[list[bool]]] = {}
    keys: dict[str, list[list]] = {}
    cells: dict[tuple[int, float], list[int]] = {}
    disagreements = []
    for pool, samples in runs.items():
        verdicts[pool], keys[pool] = [], []
        for sample, answer in zip(samples, golds):
            responses, rollouts = sample["resps"][0], sample["rollouts"]
            assert len(responses) == len(rollouts) == B, f"{RUN_NAMES[pool]} doc {sample['doc_id']}: not {B} rollouts"
            assert [r["repeat"] for r in rollouts] == list(range(B)), "resps and the logged rollouts are not aligned"
            mine = [extract(text) for text in responses]
            right = [key == answer for key in mine]
            for r, key, ok in zip(rollouts, mine, right):
                if ok != bool(r["correct"]):
                    disagreements.append(f"{RUN_NAMES[pool]} doc {sample['doc_id']} rollout {r['repeat']}: "
                                         f"mine {key!s} ({ok}), logged {r['answer']!r} ({r['correct']}), gold {answer}")
            if pool == "greedy":
                assert len(set(responses)) == 1, f"greedy doc {sample['doc_id']}: the repeats differ"
                mine, right, rollouts = mine[:1], right[:1], rollouts[:1]  # one deterministic cell, counted once
            keys[pool].append(mine)
            verdicts[pool].append(right)
            for r, ok in zip(rollouts, right):
                cell = cells.setdefault((r["L"], float(r["T"])), [0, 0])
                cell[0] += ok
                cell[1] += 1
    greedy = [v[0] for v in verdicts["greedy"]]
    sc = {p: [vote(k) == answer for k, answer in zip(keys[p], golds)] for p in ("L", "T")}
    oracle = {p: [any(v) for v in verdicts[p]] for p in ("L", "T")}
    solved = {
        "greedy": greedy, "SC_L": sc["L"], "SC_T": sc["T"], "oracle_L": oracle["L"], "oracle_T": oracle["T"],
        "corner_L": [g or o for g, o in zip(greedy, oracle["L"])],
        "corner_T": [g or o for g, o in zip(greedy, oracle["T"])],
        "corner_joint": [g or a or b for g, a, b in zip(greedy, oracle["L"], oracle["T"])],
    }
    right = {p: [sum(v) for v in verdicts[p]] for p in ("L", "T")}  # right rollouts of B, per problem
    return {"solved": solved, "right": right, "cells": cells, "disagreements": disagreements}


def note(recount) -> str:
    """What to add to a failure: the rollouts this grader reads otherwise than the project's log."""
    found = recount["disagreements"]
    return f"; this grader parts from the logged `correct` on {len(found)} rollouts: {found[:20]}" if found else ""


# ---- the report -------------------------------------------------------------------------------------------------

def read_csv(name: str) -> list[dict]:
    with open(REPORT / name, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def markdown_rows(heading: str) -> dict[str, list[str]]:
    """The body of the first table under ``heading`` in report.md: first cell -> the rest."""
    lines = (REPORT / "report.md").read_text(encoding="utf-8").splitlines()
    start = lines.index(heading)
    table = []
    for line in lines[start + 1:]:
        if line.startswith("|"):
            table.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif table:
            break
    return {cells[0]: cells[1:] for cells in table[2:]}  # after the header and its |---| line


SHARES = {  # intervals.csv quantity -> the recount's solved set
    "greedy (L=0, T=0)": "greedy", "SC T pool (B=10)": "SC_T", "oracle T pool (B=10)": "oracle_T",
    "SC L pool (B=10)": "SC_L", "oracle L pool (B=10)": "oracle_L", "corner T-only (pool + greedy)": "corner_T",
    "corner L-only (pool + greedy)": "corner_L", "corner joint (pool + greedy)": "corner_joint",
}
DIFFERENCES = {  # intervals.csv quantity -> (A, B)
    "SC: T pool − greedy": ("SC_T", "greedy"),
    "SC: L pool − greedy": ("SC_L", "greedy"),
    "SC: L pool − T pool (equal budget)": ("SC_L", "SC_T"),
    "oracle: L pool − T pool (equal budget)": ("oracle_L", "oracle_T"),
    "corner: joint − T-only": ("corner_joint", "corner_T"),
    "corner: joint − L-only": ("corner_joint", "corner_L"),
}


def test_the_report_is_made_from_these_runs(runs):
    """The report's "Runs" table names the three run folders read here, by the time stamp their samples carry."""
    named = markdown_rows("## Runs")
    stamps = {Path(path).parts[0]: timestamp(Path(path).name) for path in named}
    assert stamps == {name: timestamp(samples_file(RUNS / name).name) for name in RUN_NAMES.values()}, named


def test_this_grader_agrees_with_the_logged_correct(recount):
    assert not recount["disagreements"], "\n".join(["this grader and the project's logged `correct` part on:",
                                                    *recount["disagreements"]])


def test_the_solved_counts(recount):
    """Greedy, the two votes and the two oracles: pools.csv, intervals.csv, report.md's tables and the corners."""
    got = {name: sum(v) for name, v in recount["solved"].items()}
    pools = {row["pool"]: row for row in read_csv("pools.csv")}
    corners = {row["corner"]: int(row["solved"]) for row in read_csv("cumulative_oracle.csv") if row["corner"]}
    shares = {row["quantity"]: int(row["estimate"]) for row in read_csv("intervals.csv") if row["method"] == "Wilson"}
    reported = {
        "greedy": round(float(pools["T"]["greedy"]) * int(pools["T"]["docs"])),
        "SC_L": int(pools["L"]["sc_solved"]), "SC_T": int(pools["T"]["sc_solved"]),
        "oracle_L": int(pools["L"]["oracle_solved"]), "oracle_T": int(pools["T"]["oracle_solved"]),
        "corner_L": corners["L-only"], "corner_T": corners["T-only"], "corner_joint": corners["joint"],
    }
    assert corners["greedy"] == reported["greedy"], corners
    for quantity, name in SHARES.items():
        assert shares[quantity] == reported[name], (quantity, shares[quantity], reported[name])
    table = markdown_rows("## Pools (Table 5 layout)")  # "66.0 (66)" in the T and L pool columns
    in_md = lambda row, column: int(re.search(r"\((\d+)\)", table[row][column]).group(1))
    assert (in_md("SC (majority vote)", 0), in_md("SC (majority vote)", 1)) == (reported["SC_T"], reported["SC_L"])
    assert (in_md("Oracle", 0), in_md("Oracle", 1)) == (reported["oracle_T"], reported["oracle_L"])
    assert got == reported, f"recounted {got}, the report says {reported}{note(recount)}"
    assert {k: got[k] for k in REVIEWER} == REVIEWER, f"the outside reviewer's recount was {REVIEWER}"


def test_the_cell_accuracies(recount):
    """Right rollouts per cell (greedy's repeats once), as cell_accuracy.csv and report.md's heat-map table print."""
    reported = {(int(r["L"]), float(r["T"])): [int(r["correct"]), int(r["rollouts"])]
                for r in read_csv("cell_accuracy.csv")}
    assert recount["cells"] == reported, f"recounted {recount['cells']}, the report says {reported}{note(recount)}"
    table = markdown_rows("## Accuracy per cell")
    for (L, T), (right, rollouts) in reported.items():
        column = sorted({t for _, t in reported}).index(T)
        assert table[f"L={L}"][column] == f"{right}/{rollouts} ({100 * right / rollouts:.1f})", (L, T, table)


def test_the_wilson_intervals(recount):
    rows = {row["quantity"]: row for row in read_csv("intervals.csv")}
    for quantity, name in SHARES.items():
        solved = recount["solved"][name]
        low, high = wilson(sum(solved), len(solved))
        row = rows[quantity]
        assert int(row["docs"]) == len(solved)
        assert math.isclose(float(row["ci_low"]), low, abs_tol=6e-7), (quantity, row, low)
        assert math.isclose(float(row["ci_high"]), high, abs_tol=6e-7), (quantity, row, high)


@pytest.mark.parametrize("quantity", list(DIFFERENCES), ids=["-".join(pair) for pair in DIFFERENCES.values()])
def test_a_paired_difference(recount, quantity):
    """A - B in problems, the discordant problems, the exact sign test and the bootstrap interval (intervals.csv),
    and the same in report.md's table (one decimal, p to three)."""
    a, b = (recount["solved"][name] for name in DIFFERENCES[quantity])
    n = len(a)
    only_a = sum(x and not y for x, y in zip(a, b))
    only_b = sum(y and not x for x, y in zip(a, b))
    p = sign_test(only_a, only_b)
    low, high = bootstrap_interval([int(x) - int(y) for x, y in zip(a, b)])
    row = next(r for r in read_csv("intervals.csv") if r["quantity"] == quantity)
    mine = (sum(a) - sum(b), n, only_a, only_b)
    reported = (int(row["estimate"]), int(row["docs"]), int(row["only_a"]), int(row["only_b"]))
    assert mine == reported, f"{quantity}: recounted {mine}, the report says {reported}{note(recount)}"
    assert math.isclose(float(row["sign_p"]), p, abs_tol=5e-7 + 1e-12), (quantity, row["sign_p"], p)
    ci = float(row["ci_low"]), float(row["ci_high"])
    assert math.isclose(ci[0], low, abs_tol=5e-7 + 1e-12) and math.isclose(ci[1], high, abs_tol=5e-7 + 1e-12), (
        f"{quantity}: the report's bootstrap interval {ci}, recomputed {low, high}")
    md = markdown_rows("## Confidence intervals")[quantity]  # problems | % | [low, high] | method | A / B | p
    assert int(md[0]) == mine[0] and md[4] == f"{only_a} / {only_b}", md
    assert md[2] == f"[{ci[0] * 100:.1f}, {ci[1] * 100:.1f}]", md
    assert math.isclose(float(md[5]), p, abs_tol=5e-4 + 1e-12), md


def test_the_resampling_check(recount):
    """resampling.csv: the L pool (depth) against the seed pool (the T run's 10 seeds) at B = 10 by oracle, vote and
    accuracy per rollout: the difference, its bootstrap interval, the problems each does better on, the sign test
    and the effective n (Wilcoxon's p is not recomputed here)."""
    solved, right = recount["solved"], recount["right"]
    per_problem = {  # measure -> (A's figure, B's figure, the per-problem differences in units of 1 / scale, scale)
        "oracle": (sum(solved["oracle_L"]), sum(solved["oracle_T"]),
                   [int(x) - int(y) for x, y in zip(solved["oracle_L"], solved["oracle_T"])], 1),
        "vote": (sum(solved["SC_L"]), sum(solved["SC_T"]),
                 [int(x) - int(y) for x, y in zip(solved["SC_L"], solved["SC_T"])], 1),
        "accuracy": (sum(right["L"]) / (B * len(right["L"])), sum(right["T"]) / (B * len(right["T"])),
                     [x - y for x, y in zip(right["L"], right["T"])], B),
    }
    rows = {row["measure"]: row for row in read_csv("resampling.csv")
            if (row["pool_a"], row["pool_b"]) == ("L", "seed")}
    assert set(rows) == set(per_problem), rows
    for measure, (a, b, diff, scale) in per_problem.items():
        row, n = rows[measure], len(diff)
        better_a, better_b = sum(d > 0 for d in diff), sum(d < 0 for d in diff)
        low, high = bootstrap_interval(diff)
        mine = {"B": B, "problems": n, "a": a, "b": b, "diff": sum(diff) / n / scale, "diff_low": low / scale,
                "diff_high": high / scale, "better_a": better_a, "better_b": better_b,
                "sign_test_p": sign_test(better_a, better_b), "n_effective": better_a + better_b}
        for column, value in mine.items():
            assert math.isclose(float(row[column]), value, abs_tol=5e-7 + 1e-12), (
                f"resampling.csv {measure} {column}: the report says {row[column]}, recounted {value}{note(recount)}")


def test_the_vote_rule():
    """The tie rule this recount applies: equal groups go to the one seen first; no answer never votes."""
    assert vote([Fraction(3), Fraction(5), Fraction(5), Fraction(3)]) == 3
    assert vote([None, None, Fraction(5)]) == 5 and vote([None]) is None
    assert vote(["L-8", Fraction(8), Fraction(8), "L-8", "L-8"]) == "L-8"
    assert extract("so \\(\\boxed{\\$1,250.0}\\) dollars") == 1250 and extract("\\boxed{L - 8}") == "L-8"
    assert extract("it is \\boxed{18 \\text{ dollars}}") == 18 and extract("\\boxed{\\frac{8}{3}}") == Fraction(8, 3)
    assert extract("= 97 + 10 = 107 \\]\nSo \\(\\boxed{107") == 107  # a box cut off: the last number
