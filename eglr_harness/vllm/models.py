"""EGLR (eglr-method.md §2) inside vLLM's forward, for the families whose decoder layers take
``(positions, hidden_states, residual)`` and end in a norm of ``(hidden_states, residual)``: Llama, Qwen2,
Mistral, Qwen3 and Gemma-3 (text; its embedding scale is in ``embed_input_ids``, its soft-cap in
``compute_logits``, both vLLM's own).

One forward pass of the engine covers every scheduled token of every request in the batch. The
EGLR forward runs the stock layers one by one (the same calls as stock vLLM), keeping the input
of layer N-L, then, for the row each request samples from (the last scheduled token of the
request: vLLM's ``logits_indices``, ``query_start_loc[1:] - 1``), gates on the entropy of its
logits as vLLM's sampler reads them (``compute_logits``: the family's scale and soft-cap). For
gated rows it runs the refinement loop with the project's pure functions
(``eglr_harness.decoding.functional``) and returns, for those rows, the final norm of the chosen
``h^(N,k*)``, from which vLLM computes the logits it samples (temperature, top-k, seed: vLLM's).

K/V. vLLM's attention writes each token's key/value into its paged cache slot (the forward
context's slot mapping) whenever a layer runs. A refinement pass re-runs the top L layers on the
whole batch with the metadata of the normal pass, every row fed its own layer N-L input except the
gated rows, fed the fused state: so the gated rows attend to the past's normal keys/values plus the
refined key/value of their own position (the spec's attention context), and nothing else changes.
After the loop one more pass of the top L layers on the saved normal inputs writes the normal
keys/values back, bit for bit (the same inputs through the same kernels on the same batch), so the
paged cache ends as plain decoding leaves it. All of it goes through vLLM's own attention layers:
no backend, layout or slot is touched here. The cost of a step with a gated row is
(iterations + 1) x L/N of the batch's forward; a step without one costs a stock forward plus one
(rows, V) logits product for the gate.

Settings come per request (``row_settings.py``); a batch whose requests all decode plainly runs
stock vLLM's forward unchanged. Shape letters: T scheduled tokens of the batch, R requests (rows
sampled), G gated rows, D hidden, V vocabulary.
"""

from __future__ import annotations

import torch
from vllm.forward_context import get_forward_context
from vllm.model_executor.models.gemma3 import Gemma3ForCausalLM
from vllm.model_executor.models.llama import LlamaForCausalLM
from vllm.model_executor.models.mistral import MistralForCausalLM
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM

from eglr_harness.core.config import EglrConfig
from eglr_harness.decoding.functional import (
    entropy_gate, entropy_of_log_probs, fuse, kl_divergence, norm_match, raise_on_nan_rows, refinement_done,
)
from eglr_harness.vllm.row_settings import settings_for


def sampled_rows() -> torch.Tensor | None:
    """(R,) token index of each request's sampled row in this forward pass, from the attention
    metadata of the forward context; None outside a real step (vLLM's profile and warm-up runs)."""
    metadata = get_forward_context().attn_metadata
    if not metadata or isinstance(metadata, list):  # None, {} or micro-batches: none here
        return None
    for layer_metadata in metadata.values():
        starts = getattr(layer_metadata, "query_start_loc", None)
        if starts is not None:
            return (starts[1:] - 1).long()
    return None


