"""EGLR inside a model's ordinary forward passes, through module hooks.

During each forward pass of ``generate`` the hooks record, for the position being predicted:
the anchor ``a = h^(N-L)`` (the input of layer N-L+1, the embeddings when L = N), ``h^(N)`` (the
input of the final norm), the call arguments of each of the top L layers at that position (mask,
rotary angles, position ids, ...) and the keys/values each of those layers attended to. A forward
hook on the unembedding then gates on the entropy of the logits as ``generate`` reads them (the
family's logit scale, ``model_parts.LOGIT_SCALES``, and soft-cap applied; no temperature) and, for
gated rows, runs the refinement loop of eglr-method.md §2 and replaces that position's logits.

Refinement re-runs the top L layers on one position. Their attention sees the keys/values the
normal pass attended to at those layers with the slot of the current position holding the
refined key/value (``_ReplayCache``): the slot is overwritten in place and restored bit for bit
before decoding goes on, so the KV cache ends as plain decoding leaves it and no copy of the
keys/values is made (memory does not grow with the context). Rotary angles and masks are the
normal pass's own.

Rows of the refinement pass are the contiguous span from the first to the last gated row: a
slice is a view (no gather, no index tensor to keep on the right device); rows inside the span
that are not gated are computed and discarded. The loop runs k_max iterations and freezes each
row at its exit (the rule ``config.stop``: the KL, or one of ``core.config.STOP_RULES``; the rules that
need no distribution per iteration project the LM head once, on each row's state at its exit), so a
decoding step reads the device once (which rows are gated); counters stay on the device until the
end of the ``generate`` call.

Shape letters: the package's legend (``eglr_harness/decoding/__init__.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers.cache_utils import StaticLayer, StaticSlidingWindowLayer

from eglr_harness.core.config import EglrConfig
from eglr_harness.decoding.cache_kwarg import CACHE_KWARG
from eglr_harness.decoding.functional import (
    entropy_gate, entropy_of_log_probs, exit_signal, fuse, fusion_weights, non_finite, norm_match, raise_on_nan_rows,
    softcap,
)
from eglr_harness.decoding import refine_state
from eglr_harness.decoding.model_parts import ModelParts
from eglr_harness.decoding.stats import EglrStats

# Layer kwargs with a query-length axis, and where it is; sliced to the last position.
_QUERY_AXIS = {"attention_mask": -2, "position_ids": -1, "cache_position": -1}
_NO_BATCH_AXIS = {"cache_position"}


@dataclass
class _Attended:
    """What one top layer's attention read from the cache in the normal pass.

    keys, values: (B, H, S, d) as returned by the cache (for dynamic caches the cache's own
    storage, for static caches the whole buffer); slot: where position t sits on the S axis, an
    int or a (1,) index tensor on the keys' device (static caches count positions on the device).
    """

    keys: torch.Tensor
    values: torch.Tensor
    slot: int | torch.Tensor


@dataclass
class _LayerCall:
    """A top layer's call in the normal pass, cut to the last position, without its cache.

    device: where its input hidden state was.
    """

    args: tuple
    kwargs: dict
    device: torch.device


def current_slot(layer, keys: torch.Tensor) -> int | torch.Tensor:
    """Index on the S axis of ``keys`` (what ``layer.update`` just returned) of the last position written.

    Dynamic layers return a concatenation that ends with it. Static layers return their
    preallocated buffer, written in place at the running length (the rest is masked).
    """
    if isinstance(layer, StaticLayer) and keys is layer.keys:
        if isinstance(layer, StaticSlidingWindowLayer):  # a full window rolls: the newest slot is the last
            return min(layer.cumulative_length_int, layer.max_cache_len) - 1
        return (layer.cumulative_length.reshape(1) - 1).to(keys.device)
    return keys.shape[-2] - 1


def _read_slot(states: torch.Tensor, slot) -> torch.Tensor:
    """(G, H, S, d) -> (G, H, 1, d), a copy."""
    if isinstance(slot, int):
        return states[:, :, slot:slot + 1].clone()
    return states.index_select(2, slot)


def _write_slot(states: torch.Tensor, slot, new: torch.Tensor) -> None:
    """Overwrite slot ``slot`` of (G, H, S, d) ``states`` in place with (G, H, 1, d) ``new``."""
    new = new.to(device=states.device, dtype=states.dtype)
    if isinstance(slot, int):
        states[:, :, slot:slot + 1] = new
    else:
        states.index_copy_(2, slot, new)


class _ReplayCache:
    """Stands in for the KV cache while the top layers re-run on the refined state of rows lo:hi.

    ``update`` writes the refined key/value into the slot of position t of the keys/values the
    normal pass attended to (views of rows lo:hi, no copy) and returns them. The first write of
    each layer saves the original slot; ``restore`` puts it back.
    """

    def __init__(self, attended: dict[int, _Attended], lo: int, hi: int):
        self._attended, self._lo, self._hi = attended, lo, hi
        self._saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def _rows(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor, int | torch.Tensor]:
        seen = self._attended[layer_idx]
        return seen.keys[self._lo:self._hi], seen.values[self._lo:self._hi], seen.slot

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        keys, values, slot = self._rows(layer_idx)
        if layer_idx not in self._saved:
            self._saved[layer_idx] = (_read_slot(keys, slot), _read_slot(values, slot))
        _write_slot(keys, slot, key_states)
        _write_slot(values, slot, value_states)
        return keys, values

    def restore(self) -> None:
        for layer_idx, (old_keys, old_values) in self._saved.items():
            keys, values, slot = self._rows(layer_idx)
            _write_slot(keys, slot, old_keys)
            _write_slot(values, slot, old_values)
        self._saved.clear()


def _last_position(value, name: str, query_len: int):
    """Cut a captured layer argument to the last query position (a no-op when query_len == 1).

    At the prefill the cut is a copy, so that the capture does not keep the prompt's (B, S, ...)
    rotary tables and masks alive.
    """
    if query_len == 1 or value is None:
        return value
    if name == "position_embeddings" and isinstance(value, tuple):  # (cos, sin): (B, S, d)
        return tuple(t[:, -1:].clone() for t in value)
    if name in _QUERY_AXIS and isinstance(value, torch.Tensor):
        axis = _QUERY_AXIS[name]
        if value.shape[axis] == query_len:
            return value.narrow(axis % value.dim(), value.shape[axis] - 1, 1).clone()
        return value
    if name in _QUERY_AXIS:
        raise NotImplementedError(
            f"EGLR cannot slice the layer argument {name!r} of type {type(value).__name__}; "
            "use attn_implementation='sdpa' or 'eager'."
        )
    return value


def _rows_of(call: _LayerCall, lo: int, hi: int, batch: int) -> _LayerCall:
    """Rows lo:hi of a captured layer call: every tensor whose first axis is the batch (views)."""

    def pick(name, value):
        if isinstance(value,
                      torch.Tensor) and name not in _NO_BATCH_AXIS and value.dim() > 0 and value.shape[0] == batch:
            return value[lo:hi]
        if isinstance(value, tuple) and all(isinstance(v, torch.Tensor) for v in value):
            return tuple(pick(name, v) for v in value)
        return value

    return _LayerCall(tuple(pick("", a) for a in call.args), {k: pick(k, v) for k, v in call.kwargs.items()},
                      call.device)


@dataclass
class _StepCapture:
    """What the hooks recorded during the current forward pass."""

    active: torch.Tensor | None = None  # (B,) rows still generating
    anchor: torch.Tensor | None = None  # (B, D)
    last_hidden: torch.Tensor | None = None  # (B, D), h^(N) before the final norm
    layer_calls: dict[int, _LayerCall] = field(default_factory=dict)
    attended: dict[int, _Attended] = field(default_factory=dict)  # cache layer index -> what attention read
    norm_device: torch.device | None = None  # where the final norm ran


class _Counters:
    """Accounting of one ``generate`` call: host ints where the host knows them, the rest on the device."""

    def __init__(self, k_max: int):
        self.k_max = k_max
        self.steps = self.gated_steps = self.computed_rows = self.computed_refine_rows = 0
        self.tokens: torch.Tensor | None = None  # () active rows summed over steps
        self.histogram: torch.Tensor | None = None  # (k_max + 1,) gated rows per k*
        self.nan_rows: torch.Tensor | None = None  # (B,) rows that ever had non-finite logits

    def add_step(self, active: torch.Tensor) -> None:
        self.steps += 1
        self.computed_rows += active.numel()
        tokens = active.sum()
        self.tokens = tokens if self.tokens is None else self.tokens + tokens.to(self.tokens.device)

    def add_nan(self, nan: torch.Tensor) -> None:
        self.nan_rows = nan if self.nan_rows is None else self.nan_rows | nan.to(self.nan_rows.device)

    def add_refinement(self, iterations: torch.Tensor, pass_rows: int) -> None:
        """iterations: (G,) k* of each row of the pass, 0 for rows that were not gated."""
        self.gated_steps += 1
        self.computed_refine_rows += pass_rows * self.k_max
        ks = torch.arange(self.k_max + 1, device=iterations.device)
        counts = (iterations[:, None] == ks).sum(dim=0)  # (k_max + 1,), no data-dependent shape: no sync
        self.histogram = counts if self.histogram is None else self.histogram + counts.to(self.histogram.device)

    def flush(self, stats: EglrStats | None, L: int, head_per_iteration: bool = True) -> None:
        """Check for non-finite logits and add the totals to ``stats``: the call's one read of its counters."""
        if self.tokens is None:
            return
        device = self.tokens.device
        histogram = self.histogram if self.histogram is not None else torch.zeros(self.k_max + 1, dtype=torch.long)
        nan_rows = self.nan_rows if self.nan_rows is not None else torch.zeros(0, dtype=torch.bool)
        values = torch.cat([self.tokens.reshape(1).long(), histogram.to(device).long(),
                            nan_rows.to(device).long()]).tolist()  # one read
        tokens, histogram, nan_rows = values[0], values[1:self.k_max + 2], values[self.k_max + 2:]
        raise_on_nan_rows([row for row, nan in enumerate(nan_rows) if nan], "a decoding step of this batch")
        if stats is not None:
            stats.add_batch(steps=self.steps, gated_steps=self.gated_steps, computed_rows=self.computed_rows,
                            tokens=tokens, iterations={k: c for k, c in enumerate(histogram) if k > 0}, L=L,
                            computed_refine_rows=self.computed_refine_rows, head_per_iteration=head_per_iteration)


