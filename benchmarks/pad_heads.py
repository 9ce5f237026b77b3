"""A copy of a Llama-family safetensors folder with zero attention heads added, so that tensor parallel can split
it: the same function, more heads.

SmolLM2-135M has 9 query heads over 3 key/value heads, which vLLM cannot split across 2 ranks (each rank takes a
whole share of both). This gives each key/value group ``--heads / --kv_heads`` query heads and adds key/value
groups, all new heads zero in q, k and v and zero in the output projection's columns: a new query head attends
uniformly (its scores are all 0) and its output is multiplied by zero columns, so the residual stream is what the
original model computes (the new terms are exact zeros; only the order of float sums may differ). Padded, the
checkpoint costs more attention work (16/9 of the query heads here); compare tensor-parallel speeds on the padded
checkpoint with each other, not with the original.

    python benchmarks/pad_heads.py smollm2-fp32 smollm2-fp32-16h --heads 16 --kv_heads 4
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path


def padded_head_index(head: int, old_group: int, new_group: int) -> int:
    """Where query head ``head`` goes when each key/value group grows from ``old_group`` to ``new_group`` query
    heads (grouped-query attention maps query head h to key/value head h // group)."""
    return head // old_group * new_group + head % old_group


def pad_state(state: dict, config: dict, heads: int, kv_heads: int) -> dict:
    """The state dict ``state`` of a model with ``config`` padded to ``heads`` query over ``kv_heads`` key/value
    heads (new heads zero)."""
    import torch

    old_heads, old_kv = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // old_heads
    old_group, new_group = old_heads // old_kv, heads // kv_heads
    placed = torch.tensor([padded_head_index(h, old_group, new_group) for h in range(old_heads)])
    rows = (placed[:, None] * head_dim + torch.arange(head_dim)).flatten()  # where each old q row goes
    out = {}
    for name, tensor in state.items():
        if name.endswith("self_attn.q_proj.weight"):
            padded = tensor.new_zeros((heads * head_dim, tensor.shape[1]))
            padded[rows] = tensor
        elif name.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight")):
            padded = tensor.new_zeros((kv_heads * head_dim, tensor.shape[1]))
            padded[: tensor.shape[0]] = tensor
        elif name.endswith("self_attn.o_proj.weight"):
            padded = tensor.new_zeros((tensor.shape[0], heads * head_dim))
            padded[:, rows] = tensor
        elif "self_attn" in name and name.endswith(".bias"):
            raise SystemExit(f"pad_heads: {name}: attention biases are not handled; allowed: a Llama-family "
                             "checkpoint without attention biases")
        else:
            padded = tensor
        out[name] = padded.contiguous()
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="a safetensors folder (one model.safetensors)")
    parser.add_argument("target", help="the padded copy's folder (created)")
    parser.add_argument("--heads", type=int, required=True)
    parser.add_argument("--kv_heads", type=int, required=True)
    args = parser.parse_args(argv)
    from safetensors.torch import load_file, save_file

    source, target = Path(args.source), Path(args.target)
    config = json.loads((source / "config.json").read_text())
    old_heads, old_kv = config["num_attention_heads"], config["num_key_value_heads"]
    if (args.kv_heads < old_kv or args.heads % args.kv_heads
            or args.heads // args.kv_heads < old_heads // old_kv):
        parser.error(f"--heads {args.heads} --kv_heads {args.kv_heads}: allowed: at least {old_kv} key/value heads, "
                     f"each with a whole number of at least {old_heads // old_kv} query heads")
    target.mkdir(parents=True, exist_ok=False)
    for path in source.iterdir():
        if path.name not in ("config.json", "model.safetensors"):
            shutil.copy(path, target / path.name)
    head_dim = config.get("head_dim") or config["hidden_size"] // old_heads
    state = pad_state(load_file(source / "model.safetensors"), config, args.heads, args.kv_heads)
    save_file(state, target / "model.safetensors", metadata={"format": "pt"})
    config.update(num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, head_dim=head_dim)
    (target / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"{target}: {args.heads} query heads over {args.kv_heads} key/value heads (from {old_heads} over {old_kv})")


if __name__ == "__main__":
    main()
