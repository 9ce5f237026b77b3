"""SIGTERM and Ctrl-C through the ``lm_eval`` command: a run of the project's models ends with the interrupt line
and the signal's status (143, 130 in a shell), as docs/lm-eval.md#exit-status says; any other model's run is
stopped by the signal exactly as without the project.

Each process sends the signal to itself at a fixed point of its work (the model's construction), so that no test
depends on how fast the machine is. The exit status of a process ended by a signal is ``-signal`` here (a shell
shows 128 + the signal).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def _python(code: str, *, cwd: Path, autoload: bool = True) -> subprocess.CompletedProcess:
    path = os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "EGLR_AUTOLOAD": "1" if autoload else "0",
           "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=600,
                          cwd=cwd, env=env)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_the_lm_eval_hook_ends_an_interrupted_run_by_its_signal(tmp_path, signum):
    """The exception hook of an eglr run of ``lm_eval``: the one line, then the signal's own end (SIGTERM ended
    with status 1 before: Python ends by the signal only for a plain KeyboardInterrupt)."""
    done = _python(f"""
        import os, signal, sys
        from eglr_harness.harness.lm_eval_patches import resume_hint
        from eglr_harness.harness.output import install_user_error_hook

        signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (a background job ignores it)
        sys.argv = ["lm_eval", "--model", "eglr-hf", "--model_args", "model_config=x"]
        install_user_error_hook(hint=resume_hint)
        os.kill(os.getpid(), {int(signum)})
        raise AssertionError("the signal did not stop the command")
    """, cwd=tmp_path)
    name = signal.Signals(signum).name
    assert done.returncode == -signum, done.stderr
    assert done.stderr.splitlines() == [f"lm_eval: interrupted ({name}); nothing was stored (no output is left "
                                        "half-written). Rerun: lm_eval --model eglr-hf --model_args model_config=x. "
                                        "Add rollout_cache=DIR to --model_args to keep finished rollouts, so that a "
                                        "rerun resumes."]


@pytest.mark.parametrize("argv, hint", [
    (["--model", "eglr-hf", "--model_args", "model_config=x"], True),
    (["--model=eglr-vllm", "--model_args=pretrained=m"], True),
    (["--model", "eglr-hf", "--model_args", "model_config=x,rollout_cache=c"], False),
    (["--model", "eglr-baseline", "--model_args", "pretrained=m"], False),  # it keeps no rollouts
])
def test_the_interrupt_line_says_how_to_make_a_rerun_resume(argv, hint):
    from eglr_harness.harness.lm_eval_patches import RESUME_HINT, resume_hint

    assert resume_hint(argv) == (RESUME_HINT if hint else None)


def test_exit_handlers_run_before_the_signal_ends_the_process(tmp_path):
    """What torch or the math-verify worker registered to run at exit still runs."""
    done = _python("""
        import atexit, os, signal, sys
        from eglr_harness.harness.output import install_user_error_hook

        install_user_error_hook()
        atexit.register(lambda: print("exit handler ran", flush=True))
        os.kill(os.getpid(), signal.SIGTERM)
    """, cwd=tmp_path)
    assert done.returncode == -signal.SIGTERM and done.stdout == "exit handler ran\n", done.stderr


def test_a_hook_without_interrupts_leaves_the_signals_alone(tmp_path):
    """Another model's run on the project's tasks: its UserErrors are one line, SIGTERM is lm-eval's own."""
    done = _python("""
        import os, signal
        from eglr_harness.harness.output import install_user_error_hook

        install_user_error_hook(interrupts=False)
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("the signal did not stop the command")
    """, cwd=tmp_path)
    assert done.returncode == -signal.SIGTERM and done.stderr == "", done.stderr


@pytest.mark.parametrize("argv, names", [(["run", "--model", "eglr-hf"], True), (["--model=eglr-baseline"], True),
                                         (["--model", "eglr-vllm"], True), (["--model", "hf"], False),
                                         (["--model=hf", "--model_args", "eglr-hf"], False), (["ls", "tasks"], False)])
def test_which_command_lines_name_a_project_model(argv, names):
    from eglr_harness.harness.lm_eval_patches import command_line_names_model

    assert command_line_names_model(argv) is names


CLI = """
    import os, signal, sys
    sys.argv = [os.path.join(os.path.dirname(sys.executable), "lm_eval"), *{argv!r}]
    import {module} as target

    def stopped(self, *args, **kwargs):  # the signal arrives while the model is being built
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("the signal did not stop the command")

    target.{cls}.__init__ = stopped
    from lm_eval.__main__ import cli_evaluate
    cli_evaluate()
"""


@pytest.fixture(scope="module")
def config_only(tmp_path_factory) -> Path:
    """A model folder with a config and no weights: the run is stopped before anything would read them."""
    from transformers import LlamaConfig

    folder = tmp_path_factory.mktemp("config_only")
    LlamaConfig(num_hidden_layers=4, hidden_size=16, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1,
                vocab_size=64, max_position_embeddings=512).save_pretrained(folder)
    return folder


@pytest.mark.slow  # three lm_eval CLI runs as far as the model's construction, ~20 s each on 2 idle cores
@pytest.mark.parametrize("model, module, cls", [("hf", "lm_eval.models.huggingface", "HFLM"),
                                                ("eglr-hf", "eglr_harness.harness.model", "EglrHFLM")])
def test_sigterm_through_the_lm_eval_command(tmp_path, config_only, model, module, cls):
    """hf: killed by SIGTERM with the project installed as without it (it exited 1 with the project's line);
    eglr-hf: the line, then killed by SIGTERM (status 143 in a shell, as docs/lm-eval.md says; it exited 1)."""
    argv = ["--model", model, "--model_args", f"pretrained={config_only}", "--tasks", "eglr_demo", "--limit", "1",
            "--device", "cpu"]
    code = CLI.format(argv=argv, module=module, cls=cls)
    with_project = _python(code, cwd=tmp_path)
    assert with_project.returncode == -signal.SIGTERM, with_project.stderr[-3000:]
    lines = [x for x in with_project.stderr.splitlines() if "interrupted (SIGTERM)" in x]
    if model == "hf":
        assert lines == [] and "Traceback" not in with_project.stderr, with_project.stderr[-3000:]
        without = _python(code.replace("eglr_demo", "gsm8k"), cwd=tmp_path, autoload=False)
        assert without.returncode == -signal.SIGTERM, without.stderr[-3000:]
    else:
        assert len(lines) == 1 and lines[0].startswith("lm_eval: interrupted (SIGTERM); nothing was stored"), \
            with_project.stderr[-3000:]