class _SignalLog:
    """Per step, on the device: each row's entropy, the log-probability of the token it emitted, its
    iterations k* and last KL, and whether it was still generating; read once (``per_row``)."""

    def __init__(self):
        self.steps: list[tuple[torch.Tensor, ...]] = []  # (entropy, iterations, final_kl, active), each (B,)
        self.logprobs: list[torch.Tensor] = []  # (B,) per step, once the step's token is known
        self._pending: torch.Tensor | None = None  # (B, V) log-probabilities of the last step's distribution

    def add_step(self, entropies, iterations, final_kls, active, logp) -> None:
        self.steps.append((entropies, iterations, final_kls, active))
        self._pending = logp

    def add_tokens(self, tokens: torch.Tensor) -> None:
        """The tokens (B,) emitted from the last step's distribution."""
        if self._pending is not None:
            self.logprobs.append(self._pending.gather(1, tokens.to(self._pending.device)[:, None])[:, 0])
            self._pending = None

    def per_row(self) -> list[dict[str, list]]:
        """Each row's per-token values over the steps it was generating (one read)."""
        if not self.steps:
            return []
        device = self.steps[0][0].device
        columns = [torch.stack([step[i].to(device).double() for step in self.steps]) for i in range(4)]
        columns.append(torch.stack([lp.to(device).double() for lp in self.logprobs]))
        entropies, iterations, kls, active, logprobs = (c.T.tolist() for c in columns)  # (B, steps) each
        rows = []
        for e, k, kl, a, lp in zip(entropies, iterations, kls, active, logprobs):
            n = int(sum(a))  # a finished row stays finished: its first n steps
            rows.append({"entropies": e[:n], "token_iterations": [int(v) for v in k[:n]], "final_kls": kl[:n],
                         "logprobs": lp[:n]})
        return rows


