"""eglr-leaderboard: command lines (checked against lm-eval's own CLI parser), resume, failures,
and the table, with a fake lm_eval executor that writes lm-eval's real layout."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

from helpers import lmeval_fakes
import pytest
from lm_eval._cli import HarnessCLI

from eglr_harness.analysis.portable import portable
from eglr_harness.core.benchmark_names import benchmark_of
from eglr_harness.commands.leaderboard import main
from eglr_harness.leaderboard.runner import RECORD_NAME, run_leaderboard
from eglr_harness.leaderboard.runs import (
    LeaderboardOptions, build_command, default_output_dir, model_slug, parse_beams, parse_limit, plan_runs,
)

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)

MODEL_ARGS = "pretrained=/models/smol,gguf_file=SmolLM2-135M-Instruct.Q4_1.gguf"
HF_ACC = {None: 0.5, 4: 0.75, 11: 0.25}  # num_beams -> acc the fake greedy/beam runs report


def parse_lm_eval(argv):
    """lm-eval 0.4.13's own parser on our command (argv[0:3] = python -m lm_eval)."""
    assert argv[1:3] == ["-m", "lm_eval"]
    return HarnessCLI()._parser.parse_args(argv[3:])


def model_kwargs_clash(args) -> None:
    """What lm-eval 0.4.13 does next with the parsed command: ``cls(**model_args, **flags)``, where the flags
    always hold ``device`` (default cuda:0) and ``batch_size``; a name in both is Python's TypeError."""
    from lm_eval.config.evaluate_config import EvaluatorConfig
    from lm_eval.utils import simple_parse_args_string

    cfg = EvaluatorConfig.from_cli(args)
    model_args = cfg.model_args if isinstance(cfg.model_args, dict) else simple_parse_args_string(cfg.model_args)
    flags = {k: v for k, v in {"batch_size": cfg.batch_size, "max_batch_size": cfg.max_batch_size,
                               "device": cfg.device}.items() if v is not None}
    if clash := sorted(set(model_args) & set(flags)):
        raise TypeError(f"HFLM() got multiple values for keyword argument {clash[0]!r}")


def sc_docs():
    """L-only pool L=1..10 at T=0 over 4 docs. doc0 right only at L=1, doc1 at L=1,2, doc2 at L=1..6,
    doc3 everywhere; wrong rollouts answer "x". Majority: doc0 x(9), doc1 x(8) wrong; doc2 g2(6), doc3 right
    -> maj 2/4. Oracle 4/4. Best cell L=1 (4/4)."""
    right = {0: {1}, 1: {1, 2}, 2: set(range(1, 7)), 3: set(range(1, 11))}
    return {
        d: [
            {
                "repeat": L - 1,
                "L": L,
                "T": 0.0,
                "cycle": 0,
                "answer": f"g{d}" if L in right[d] else "x",
                "correct": int(L in right[d]),
            }
            for L in range(1, 11)
        ]
        for d in range(4)
    }


class FakeLmEval:
    """Stands in for `python -m lm_eval run ...`: parses the command, writes results + samples."""

    def __init__(self, fail_tasks=(), sc_metrics=True):
        self.calls: list[list[str]] = []
        self.fail_tasks = set(fail_tasks)
        self.sc_metrics = sc_metrics

    def __call__(self, argv):
        self.calls.append(list(argv))
        args = parse_lm_eval(argv)
        model_kwargs_clash(args)
        task, gen = args.tasks[0], args.gen_kwargs or {}
        if task in self.fail_tasks:
            return 1
        if args.model == "eglr-baseline":
            acc = HF_ACC[gen.get("num_beams")]
            docs = {
                d: [
                    {
                        "repeat": 0,
                        "L": None,
                        "T": None,
                        "cycle": None,
                        "answer": f"g{d}" if d < 4 * acc else "x",
                        "correct": int(d < 4 * acc),
                    }
                ]
                for d in range(4)
            }
            lmeval_fakes.write_run(
                args.output_path,
                task=task,
                docs=docs,
                model=args.model,
                model_args=args.model_args,
                metrics={"acc": acc},
                limit=args.limit,
            )
        else:
            cells = {f"L={L},T=0.0": {"tokens": 100, "flop_ratio": 1.0 + L / 1000} for L in range(1, 11)}
            metrics = {"best_cfg_acc": 1.0, "maj@10": 0.5, "oracle@10": 1.0} if self.sc_metrics else {"acc": 1.0}
            lmeval_fakes.write_run(
                args.output_path,
                task=task,
                docs=sc_docs(),
                model="eglr-hf",
                model_args=args.model_args,
                metrics=metrics,
                limit=args.limit,
                eglr=lmeval_fakes.eglr_block(flop_ratio=1.02, cells=cells),
            )
        return 0


