"""Issue 47 (4): Ctrl-C (SIGINT) and SIGTERM end every command with one line, what was stored and the
command that resumes, and no traceback (a 93-line KeyboardInterrupt traceback before; two in the
leaderboard, parent and child).

Each case is a real process that receives a real signal at a fixed point of its work (the point is
reached by the code, not by a timer): the process sends the signal to itself from a function the
command calls, so the test never depends on how fast the machine is.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REAL = Path(__file__).parent / "data" / "real_gsm8k_eglr_sc"
HERE = Path(__file__).parent


def _python(code: str, *, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    # HERE.parent: tests/, where tests/helpers is found (pyproject's pythonpath, which a child does not read); the
    # caller's PYTHONPATH kept after them (a copy of the tree under test, as benchmarks/mutation_run.py sets it)
    path = os.pathsep.join(filter(None, [str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env={**os.environ, "PYTHONPATH": path, **(env or {})})


def _lines(done: subprocess.CompletedProcess) -> list[str]:
    return [x for x in done.stderr.splitlines() if x.strip() and not x.startswith(("INFO", "WARNING"))]


@pytest.mark.parametrize("signum, status, name", [(signal.SIGINT, 130, "SIGINT"), (signal.SIGTERM, 143, "SIGTERM")])
def test_an_interrupted_report_says_nothing_was_stored_and_how_to_rerun(tmp_path, signum, status, name):
    run = tmp_path / "run"
    shutil.copytree(REAL, run)
    done = _python(f"""
        import os, signal, sys
        import eglr_harness.commands.report as report

        signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (a background job ignores it)

        def stopped(*args, **kwargs):
            os.kill(os.getpid(), {int(signum)})  # the signal arrives while the report is being built
            raise AssertionError("the signal did not stop the command")

        report.build_report = stopped
        sys.argv = ["eglr-report", {str(run)!r}, "--out", "r"]
        sys.exit(report.main())
    """, cwd=tmp_path)
    assert done.returncode == status and "Traceback" not in done.stderr, done.stderr
    assert _lines(done) == [f"eglr-report: interrupted ({name}); nothing was stored (no output is left "
                            f"half-written). Rerun: eglr-report {run} --out r"], done.stderr


def test_an_interrupted_leaderboard_counts_its_finished_runs_and_gives_the_resuming_command(tmp_path):
    """The first run finishes, the second is stopped by SIGTERM: one line from the parent, which names
    the finished run's count and the command; rerun, it resumes (the finished run is skipped)."""
    code = """
        import os, signal, sys
        from pathlib import Path
        from test_analysis_leaderboard import FakeLmEval, make_runnable
        from eglr_harness.commands import leaderboard

        Path("m").mkdir(exist_ok=True)
        MODEL_ARGS, data = make_runnable(Path("m")) if not Path("m/model").exists() else ("pretrained=m/model", None)
        os.environ["EGLR_DATA_DIR"] = "m/data"
        fake = FakeLmEval()

        def executor(argv):
            if fake.calls:  # the second run: stopped while it runs
                os.kill(os.getpid(), signal.SIGTERM)
            return fake(argv)

        argv = ["--model_args", MODEL_ARGS, "--tasks", "gsm8k", "--limit", "4", "--beams", "none",
                "--output_dir", "lb"]
        sys.exit(leaderboard.main(argv, executor=executor))
    """
    done = _python(code, cwd=tmp_path)
    assert done.returncode == 143 and "Traceback" not in done.stderr, done.stderr
    errors = [x for x in _lines(done) if not x.startswith("ERROR")]
    assert errors == ["eglr-leaderboard: interrupted (SIGTERM); stored: 1 finished run in lb. Rerun to resume: "
                      "eglr-leaderboard --model_args pretrained=m/model "
                      "--tasks gsm8k --limit 4 --beams none --output_dir lb"], done.stderr
    resumed = _python(code.replace("if fake.calls:", "if False:"), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "skip gsm8k/greedy: finished" in resumed.stderr


def test_the_stock_lm_eval_cli_says_how_many_rollouts_were_stored(tmp_path):
    """lm_eval (and eglr-eval) with rollout_cache=: the rollouts stored before Ctrl-C, through the same hook
    that prints its one-line errors; a rerun of the same command takes them from the store."""
    done = _python("""
        import os, signal, sys
        from eglr_harness.harness.output import install_user_error_hook
        from eglr_harness.run.stores import RolloutStore

        signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (a background job ignores it)
        install_user_error_hook()
        sys.argv = ["lm_eval", "--model", "eglr-hf", "--model_args", "model_config=x,rollout_cache=cache"]
        store = RolloutStore("cache")
        record = {"text": "42", "signals": None, "engine": "hook",
                   "accounting": {"tokens": 1, "iterations": {}, "L": 0}}
        store.put_many({"a": record, "b": record})
        store.put("a", record)  # rewritten with its batch's shares: still one rollout
        os.kill(os.getpid(), signal.SIGINT)
        raise AssertionError("the signal did not stop the command")
    """, cwd=tmp_path)
    assert "Traceback" not in done.stderr, done.stderr
    assert _lines(done)[-1] == (f"lm_eval: interrupted (SIGINT); stored: 2 rollouts in "
                                f"{Path('cache') / 'rollouts_rank0.sqlite'}. Rerun to resume: lm_eval --model eglr-hf "
                                "--model_args model_config=x,rollout_cache=cache"), done.stderr


def test_a_child_whose_parent_reports_for_it_is_quiet():
    """The leaderboard's lm_eval child prints no second line (the parent prints one for both)."""
    from eglr_harness.core.interrupt import QUIET_ENV

    done = subprocess.run([sys.executable, "-c", "import os, signal, sys\n"
                           "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
                           "from eglr_harness.core.interrupt import run_interruptible\n"
                           "sys.exit(run_interruptible('x', lambda: os.kill(os.getpid(), signal.SIGINT)))"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, QUIET_ENV: "1"})
    assert done.returncode == 130 and done.stderr == "", done.stderr
