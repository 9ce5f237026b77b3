"""`eglr-calibrate` writes a calibrated tau_h into a preset file."""

from __future__ import annotations

import yaml

from eglr_harness.commands.calibrate import main
from eglr_harness.run.calibration import calibrated_threshold


def test_threshold_is_the_capped_95th_percentile():
    import torch

    values = torch.arange(1, 101, dtype=torch.float32) / 100  # 0.01 .. 1.00
    assert calibrated_threshold(values) == float(torch.quantile(values, 0.95))
    assert calibrated_threshold(values * 10) == 2.5


PRESET = """name: tiny
# a comment the user wrote
model_args:
  pretrained: {pretrained}
  dtype: float32
  device: cpu
eglr:
  L: 2
tau_h:
  gsm8k: 1.25  # set by hand
"""


def test_eglr_calibrate_refuses_to_write_a_value_it_calls_untrustworthy(tiny_model_dir, tmp_path, monkeypatch,
                                                                        capsys):
    """Issue 38: a value from 24 token entropies was written right after the warning that it is too few."""
    monkeypatch.setenv("EGLR_CACHE_DIR", str(tmp_path / "cache"))
    preset = tmp_path / "tiny.yaml"
    preset.write_text(PRESET.format(pretrained=tiny_model_dir("llama")))
    before = preset.read_text()
    assert main(["--model_config", str(preset), "--tasks", "eglr_demo", "--calib_limit", "3",
                 "--gen_kwargs", "max_gen_toks=8", "--batch_size", "3"]) == 2
    out = capsys.readouterr()
    assert "eglr_demo: tau_h =" in out.out and "too few to trust, not written" in out.err
    assert preset.read_text() == before


def test_eglr_calibrate_writes_beside_the_user_not_into_the_package(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """Issue 38: a preset name was written into the installed package's model_configs/ (lost on reinstall) and
    lost its comments. Now: model_configs/<name>.yaml under the current folder, comments kept."""
    monkeypatch.setenv("EGLR_CACHE_DIR", str(tmp_path / "cache"))
    installed = tmp_path / "site-packages" / "model_configs"
    installed.mkdir(parents=True)
    (installed / "tiny.yaml").write_text(PRESET.format(pretrained=tiny_model_dir("llama")))
    packaged = (installed / "tiny.yaml").read_text()
    monkeypatch.setattr("eglr_harness.run.presets.model_configs_dir", lambda: installed)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(["--model_config", "tiny", "--tasks", "eglr_demo", "--calib_limit", "3", "--allow_few_tokens",
                 "--gen_kwargs", "max_gen_toks=8", "--batch_size", "3"]) == 0
    assert (installed / "tiny.yaml").read_text() == packaged  # the installed preset is never edited
    written_text = (work / "model_configs" / "tiny.yaml").read_text()
    written = yaml.safe_load(written_text)
    assert written["tau_h"]["gsm8k"] == 1.25  # other entries are kept
    assert 0 < written["tau_h"]["eglr_demo"] <= 2.5
    assert "# a comment the user wrote\n" in written_text and "1.25  # set by hand\n" in written_text
    assert "written to model_configs/tiny.yaml" in capsys.readouterr().out


def test_every_shipped_preset_takes_a_value_with_its_comments_kept():
    from eglr_harness.core.resources import model_configs_dir
    from eglr_harness.run.presets import with_tau_h

    for path in sorted(model_configs_dir().glob("*.yaml")):
        text = path.read_text()
        new = with_tau_h(with_tau_h(text, "gsm8k", 1.23456), "math500", float("inf"))
        assert yaml.safe_load(new)["tau_h"] == {**(yaml.safe_load(text)["tau_h"] or {}), "gsm8k": 1.2346,
                                                "math500": float("inf")}, path.name
        assert [line for line in text.splitlines() if line.lstrip().startswith("#")] == [
            line for line in new.splitlines() if line.lstrip().startswith("#")], path.name


import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


@pytest.mark.parametrize("extra, message", [
    (["--calib_limit", "0"], "`--calib_limit`=0 is not allowed; allowed: an int >= 1"),  # a 19-line traceback
    (["--out", "{folder}"], "is a folder; allowed: the preset YAML file to write"),  # failed after calibrating
    (["--tasks", "gsm8k_eglrr"], "`--tasks`='gsm8k_eglrr': no task gsm8k_eglrr (neither eglr-harness's nor "
     "lm-eval's); gsm8k_eglrr -> did you mean gsm8k_eglr"),  # loaded the model first
    (["EGLR_DATA_DIR={folder}"], "{folder}/gsm8k/test.jsonl: no such file"),  # data that cannot be had
    # issue 55, item 16: a fresh clone (no data) got the data's refusal before its own --out's
    (["--out", "{folder}", "EGLR_DATA_DIR={folder}"], "is a folder; allowed: the preset YAML file to write"),
])
def test_eglr_calibrate_refuses_before_the_model_loads(tmp_path, extra, message):
    """Issue 47: the console script, on a preset whose model cannot load: the refusal must come first."""
    preset = tmp_path / "tiny.yaml"
    preset.write_text(PRESET.format(pretrained=tmp_path / "no_such_model"))
    (tmp_path / "folder").mkdir()
    argv = ["--model_config", str(preset), "--tasks", "gsm8k_eglr"]
    extra = [x.format(folder=tmp_path / "folder") for x in extra]
    env = {**os.environ, **dict(x.split("=", 1) for x in extra if "=" in x and not x.startswith("-"))}
    argv += [x for x in extra if not ("=" in x and not x.startswith("-"))]
    message = message.format(folder=tmp_path / "folder")
    script = Path(sys.executable).with_name("eglr-calibrate")
    done = subprocess.run([str(script), *argv], capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    lines = [x for x in done.stderr.splitlines() if x.startswith("eglr-calibrate: error: ")]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert len(lines) == 1 and message in lines[0], done.stderr[-2000:]
    assert "no_such_model" not in done.stderr  # nothing tried to load it
