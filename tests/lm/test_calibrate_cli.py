"""`eglr-calibrate` writes a calibrated tau_h into a preset file."""

from __future__ import annotations

import yaml

from eglr_harness.calibrate import calibrated_threshold
from eglr_harness.harness.cli import calibrate_main as main


def test_threshold_is_the_capped_95th_percentile():
    import torch

    values = torch.arange(1, 101, dtype=torch.float32) / 100  # 0.01 .. 1.00
    assert calibrated_threshold(values) == float(torch.quantile(values, 0.95))
    assert calibrated_threshold(values * 10) == 2.5


def test_eglr_calibrate_writes_the_preset(tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EGLR_CACHE_DIR", str(tmp_path / "cache"))
    preset = tmp_path / "tiny.yaml"
    preset.write_text(yaml.safe_dump({
        "name": "tiny", "model_args": {"pretrained": str(tiny_model_dir("llama")), "dtype": "float32", "device": "cpu"},
        "eglr": {"L": 2}, "tau_h": {"gsm8k": 1.25},
    }))
    main(["--model_config", str(preset), "--tasks", "eglr_demo", "--calib_limit", "3",
          "--gen_kwargs", "max_gen_toks=8", "--batch_size", "3"])
    written = yaml.safe_load(preset.read_text())
    assert written["tau_h"]["gsm8k"] == 1.25  # other entries are kept
    assert 0 < written["tau_h"]["eglr_demo"] <= 2.5
    assert "eglr_demo: tau_h =" in capsys.readouterr().out
