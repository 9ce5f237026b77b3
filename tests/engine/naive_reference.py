"""An independent, deliberately naive EGLR: no KV cache, whole-sequence recomputation.

Written from eglr-method.md §2 without using eglr_harness's code. Each refinement iteration
re-runs the whole model on the whole sequence, with the last position's state at layer N-L
overwritten by a forward pre-hook on layer N-L+1 (0-based index N-L). By causality this equals
re-applying the top L layers at that position against the original keys/values of the past.
"""

from __future__ import annotations

import torch


def _decoder(model):
    return model.model


def _hidden_arg(args, kwargs):
    return args[0] if args else kwargs["hidden_states"]


def _run(model, ids, *, capture_layer=None, replace_layer=None, replacement=None):
    """One uncached forward of a single sequence; returns (logits at last position, captures)."""
    decoder = _decoder(model)
    captured = {}
    handles = []

    def grab_final(module, args):
        captured["h_final"] = args[0][0, -1].detach().clone()

    handles.append(decoder.norm.register_forward_pre_hook(grab_final))
    if capture_layer is not None:
        def grab_anchor(module, args, kwargs):
            captured["anchor"] = _hidden_arg(args, kwargs)[0, -1].detach().clone()
        handles.append(decoder.layers[capture_layer].register_forward_pre_hook(grab_anchor, with_kwargs=True))
    if replace_layer is not None:
        def overwrite(module, args, kwargs):
            hidden = _hidden_arg(args, kwargs).clone()
            hidden[0, -1] = replacement
            if args:
                return (hidden, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": hidden}
        handles.append(decoder.layers[replace_layer].register_forward_pre_hook(overwrite, with_kwargs=True))
    try:
        with torch.no_grad():
            logits = model(torch.tensor([ids]), use_cache=False).logits[0, -1].float()
    finally:
        for h in handles:
            h.remove()
    return logits, captured


def naive_eglr_greedy(model, prompt, *, L, alpha, k_max, tau_kl, tau_h, max_new_tokens, eos_ids, kl_sink=None):
    """Greedy EGLR for one prompt. Returns (new tokens, emitted logits per step, gated flags).

    ``kl_sink``, when given, receives every KL compared with ``tau_kl`` (for tests that must keep
    their thresholds away from the observed values).
    """
    num_layers = len(_decoder(model).layers)
    seq, new_tokens, emitted, gated_flags = list(prompt), [], [], []
    for _ in range(max_new_tokens):
        anchor_layer = num_layers - L if L > 0 else None
        logits, cap = _run(model, seq, capture_layer=anchor_layer)
        p = torch.softmax(logits, -1)
        H = -(p * torch.log(p)).sum()
        gated = L > 0 and float(H) > tau_h
        if gated:
            a, h = cap["anchor"], cap["h_final"]
            prev_logp = torch.log_softmax(logits, -1)
            for _k in range(k_max):
                h_hat = h * (a.float().norm() / h.float().norm())
                u = (1 - alpha) * a + alpha * h_hat
                logits, cap2 = _run(model, seq, replace_layer=num_layers - L, replacement=u)
                h = cap2["h_final"]
                logp = torch.log_softmax(logits, -1)
                kl = (logp.exp() * (logp - prev_logp)).sum()
                prev_logp = logp
                if kl_sink is not None:
                    kl_sink.append(float(kl))
                if float(kl) < tau_kl:
                    break
        token = int(torch.argmax(logits))
        emitted.append(logits)
        gated_flags.append(gated)
        seq.append(token)
        new_tokens.append(token)
        if token in eos_ids:
            break
    return new_tokens, emitted, gated_flags