def options(tmp_path, **kw):
    base = dict(
        model_args=MODEL_ARGS,
        tasks=("gsm8k", "math500"),
        output_dir=tmp_path / "lb",
        limit=4,
        max_gen_toks=256,
        batch_size="8",
        apply_chat_template=True,
        python="python",
    )
    return LeaderboardOptions(**{**base, **kw})


# ------------------------------------------------------------------ command lines
def test_commands_are_exact_and_parse_with_lm_eval(tmp_path):
    opts = options(tmp_path, tasks=("gsm8k",), eglr_model_args="tau_h=auto")
    runs = plan_runs(opts)
    assert [r.name for r in runs] == ["greedy", "beam4", "beam11", "eglr_sc"]
    out = tmp_path / "lb" / "gsm8k"
    assert build_command(runs[0], opts) == [
        "python",
        "-m",
        "lm_eval",
        "run",
        "--model",
        "eglr-baseline",
        "--model_args",
        MODEL_ARGS,
        "--tasks",
        "gsm8k_eglr",
        "--output_path",
        str(out / "greedy"),
        "--log_samples",
        "--gen_kwargs",
        "do_sample=False,max_gen_toks=256",
        "--limit",
        "4",
        "--batch_size",
        "8",
        "--apply_chat_template",
    ]
    parsed = [parse_lm_eval(build_command(r, opts)) for r in runs]
    assert [p.model for p in parsed] == ["eglr-baseline", "eglr-baseline", "eglr-baseline", "eglr-hf"]
    assert [p.tasks for p in parsed] == [["gsm8k_eglr"]] * 3 + [["gsm8k_eglr_sc"]]
    assert parsed[1].gen_kwargs == {"do_sample": False, "num_beams": 4, "max_gen_toks": 256}
    assert parsed[2].gen_kwargs["num_beams"] == 11
    assert parsed[3].gen_kwargs == {"max_gen_toks": 256}
    assert parsed[3].model_args == {
        "pretrained": "/models/smol",
        "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "tau_h": "auto",
    }
    assert parsed[0].model_args == {"pretrained": "/models/smol", "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf"}
    assert all(p.log_samples and p.limit == 4.0 and p.apply_chat_template is True for p in parsed)
    assert [p.output_path for p in parsed] == [str(out / n) for n in ("greedy", "beam4", "beam11", "eglr_sc")]


def test_optional_flags_and_beams(tmp_path):
    opts = options(
        tmp_path,
        tasks=("aime24_eglr_sc",),
        beams=(),
        limit=None,
        max_gen_toks=None,
        batch_size=None,
        apply_chat_template=False,
        device="cpu",
        lm_eval_args=("--seed", "0"),
    )
    runs = plan_runs(opts)
    assert [(r.name, r.task) for r in runs] == [("greedy", "aime24_eglr"), ("eglr_sc", "aime24_eglr_sc")]
    argv = build_command(runs[1], opts)
    assert "--limit" not in argv and "--gen_kwargs" not in argv and "--apply_chat_template" not in argv
    assert argv[-4:] == ["--device", "cpu", "--seed", "0"]
    assert parse_lm_eval(argv).seed == [0, 0, 0, 0]
    assert build_command(plan_runs(options(tmp_path, limit=0.5))[0], options(tmp_path, limit=0.5))[-5:-3] == [
        "--limit",
        "0.5",
    ]


@pytest.mark.parametrize(
    ("task", "bench"),
    [
        ("gsm8k", "gsm8k"),
        ("gsm8k_eglr", "gsm8k"),
        ("math500_eglr_sc", "math500"),
        ("minerva_math_eglr_lxt", "minerva_math"),
        ("eglr_demo_lxt", "eglr_demo"),  # the leaderboard once kept the suffix here; presets did not
        ("eglr_demo_sc", "eglr_demo"),
    ],
)
def test_benchmark_of(task, bench):
    assert benchmark_of(task) == bench


