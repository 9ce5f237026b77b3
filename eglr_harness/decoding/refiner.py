"""EGLR inside a model's ordinary forward passes, through module hooks.

During each forward pass of ``generate`` the hooks record, for the position being predicted:
the anchor ``a = h^(N-L)`` (the input of layer N-L+1, the embeddings when L = N), ``h^(N)`` (the
input of the final norm), the call arguments of each of the top L layers (mask, rotary angles,
position ids, ...) and the keys/values that each of those layers attended to. A forward hook on
the unembedding then gates on the entropy of the raw logits and, for gated rows, runs the
refinement loop of eglr-method.md §2 and replaces that position's logits.

Refinement re-runs the top L layers on one position. Their attention sees the keys/values the
normal pass attended to at those layers, minus the current position, plus the key/value of the
refined input (``_ReplayCache``). The real KV cache is never written, so decoding continues
exactly as plain decoding would. Rotary angles and masks are the normal pass's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from eglr_harness.config import EglrConfig
from eglr_harness.decoding.accounting import EglrStats
from eglr_harness.decoding.math import check_finite, entropy, entropy_gate, fuse, kl_divergence, norm_match, softcap
from eglr_harness.decoding.model_parts import ModelParts

_CACHE_KWARGS = ("past_key_values", "past_key_value")
# Layer kwargs with a query-length axis, and where it is; sliced to the last position.
_QUERY_AXIS = {"attention_mask": -2, "position_ids": -1, "cache_position": -1}
_NO_BATCH_AXIS = {"cache_position"}


class _ReplayCache:
    """Stands in for the KV cache while the top layers re-run on the refined state.

    ``update`` returns the keys/values the normal pass attended to at that layer with the last
    position replaced by the refined one, and stores nothing.
    """

    def __init__(self, attended: dict[int, tuple[torch.Tensor, torch.Tensor]]):
        self._attended = attended

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        keys, values = self._attended[layer_idx]
        return torch.cat([keys[..., :-1, :], key_states], dim=-2), torch.cat([values[..., :-1, :], value_states], dim=-2)


def _last_position(value, name: str, query_len: int):
    """Slice a captured layer argument to the last query position (a no-op when query_len == 1)."""
    if query_len == 1 or value is None:
        return value
    if name == "position_embeddings" and isinstance(value, tuple):  # (cos, sin): (B, T, d)
        return tuple(t[:, -1:] for t in value)
    if name in _QUERY_AXIS and isinstance(value, torch.Tensor):
        axis = _QUERY_AXIS[name]
        if value.shape[axis] == query_len:
            return value.narrow(axis % value.dim(), value.shape[axis] - 1, 1)
        return value
    if name in _QUERY_AXIS:
        raise NotImplementedError(
            f"EGLR cannot slice the layer argument {name!r} of type {type(value).__name__}; "
            "use attn_implementation='sdpa' or 'eager'."
        )
    return value


@dataclass
class _StepCapture:
    """What the hooks recorded during the current forward pass."""

    active: torch.Tensor | None = None  # (B,) rows still generating
    anchor: torch.Tensor | None = None  # (B, D)
    last_hidden: torch.Tensor | None = None  # (B, D), h^(N) before the final norm
    layer_calls: dict[int, tuple[tuple, dict, int]] = field(default_factory=dict)  # layer -> (args, kwargs, T)
    attended: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)  # cache idx -> (K, V)


class EglrRefiner:
    """Context manager that applies EGLR to every forward pass of ``model`` while it is open.

    Args:
        model: the causal LM (as called by ``generate``).
        parts: its EGLR modules (``find_model_parts``).
        config: L, alpha, k_max, tau_kl, tau_h are used here (T is the sampler's business).
        stats: accounting to add to; None keeps none.
        finished_rows: returns the (B,) bool mask of rows that generation has finished (or None
            before the first check); finished rows are neither gated nor counted.
        record_entropies: keep the raw-logit entropy of every active row (for tau_h calibration).
    """

    def __init__(self, model, parts: ModelParts, config: EglrConfig, *, stats: EglrStats | None = None,
                 finished_rows=None, record_entropies: bool = False):
        config.validate_for_model(parts.num_layers)
        self.model, self.parts, self.config, self.stats = model, parts, config, stats
        self.finished_rows = finished_rows or (lambda: None)
        self.record_entropies = record_entropies
        self.entropies: list[torch.Tensor] = []
        self._top = list(range(parts.num_layers - config.L, parts.num_layers)) if config.refines else []
        self._handles: list = []
        self._capture = _StepCapture()
        self._step = 0
        self._refining = False
        self._wrapped_caches: list = []

    # ---------------------------------------------------------------- hooks
    def __enter__(self) -> "EglrRefiner":
        self._handles.append(self.model.register_forward_pre_hook(self._on_model_call, with_kwargs=True))
        self._handles.append(self.parts.lm_head.register_forward_hook(self._on_logits))
        if self._top:
            self._handles.append(self.parts.final_norm.register_forward_pre_hook(self._on_final_norm))
            for i in self._top:
                self._handles.append(self.parts.layers[i].register_forward_pre_hook(self._layer_hook(i), with_kwargs=True))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for cache in self._wrapped_caches:
            cache.__dict__.pop("update", None)
        self._wrapped_caches.clear()
        self._capture = _StepCapture()

    def _on_model_call(self, module, args, kwargs):
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        self._capture = _StepCapture()
        if input_ids is None:
            raise ValueError("EGLR needs input_ids in each forward call (inputs_embeds-only generation is not supported).")
        finished = self.finished_rows()
        if finished is None:
            self._capture.active = torch.ones(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        else:
            self._capture.active = ~finished.to(input_ids.device)
        self._step += 1

    def _layer_hook(self, index: int):
        def hook(module, args, kwargs):
            if self._refining:
                return None
            hidden = args[0] if args else kwargs["hidden_states"]
            if index == self._top[0]:
                self._capture.anchor = hidden[:, -1]
                self._wrap_cache(next((kwargs[k] for k in _CACHE_KWARGS if kwargs.get(k) is not None), None))
            self._capture.layer_calls[index] = (args[1:], kwargs, hidden.shape[1])
            return None

        return hook

    def _wrap_cache(self, cache) -> None:
        """Record what each top layer's attention reads from the cache (no copy: references)."""
        if cache is None:
            raise ValueError("EGLR needs the KV cache: call generate with use_cache=True.")
        if "update" in cache.__dict__:
            return
        top = set(self._top)  # a layer's cache index is its index in the decoder's layer list
        original = type(cache).update

        def update(key_states, value_states, layer_idx, *args, **kwargs):
            keys, values = original(cache, key_states, value_states, layer_idx, *args, **kwargs)
            if not self._refining and layer_idx in top:
                self._capture.attended[layer_idx] = (keys, values)
            return keys, values

        cache.update = update
        self._wrapped_caches.append(cache)

    def _on_final_norm(self, module, args):
        if not self._refining:
            self._capture.last_hidden = args[0][:, -1]
        return None

    def _on_logits(self, module, args, output):
        if self._refining:
            return None
        capture = self._capture
        active = capture.active if capture.active is not None else torch.ones(output.shape[0], dtype=torch.bool, device=output.device)
        if not (self._top or self.record_entropies):
            self._count(active, [], 0)
            return None
        raw = output[:, -1]  # (B, V)
        final = softcap(raw.float(), self.parts.logit_softcap)
        entropies = entropy(final)
        check_finite(entropies, f"decoding step {self._step}")
        if self.record_entropies:
            self.entropies.append(entropies[active].detach().cpu())
        gate = entropy_gate(entropies, self.config.tau_h, active) if self._top else torch.zeros_like(active)
        if not bool(gate.any()):
            self._count(active, [], 0)
            return None
        refined_raw, iterations, loops = self._refine(raw, final, gate)
        self._count(active, iterations[gate].tolist(), loops)
        output = output.clone()
        output[:, -1] = refined_raw
        return output

    def _count(self, active: torch.Tensor, gated_iterations: list[int], loops: int) -> None:
        if self.stats is not None:
            self.stats.add_step(batch_rows=int(active.numel()), active_rows=int(active.sum()),
                                gated_iterations=gated_iterations, L=self.config.L, loop_iterations=loops)

    # ---------------------------------------------------------------- refinement
    def _refine(self, raw0: torch.Tensor, final0: torch.Tensor, gate: torch.Tensor):
        """Run up to k_max refinement iterations for the gated rows only.

        Each gated row keeps its own result and stops at its own KL exit; rows never influence
        each other. raw0: (B, V) raw logits of the normal pass; final0: (B, V) fp32 after the
        soft-cap; gate: (B,) bool. Returns the raw logits to emit (B, V), iterations per row (B,)
        and the number of loop iterations run (for the batched accounting, over gated rows).
        """
        capture, cfg = self._capture, self.config
        if capture.anchor is None or capture.last_hidden is None or len(capture.layer_calls) != len(self._top):
            raise RuntimeError("EGLR hooks did not see the whole forward pass (is the model wrapped or compiled?).")
        rows = torch.nonzero(gate).flatten()  # (G,)
        anchor = capture.anchor[rows]  # (G, D)
        hidden = capture.last_hidden[rows].to(anchor.device)  # (G, D); devices differ when parallelize=True
        calls = {i: _select_rows(call, rows, gate.numel()) for i, call in capture.layer_calls.items()}
        attended = {i: (k[rows], v[rows]) for i, (k, v) in capture.attended.items()}
        logp_prev = torch.log_softmax(final0[rows], dim=-1)
        chosen = raw0[rows].clone()  # (G, V)
        iterations = torch.zeros(rows.numel(), dtype=torch.long, device=gate.device)
        running = torch.ones(rows.numel(), dtype=torch.bool, device=gate.device)
        loops = 0
        self._refining = True
        try:
            for k in range(1, cfg.k_max + 1):
                fused = fuse(anchor, norm_match(hidden, anchor), cfg.alpha)  # (G, D)
                hidden = self._run_top_layers(fused, calls, attended)  # (G, D)
                raw = self.parts.lm_head(self.parts.final_norm(hidden[:, None, :]))[:, -1]  # (G, V)
                logp = torch.log_softmax(softcap(raw.float(), self.parts.logit_softcap), dim=-1)
                chosen[running] = raw[running].to(chosen.dtype)
                iterations[running] = k
                loops = k
                running &= kl_divergence(logp, logp_prev) >= cfg.tau_kl  # KL early exit per row
                logp_prev = logp
                if not bool(running.any()):
                    break
        finally:
            self._refining = False
        out_raw = raw0.clone()
        out_raw[rows] = chosen
        out_iterations = torch.zeros_like(gate, dtype=torch.long)
        out_iterations[rows] = iterations
        return out_raw, out_iterations, loops

    def _run_top_layers(self, fused: torch.Tensor, calls: dict, attended: dict) -> torch.Tensor:
        """Apply layers N-L+1..N to the fused state at the current position.  (G, D) -> (G, D)."""
        replay = _ReplayCache(attended)
        hidden = fused[:, None, :]  # (G, 1, D)
        for i in self._top:
            args, kwargs, query_len = calls[i]
            kwargs = {name: _last_position(value, name, query_len) for name, value in kwargs.items()}
            for key in _CACHE_KWARGS:
                if key in kwargs:
                    kwargs[key] = replay
            kwargs.pop("hidden_states", None)
            args = tuple(_last_position(a, "", query_len) for a in args)
            out = self.parts.layers[i](hidden, *args, **kwargs)
            hidden = out[0] if isinstance(out, tuple) else out
        return hidden[:, -1]


def _select_rows(call: tuple, rows: torch.Tensor, batch: int) -> tuple:
    """Keep the gated rows of a captured layer call: every tensor whose first axis is the batch."""

    def pick(name, value):
        if isinstance(value, torch.Tensor) and name not in _NO_BATCH_AXIS and value.dim() > 0 and value.shape[0] == batch:
            return value[rows]
        if isinstance(value, tuple) and all(isinstance(v, torch.Tensor) for v in value):
            return tuple(pick(name, v) for v in value)
        return value

    args, kwargs, query_len = call
    return tuple(pick("", a) for a in args), {k: pick(k, v) for k, v in kwargs.items()}, query_len
