"""Dataset loading: local JSONL (EGLR_DATA_DIR), hub layouts, clear errors, the demo generator."""

from __future__ import annotations

import json
import re

import pytest

from eglr_harness.data import BENCHMARKS, load_dataset_dict, load_problems
from eglr_harness.data.demo import generate_problem, generate_problems
from eglr_harness.data.sources import to_schema
from eglr_harness.scoring.extraction import extract_answer

SIZES = {"gsm8k": 1319, "math500": 500, "minerva_math": 272, "amc23": 40, "aime24": 30, "aime25": 30}
FIRST_GOLD = {"gsm8k": "18", "math500": "\\left( 3, \\frac{\\pi}{2} \\right)", "minerva_math": "1.6",
              "amc23": "27", "aime24": "204", "aime25": "70"}


@pytest.mark.parametrize("name", list(SIZES))
def test_local_data_maps_to_the_schema(name, shared_data_dir, monkeypatch):
    monkeypatch.setenv("EGLR_DATA_DIR", str(shared_data_dir))
    problems = load_problems(name)
    assert len(problems) == SIZES[name]
    assert problems[0]["answer"] == FIRST_GOLD[name]
    assert len({p["id"] for p in problems}) == len(problems)
    for p in problems:
        assert set(p) == {"id", "problem", "answer", "answer_format", "metadata"}
        assert p["problem"].strip() and p["answer"].strip()
        assert p["answer_format"] == ("number" if name == "gsm8k" else "math")


def test_integer_golds_are_normalised(shared_data_dir):
    aime24 = load_problems("aime24", data_dir=shared_data_dir)
    assert [p["answer"] for p in aime24][7] == "25"  # "025" in the file
    assert aime24[7]["metadata"]["original_answer"] == "025"
    assert load_problems("amc23", data_dir=shared_data_dir)[0]["metadata"]["original_answer"] == "27.0"


def test_dataset_dict_for_lm_eval(shared_data_dir):
    ds = load_dataset_dict("aime25", data_dir=shared_data_dir)
    assert list(ds) == ["test"] and len(ds["test"]) == 30
    assert set(ds["test"].features) >= {"problem", "answer", "id"}