def test_bad_options_name_the_value(tmp_path):
    with pytest.raises(ValueError, match="pretrained="):
        options(tmp_path, model_args="gguf_file=x.gguf")
    with pytest.raises(ValueError, match="twice"):
        options(tmp_path, tasks=("gsm8k", "gsm8k_eglr"))
    with pytest.raises(ValueError, match="`--limit`=0"):
        options(tmp_path, limit=0)
    with pytest.raises(ValueError, match="not a task name"):
        benchmark_of("gsm8k;rm -rf")
    with pytest.raises(ValueError, match="'1' is not a beam count"):
        parse_beams("4,1")
    with pytest.raises(ValueError, match="'\uff12' is not a beam count"):  # a full-width 2: int() reads it as 2
        parse_beams("\uff12")
    assert parse_beams("4,11") == (4, 11) and parse_beams("none") == ()


def test_beam_runs_take_their_own_batch_size(tmp_path):
    opts = options(tmp_path, beams=(4, 11), batch_size="64", beam_batch_size="16")
    sizes = {r.name: (a := build_command(r, opts))[a.index("--batch_size") + 1] for r in plan_runs(opts)}
    assert sizes == {"greedy": "64", "beam4": "16", "beam11": "16", "eglr_sc": "64"}
    same = options(tmp_path, beams=(4,), batch_size="8")
    assert {(a := build_command(r, same))[a.index("--batch_size") + 1] for r in plan_runs(same)} == {"8"}


def test_parse_limit_global_and_per_benchmark():
    assert parse_limit(None) == (None, ()) and parse_limit("100") == (100.0, ())
    assert parse_limit("gsm8k=100,math500_eglr=50") == (None, (("gsm8k", 100.0), ("math500", 50.0)))
    assert parse_limit("20,gsm8k=100") == (20.0, (("gsm8k", 100.0),))
    for bad, why in [("0", "'0' is not allowed"), ("gsm8k=x", "'gsm8k=x' is not allowed"),
                     ("gsm 8k=3", "'gsm 8k=3' is not allowed"), ("5,6", "two limits")]:
        with pytest.raises(ValueError, match=why):
            parse_limit(bad)


def test_per_benchmark_limits_size_each_run_and_resume_per_benchmark(tmp_path):
    opts = options(tmp_path, beams=(4,), limit=None, limits=(("gsm8k", 4.0), ("math500", 2.0)))
    argvs = {(r.benchmark, r.name): build_command(r, opts) for r in plan_runs(opts)}
    for (bench, _name), argv in argvs.items():
        assert argv[argv.index("--limit") + 1] == {"gsm8k": "4", "math500": "2"}[bench]
    fake = FakeLmEval()
    outcome = run_leaderboard(opts, fake)
    assert len(fake.calls) == 6 and not outcome.failed
    assert "Size: gsm8k: --limit 4, math500: --limit 2" in outcome.tables["markdown"].read_text()
    # gsm8k keeps its limit: skipped; math500 now runs at 3: rerun (3 cells)
    again = run_leaderboard(options(tmp_path, beams=(4,), limit=3, limits=(("gsm8k", 4.0),)), fake)
    assert len(fake.calls) == 9 and len(again.skipped) == 3
    assert all(c[c.index("--tasks") + 1].startswith("math500") for c in fake.calls[6:])
    with pytest.raises(ValueError, match=r"names \['aime24'\]"):
        options(tmp_path, limits=(("aime24", 3.0),))