class EglrRefiner:
    """Context manager that applies EGLR to every forward pass of ``model`` while it is open.

    Args:
        model: the causal LM (as called by ``generate``).
        parts: its EGLR modules (``find_model_parts``).
        config: L, alpha, k_max, tau_kl, tau_h are used here (T is the sampler's business).
        stats: accounting to add to when the context closes; None keeps none.
        finished_rows: returns the (B,) bool mask of rows that generation has finished (EOS, max
            length, a stop string; or None before the first check); finished rows are neither
            gated, counted nor recorded.

        record_signals: keep every step's signals (entropy, the emitted token's log-probability,
            iterations, last KL) per row in ``signals`` (``_SignalLog``); ``add_tokens`` receives the
            last step's tokens. Off, a plain decode (L = 0, or tau_h = inf) reads nothing per step.
    """

    def __init__(self, model, parts: ModelParts, config: EglrConfig, *, stats: EglrStats | None = None,
                 finished_rows=None, record_signals: bool = False):
        # the layer-count rule is checked where the cells are resolved (RunSettings.check_cells, eglr_generate)
        assert config.L <= parts.num_layers, f"L={config.L} > {parts.num_layers} layers"
        self.model, self.parts, self.config, self.stats = model, parts, config, stats
        self.finished_rows = finished_rows or (lambda: None)
        self.record_signals = record_signals
        self.signals = _SignalLog()
        self._top = list(range(parts.num_layers - config.L, parts.num_layers)) if config.refines else []
        self._handles: list = []
        self._capture = _StepCapture()
        self._counters = _Counters(config.k_max)
        self._refining = False
        self._wrapped_caches: list = []

    # ---------------------------------------------------------------- hooks
    def __enter__(self) -> "EglrRefiner":
        self._counters = _Counters(self.config.k_max)
        self.signals = _SignalLog()
        self._handles.append(self.model.register_forward_pre_hook(self._on_model_call, with_kwargs=True))
        self._handles.append(self.parts.lm_head.register_forward_hook(self._on_logits))
        if self._top:
            self._handles.append(self.parts.final_norm.register_forward_pre_hook(self._on_final_norm))
            for i in self._top:
                self._handles.append(self.parts.layers[i].register_forward_pre_hook(self._layer_hook(i),
                                                                                    with_kwargs=True))
        return self

    def __exit__(self, exc_type, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for cache in self._wrapped_caches:
            cache.__dict__.pop("update", None)
        self._wrapped_caches.clear()
        self._capture = _StepCapture()
        if exc_type is None:
            self._counters.flush(self.stats, self.config.L, self.config.stop_rule.head_per_iteration)

    def add_tokens(self, tokens: torch.Tensor) -> None:
        """The last step's tokens (B,), which no later forward call shows (``generate``'s output)."""
        self.signals.add_tokens(tokens)

    def _on_model_call(self, module, args, kwargs):
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        self._capture = _StepCapture()
        if input_ids is None:
            raise ValueError("EGLR needs input_ids in each forward call (inputs_embeds-only generation is not "
                             "supported).")
        self.signals.add_tokens(input_ids[:, -1])  # the token the previous step emitted
        finished = self.finished_rows()
        if finished is None:
            self._capture.active = torch.ones(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        else:
            self._capture.active = ~finished.to(input_ids.device)

    def _layer_hook(self, index: int):
        def hook(module, args, kwargs):
            if self._refining:
                return None
            hidden = args[0] if args else kwargs["hidden_states"]
            query_len = hidden.shape[1]
            if index == self._top[0]:
                anchor = hidden[:, -1]
                self._capture.anchor = anchor.clone() if query_len > 1 else anchor
                self._wrap_cache(kwargs.get(CACHE_KWARG))
            kept = {name: _last_position(value, name, query_len) for name, value in kwargs.items()
                    if name not in ("hidden_states", CACHE_KWARG)}
            call_args = tuple(_last_position(a, "", query_len) for a in args[1:])
            self._capture.layer_calls[index] = _LayerCall(call_args, kept, hidden.device)
            return None

        return hook

    def _wrap_cache(self, cache) -> None:
        """Record what each top layer's attention reads from the cache (references, no copy)."""
        if cache is None:
            raise ValueError(f"EGLR needs the KV cache: call generate with use_cache=True (the decoder layers "
                             f"received no {CACHE_KWARG!r} argument).")
        if "update" in cache.__dict__:
            return
        top = set(self._top)  # a layer's cache index is its index in the decoder's layer list
        original = type(cache).update

        def update(key_states, value_states, layer_idx, *args, **kwargs):
            keys, values = original(cache, key_states, value_states, layer_idx, *args, **kwargs)
            if not self._refining and layer_idx in top:
                self._capture.attended[layer_idx] = _Attended(keys, values, current_slot(cache.layers[layer_idx], keys))
            return keys, values

        cache.update = update
        self._wrapped_caches.append(cache)

    def _on_final_norm(self, module, args):
        if not self._refining:
            hidden = args[0]
            last = hidden[:, -1]
            self._capture.last_hidden = last.clone() if hidden.shape[1] > 1 else last
            self._capture.norm_device = hidden.device
        return None

    def _on_logits(self, module, args, output):
        if self._refining:
            return None
        capture = self._capture
        raw = output[:, -1]  # (B, V)
        active = capture.active.to(raw.device) if capture.active is not None else \
            torch.ones(raw.shape[0], dtype=torch.bool, device=raw.device)
        self._counters.add_step(active)
        if not (self._top or self.record_signals):
            return None
        final = softcap(self.parts.scale_logits(raw).float(), self.parts.logit_softcap)  # (B, V) as generate reads them
        logp = torch.log_softmax(final, dim=-1)  # (B, V) what is read
        entropies = entropy_of_log_probs(logp)  # (B,)
        iterations = torch.zeros(raw.shape[0], dtype=torch.long, device=raw.device)
        kls = torch.zeros_like(entropies)
        nan = torch.zeros_like(active)  # (B,) rows whose refinement met a NaN
        if self._top:
            gate = entropy_gate(entropies, self.config.gate_tau_h, active)
            gated = [row for row, on in enumerate(gate.tolist()) if on]  # the step's one read from the device
            if gated:
                lo, hi = gated[0], gated[-1] + 1
                refined, k_star, last_kl, refined_logp, refined_nan = self._refine(raw, logp, gate, lo, hi,
                                                                                   head_device=args[0].device)
                self._counters.add_refinement(k_star, hi - lo)
                output = output.clone()
                output[lo:hi, -1] = refined
                logp = logp.clone()
                logp[lo:hi] = refined_logp
                iterations[lo:hi], kls[lo:hi], nan[lo:hi] = k_star, last_kl, refined_nan
        self._counters.add_nan(nan | non_finite(entropies, kls))
        if self.record_signals:
            self.signals.add_step(entropies, iterations, kls, active, logp)
        return output

    # ---------------------------------------------------------------- refinement
    def _refine(self, raw0: torch.Tensor, logp0: torch.Tensor, gate: torch.Tensor, lo: int, hi: int,
                head_device: torch.device):
        """Run k_max refinement iterations for rows lo:hi, keeping each gated row's own exit (``config.stop``).

        Rows never influence each other. raw0: (B, V) raw logits of the normal pass; logp0: (B, V)
        their fp32 log-probabilities after the soft-cap; gate: (B,) bool, true at lo and hi-1. Returns,
        for rows lo:hi, the raw logits to emit (G, V), the iterations k* (G,) (0 where not gated), the
        exit signal of each row's last iteration (G,) (the KL with stop=kl; 0 where not gated), the
        emitted distribution's log-probabilities (G, V) and the rows that met a NaN (G,) bool (the
        NaN policy of ``refine_state``: a NaN iteration is not taken).
        """
        capture, cfg = self._capture, self.config
        if capture.anchor is None or capture.last_hidden is None or len(capture.layer_calls) != len(self._top):
            raise RuntimeError("EGLR hooks did not see the whole forward pass (is the model wrapped or compiled?).")
        batch = gate.numel()
        anchor = capture.anchor[lo:hi]  # (G, D)
        hidden = capture.last_hidden[lo:hi].to(anchor.device)  # (G, D); devices differ with a split device_map
        calls = {i: _rows_of(call, lo, hi, batch) for i, call in capture.layer_calls.items()}
        replay = _ReplayCache(capture.attended, lo, hi)
        rule = cfg.stop_rule
        logp_prev = logp0[lo:hi]  # (G, V)
        hidden_prev2 = hidden  # (G, D) h^(N) of iteration k-2 (accel; its signal is ignored at k = 1)
        chosen, chosen_logp = raw0[lo:hi].clone(), logp_prev  # (G, V)
        chosen_hidden = hidden  # (G, D) h^(N) to project once at the end (rules without a head per iteration)
        state = refine_state.start(gate[lo:hi].clone())  # running, k*, streaks, last signals of rows lo:hi
        alpha, one_minus_alpha = fusion_weights(cfg.alpha, hi - lo, anchor.device)
        self._refining = True
        try:
            for k in range(1, cfg.k_max + 1):
                # fuse the anchor with the last state, re-run the top L layers on it
                hidden_prev = hidden.to(anchor.device)
                fused = fuse(anchor, norm_match(hidden_prev, anchor), alpha, one_minus_alpha)  # (G, D)
                hidden = self._run_top_layers(fused, calls, replay)  # (G, D)
                # the rule's signal: on p_k (the LM head each iteration) or on the states
                if rule.head_per_iteration:
                    raw, logp = self._project(hidden, head_device, raw0.device)
                    signal = exit_signal(rule.name, logp=logp, logp_prev=logp_prev).to(raw0.device)
                else:
                    signal = exit_signal(rule.name, hidden=hidden, hidden_prev=hidden_prev,
                                         hidden_prev2=hidden_prev2.to(hidden.device)).to(raw0.device)
                    hidden_prev2 = hidden_prev
                # each row's own exit (refine_state: a NaN iteration is not taken)
                state, taken = refine_state.advance(state, rule.name, signal, cfg.stop_threshold, k, cfg.k_max)
                if rule.head_per_iteration:  # the rows that took iteration k keep its logits
                    chosen = refine_state.choose(taken, raw, chosen)
                    chosen_logp, logp_prev = refine_state.choose(taken, logp, chosen_logp), logp
                else:  # ... or its state, projected once at the exit
                    chosen_hidden = refine_state.choose(taken, hidden, chosen_hidden.to(hidden.device))
            if not rule.head_per_iteration:  # the one projection of the exit states (the other rows keep raw0)
                raw, logp = self._project(chosen_hidden, head_device, raw0.device)
                state, use = refine_state.exit_projection(state, logp)
                chosen, chosen_logp = refine_state.choose(use, raw, chosen), refine_state.choose(use, logp, chosen_logp)
        finally:
            replay.restore()
            self._refining = False
        return chosen, state.iterations, state.signal, chosen_logp, state.non_finite

    def _project(self, hidden: torch.Tensor, head_device: torch.device, out_device: torch.device):
        """The final norm and the LM head on refined states, as the normal pass applies them.

        hidden: (G, D) h^(N) -> raw logits (G, V) on ``out_device`` and their fp32 log-probabilities (G, V)
        after the family's scale and soft-cap.
        """
        normed = self.parts.final_norm(hidden[:, None, :].to(self._capture.norm_device or hidden.device))
        raw = self.parts.lm_head(normed.to(head_device))[:, -1].to(out_device)  # (G, V)
        logp = torch.log_softmax(softcap(self.parts.scale_logits(raw).float(), self.parts.logit_softcap), dim=-1)
        return raw, logp

    def _run_top_layers(self, fused: torch.Tensor, calls: dict[int, _LayerCall], replay: _ReplayCache) -> torch.Tensor:
        """Apply layers N-L+1..N to the fused state at the current position.  (G, D) -> (G, D)."""
        hidden = fused[:, None, :]  # (G, 1, D)
        for i in self._top:
            call = calls[i]
            kwargs = {**call.kwargs, CACHE_KWARG: replay}
            out = self.parts.layers[i](hidden.to(call.device), *call.args, **kwargs)
            hidden = out[0] if isinstance(out, tuple) else out
        return hidden[:, -1]