def test_missing_file_names_path_and_layout(tmp_path, monkeypatch):
    monkeypatch.setenv("EGLR_DATA_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError) as err:
        load_problems("math500")
    message = str(err.value)
    assert str(tmp_path / "math500" / "test.jsonl") in message and "EGLR_DATA_DIR" in message


def test_unknown_layout_names_file_row_and_fields(tmp_path):
    (tmp_path / "math500").mkdir()
    path = tmp_path / "math500" / "test.jsonl"
    path.write_text(json.dumps({"prompt": "1+1?", "target": "2"}) + "\n")
    with pytest.raises(ValueError) as err:
        load_problems("math500", data_dir=tmp_path)
    message = str(err.value)
    assert f"{path}:1:" in message and "'prompt'" in message  # the file and its 1-based line
    assert "problem | question" in message and "answer" in message


def test_bad_json_names_the_line(tmp_path):
    (tmp_path / "aime25").mkdir()
    (tmp_path / "aime25" / "test.jsonl").write_text('{"problem": "p", "answer": "1"}\n{oops\n')
    with pytest.raises(ValueError, match=r"test.jsonl:2"):
        load_problems("aime25", data_dir=tmp_path)


def test_unknown_benchmark_lists_the_allowed_ones():
    with pytest.raises(ValueError, match="gsm8k, math500"):
        load_problems("math5000")


@pytest.mark.parametrize("name, row, gold", [
    ("gsm8k", {"question": "q", "answer": "work\n#### 1,234"}, "1234"),
    ("math500", {"problem": "p", "solution": "s", "answer": "\\frac12", "unique_id": "test/x.json"}, "\\frac12"),
    ("minerva_math", {"question": "q", "answer": "4.5e33"}, "4.5e33"),  # hub layout
    ("minerva_math", {"problem": "p", "solution": "so \\boxed{1.6} cm"}, "1.6"),  # local layout
    ("amc23", {"id": 3, "question": "q", "answer": 3159.0, "url": "u"}, "3159"),
    ("aime24", {"id": 60, "problem": "p", "solution": "s", "answer": "025", "url": "u"}, "25"),
    ("aime25", {"problem": "p", "answer": "70"}, "70"),
    ("aime25", {"problem": "p", "answer": 70, "id": "I-1"}, "70"),
])
def test_hub_and_local_layouts(name, row, gold):
    assert to_schema(BENCHMARKS[name], row, 0, "test")["answer"] == gold


def test_hub_path_is_used_without_data_dir(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(path, name=None, split=None, **kwargs):
        calls.append((path, name, split))
        return [{"problem": "What is 1+1?", "answer": "2", "solution": "\\boxed{2}", "unique_id": "a"}]

    monkeypatch.delenv("EGLR_DATA_DIR", raising=False)
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    problems = load_problems("math500")
    assert calls == [("HuggingFaceH4/MATH-500", None, "test")]
    assert problems[0]["answer"] == "2" and problems[0]["id"] == "math500-a"
    gsm8k_rows = [{"question": "q", "answer": "#### 3"}]
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: calls.append(a) or gsm8k_rows)
    assert load_problems("gsm8k")[0]["answer"] == "3" and calls[-1] == ("openai/gsm8k", "main")


# --------------------------------------------------------------------------- demo

def test_demo_is_seeded_and_prefix_stable():
    assert generate_problems(20) == generate_problems(20)
    assert generate_problems(50)[:20] == generate_problems(20)
    assert generate_problems(5, seed=1) != generate_problems(5, seed=2)
    assert generate_problem(7) == generate_problems(8)[7]


def test_demo_levels_answers_and_schema():
    problems = load_problems("demo", demo_n=100)
    assert len(problems) == 100
    assert [p["metadata"]["level"] for p in problems[:5]] == ["1", "2", "3", "4", "5"]
    for p in problems:
        assert p["answer_format"] == "number"
        assert int(p["answer"]) >= 0 and p["answer"] == str(int(p["answer"]))
        # the answer cannot be copied from the text
        assert p["answer"] not in re.findall(r"\d+", p["problem"])
        assert extract_answer(p["problem"], "number") != p["answer"]


@pytest.mark.parametrize("n", [0, -3, 2.5, True])
def test_demo_size_is_validated(n):
    with pytest.raises(ValueError, match="demo_n"):
        generate_problems(n)


def test_demo_levels_pick_the_default_sets_problems():
    # levels 1 and 2 are problems 0, 1, 5, 6, 10, ... of the default set (problem i has level i % 5 + 1)
    subset = generate_problems(6, levels=[1, 2])
    assert [p["id"] for p in subset] == ["demo-1333-0000", "demo-1333-0001", "demo-1333-0005",
                                         "demo-1333-0006", "demo-1333-0010", "demo-1333-0011"]
    assert [p["metadata"]["level"] for p in subset] == ["1", "2", "1", "2", "1", "2"]
    default = generate_problems(12)
    assert subset == [default[i] for i in (0, 1, 5, 6, 10, 11)]
    assert [p["id"] for p in generate_problems(3, seed=7, levels=4)] == ["demo-7-0003", "demo-7-0008", "demo-7-0013"]


def test_demo_levels_extend_and_default_is_unchanged():
    assert generate_problems(9, levels="1,3")[:4] == generate_problems(4, levels="1,3")
    assert generate_problems(20, levels=None) == generate_problems(20) == generate_problems(20, levels="1-5")
    assert [p["metadata"]["level"] for p in generate_problems(5, levels="5|2")] == ["2", "5", "2", "5", "2"]
    assert generate_problems(4, levels="2-3") == generate_problems(4, levels=[3, 2]) == generate_problems(4,
                                                                                                          levels="2;3")
    assert load_problems("demo", demo_n=2, demo_levels="3")[1]["id"] == "demo-1333-0007"


def test_demo_level_0_is_opt_in_and_never_repeats_before_its_132_problems():
    zero = generate_problems(3, levels=0)
    assert [(p["id"], p["problem"], p["answer"]) for p in zero] == [
        ("demo-1333-level0-0000", "What is 10 more than 14?", "24"),
        ("demo-1333-level0-0001", "What is 10 more than 69?", "79"),
        ("demo-1333-level0-0002", "What is 10 more than 49?", "59"),
    ]
    assert all(p["metadata"]["level"] == "0" for p in zero)
    mixed = generate_problems(4, levels="0,1")
    assert [p["id"] for p in mixed] == ["demo-1333-level0-0000", "demo-1333-0000", "demo-1333-level0-0001",
                                        "demo-1333-0005"]
    assert all(p["metadata"]["level"] != "0" for p in generate_problems(500))  # never in the default set
    many = generate_problems(140, levels=0, seed=5)
    texts = [p["problem"] for p in many]
    assert len(set(texts[:132])) == 132 and texts[132:] == texts[:8]  # 88 "ten more" + 44 doubles, then again
    for p in many:
        if m := re.fullmatch(r"What is 10 more than (\d+)\?", p["problem"]):
            assert 2 <= int(m[1]) <= 89 and p["answer"] == str(int(m[1]) + 10)
        else:
            a, b = re.fullmatch(r"What is (\d+) \+ (\d+)\?", p["problem"]).groups()
            assert a == b and 2 <= int(a) <= 45 and p["answer"] == str(2 * int(a))


@pytest.mark.parametrize("levels, bad",
                         [(-1, "level -1"), ("-1", "'-1'"), (6, "level 6"), ("1,7", "level 7"), ("a", "'a'"),
                                         ("3-1", "'3-1'"), ([], "names no level"), ("", "names no level"),
                                         (True, "True"), (1.5, "1.5"), (["1"], "'1'")])
def test_demo_levels_are_validated(levels, bad):
    with pytest.raises(ValueError, match="demo_levels") as err:
        generate_problems(5, levels=levels)
    assert bad in str(err.value) and "allowed: levels 0..5 (default 1-5" in str(err.value)


def test_demo_needs_no_files(monkeypatch, tmp_path):
    monkeypatch.setenv("EGLR_DATA_DIR", str(tmp_path))  # empty: the demo must not look there
    assert len(load_problems("demo")) == 50
