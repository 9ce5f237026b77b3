"""EGLR (eglr-method.md §2) inside vLLM's forward, for the families whose decoder layers take
``(positions, hidden_states, residual)`` and end in a norm of ``(hidden_states, residual)``: Llama, Qwen2,
Mistral, Qwen3 and Gemma-3 (text; its embedding scale is in ``embed_input_ids``, its soft-cap in
``compute_logits``, both vLLM's own).

One forward pass of the engine covers every scheduled token of every request in the batch. The
EGLR forward runs the normal pass, keeping the residual stream at the input of layer N-L (the
anchor) and after layer N, then, for the row each request samples from (the last scheduled token of
the request: vLLM's ``logits_indices``, ``query_start_loc[1:] - 1``), gates on the entropy of its
logits as vLLM's sampler reads them (``compute_logits``: the family's scale and soft-cap). For
gated rows it runs the refinement loop with the project's pure functions
(``eglr_harness.decoding.functional``) and returns, for those rows, the final norm of the chosen
``h^(N,k*)``, from which vLLM computes the logits it samples (temperature, top-k, seed: vLLM's).
Each row ends by its request's own exit rule (``stop``: the paper's KL, or latent, accel, margin, entropy;
their signals, hits and two-hit streak are ``functional``'s), so one batch mixes rules: each rule's signal is
computed on its own rows only, and only the rows whose rule reads a distribution (kl, margin, entropy) project
the LM head at every iteration; latent's and accel's project it once, at their exit.

Only the gated rows pay. A refinement iteration runs layers N-L..N-1 on the rows still refining and
nothing else: one one-token query per row, at the row's own position, under a forward context of its
own whose attention metadata vLLM's own metadata builder makes for that sub-batch (the rows' sequence
lengths, block-table rows and slots, sliced from the step's: how vLLM's speculative drafters build
metadata for their draft tokens). So each row attends to its past's normal keys/values plus the refined
key/value of its own position (the spec's attention context). Before the loop the cache blocks that
hold those rows' slots in layers N-L..N-1 are copied aside and after it copied back (every layer's
cache is block-major in vLLM): the paged cache ends bit for bit as plain decoding leaves it. A step
costs the normal pass and, per gated row, k* x L/N of a row's forward (plus the copy of the rows' cache
blocks in those layers, twice); the gate's logits, and those of each row's chosen iteration, are the
ones vLLM samples from (``compute_logits`` hands them over: no second (R, V) product). The spans of a
step refine in one pass per iteration: deepest span first, each row joins at its own layer N-L, and the
rows share the final norm and the LM head product (on a CPU or a GPU a few rows' iteration costs the
reading of those weights, whatever the number of rows: a pool paid it once per span before).

Compilation. The normal pass of the families with vLLM's auxiliary hidden-state outputs (Llama,
Mistral, Qwen2, Qwen3: the EAGLE-3 hook of their ``Model.forward``) is the family's own
``Model.forward``, compiled as vLLM compiles it; the anchors come out as its auxiliary outputs (fixed
at build time: the layers ``N - L`` of the spans the engine serves, ``eglr_spans``). Gemma-3's has
none: its EGLR normal pass runs the layers one by one outside the compiled piece. The refinement and
the host decisions (the gate, which rows still run, the exit rules) run between compiled pieces, eagerly
(docs/vllm.md: how this maps onto piecewise CUDA graphs).

Settings come per request (``row_settings.py``), kept per slot of vLLM's persistent batch: under V1's runner
the forward's row i holds slot i; under Model Runner V2 the forward is told its rows' slots by the model's own
MRV2 model state (``model_state.py``). A batch whose requests all decode plainly runs stock vLLM's forward
unchanged. Shape letters: T scheduled tokens of the batch, R requests (rows
sampled), G gated rows, A rows still refining, D hidden, V vocabulary.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import logging

import torch
from vllm.forward_context import ForwardContext, get_forward_context, override_forward_context
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.models.gemma3 import Gemma3ForCausalLM
from vllm.model_executor.models.llama import LlamaForCausalLM
from vllm.model_executor.models.mistral import MistralForCausalLM
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM
from vllm.v1.attention.backend import CommonAttentionMetadata

from eglr_harness.core.config import STOP_RULES, EglrConfig
from eglr_harness.decoding import refine_state
from eglr_harness.decoding.functional import entropy_gate, entropy_of_log_probs, exit_signal, fuse, norm_match
from eglr_harness.vllm.row_settings import REQUEST_SLOTS_ARG, settings_for

# set in the forward context's additional_kwargs while refinement rows run (what a hook may look for)
REFINEMENT_KEY = "eglr_refinement"

logger = logging.getLogger(__name__)


def _warn_on_nan_rows(values: torch.Tensor, where: str, outcome: str = "decode as stock vLLM would") -> None:
    """Log (warning) the rows whose ``values`` ((R,) entropies, or NaN where a row is flagged) are NaN: non-finite
    logits; ``outcome``: what those rows do instead of raising (the NaN policy: ``decoding/refine_state.py``)."""
    rows = values.isnan().nonzero()[:, 0].tolist()
    if rows:
        logger.warning("eglr-vllm: non-finite logits at %s (rows %s); those rows %s. Try dtype=float32 or bfloat16 "
                       "instead of float16.", where, rows, outcome)


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
        check_cudagraph_mode(vllm_config.compilation_config.cudagraph_mode)
        self._eglr_vllm_config = vllm_config
        self._eglr_builders: dict[tuple[str, ...], object] = {}
        num_layers = len(self.model.layers)
        self._eglr_spans = served_spans(vllm_config.model_config.hf_config, num_layers)
        # the family's compiled Model.forward hands out the residual stream at these layer inputs (vLLM's EAGLE-3
        # hook, fixed before vLLM compiles it): the anchors of the spans served (layer 0's, the embedding, is
        # taken from the embedding table instead: the first layer's fused norm updates that tensor in place) and
        # h^(N) after the last layer
        self._eglr_aux_layers = None
        if hasattr(self.model, "_set_aux_hidden_state_layers"):
            self._eglr_aux_layers = tuple(sorted({num_layers - span for span in self._eglr_spans} - {0}
                                                 | {num_layers}))
            self.model._set_aux_hidden_state_layers(self._eglr_aux_layers)

    @staticmethod
    def get_model_state_cls():
        """Model Runner V2's hook for a model's own state (``vllm/v1/worker/gpu/model_states/__init__.py``): the
        one that hands the forward its rows' slots. V1's runner never calls it."""
        from eglr_harness.vllm.model_state import EglrModelState

        return EglrModelState

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs):
        self._eglr_step_logits = None  # a step's logits serve only the compute_logits call right after it
        plan = self._eglr_plan(kwargs.pop(REQUEST_SLOTS_ARG, None))
        if self._eglr_aux_layers is None:  # Gemma-3: stock forward, or the EGLR normal pass layer by layer
            if plan is None:
                return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds, **kwargs)
            normed, streams = self._normal_pass_by_layer(input_ids, positions, inputs_embeds, plan[1])
        else:
            normed, aux = self.model(input_ids, positions, intermediate_tensors, inputs_embeds, **kwargs)
            if plan is None:
                return normed
            streams = dict(zip(self._eglr_aux_layers, aux))
        return self._eglr_step(input_ids, positions, inputs_embeds, normed, streams, *plan)

    def _eglr_plan(self, request_slots: list[int] | None = None
                   ) -> tuple[torch.Tensor, list[EglrConfig], object, list[int]] | None:
        """(sampled rows, their requests' settings, the tracker, the rows' slots), or None when no row can refine
        and none records signals (stock forward). request_slots: MRV2's slot of each row (``model_state.py``)."""
        rows = sampled_rows()
        if rows is None:
            return None
        tracker = settings_for(self._eglr_vllm_config)
        if tracker is None:
            raise RuntimeError("eglr-vllm: the EglrRowSettings logits processor is not loaded in this engine; "
                               "allowed: an engine built with eglr_harness.vllm.engine_args (its logits_processors).")
        slots = tracker.batch_slots(rows.numel(), request_slots)
        if slots is None:
            return None
        configs = tracker.configs(slots)
        if not any(config.refines for config in configs) and not tracker.records(slots):
            return None
        # every L here is one the model serves: admission refuses the others, and the tracker decodes plainly any
        # that an engine without spans admitted (``EglrRowSettings._set_slot``); nothing here raises for a request,
        # which would stop the engine and every request in it
        return rows, configs, tracker, slots

    def _normal_pass_by_layer(self, input_ids, positions, inputs_embeds, configs):
        """The normal pass layer by layer (families without auxiliary outputs): ((T, D) final-normed states,
        {layer index: (T, D) residual stream at its input} for the spans' anchors and layer N)."""
        model = self.model
        num_layers = len(model.layers)
        wanted = {num_layers - config.L for config in configs if config.refines} - {0}
        hidden = inputs_embeds if inputs_embeds is not None else model.embed_input_ids(input_ids)
        residual = None
        streams = {}
        for index, layer in enumerate(model.layers):
            if index in wanted:
                streams[index] = hidden + residual
            hidden, residual = layer(positions, hidden, residual)
        streams[num_layers] = hidden + residual
        normed, _ = model.norm(hidden, residual)  # in place: the streams are copies
        return normed, streams

    def _anchors(self, input_ids, inputs_embeds, streams, firsts: list[int], token_rows) -> torch.Tensor:
        """(G, D) each gated row's anchor: the residual stream at the input of its layer ``firsts[g]`` (= N-L), for
        the token rows ``token_rows`` (G,)."""
        anchors = None
        for first in sorted(set(firsts)):
            group = torch.tensor([g for g, f in enumerate(firsts) if f == first], device=token_rows.device)
            if first > 0:
                values = streams[first][token_rows[group]]
            elif inputs_embeds is not None:
                values = inputs_embeds[token_rows[group]]
            else:
                values = self.model.embed_input_ids(input_ids[token_rows[group]])
            if anchors is None:
                anchors = values.new_empty((len(firsts), values.shape[-1]))
            anchors[group] = values
        return anchors

    def compute_logits(self, hidden_states: torch.Tensor):
        """vLLM's logits of the sampled rows; after an EGLR step, the logits that step already computed for the
        states it returned (the same function of the same states: the gate's for ungated rows, the chosen
        iteration's for gated ones), so L = 0 costs no second (R, V) product."""
        cached, self._eglr_step_logits = getattr(self, "_eglr_step_logits", None), None
        if cached is not None and cached.shape[0] == hidden_states.shape[0]:
            return cached
        return super().compute_logits(hidden_states)

    def _logits_and_logprobs(self, normed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(R, D) final-normed states -> ((R, V) the logits vLLM samples from, (R, V) their fp32 log-probabilities)."""
        logits = super().compute_logits(normed)
        return logits, torch.log_softmax(logits.float(), dim=-1)

    def _eglr_step(self, input_ids, positions, inputs_embeds, normed, streams, rows: torch.Tensor,
                   configs: list[EglrConfig], tracker, slots: list[int]):
        """Gate the sampled rows on the normal pass and refine the gated ones; returns (T, D) final-normed states
        (the gated rows' replaced by those of their chosen h^(N,k*))."""
        num_layers = len(self.model.layers)
        final_stream = streams[num_layers][rows]  # (R, D) h^(N), before the final norm
        logits, logp = self._logits_and_logprobs(normed[rows])  # (R, V) each
        entropies = entropy_of_log_probs(logp)  # (R,)
        # a row with non-finite logits decodes as stock vLLM would (its gate stays shut: NaN > tau_h is false);
        # raising here would stop the engine and every other request with it
        _warn_on_nan_rows(entropies, "the normal pass")
        tau_h = torch.tensor([config.tau_h for config in configs], dtype=torch.float64, device=entropies.device)
        normed = normed.clone()
        iterations = torch.zeros(len(configs), dtype=torch.long, device=entropies.device)  # (R,) k*, 0 ungated
        # (R,) each row's last exit signal (the KL with stop=kl; what the signal record calls its last KL), 0 ungated
        last_kls = torch.zeros(len(configs), dtype=torch.float32, device=entropies.device)
        refines = torch.tensor([config.refines for config in configs], device=entropies.device)
        # the G gated requests, deepest span first: the rows that run a layer are then a prefix of those still refining
        order = sorted(entropy_gate(entropies, tau_h, refines).nonzero()[:, 0].tolist(), key=lambda i: -configs[i].L)
        if order:
            gated = torch.tensor(order, device=rows.device)  # (G,)
            gated_configs = [configs[i] for i in order]
            firsts = [num_layers - config.L for config in gated_configs]
            token_rows = rows[gated]
            anchors = self._anchors(input_ids, inputs_embeds, streams, firsts, token_rows)
            refined, refined_logits, k_star, signal = self._refine(
                positions, anchors, firsts, gated, token_rows, final_stream[gated], normed[token_rows], logits[gated],
                logp[gated], gated_configs)
            normed[token_rows], logits[gated] = refined, refined_logits
            iterations[gated], last_kls[gated] = k_star, signal
        if tracker.records(slots):
            tracker.record(slots, entropies.tolist(), iterations.tolist(), last_kls.tolist())
        self._eglr_step_logits = logits
        return normed

    def _refine(self, positions, anchors, firsts: list[int], requests, token_rows, final_stream, normed0, logits0,
                logp0, configs):
        """The refinement loop of the G gated rows, every span in one pass per iteration, each row ending by its own
        exit rule (``EglrConfig.stop``, its threshold and k_max).

        anchors: (G, D) each row's anchor a, the input of its layer ``firsts[g]`` (= N-L), ``firsts`` ascending (the
        deepest span first); requests: (G,) their requests' indices in the step's batch; token_rows: (G,) their
        token indices; final_stream: (G, D) h^(N); normed0: (G, D) its final norm; logits0, logp0: (G, V) its logits
        and p^(0). An iteration runs each layer on the rows still refining whose span covers it, only them: a row
        joins the pass at its own first layer (as the residual stream u, the fused state: its residual part zero),
        and the A rows still refining share one final norm and one LM head product (a pool of spans pays its
        deepest span's weights once per iteration, not once per span). Only the rows whose rule reads a
        distribution (``StopRule.head_per_iteration``: kl, margin, entropy) project the head at every iteration;
        latent's and accel's rows project it once, on their state at the exit. Returns (G, D) the final norm of
        h^(N,k*), the state vLLM's logits come from, (G, V) those logits, (G,) k* and (G,) the exit signal of each
        row's last iteration (the KL with ``stop=kl``).
        """
        device = anchors.device
        num_layers = len(self.model.layers)
        alpha = torch.tensor([c.alpha for c in configs], dtype=torch.float32, device=device)
        one_minus_alpha = torch.tensor([1.0 - c.alpha for c in configs], dtype=torch.float32, device=device)
        threshold = torch.tensor([c.stop_threshold for c in configs], dtype=torch.float64, device=device)
        k_max = torch.tensor([c.k_max for c in configs], device=device)
        rules = [c.stop for c in configs]
        state = final_stream.clone()  # (G, D) h^(N,k) of each row's last iteration
        state_before = final_stream.clone()  # (G, D) h^(N,k-1) (accel's second difference; any value at k = 1)
        logp_prev, chosen, chosen_logits = logp0.clone(), normed0.clone(), logits0.clone()
        exit_state = final_stream.clone()  # (G, D) h^(N,k*) of the rows that project the head once, at the exit
        rows_state = refine_state.start(torch.ones(len(configs), dtype=torch.bool, device=device))  # running, k*, ...
        # (forward context, (A', ) positions) of each set of rows a segment has run, built once per call: rows
        # mostly run every iteration (k_max), and a context's attention metadata, like a step's, serves every layer
        sub_batches: dict[tuple[int, ...], tuple[ForwardContext, torch.Tensor]] = {}
        with contextlib.ExitStack() as kept:
            for start, end, count in layer_segments(firsts, num_layers):
                kept.enter_context(kept_kv_blocks(attention_layer_names(self.model.layers[start:end]),
                                                  token_rows[:count], self._eglr_vllm_config))
            for k in range(1, int(k_max.max()) + 1):
                # the A rows still refining (ascending: still the deepest span first) fuse anchor and last state
                active_rows = rows_state.running.nonzero()[:, 0].tolist()
                active = torch.tensor(active_rows, device=device)  # (A,)
                fused = fuse(anchors[active], norm_match(state[active], anchors[active]), alpha[active],
                             one_minus_alpha[active])  # (A, D)
                # layers N-L..N-1, each row joining at its own layer N-L
                hidden, residual = self._run_segments(fused, active_rows, active, firsts, requests, token_rows,
                                                      positions, sub_batches)
                new_state = hidden + residual  # (A, D) h^(N,k)
                # the head on the rows whose rule reads p_k, in one product (``heads``: their positions)
                groups = rule_groups([rules[i] for i in active_rows])
                heads = sorted(a for name, members in groups for a in members if STOP_RULES[name].head_per_iteration)
                if heads:
                    head_at = None if len(heads) == len(active_rows) else torch.tensor(heads, device=device)
                    normed, _ = (self.model.norm(hidden, residual) if head_at is None else
                                 self.model.norm(hidden[head_at], residual[head_at]))
                    logits, logp = self._logits_and_logprobs(normed)  # (H, V) each: row h is active row heads[h]
                    head_of = {a: h for h, a in enumerate(heads)}
                # each rule's signal and exit, on its own rows only
                for name, members in groups:
                    at = torch.tensor(members, device=device)  # positions among the active rows
                    rows = active[at]
                    if STOP_RULES[name].head_per_iteration:
                        value = exit_signal(name, logp=logp[torch.tensor([head_of[a] for a in members],
                                                                         device=device)], logp_prev=logp_prev[rows])
                    else:
                        value = exit_signal(name, hidden=new_state[at], hidden_prev=state[rows],
                                            hidden_prev2=state_before[rows])
                    signal = torch.zeros(len(configs), dtype=torch.float32, device=device).index_copy(0, rows, value)
                    members_mask = torch.zeros_like(rows_state.running).index_fill(0, rows, True)
                    rows_state, _ = refine_state.advance(rows_state, name, signal, threshold, k, k_max, members_mask)
                # the rows that took iteration k keep its state and logits (a NaN one is not taken: refine_state)
                took = rows_state.iterations[active] == k  # (A,)
                if heads:
                    head_rows = active if head_at is None else active[head_at]
                    head_took = took if head_at is None else took[head_at]
                    chosen[head_rows[head_took]] = normed[head_took]
                    chosen_logits[head_rows[head_took]] = logits[head_took]
                    logp_prev[head_rows] = logp
                exit_state[active[took]] = new_state[took]  # read only for the rows that project at the exit
                state_before[active], state[active] = state[active], new_state
                if not bool(rows_state.running.any()):
                    break
        rows_state = self._project_at_exit(chosen, chosen_logits, exit_state, rows_state, configs)
        _warn_on_nan_rows(torch.where(rows_state.non_finite, torch.nan, 0.0), "a refinement (gated rows)",
                          "keep their last finite iteration (the normal pass's if none)")
        return chosen, chosen_logits, rows_state.iterations, rows_state.signal

    def _run_segments(self, fused, active_rows: list[int], active, firsts, requests, token_rows, positions,
                      sub_batches) -> tuple[torch.Tensor, torch.Tensor]:
        """Layers N-L..N-1 of one iteration on the A rows still refining (``active_rows``, the deepest span first),
        each row joining at its own first layer ``firsts[g]``; ``sub_batches`` caches each set of rows' forward
        context. fused: (A, D) -> the last layer's (hidden, residual), (A, D) each."""
        hidden, residual, entered = None, None, 0
        for start, end, count in layer_segments([firsts[i] for i in active_rows], len(self.model.layers)):
            joining = fused[entered:count]
            if hidden is None:  # the deepest rows start the pass as a stack's first layer does
                hidden = joining
            else:  # the rows of a shorter span join with their residual part zero: u + 0 is u, exactly
                hidden = torch.cat([hidden, joining])
                residual = torch.cat([residual, torch.zeros_like(joining)])
            entered = count
            key = tuple(active_rows[:count])
            if key not in sub_batches:
                these = active[:count]
                sub_batches[key] = (self._sub_batch_context(requests[these], token_rows[these]),
                                    positions[token_rows[these]])
            context, these_positions = sub_batches[key]
            with override_forward_context(context):
                for layer in self.model.layers[start:end]:
                    hidden, residual = layer(these_positions, hidden, residual)
        return hidden, residual

    def _project_at_exit(self, chosen, chosen_logits, exit_state, rows_state, configs):
        """The one head projection of the rows whose rule reads no distribution per iteration (latent, accel), on
        their state at the exit, written into ``chosen`` (G, D) and ``chosen_logits`` (G, V) in place.

        exit_state: (G, D) each row's h^(N,k*); rows_state: the loop's ``RefineState`` (a row with no iteration
        taken keeps the normal pass's). A row whose exit logits are not finite keeps the normal pass's (as stock
        vLLM decodes it) and is flagged in the returned state (``refine_state.exit_projection``)."""
        once = [g for g, config in enumerate(configs) if not config.stop_rule.head_per_iteration]
        if not once:
            return rows_state
        once = torch.tensor(once, device=exit_state.device)
        normed = self.model.norm(exit_state[once])
        logits, logp = self._logits_and_logprobs(normed)
        these, use = refine_state.exit_projection(refine_state.RefineState(*(t[once] for t in rows_state)), logp)
        chosen[once[use]], chosen_logits[once[use]] = normed[use], logits[use]
        return rows_state._replace(non_finite=rows_state.non_finite.index_copy(0, once, these.non_finite))

    def _sub_batch_context(self, requests: torch.Tensor, token_rows: torch.Tensor) -> ForwardContext:
        """The step's forward context cut to one one-token query per row: row i is token ``token_rows[i]`` of
        request ``requests[i]`` (its own position and slot, its request's sequence length and block-table row),
        with attention metadata built by vLLM's own builder of each layer group. Marked ``REFINEMENT_KEY``."""
        context = get_forward_context()
        count = int(requests.numel())
        metadata, slots, built = {}, {}, {}
        for name, step_metadata in context.attn_metadata.items():
            if id(step_metadata) not in built:
                names = tuple(n for n, m in context.attn_metadata.items() if m is step_metadata)
                seq_lens = step_metadata.seq_lens[requests]
                starts = torch.arange(count + 1, dtype=torch.int32, device=seq_lens.device)
                common = CommonAttentionMetadata(
                    query_start_loc=starts, query_start_loc_cpu=starts.cpu(), seq_lens=seq_lens, num_reqs=count,
                    num_actual_tokens=count, max_query_len=1, max_seq_len=int(seq_lens.max()),
                    block_table_tensor=step_metadata.block_table[requests],
                    slot_mapping=context.slot_mapping[name][token_rows])
                built[id(step_metadata)] = self._builder(context, names).build(0, common)
            metadata[name] = built[id(step_metadata)]
            slots[name] = context.slot_mapping[name][token_rows]
        return dataclasses.replace(context, attn_metadata=metadata, slot_mapping=slots, batch_descriptor=None,
                                   ubatch_slices=None, is_padding=None,
                                   additional_kwargs={**context.additional_kwargs, REFINEMENT_KEY: True})

    def _builder(self, context: ForwardContext, names: tuple[str, ...]):
        """vLLM's attention metadata builder of the layer group ``names`` (made once, as the runner makes its own)."""
        if names not in self._eglr_builders:
            layer = context.no_compile_layers[names[0]]
            spec = layer.get_kv_cache_spec(self._eglr_vllm_config)
            self._eglr_builders[names] = layer.get_attn_backend().get_builder_cls()(
                spec, list(names), self._eglr_vllm_config, self.model.norm.weight.device)
        return self._eglr_builders[names]


def check_cudagraph_mode(mode) -> None:
    """One-line ValueError for a ``cudagraph_mode`` with full CUDA graphs: a full graph captures the whole forward
    of this class, the gate's and the refinement's host decisions included, at capture time (where no request
    refines) and replays that, so EGLR would silently never refine. Piecewise graphs capture only the compiled
    ``Model.forward`` (docs/vllm.md); None or NONE: no graphs (the CPU)."""
    if mode is not None and mode.has_full_cudagraphs():
        raise ValueError(f"eglr-vllm: cudagraph_mode={mode.name} is not allowed; allowed: PIECEWISE or NONE (a full "
                         "CUDA graph replays the EGLR forward's host decisions as captured: it would never refine; "
                         "eglr_harness.vllm.engine_args sets PIECEWISE).")


def served_spans(hf_config, num_layers: int) -> tuple[int, ...]:
    """The spans L an engine refines with: the config's ``eglr_spans`` (``engine_args(..., spans=...)``), else every
    L in 1..N. One-line ValueError for a span outside 1..N."""
    spans = getattr(hf_config, "eglr_spans", None)
    if spans is None:
        return tuple(range(1, num_layers + 1))
    bad = [span for span in spans if not (isinstance(span, int) and 1 <= span <= num_layers)]
    if bad:
        raise ValueError(f"eglr-vllm: eglr_spans value {bad[0]!r} is not allowed; allowed: integers 1..{num_layers}.")
    return tuple(sorted(set(spans)))


def rule_groups(rules: list[str]) -> list[tuple[str, list[int]]]:
    """The positions of each exit rule in ``rules`` (one per row), rules in order of first appearance.

    >>> rule_groups(["kl", "latent", "kl"])
    [('kl', [0, 2]), ('latent', [1])]
    """
    groups: dict[str, list[int]] = {}
    for position, rule in enumerate(rules):
        groups.setdefault(rule, []).append(position)
    return list(groups.items())


def layer_segments(firsts: list[int], num_layers: int) -> list[tuple[int, int, int]]:
    """The layers of one refinement pass cut where a span starts: (start, end, rows) per segment, layers
    start..end-1 run on the first ``rows`` rows. ``firsts``: each row's first layer N-L, ascending.

    >>> layer_segments([2, 2, 5], 8)
    [(2, 5, 2), (5, 8, 3)]
    """
    starts = sorted(set(firsts))
    return [(start, end, bisect.bisect_right(firsts, start))
            for start, end in zip(starts, [*starts[1:], num_layers])]


def attention_layer_names(layers) -> list[str]:
    """The names vLLM gave the attention layers inside ``layers`` (its forward context's keys)."""
    return [module.layer_name for layer in layers for module in layer.modules() if isinstance(module, Attention)]


@contextlib.contextmanager
def kept_kv_blocks(names: list[str], token_rows: torch.Tensor, vllm_config):
    """While open, the paged keys/values that layers ``names`` hold in the cache blocks of the step's tokens
    ``token_rows`` (G,) may be overwritten; on leaving those blocks hold again, bit for bit, what they held on
    entry.

    Whole blocks: every layer's cache is block-major ([blocks, ...], vLLM's RFC #42082), but how a block lays out
    its tokens is the backend's (the CPU one keeps a block's keys, then its values). A slot is block * block size
    + offset (the step's slot mapping, per layer; the block size is the cache spec's)."""
    context = get_forward_context()
    saved = []
    for name in names:
        layer = context.no_compile_layers[name]
        block_size = layer.get_kv_cache_spec(vllm_config).block_size
        blocks = torch.unique(context.slot_mapping[name][token_rows].long() // block_size)
        saved.append((layer.kv_cache, blocks, layer.kv_cache[blocks]))  # a copy: indexing by a tensor gathers
    try:
        yield
    finally:
        for cache, blocks, values in saved:
            cache[blocks] = values


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
