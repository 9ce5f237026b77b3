"""Check 2, placement: half the layers offloaded (accelerate's ``device_map``) give the tokens of one device
(``check_placement``)."""

from __future__ import annotations

import tempfile

import torch

from .common import PAPER, _free, calibrate_tau_h, decode, greedy_entropies
from .models import EXACT_SLIDING_WINDOW, FAMILIES, build_model, family_config, random_prompts


def split_device_map(model, first, second) -> dict:
    """Layers [0, N/2), the embeddings and rotary tables on ``first``; the rest, the final norm and
    lm_head on ``second``. The random models here are untied (``_UNTIE``), so no weight is split."""
    decoder = model.model
    layers = len(decoder.layers)
    device_map = {}
    for name, _ in decoder.named_children():
        if name == "layers":
            device_map.update({f"model.layers.{i}": first if i < layers // 2 else second for i in range(layers)})
        elif name == "norm":
            device_map[f"model.{name}"] = second
        else:
            device_map[f"model.{name}"] = first
    for name, _ in model.named_children():
        if name != "model":
            device_map[name] = second
    return device_map


def check_placement(name: str, args, device: str) -> dict:
    """Check 2: the same tokens (L=0 and L=N/2) with half the model offloaded as on one device.

    With CUDA: GPU + CPU (accelerate executes CPU-mapped modules on the GPU, streaming weights, as
    ``parallelize=True`` with a CPU ``max_memory`` does). Without CUDA the same code path runs as
    CPU + disk offload and the check is marked skipped.
    """
    try:
        from accelerate import dispatch_model
    except ImportError:
        return {"skipped": "accelerate not installed (pip install accelerate)"}
    n = args.exact_layers
    config = family_config(name, args.size, layers=n, sliding_window=EXACT_SLIDING_WINDOW)
    prompts = random_prompts([12, 7, 9, 5], config.vocab_size, args.seed + 1)
    model = build_model(config, dtype=torch.float32, attn=FAMILIES[name].attn[0], device=device,
                        logit_std=args.logit_std, seed=args.seed)
    tau_h = calibrate_tau_h(greedy_entropies(model, prompts, args.exact_new_tokens, device=device))
    modes = {"L0": dict(L=0), f"L{n // 2}": dict(L=n // 2, tau_h=tau_h, **PAPER),
             f"L{n // 2}_always": dict(L=n // 2, tau_h=0.0, **PAPER)}
    single = {mode: decode(model, prompts, args.exact_new_tokens, device=device,
                           eglr=eglr)[0] for mode, eglr in modes.items()}
    cuda = device.startswith("cuda")
    first, second = (0, "cpu") if cuda else ("cpu", "disk")
    model.to("cpu")
    device_map = split_device_map(model, first, second)
    with tempfile.TemporaryDirectory() as offload_dir:
        dispatch_model(model, device_map=device_map, main_device=first, offload_dir=offload_dir)
        split = {mode: decode(model, prompts, args.exact_new_tokens, device=device, eglr=eglr)[0]
                 for mode, eglr in modes.items()}
        del model
    _free(device)
    result = {"devices": [str(first), second], "layers": n, "tau_h_p95": tau_h,
              "tokens_equal": {mode: single[mode] == split[mode] for mode in modes}}
    result["ok"] = all(result["tokens_equal"].values())
    if not cuda:
        result["skipped"] = "no cuda: ran as CPU + disk offload instead of GPU + CPU"
    return result