def test_model_config_preset_spells_out_hf_args_and_keeps_the_preset_for_eglr(tmp_path):
    from eglr_harness.run.presets import load_preset

    preset = load_preset("smollm2-135m-instruct")["model_args"]
    opts = options(tmp_path, model_args="model_config=smollm2-135m-instruct,dtype=bfloat16", beams=(4,))
    argvs = {r.name: build_command(r, opts) for r in plan_runs(opts) if r.benchmark == "gsm8k"}
    hf_args = dict(kv.split("=", 1) for kv in argvs["greedy"][argvs["greedy"].index("--model_args") + 1].split(","))
    assert hf_args["pretrained"] == preset["pretrained"] and not hf_args["pretrained"].startswith("pkg://")
    assert hf_args["gguf_file"] == preset["gguf_file"] and hf_args["dtype"] == "bfloat16"  # the user's arg wins
    assert "model_config" not in hf_args and argvs["beam4"][argvs["beam4"].index("--model_args") + 1] == ",".join(
        f"{k}={v}" for k, v in hf_args.items()
    )
    eglr_args = argvs["eglr_sc"][argvs["eglr_sc"].index("--model_args") + 1]
    assert eglr_args == "model_config=smollm2-135m-instruct,dtype=bfloat16"
    assert default_output_dir("model_config=smollm2-135m-instruct") == Path("out/leaderboard/smollm2-135m-instruct")
    with pytest.raises(ValueError, match="known preset"):
        options(tmp_path, model_args="model_config=no-such-model")
    with pytest.raises(ValueError, match="or model_config=PRESET"):
        options(tmp_path, model_args="dtype=float32")


def test_default_output_dir_names_the_model():
    assert model_slug(MODEL_ARGS) == "SmolLM2-135M-Instruct.Q4_1"
    assert default_output_dir("pretrained=Qwen/Qwen2.5-3B-Instruct") == Path("out/leaderboard/Qwen2.5-3B-Instruct")


# ------------------------------------------------------------------ runner
def _table(outcome):
    with open(outcome.tables["csv"], newline="") as handle:
        return {row["method"]: row for row in csv.DictReader(handle)}


def test_runs_every_cell_then_resumes_without_rerunning(tmp_path):
    fake = FakeLmEval()
    first = run_leaderboard(options(tmp_path), fake)
    assert len(fake.calls) == 8 and not first.failed and len(first.ran) == 8
    table = _table(first)
    assert list(table) == ["Greedy", "Beam-4", "Beam-11", "EGLR (best L)", "EGLR-SC_L (B=10)", "Oracle_L (B=10)"]
    assert (table["Greedy"]["gsm8k"], table["Beam-4"]["math500"], table["Beam-11"]["gsm8k"]) == ("50.0", "75.0", "25.0")
    assert (
        table["EGLR (best L)"]["gsm8k"],
        table["EGLR-SC_L (B=10)"]["gsm8k"],
        table["Oracle_L (B=10)"]["math500"],
    ) == ("100.0", "50.0", "100.0")

    again = run_leaderboard(options(tmp_path), fake)
    assert len(fake.calls) == 8 and len(again.skipped) == 8 and not again.ran

    # delete one cell's results: only that run is redone
    for path in (tmp_path / "lb" / "math500" / "beam4").rglob("results_*.json"):
        path.unlink()
    third = run_leaderboard(options(tmp_path), fake)
    assert third.ran == ("math500/beam4",) and len(fake.calls) == 9


def test_records_command_versions_wall_time_and_flops(tmp_path):
    fake = FakeLmEval()
    outcome = run_leaderboard(options(tmp_path, tasks=("gsm8k",)), fake)
    record = json.loads((tmp_path / "lb" / "gsm8k" / "eglr_sc" / RECORD_NAME).read_text())
    assert record["returncode"] == 0
    # the record names folders as on any machine: the command ran with /models/smol and tmp_path
    assert record["command"] == [portable(a) for a in fake.calls[-1]] and "--model_args" in record["command"]
    assert "/models" in " ".join(fake.calls[-1]) and "/models" not in json.dumps(record)
    assert str(tmp_path) in " ".join(fake.calls[-1]) and str(tmp_path) not in json.dumps(record)
    assert record["command_line"].startswith("python -m lm_eval run --model eglr-hf")
    assert {"lm_eval", "transformers", "torch", "python"} <= set(record["versions"]) and record["wall_time_s"] >= 0
    cells = {c.method: c for c in outcome.cells}
    assert (cells["greedy"].flop_ratio, cells["beam4"].flop_ratio, cells["beam11"].flop_ratio) == (1.0, 4.0, 11.0)
    assert cells["eglr_best"].flop_ratio == pytest.approx(1.001)  # cell L=1's accounted ratio
    assert cells["eglr_sc"].flop_ratio == pytest.approx(10.2) and cells["eglr_sc"].budget == 10  # B × 1.02
    assert cells["eglr_best"].detail.startswith("best cell L=1,T=0.0")
    assert cells["greedy"].n_docs == 4 and cells["greedy"].source == "results: acc"
    text = outcome.tables["markdown"].read_text()
    assert "| method | gsm8k (n=4) |" in text and "| EGLR-SC_L (B=10) | 10.20× |" in text
    assert "| Greedy | 50.0 |" in text
    with open(outcome.tables["cells_csv"], newline="") as handle:
        long_rows = list(csv.DictReader(handle))
    assert {r["method"] for r in long_rows} == {"greedy", "beam4", "beam11", "eglr_best", "eglr_sc", "oracle"}
    assert all(r["command"] and "lm_eval=" in r["versions"] for r in long_rows)


