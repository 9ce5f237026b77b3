"""One decoding step of the continuous engine as a function of fixed-shape tensors.

A step takes A advancing slots and R refining slots (index tensors whose sizes are buckets chosen
by the host; padding entries name the trash slot, whose results are never read) and runs

- layers 0 .. join-1 on the A advancing rows (their newest token, embedded); none of them when A = 0
  (a step of refining rows only: it reads the top layers' weights alone),
- layers join .. N-1 on the A + R rows, the refining rows entering at ``join`` = N - max L with
  their fused state u; a refining row of a smaller L has u put back at its own layer N - L (a
  masked select: the few layers it ran before are discarded, shapes never change),
- the final norm and unembedding, then ``settle``: the entropy gate, the iteration counters and
  the exit rule (``invariants.stop``: the KL, or another of ``core.config.STOP_RULES``; the unembedding runs
  on every row of every step whatever the rule, the shapes being fixed) as masks, the token (argmax,
  or the per-row Gumbel-max draw), the per-slot state updates as scatters, and the one small read
  the host needs (``step_state.READ_FIELDS``).

Nothing here branches on a tensor value, reads a tensor on the host or makes a data-dependent
shape, so ``torch.compile(decode_step, fullgraph=True)`` traces it whole
(tests/decoding/test_fixed_step.py), and on CUDA it can be captured as a CUDA graph per (A, R, width) bucket.

What holds for "a row's tokens depend only on its own request": the row's draws depend only on its seed
and token index (``sampling.py``); its attention reads its own slot only (masks by slot); every other op
is row-wise. On CPU in fp32 the tokens are the same alone or in any batch and any slot (tested), and an
eager step of few rows, which attends over its rows' own slots gathered (``gathers``), computes what it
computes in place (the same tokens, tested; at one thread the same bits; more threads may split the
attention's work otherwise, which would move last bits only). On a GPU (bf16 especially) a matmul's
kernel and its reduction order may depend on the number of rows it is called with: here that is the
step's (A, R) buckets (and the prefill's row count), never the neighbours' lengths or positions, since
the K/V width is a length bucket of the running batch. A row's logits can therefore differ in the last
bits between two runs whose buckets differ (another max_batch, or a run whose other rows finish
earlier), as with any batched decoding; with the same buckets and the same inputs the step is
deterministic.

Shape letters: the package's legend (``eglr_harness/decoding/__init__.py``).
"""

from __future__ import annotations

import torch

from eglr_harness.decoding.continuous.kv_slots import SlotCache, SlotView, decode_masks
from eglr_harness.decoding.continuous.stack import call_layer
from eglr_harness.decoding.continuous.step_state import READ_FIELDS, RowPhase, SlotState, StepInvariants
from eglr_harness.decoding import refine_state
from eglr_harness.decoding.functional import entropy_gate, entropy_of_log_probs, exit_signal, fuse, norm_match, softcap
from eglr_harness.decoding.processors import ban_ngram_repeats, ban_tokens, penalize_repeats
from eglr_harness.decoding.sampling import sample_rows


