"""An independent, deliberately naive EGLR: no KV cache, whole-sequence recomputation.

Written from eglr-method.md §2 without using eglr_harness's code. It is the yardstick that both engines
(``decoding/hook``, ``decoding/continuous``) and the vLLM plugin are proven against token for token
(tests/decoding, tests/eglr_vllm, benchmarks/gpucheck/exactness.py), so it may import torch, the standard library and
``eglr_harness.core`` only, nothing of the engines it checks (tests/test_layers.py keeps it so): a bug it
shared with an engine would cancel out. It lives in the package so that tests and benchmarks import one
module.

Each refinement iteration re-runs the whole model on the whole sequence, with the last position's state
at layer N-L overwritten by a forward pre-hook on layer N-L+1 (0-based index N-L). By causality this
equals re-applying the top L layers at that position against the original keys/values of the past.

The exit rules (``stop``: kl, latent, accel, margin, entropy) are written here from their definitions
in eglr-method.md, in Python floats and plain tensors, one position at a time.

Sampling (``naive_eglr_sampled``) warps the refined logits by temperature, top-k and top-p, written
here from their definitions, and draws by Gumbel-max with the noise the engines' spec names
(eglr_harness/decoding/sampling.py's docstring), computed here in Python integers, one token at a time.
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


def _kl(logp_p, logp_q):
    """KL(p || q) = sum p (log p - log q), from log-probabilities.  (V,), (V,) -> ()"""
    return (logp_p.exp() * (logp_p - logp_q)).sum()


def _entropy(logp):
    """Shannon entropy in nats from log-probabilities.  (V,) -> ()"""
    return -(logp.exp() * logp).sum()


def _stop_value(stop, logp, prev_logp, h, h_prev, h_prev2):
    """What rule ``stop`` compares with its threshold after an iteration, from its definition
    (eglr-method.md, "Exit rules"); ``h`` are h^(N) vectors (D,), ``logp`` log-probabilities (V,)."""
    if stop == "kl":
        return float(_kl(logp, prev_logp))
    if stop == "entropy":
        return abs(float(_entropy(logp)) - float(_entropy(prev_logp)))
    if stop == "margin":
        ranked = sorted((float(v) for v in logp.exp()), reverse=True)
        return ranked[0] - ranked[1]
    if stop == "latent":
        return float((h.float() - h_prev.float()).norm() / h.float().norm())
    if stop == "accel":
        if h_prev2 is None:  # k = 1: no second difference yet
            return None
        return float(((h.float() - h_prev.float()) - (h_prev.float() - h_prev2.float())).norm() / h.float().norm())
    raise ValueError(f"unknown stop rule {stop!r}")


def _hits(stop, value, threshold):
    if value is None:
        return False
    if value != value:  # NaN ends the refinement
        return True
    return value > threshold if stop == "margin" else value < threshold


def _eglr_logits(model, seq, *, L, alpha, k_max, tau_kl, tau_h, kl_sink, kl_pair_sink, stop="kl", tau_stop=None):
    """The logits EGLR emits for the next position of ``seq``. Returns (logits (V,), gated, k*).

    ``stop`` picks the exit rule; its threshold is ``tau_kl`` for ``kl``, ``tau_stop`` for the others.
    accel exits on two consecutive hits, the others on one.
    """
    threshold = tau_kl if stop == "kl" else tau_stop
    needed = 2 if stop == "accel" else 1
    num_layers = len(_decoder(model).layers)
    anchor_layer = num_layers - L if L > 0 else None
    logits, cap = _run(model, seq, capture_layer=anchor_layer)
    p = torch.softmax(logits, -1)
    H = -(p * torch.log(p)).sum()
    if not (L > 0 and float(H) > tau_h):
        return logits, False, 0
    a, h = cap["anchor"], cap["h_final"]
    prev_logp = torch.log_softmax(logits, -1)
    h_prev2 = None
    hits_in_a_row = 0
    k = 0
    for k in range(1, k_max + 1):
        h_hat = h * (a.float().norm() / h.float().norm())
        u = (1 - alpha) * a + alpha * h_hat
        logits, cap2 = _run(model, seq, replace_layer=num_layers - L, replacement=u)
        h_prev, h = h, cap2["h_final"]
        logp = torch.log_softmax(logits, -1)
        value = _stop_value(stop, logp, prev_logp, h, h_prev, h_prev2)
        if kl_sink is not None and value is not None:
            kl_sink.append(value)
        if kl_pair_sink is not None:
            kl_pair_sink.append((k, float(_kl(logp, prev_logp)), float(_kl(prev_logp, logp))))
        prev_logp, h_prev2 = logp, h_prev
        hits_in_a_row = hits_in_a_row + 1 if _hits(stop, value, threshold) else 0
        if hits_in_a_row >= needed:
            break
    return logits, True, k


def naive_eglr_greedy(model, prompt, *, L, alpha, k_max, tau_kl, tau_h, max_new_tokens, eos_ids, kl_sink=None,
                      iterations_sink=None, kl_pair_sink=None, stop="kl", tau_stop=None):
    """Greedy EGLR for one prompt. Returns (new tokens, emitted logits per step, gated flags).

    Optional sinks (lists), for tests that must know what the reference did:
    ``kl_sink`` receives every value the exit rule compares with its threshold (the KL with
    ``stop="kl"``; to keep thresholds away from observed values); ``iterations_sink`` one refinement
    count k* per emitted token (0 when not gated);
    ``kl_pair_sink`` ``(k, KL(p_k || p_{k-1}), KL(p_{k-1} || p_k))`` per iteration.
    """
    return _decode(model, prompt, L=L, alpha=alpha, k_max=k_max, tau_kl=tau_kl, tau_h=tau_h,
                   max_new_tokens=max_new_tokens, eos_ids=eos_ids, pick=lambda logits: int(torch.argmax(logits)),
                   kl_sink=kl_sink, iterations_sink=iterations_sink, kl_pair_sink=kl_pair_sink, stop=stop,
                   tau_stop=tau_stop)


def warp(logits, *, temperature, top_k, top_p):
    """Temperature, then top-k (0 = off), then top-p (1.0 = off); removed tokens get -inf.  (V,) -> (V,)"""
    scores = logits.float() / temperature
    if top_k > 0:
        kth_best = torch.topk(scores, min(top_k, scores.numel())).values[-1]
        scores = scores.masked_fill(scores < kth_best, float("-inf"))
    if top_p < 1.0:
        order = torch.argsort(scores, descending=True)
        probs = torch.softmax(scores[order], -1)
        mass_before = torch.cumsum(probs, -1) - probs  # probability of the strictly better tokens
        drop = mass_before >= top_p  # keep the smallest prefix whose mass reaches top_p
        drop[0] = False
        scores = scores.clone()
        scores[order[drop]] = float("-inf")
    return scores


def _lowbias32(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def gumbel(seed: int, n: int, token: int) -> torch.Tensor:
    """The noise of token ``token`` at draw ``n`` of the row seeded ``seed``: a 0-dim fp32 tensor."""
    row = _lowbias32(_lowbias32((seed & 0xFFFFFFFF) ^ 0x9E3779B9) ^ ((seed >> 32) & 0xFFFFFFFF))
    key = _lowbias32(row ^ _lowbias32((n + 0x632BE5AB) & 0xFFFFFFFF))
    bits = _lowbias32(_lowbias32(key ^ token) ^ 0x85EBCA6B)
    u = torch.tensor(((bits >> 9) + 0.5) / 2 ** 23, dtype=torch.float32)  # exact: 23 bits and a half, below 1
    return -torch.log(-torch.log(u))


def naive_eglr_sampled(model, prompt, *, L, alpha, k_max, tau_kl, tau_h, max_new_tokens, eos_ids, temperature,
                       top_k, top_p, seed, kl_sink=None, iterations_sink=None, stop="kl", tau_stop=None):
    """Sampled EGLR for one prompt: draw n is argmax over the kept tokens of warped score + gumbel(seed, n, token).

    Returns (new tokens, refined logits per step before warping, gated flags); sinks as in
    ``naive_eglr_greedy``.
    """
    drawn = []

    def draw(logits):
        scores = warp(logits, temperature=temperature, top_k=top_k, top_p=top_p)
        kept = [v for v in range(scores.numel()) if scores[v] != float("-inf")]
        noisy = {v: float(scores[v] + gumbel(seed, len(drawn), v)) for v in kept}
        drawn.append(max(kept, key=lambda v: (noisy[v], -v)))  # ties: the lowest id, as argmax
        return drawn[-1]

    return _decode(model, prompt, L=L, alpha=alpha, k_max=k_max, tau_kl=tau_kl, tau_h=tau_h,
                   max_new_tokens=max_new_tokens, eos_ids=eos_ids, pick=draw, kl_sink=kl_sink,
                   iterations_sink=iterations_sink, kl_pair_sink=None, stop=stop, tau_stop=tau_stop)


def _decode(model, prompt, *, max_new_tokens, eos_ids, pick, iterations_sink, **eglr):
    seq, new_tokens, emitted, gated_flags = list(prompt), [], [], []
    for _ in range(max_new_tokens):
        logits, gated, iterations = _eglr_logits(model, seq, **eglr)
        token = pick(logits)
        emitted.append(logits)
        gated_flags.append(gated)
        if iterations_sink is not None:
            iterations_sink.append(iterations)
        seq.append(token)
        new_tokens.append(token)
        if token in eos_ids:
            break
    return new_tokens, emitted, gated_flags