def test_sc_numbers_fall_back_to_samples(tmp_path):
    outcome = run_leaderboard(options(tmp_path, tasks=("gsm8k",), beams=()), FakeLmEval(sc_metrics=False))
    cells = {c.method: c for c in outcome.cells}
    # from sc_docs(): best L=1 4/4, majority 2/4, oracle 4/4; B = 10 rollouts per doc
    assert (cells["eglr_best"].accuracy, cells["eglr_sc"].accuracy, cells["oracle"].accuracy) == (1.0, 0.5, 1.0)
    assert cells["eglr_sc"].source.startswith("samples") and cells["eglr_sc"].budget == 10


def test_failed_runs_are_reported_and_retried(tmp_path, capsys):
    failing = FakeLmEval(fail_tasks={"math500_eglr_sc"})
    outcome = run_leaderboard(options(tmp_path, beams=(4,)), failing)
    assert outcome.failed == ("math500/eglr_sc",)
    table = _table(outcome)
    assert table["EGLR-SC_L (B=10)"]["math500"] == "" and table["Greedy"]["math500"] == "50.0"
    md = outcome.tables["markdown"].read_text()
    assert "failed" in md and "Rerun the same command to resume" in md
    fixed = FakeLmEval()
    retry = run_leaderboard(options(tmp_path, beams=(4,)), fixed)
    assert [parse_lm_eval(c).tasks for c in fixed.calls] == [["math500_eglr_sc"]] and not retry.failed


def test_table_is_refreshed_while_running_with_pending_cells(tmp_path):
    fake = FakeLmEval()
    seen = []

    def executor(argv):
        md = tmp_path / "lb" / "leaderboard.md"
        seen.append(md.read_text() if md.exists() else None)
        return fake(argv)

    run_leaderboard(options(tmp_path, tasks=("gsm8k",), beams=()), executor)
    assert seen[0] is None  # nothing written before the first run ends
    assert "| Greedy | 50.0 |" in seen[1] and "| EGLR-SC_L | pending |" in seen[1]


def test_a_different_limit_is_not_reused(tmp_path):
    fake = FakeLmEval()
    run_leaderboard(options(tmp_path, tasks=("gsm8k",), beams=()), fake)
    run_leaderboard(options(tmp_path, tasks=("gsm8k",), beams=(), limit=2), fake)
    assert len(fake.calls) == 4


def make_runnable(folder: Path) -> tuple[str, Path]:
    """Model args and a data folder that pass the leaderboard's check of every cell: a model folder with a
    config only (read without weights), and a four-problem gsm8k/test.jsonl for EGLR_DATA_DIR."""
    from transformers import LlamaConfig

    model = folder / "model"
    LlamaConfig(num_hidden_layers=12, hidden_size=16, intermediate_size=32, num_attention_heads=2,
                num_key_value_heads=1, vocab_size=64, max_position_embeddings=4096).save_pretrained(model)
    data = folder / "data" / "gsm8k"
    data.mkdir(parents=True)
    (data / "test.jsonl").write_text("".join(json.dumps({"question": f"{i} + 1?", "answer": f"#### {i + 1}"}) + "\n"
                                             for i in range(4)))
    return f"pretrained={model}", data.parent


@pytest.fixture
def runnable(tmp_path, monkeypatch) -> str:
    """:func:`make_runnable`'s model args, its data folder as EGLR_DATA_DIR."""
    model_args, data = make_runnable(tmp_path)
    monkeypatch.setenv("EGLR_DATA_DIR", str(data))
    return model_args


