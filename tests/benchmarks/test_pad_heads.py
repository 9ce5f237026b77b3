"""benchmarks/pad_heads.py, run as its command, on a tiny random Llama saved as safetensors: the padded copy has
the head counts asked for and computes the original's logits (the added heads are zero)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "pad_heads.py"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config).eval()
    source = tmp_path_factory.mktemp("source")
    model.save_pretrained(source, safe_serialization=True)
    target = tmp_path_factory.mktemp("padded") / "model"
    subprocess.run([sys.executable, str(SCRIPT), str(source), str(target), "--heads", "8", "--kv_heads", "2"],
                   check=True, capture_output=True, text=True)
    return model, target


def test_the_padded_model_computes_the_original_logits(folders):
    from transformers import AutoModelForCausalLM

    model, target = folders
    padded = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    config = json.loads((target / "config.json").read_text())
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (8, 2, 8)
    ids = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        expected, got = model(ids).logits, padded(ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    # the second group's heads moved one head down (a zero head closes each group): the logits saw the move
    assert not torch.equal(padded.model.layers[0].self_attn.q_proj.weight[24:48],
                           model.model.layers[0].self_attn.q_proj.weight[24:48]), "no head moved: a weak test"


def test_more_kv_heads_and_a_refused_shape(folders, tmp_path):
    from transformers import AutoModelForCausalLM

    model, target = folders
    more = tmp_path / "more"
    subprocess.run([sys.executable, str(SCRIPT), str(target), str(more), "--heads", "12", "--kv_heads", "3"],
                   check=True, capture_output=True, text=True)
    padded = AutoModelForCausalLM.from_pretrained(more, dtype=torch.float32).eval()
    ids = torch.randint(0, 64, (1, 10))
    with torch.no_grad():
        torch.testing.assert_close(padded(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)
    refused = subprocess.run([sys.executable, str(SCRIPT), str(target), str(tmp_path / "bad"), "--heads", "6",
                              "--kv_heads", "4"], capture_output=True, text=True)
    assert refused.returncode == 2 and "--heads 6 --kv_heads 4" in refused.stderr.splitlines()[-1]