class EglrForCausalLMMixin:
    """The EGLR forward over a stock vLLM causal LM (``self.model``: embed_input_ids, layers, norm)."""

    def __init__(self, *, vllm_config, prefix: str = "", **kwargs):
        super().__init__(vllm_config=vllm_config, prefix=prefix, **kwargs)
        if vllm_config.parallel_config.pipeline_parallel_size != 1:
            raise ValueError("eglr-vllm: pipeline_parallel_size="
                             f"{vllm_config.parallel_config.pipeline_parallel_size} is not supported; allowed: 1 "
                             "(the refinement needs layers N-L..N and the final norm on one rank).")
        self._eglr_vllm_config = vllm_config

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs):
        plan = self._eglr_plan()
        if plan is None:
            return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds, **kwargs)
        return self._eglr_forward(input_ids, positions, inputs_embeds, *plan)

    def _eglr_plan(self) -> tuple[torch.Tensor, list[EglrConfig], object] | None:
        """(sampled rows, their requests' settings, the tracker), or None when no row can refine and
        none records signals (stock forward)."""
        rows = sampled_rows()
        if rows is None:
            return None
        tracker = settings_for(self._eglr_vllm_config)
        if tracker is None:
            raise RuntimeError("eglr-vllm: the EglrRowSettings logits processor is not loaded in this engine: "
                               "install eglr-harness (its vllm.logits_processors entry point) or pass "
                               "logits_processors=['eglr_harness.vllm.row_settings:EglrRowSettings'].")
        configs = tracker.configs(rows.numel())
        if not any(config.refines for config in configs) and not tracker.records(rows.numel()):
            return None
        num_layers = len(self.model.layers)
        for config in configs:
            config.validate_for_model(num_layers)
        return rows, configs, tracker

    def _run_layers(self, positions, hidden, residual, first: int):
        """Layers first..N-1 on (T, D) states (copies: vLLM's fused norms work in place)."""
        hidden = hidden.clone()
        residual = None if residual is None else residual.clone()
        for layer in self.model.layers[first:]:
            hidden, residual = layer(positions, hidden, residual)
        return hidden, residual

    def _logprobs(self, normed: torch.Tensor) -> torch.Tensor:
        """(R, D) final-normed states -> (R, V) fp32 log-probabilities of the logits vLLM samples from."""
        return torch.log_softmax(self.compute_logits(normed).float(), dim=-1)

    def _eglr_forward(self, input_ids, positions, inputs_embeds, rows: torch.Tensor, configs: list[EglrConfig],
                      tracker):
        model = self.model
        num_layers = len(model.layers)
        spans = sorted({config.L for config in configs if config.refines})
        anchor_layers = {num_layers - span for span in spans}
        hidden = inputs_embeds if inputs_embeds is not None else model.embed_input_ids(input_ids)
        residual = None
        saved = {}  # layer index -> its input (hidden, residual) in the normal pass, (T, D) each
        for index, layer in enumerate(model.layers):
            if index in anchor_layers:
                saved[index] = (hidden.clone(), None if residual is None else residual.clone())
            hidden, residual = layer(positions, hidden, residual)
        final_stream = (hidden + residual)[rows]  # (R, D) h^(N), before the final norm (which works in place)
        normed, _ = model.norm(hidden, residual)  # (T, D)
        logp = self._logprobs(normed[rows])  # (R, V)
        entropies = entropy_of_log_probs(logp)  # (R,)
        raise_on_nan_rows([r for r, bad in enumerate(entropies.isnan().tolist()) if bad], "the normal pass")
        tau_h = torch.tensor([config.tau_h for config in configs], dtype=torch.float64, device=entropies.device)
        spans_of_rows = torch.tensor([config.L for config in configs], device=entropies.device)
        normed = normed.clone()
        iterations = torch.zeros(len(configs), dtype=torch.long, device=entropies.device)  # (R,) k*, 0 ungated
        last_kls = torch.zeros(len(configs), dtype=torch.float32, device=entropies.device)  # (R,)
        for span in spans:
            gated = entropy_gate(entropies, tau_h, spans_of_rows == span).nonzero()[:, 0]  # (G,)
            if gated.numel() == 0:
                continue
            first = num_layers - span
            refined, k_star, kl = self._refine(positions, saved[first], first, rows[gated], final_stream[gated],
                                               normed[rows[gated]], logp[gated], [configs[i] for i in gated.tolist()])
            normed[rows[gated]] = refined
            iterations[gated], last_kls[gated] = k_star, kl
        if tracker.records(len(configs)):
            tracker.record(entropies.tolist(), iterations.tolist(), last_kls.tolist())
        return normed

    def _refine(self, positions, anchor_input, first: int, token_rows, final_stream, normed0, logp0, configs):
        """The refinement loop for G gated rows whose anchor is the input of layer ``first`` (= N-L).

        anchor_input: (hidden, residual) (T, D) of the normal pass at that layer (residual None at layer 0);
        token_rows: (G,) their token indices; final_stream: (G, D) h^(N); normed0: (G, D) its final norm;
        logp0: (G, V) p^(0). Returns (G, D) the final norm of h^(N,k*), the state vLLM's logits come from,
        (G,) k* and (G,) the KL of each row's last iteration.
        """
        hidden, residual = anchor_input
        anchor_all = hidden if residual is None else hidden + residual  # (T, D) the residual stream a
        anchor = anchor_all[token_rows]  # (G, D)
        device = anchor.device
        alpha = torch.tensor([c.alpha for c in configs], dtype=torch.float32, device=device)
        one_minus_alpha = torch.tensor([1.0 - c.alpha for c in configs], dtype=torch.float32, device=device)
        tau_kl = torch.tensor([c.tau_kl for c in configs], dtype=torch.float64, device=device)
        k_max = torch.tensor([c.k_max for c in configs], device=device)
        state, logp_prev, chosen = final_stream, logp0, normed0
        running = torch.ones(len(configs), dtype=torch.bool, device=device)
        iterations = torch.zeros(len(configs), dtype=torch.long, device=device)
        last_kl = torch.zeros(len(configs), dtype=torch.float32, device=device)
        try:
            for k in range(1, int(k_max.max()) + 1):
                fused = fuse(anchor, norm_match(state, anchor), alpha, one_minus_alpha)  # (G, D)
                inputs = anchor_all.clone()
                inputs[token_rows] = fused
                out_hidden, out_residual = self._run_layers(positions, inputs, None, first)
                state = (out_hidden + out_residual)[token_rows]  # (G, D) h^(N,k)
                normed, _ = self.model.norm(out_hidden[token_rows], out_residual[token_rows].clone())
                logp = self._logprobs(normed)
                kl = kl_divergence(logp, logp_prev)
                raise_on_nan_rows([r for r, bad in enumerate((kl.isnan() & running).tolist()) if bad], "a refinement")
                chosen = torch.where(running[:, None], normed, chosen)
                iterations = torch.where(running, k, iterations)
                last_kl = torch.where(running, kl, last_kl)
                running = running & ~refinement_done(kl, tau_kl, k, k_max)  # each row's own KL exit
                logp_prev = logp
                if not bool(running.any()):
                    break
        finally:
            self._run_layers(positions, hidden, residual, first)  # the normal keys/values back into the cache
        return chosen, iterations, last_kl


class EglrLlamaForCausalLM(EglrForCausalLMMixin, LlamaForCausalLM):
    pass


class EglrQwen2ForCausalLM(EglrForCausalLMMixin, Qwen2ForCausalLM):
    pass


class EglrMistralForCausalLM(EglrForCausalLMMixin, MistralForCausalLM):
    pass


class EglrQwen3ForCausalLM(EglrForCausalLMMixin, Qwen3ForCausalLM):
    pass


class EglrGemma3ForCausalLM(EglrForCausalLMMixin, Gemma3ForCausalLM):
    pass