def test_main_with_injected_executor_and_dry_run(tmp_path, capsys, runnable):
    argv = [
        "--model_args",
        runnable,
        "--tasks",
        "gsm8k",
        "--limit",
        "4",
        "--beams",
        "4",
        "--output_dir",
        str(tmp_path / "lb"),
        "--python",
        "python",
    ]
    fake = FakeLmEval()
    assert main([*argv, "--dry_run"], executor=fake) == 0
    header, *printed = capsys.readouterr().out.strip().splitlines()
    assert header == ("# eglr-leaderboard --dry_run: 3 of 3 runs to do (0 finished); the lm_eval command of each, "
                      "one a line (nothing was run)")
    assert len(printed) == 3 and not fake.calls and all(line.startswith("python -m lm_eval run") for line in printed)
    assert not (tmp_path / "lb" / "leaderboard.md").exists()
    assert main(argv, executor=fake) == 0 and len(fake.calls) == 3
    assert capsys.readouterr().out.strip().endswith("leaderboard.md")
    assert main([*argv, "--dry_run"], executor=fake) == 0 and len(fake.calls) == 3  # all finished: nothing printed
    header = capsys.readouterr().out.strip().splitlines()[0]
    assert header.startswith("# eglr-leaderboard --dry_run: 0 of 3 runs to do (3 finished)"), header
    assert main([*argv[:-2], "--python", "python", "--beams", "1"], executor=fake) == 2
    assert "not a beam count" in capsys.readouterr().err
    assert main(argv, executor=FakeLmEval(fail_tasks={"gsm8k_eglr"})) == 0  # finished: nothing runs


@pytest.mark.parametrize("tasks", ["gsm8k,math5000", "aime", "eglr_math"])
def test_unknown_benchmarks_are_refused_before_anything_runs(tmp_path, capsys, tasks):
    fake = FakeLmEval()
    argv = ["--model_args", MODEL_ARGS, "--tasks", tasks, "--beams", "none", "--output_dir", str(tmp_path / "lb")]
    assert main(argv, executor=fake) == 2  # today: gsm8k's runs first, then lm-eval's "Tasks not found"
    assert not fake.calls
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "`--tasks`=" in err[0] and "allowed benchmarks" in err[0] and "math500" in err[0]


@pytest.mark.parametrize(("flag", "value"), [("--model_args", f"{MODEL_ARGS},k_max=2.5"),
                                             ("--eglr_model_args", "alpha=2"), ("--eglr_model_args", "tau_h=abc")])
def test_eglr_settings_no_run_accepts_are_refused_before_the_hf_runs(tmp_path, capsys, flag, value):
    fake = FakeLmEval()
    argv = ["--model_args", MODEL_ARGS, "--tasks", "gsm8k", "--beams", "none", "--output_dir", str(tmp_path / "lb")]
    argv = [*argv, flag, value] if flag == "--eglr_model_args" else [*argv[2:], "--model_args", value]
    assert main(argv, executor=fake) == 2  # today: the greedy run first, then eglr-hf refuses the value
    assert not fake.calls
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"`{flag}`" in err[0] and "is not allowed" in err[0]


def test_a_presets_device_reaches_lm_eval_as_a_flag_for_every_run(tmp_path):
    """Issue 38: the preset's `device` went into `--model hf`'s model args, where lm-eval's own `device`
    clashed (TypeError in greedy and every beam run); it must travel as `--device` for hf and eglr-hf alike."""
    fake = FakeLmEval()
    outcome = run_leaderboard(options(tmp_path, model_args="model_config=smollm2-135m-instruct", batch_size=None), fake)
    assert not outcome.failed and len(fake.calls) == 8
    for argv in fake.calls:
        parsed = parse_lm_eval(argv)
        assert parsed.device == "cpu" and "device" not in str(parsed.model_args)
    # the user's --device wins over the preset's; a device in --model_args becomes the flag too
    fake = FakeLmEval()
    run_leaderboard(options(tmp_path / "b", model_args=MODEL_ARGS + ",device=cpu,batch_size=2", beams=(4,),
                            batch_size=None), fake)
    assert {parse_lm_eval(a).device for a in fake.calls} == {"cpu"}
    assert {parse_lm_eval(a).batch_size for a in fake.calls} == {"2"}
    fake = FakeLmEval()
    run_leaderboard(options(tmp_path / "c", model_args="model_config=smollm2-135m-instruct", device="meta"), fake)
    assert {parse_lm_eval(a).device for a in fake.calls} == {"meta"}