def process(invariants: StepInvariants, state: SlotState, rows: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """generate's logits processors, in its order, on the logits a step emits from (``processors.py``).

    rows: (G,) slots; scores: (G, V) fp32 -> (G, V). Only the processors some row of the run uses run.
    """
    used, settings = invariants.processors, state.settings
    if used.penalty:
        scores = penalize_repeats(scores, state.seen[rows], settings.penalty[rows])
    if used.ngram_size:
        scores = ban_ngram_repeats(scores, state.history[rows], state.position[rows] + 1, used.ngram_size,
                                   settings.ngram[rows])
    if used.eos_block:
        scores = ban_tokens(scores,
                            (state.drawn[rows] < settings.eos_blocked_until[rows])[:, None] & settings.eos[None])
    if used.suppress:
        scores = ban_tokens(scores, settings.suppress[rows])
    if used.begin_suppress:
        scores = ban_tokens(scores, settings.begin_suppress[rows] & (state.drawn[rows] == 0)[:, None])
    return scores


def remember_tokens(invariants: StepInvariants, state: SlotState, rows: torch.Tensor, token: torch.Tensor,
                    emits: torch.Tensor) -> None:
    """What the processors of later tokens read: the emitted tokens as seen, and by position.  rows, token, emits:
    (G,)."""
    if invariants.processors.penalty:
        seen = state.seen[rows, token]
        state.seen.index_put_((rows, token), seen | emits)
    if invariants.processors.ngram_size:
        at = (state.position[rows] + 1).clamp(max=state.history.shape[1] - 1)  # the emitted token's position
        state.history.index_put_((rows, at), torch.where(emits, token, state.history[rows, at]))


def settle(stack, invariants: StepInvariants, state: SlotState, rows: torch.Tensor, num_refining: int,
           last_hidden: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
    """Gate the rows that advanced, run the exit rule (``invariants.stop``) of the rows that refined, pick tokens,
    update the slots.

    rows: (G,) slots, the last ``num_refining`` of them refining; last_hidden: (G, D) h^(N) before
    the final norm; raw: (G, V) logits before any soft-cap. Returns the read: (G, len(READ_FIELDS)) fp32.
    """
    settings = state.settings  # the requests' (read only), beside the slots' running state
    final = softcap(raw.float(), invariants.logit_softcap)  # fp32: what the gate, the KL exit and log-probs read
    decode_logits = final if invariants.logit_softcap is None else stack.emitted(raw)  # what generate decodes from
    logp = torch.log_softmax(final, dim=-1)
    entropy = entropy_of_log_probs(logp)  # (G,)
    num_adv = rows.shape[0] - num_refining
    refining = torch.arange(rows.shape[0], device=rows.device) >= num_adv  # (G,)
    ref = rows[num_adv:]  # (R,) the refining rows' slots: their previous iteration's state is in the slots
    signal = exit_signal(invariants.stop, logp=logp[num_adv:], logp_prev=state.logp_prev[ref],
                         hidden=last_hidden[num_adv:],
                         hidden_prev=state.h_prev[ref], hidden_prev2=state.h_prev2[ref])  # (R,)
    kl = torch.cat([torch.zeros(num_adv, dtype=signal.dtype, device=signal.device), signal])  # (G,) the exit signal
    # the refining rows' iteration: their counters resume from the slots (the advancing rows' from 0)
    resumed = refine_state.start(refining, torch.where(refining, state.iterations[rows], 0),
                                 torch.where(refining, state.streak[rows], 0))
    refined, _ = refine_state.advance(resumed, invariants.stop, kl, settings.stop_threshold[rows],
                                      resumed.iterations + 1, settings.k_max[rows])
    gated = entropy_gate(entropy, settings.tau_h[rows], ~refining)
    emits = (~refining & ~gated) | (refining & ~refined.running)  # plain rows, and rows whose refinement ended
    scores = process(invariants, state, rows, decode_logits)
    token = scores.argmax(dim=-1)
    if invariants.sampled:
        drawn = sample_rows(scores, settings.temperature[rows], settings.top_k[rows], settings.top_p[rows],
                            settings.seed[rows], state.drawn[rows], invariants.num_candidates,
                            min_p=settings.min_p[rows] if invariants.processors.min_p else None)
        token = torch.where(settings.sampled[rows], drawn, token)
    logprob = logp.gather(1, token[:, None])[:, 0]
    nan = entropy.isnan() | refined.non_finite  # the host raises on these (the NaN policy: refine_state.py)
    # the slots' state: where the next iteration starts from, counters, the token to feed next
    if invariants.stop == "accel":  # the second difference reads two iterations back
        state.h_prev2.index_copy_(0, rows, state.h_prev[rows])
    state.h_prev.index_copy_(0, rows, last_hidden.to(state.h_prev.dtype))
    state.streak.index_copy_(0, rows, refined.streak)
    state.logp_prev.index_copy_(0, rows, logp)
    state.iterations.index_copy_(0, rows, refined.iterations)
    state.token.index_copy_(0, rows, torch.where(emits, token, state.token[rows]))
    remember_tokens(invariants, state, rows, token, emits)
    state.drawn.index_add_(0, rows, emits.long())
    read = {"token": torch.where(emits, token, -1).float(), "gated": gated.float(), "emitted": emits.float(),
            "entropy": entropy, "logprob": logprob, "kl": refined.signal,
            "iterations": refined.iterations.float(), "nan": nan.float()}
    return torch.stack([read[name] for name in READ_FIELDS], dim=1)  # the host reads its columns by these names


# An eager step whose rows are at most this share of the slots attends over the rows' own slots, their K/V
# columns gathered, instead of over every slot's: a step of few rows (the last rows of a batch, a step of
# refining rows only) then reads the K/V of its rows, not of the whole batch. A gather copies what it reads
# (on SmolLM2's shapes, CPU: gathering 32 of 33 slots cost 1.5x attending over all 33), so a full batch
# attends in place. A compiled layer never gathers: its inputs keep one form (no second compilation).
GATHER_SHARE = 1 / 3


def gathers(layers, rows: int, slots: int) -> bool:
    """Whether a step's layers, run by ``layers`` on ``rows`` rows of ``slots`` slots (the trash slot
    included), attend over the rows' own slots gathered (``GATHER_SHARE``): eager layers only."""
    return layers is call_layer and rows <= GATHER_SHARE * slots


def save_anchors(anchor: torch.Tensor, slots: torch.Tensor, hidden: torch.Tensor, entry: torch.Tensor,
                 layer: int) -> None:
    """Keep, as the anchor a (eglr-method.md §2), the input of ``layer`` of the rows that enter refinement
    there: the hidden state at layer N - L of the position they are decoding. Used by the step (advancing
    rows) and the prefill (rows whose prompt ends), so an anchor is taken one way wherever it is taken.

    anchor: (B+1, D) the slots' anchors, written in place; slots: (G,) the rows' slots; hidden: (G, D) their
    input to ``layer``; entry: (G,) N - L of each row (rows of other spans keep their anchor).
    """
    takes = (entry == layer)[:, None]
    anchor.index_copy_(0, slots, torch.where(takes, hidden.to(anchor.dtype), anchor[slots]))


def decode_step(stack, invariants: StepInvariants, state: SlotState, cache: SlotCache, advancing: torch.Tensor,
                refining: torch.Tensor, layers=call_layer) -> torch.Tensor:
    """One decoding step of every running row.

    advancing: (A,) slots that feed their newest token; refining: (R,) slots that run one iteration
    (R may be 0; A may be 0 when R is not: the step then runs the layers from ``join`` on only, for its
    refining rows); padding entries of both are the trash slot. The attention reads the first
    ``cache.width`` columns of the slots. layers: how a decoder layer runs (``stack.call_layer``, or
    its compiled form: ``step_graphs.py``). Returns settle's read, (A + R, F).
    """
    slots, num_layers, settings = state.position.shape[0], invariants.num_layers, state.settings
    num_adv, num_ref = advancing.shape[0], refining.shape[0]
    phase = torch.full((slots,), RowPhase.PREFILL, dtype=torch.long, device=advancing.device)  # idle slots
    phase = phase.index_fill(0, advancing, RowPhase.ADVANCE).index_fill(0, refining, RowPhase.REFINE)
    is_refining = phase == RowPhase.REFINE
    # (B,)
    query = torch.where(phase == RowPhase.ADVANCE, state.position + 1, torch.where(is_refining, state.position, 0))
    masks = {kind: SlotView.of(advancing, mask, state.anchor.dtype)
             for kind, mask in decode_masks(query, is_refining, cache.width, stack.windows).items()}
    angles_all = stack.rotary_angles(state.anchor[:, None], query[:, None])  # per kind (B, 1, d)

    hidden = stack.embed(state.token[advancing][:, None])  # (A, 1, D)
    # column 1 + p of the new position p; the clamp only ever bites the trash slot, whose position runs on
    rows, columns = advancing, (state.position[advancing] + 2).clamp(max=cache.width - 1)
    if num_ref:
        anchor = state.anchor[refining]
        fused = fuse(anchor, norm_match(state.h_prev[refining], anchor), settings.alpha[refining],
                          settings.one_minus_alpha[refining])[:, None]  # (R, 1, D)
        entry = num_layers - settings.L[refining]  # (R,) the layer each refining row enters at
    adv_entry = num_layers - settings.L[advancing]  # (A,) where each advancing row's anchor is taken
    # a step of refining rows only (A = 0) starts at join: the layers below it would run for no row
    first = invariants.join_layer if num_adv == 0 and num_ref else 0
    views = angles = None
    for index in range(first, num_layers):
        if num_ref and index == invariants.join_layer:
            hidden = torch.cat([hidden, fused.to(hidden.dtype)])
            rows = torch.cat([advancing, refining])
            columns = torch.cat([columns, torch.zeros_like(refining)])  # a refined key/value goes to the scratch column
            views = None
        elif num_ref and index in invariants.entry_layers and index > invariants.join_layer:
            enters = (entry == index)[:, None, None]
            hidden = torch.cat([hidden[:num_adv], torch.where(enters, fused.to(hidden.dtype), hidden[num_adv:])])
        if index in invariants.entry_layers:
            save_anchors(state.anchor, advancing, hidden[:num_adv, 0], adv_entry, index)
        if views is None:
            gather = gathers(layers, rows.shape[0], slots)
            if gather:  # the attention reads the rows' own slots, gathered in the rows' order
                local = torch.arange(rows.shape[0], device=rows.device)
                views = {kind: SlotView(local, view.mask[rows], view.bias[rows]) for kind, view in masks.items()}
            else:
                views = {kind: SlotView(rows, view.mask, view.bias) for kind, view in masks.items()}
            angles = {kind: (cos[rows], sin[rows]) for kind, (cos, sin) in angles_all.items()}
            positions = query[rows][:, None]
        kind = stack.layer_kinds[index]
        hidden = layers(stack.parts.layers[index], hidden, views[kind], angles[kind], positions,
                        cache.layer(index, rows, columns, gather))
    state.position.index_add_(0, advancing, torch.ones_like(advancing))
    last_hidden = hidden[:, 0]
    return settle(stack, invariants, state, rows, num_ref, last_hidden, stack.logits(last_hidden))