def test_committed_results_are_never_overwritten_nor_taken_for_the_users_runs(tmp_path, monkeypatch, capsys,
                                                                             runnable):
    """Issue 38: the default output was the checkout's results/<model>/leaderboard: a first run overwrote the
    committed tables and skipped the committed runs as finished. Now the default is out/leaderboard/<model>,
    and a folder with files git tracks is refused before anything runs."""
    import subprocess

    checkout = tmp_path / "checkout"
    committed = checkout / "results" / "smol" / "leaderboard"
    FakeLmEval()(build_command(plan_runs(options(tmp_path, output_dir=committed))[0],
                               options(tmp_path, output_dir=committed)))
    (committed / "leaderboard.md").write_text("committed numbers\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", str(checkout)], check=True)
    subprocess.run([*git, "-C", str(checkout), "add", "-A"], check=True)
    subprocess.run([*git, "-C", str(checkout), "commit", "-qm", "results"], check=True)
    monkeypatch.chdir(checkout)
    argv = ["--model_args", runnable, "--tasks", "gsm8k", "--limit", "4", "--max_gen_toks", "256", "--beams", "none"]
    fake = FakeLmEval()
    assert main([*argv, "--output_dir", str(committed)], executor=fake) == 2
    assert "tracked by git" in capsys.readouterr().err and fake.calls == []
    assert (committed / "leaderboard.md").read_text() == "committed numbers\n"
    assert main(argv, executor=fake) == 0  # the default folder: out/leaderboard/<model>, every run made afresh
    assert len(fake.calls) == 2
    assert all(parse_lm_eval(a).output_path.startswith("out/leaderboard/model/")
               for a in fake.calls)
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    assert status.stdout == ""
    assert main([*argv, "--output_dir", str(committed), "--update_committed"], executor=FakeLmEval()) == 0



@pytest.mark.parametrize("argv, message", [
    (["--beams", "0"], "`--beams`='0': '0' is not a beam count; allowed: ints >= 2 (e.g. 4,11) or 'none'."),
    (["--batch_size", "-3"], "`--batch_size`='-3' is not allowed; allowed: an int >= 1, auto or auto:N."),
    (["--beam_batch_size", "x"], "`--beam_batch_size`='x' is not allowed"),
    (["--batch_size", "3.0"], "`--batch_size`='3.0' is not allowed"),  # each run hands lm-eval the text: int("3.0")
    # a batch size or device in the model args that a flag contradicts was dropped silently
    (["--model_args", MODEL_ARGS + ",batch_size=2", "--batch_size", "8"],
     "`batch_size=2` in --model_args contradicts `--batch_size 8`"),
    (["--model_args", MODEL_ARGS + ",device=cpu", "--device", "cuda"],
     "`device=cpu` in --model_args contradicts `--device cuda`"),
])
def test_flags_that_cannot_run_are_refused_before_any_run(tmp_path, capsys, argv, message):
    """Issue 47: `--beams 0` and `--batch_size -3` were accepted; the console entry point, nothing runs."""
    fake = FakeLmEval()
    base = ["--model_args", MODEL_ARGS, "--tasks", "gsm8k", "--limit", "4", "--output_dir", str(tmp_path / "lb")]
    assert main([*base, *argv], executor=fake) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("eglr-leaderboard: error: ") and message in err[0], err
    assert fake.calls == [] and not (tmp_path / "lb").exists()


def test_every_cell_is_checked_before_the_first_runs(tmp_path, capsys, runnable):
    """The console script as a user runs it, without data (EGLR_DATA_DIR empty, hub offline, an empty cache):
    one line naming the cell and both ways to the data, exit 2, and no lm_eval run started; then a setting only
    the eglr-hf cell meets (its model's layer count), likewise."""
    import subprocess
    import sys

    marker = tmp_path / "started"
    fake_python = tmp_path / "python"
    fake_python.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    fake_python.chmod(0o755)
    env = {**os.environ, "EGLR_DATA_DIR": "", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_CACHE": str(tmp_path / "hf")}
    argv = [str(Path(sys.executable).parent / "eglr-leaderboard"), "--model_args", runnable, "--tasks",
            "gsm8k", "--beams", "4", "--output_dir", str(tmp_path / "lb"), "--python", str(fake_python)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert len(errors) == 1 and "cell gsm8k/greedy (gsm8k_eglr): benchmark 'gsm8k' cannot be had" in errors[0]
    assert "EGLR_DATA_DIR" in errors[0] and "Hugging Face hub" in errors[0]
    assert main([*argv[1:], "--eglr_model_args", "L=13"]) == 2  # with the fixture's four problems
    assert "cell gsm8k/eglr_sc (gsm8k_eglr_sc): `L`=13 exceeds the model's 12" in capsys.readouterr().err
    assert not marker.exists() and not (tmp_path / "lb").exists()


def test_a_failed_cell_gets_its_reason_into_the_table(tmp_path, runnable):
    """Each cell's lm_eval (here an interpreter that fails as lm_eval does, with a traceback or a one-line
    refusal) ends up in leaderboard.md's notes and the CSV's detail column, not as a bare "failed"."""
    fake_python = tmp_path / "python"
    fake_python.write_text("#!/bin/sh\n"
                           "case \"$*\" in\n"
                           "  *num_beams*) printf 'Traceback (most recent call last):\\n  File x\\n'"
                           " >&2; printf 'torch.OutOfMemoryError: CUDA out of memory\\n' >&2; exit 1;;\n"
                           "  *) printf 'progress 1/2\\rerror: `tau_h`=auto needs a calibration\\nbye\\n' >&2;"
                           " exit 2;;\n"
                           "esac\n")
    fake_python.chmod(0o755)
    assert main(["--model_args", runnable, "--tasks", "gsm8k", "--beams", "4", "--output_dir", str(tmp_path / "lb"),
                 "--python", str(fake_python)]) == 1
    md = (tmp_path / "lb" / "leaderboard.md").read_text()
    assert "gsm8k/beam4 (failed: exit status 1: torch.OutOfMemoryError: CUDA out of memory)" in md
    assert "gsm8k/greedy (failed: exit status 2: `tau_h`=auto needs a calibration)" in md
    with (tmp_path / "lb" / "leaderboard_cells.csv").open() as f:
        details = {row["method"]: row["detail"] for row in csv.DictReader(f)}
    assert details["eglr_sc"] == details["greedy"] == "exit status 2: `tau_h`=auto needs a calibration"
    record = json.loads((tmp_path / "lb" / "gsm8k" / "beam4" / RECORD_NAME).read_text())
    assert record["failure"] == "exit status 1: torch.OutOfMemoryError: CUDA out of memory"


COMMITTED = Path(__file__).resolve().parents[2] / "results" / "smollm2-135m-instruct" / "leaderboard"


@pytest.mark.parametrize("benchmark", ["gsm8k", "math500"])
def test_one_report_of_a_committed_leaderboards_folders_pairs_its_beam_run(benchmark, tmp_path):
    """The committed leaderboard's folders of one benchmark (eglr-baseline's greedy and Beam-4 on `<b>_eglr`, eglr-hf's
    pool on `<b>_eglr_sc`) make one report, the way docs/analyses.md runs it; each run's share there is the one the
    leaderboard read from lm-eval's aggregated metrics, and the beam run is paired with the L pool's vote."""
    from eglr_harness.commands.report import main as eglr_report

    runs = sorted(str(p) for p in (COMMITTED / benchmark).iterdir() if p.is_dir())
    assert eglr_report([*runs, "--out", str(tmp_path), "--sections", "intervals", "--verbosity", "WARNING"]) == 0
    with open(tmp_path / "intervals.csv", newline="") as handle:
        rows = {r["quantity"]: r for r in csv.DictReader(handle)}
    with open(COMMITTED / "leaderboard.csv", newline="") as handle:
        board = {r["method"]: float(r[benchmark]) / 100 for r in csv.DictReader(handle)}
    assert float(rows["Beam-4 (eglr-baseline)"]["share"]) == pytest.approx(board["Beam-4"])
    assert float(rows["eglr-baseline, no beams"]["share"]) == pytest.approx(board["Greedy"])
    assert float(rows["SC L pool (B=10)"]["share"]) == pytest.approx(board["EGLR-SC_L (B=10)"])
    paired = rows["SC: L pool − Beam-4 (eglr-baseline)"]
    assert float(paired["estimate"]) == round(
        float(rows["SC L pool (B=10)"]["estimate"]) - float(rows["Beam-4 (eglr-baseline)"]["estimate"]), 6)
