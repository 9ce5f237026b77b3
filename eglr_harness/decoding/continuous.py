"""The continuous engine: EGLR with refinement folded into the batch, and continuous batching.

``generate`` (the ``hf`` engine, ``generate.py``) refines inside a decoding step: the step waits
while its gated rows re-run the top L layers, and a pass over a few rows costs about what the
whole batch's step costs, since the layers' weights are read once per call either way. Here every
running row is, at each step, either

- **advancing**: a normal forward of its newest token through all N layers, or
- **refining**: one EGLR iteration (eglr-method.md §2, step 3) of its pending position t, which
  joins the batch at layer N-L with its fused state ``u`` and runs the top L layers only,

so the top layers' weights are read once for both kinds of row. A refining row's key/value goes to
its scratch column (``slots.py``); the cache keeps the normal pass's key/value at t. A row emits a
token when it is not gated, or when its refinement ends (KL exit or k_max), from the last
distribution computed; then it advances again. Finished rows leave and waiting requests are
prefilled into the free slots, so the batch stays full. A row's tokens depend only on its own
request: sampling draws from the row's own seeded generator, one draw per emitted token, as the
``hf`` engine does.

Shape letters: B slots, G rows of a forward, D hidden size, V vocabulary, Q prompt positions.
"""

from __future__ import annotations

import math
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import StopStringCriteria

from eglr_harness.config import EglrConfig
from eglr_harness.decoding.accounting import EglrStats
from eglr_harness.decoding.functional import (
    entropy_of_log_probs, fuse, kl_divergence, norm_match, raise_on_nan_rows, softcap,
)
from eglr_harness.decoding.sampling import draw, warp
from eglr_harness.decoding.slots import SlotCache, SlotView, decode_masks, prefill_masks
from eglr_harness.decoding.stack import ModelStack

_IDLE, _ADVANCE, _REFINE = 0, 1, 2


@dataclass(frozen=True)
class Request:
    """One rollout to decode.

    prompt: its token ids (no padding); config: its EGLR cell (L, T, alpha, k_max, tau_kl, tau_h,
    top_k, top_p); seed: the row's generator seed when T > 0; stop_strings: texts that end it.
    """

    prompt: tuple[int, ...]
    config: EglrConfig
    max_new_tokens: int
    seed: int | None = None
    stop_strings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.prompt:
            raise ValueError("a Request needs a prompt of at least one token.")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"`max_new_tokens`={self.max_new_tokens!r} is not allowed; allowed: an int >= 1.")
        if self.config.sampled and self.seed is None:
            raise ValueError(f"a sampled Request (T={self.config.T}) needs its row `seed`.")


@dataclass
class Outcome:
    """What one request produced: its new tokens (the stop token included), why it ended
    (``"eos"``, ``"stop"`` or ``"length"``), its accounting and, when recorded, the raw-logit
    entropy of every normal pass."""

    tokens: list[int] = field(default_factory=list)
    finish: str = ""
    gated: int = 0
    iterations: Counter = field(default_factory=Counter)  # k* -> gated tokens
    entropies: list[float] = field(default_factory=list)


@dataclass
class _Row:
    request: Request
    outcome: Outcome
    index: int  # of the request
    position: int  # last position whose key/value is in the slot
    phase: int = _ADVANCE
    iterations_done: int = 0
    generator: torch.Generator | None = None


class ContinuousEngine:
    """Decodes many requests with EGLR through one running batch of ``max_batch`` slots.

    Args:
        model: a transformers causal LM of a family ``stack.ModelStack`` supports, on one device.
        max_batch: rows advancing together (the batch size of plain decoding).
        eos_token_ids: tokens that end a row (``generate``'s ``eos_token_id``).
        tokenizer: needed when requests have stop strings.
        admit_at: prefill waiting requests once this many rows can be admitted (or the batch is
            empty); fewer, larger prefills read the weights fewer times.
        refine_headroom: extra slots, as a share of ``max_batch``, for rows that are refining. A
            refining row emits nothing that step; without headroom it would take an advancing
            row's place, and a step (whose cost is mostly reading the weights on an accelerator)
            would emit fewer tokens. With it, ``max_batch`` rows keep advancing while the refining
            ones ride along in the top L layers.
    """

    def __init__(self, model, *, max_batch: int, eos_token_ids: Sequence[int] = (), tokenizer=None,
                 admit_at: int | None = None, refine_headroom: float = 0.5):
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"`max_batch`={max_batch!r} is not allowed; allowed: an int >= 1.")
        self.stack = ModelStack.of(model)
        self.max_batch = max_batch
        self.eos = frozenset(int(t) for t in eos_token_ids)
        self.tokenizer = tokenizer
        self.admit_at = admit_at or max(1, max_batch // 8)
        if not 0 <= refine_headroom <= 1:
            raise ValueError(f"`refine_headroom`={refine_headroom!r} is not allowed; allowed: [0, 1].")
        self.refine_headroom = refine_headroom
        self._stop_criteria: dict[tuple[str, ...], StopStringCriteria] = {}

    # ---------------------------------------------------------------- public
    def run(self, requests: Sequence[Request], *, record_entropies: bool = False,
            stats_for: Callable[[EglrConfig], EglrStats] | None = None,
            on_finish: Callable[[int, Outcome], None] | None = None) -> list[Outcome]:
        """Decode every request; returns their outcomes in request order.

        stats_for: the accounting each config's rows add to (tokens, gated tokens, iterations,
        FLOP ratios; steps and wall time shared out by the rows' layer evaluations).
        on_finish: called with (request index, outcome) as each request ends (progress, storage).
        """
        for request in requests:
            request.config.validate_for_model(self.stack.num_layers)
            if request.stop_strings and self.tokenizer is None:
                raise ValueError("requests with stop strings need the engine's `tokenizer`.")
        if not requests:
            return []
        started = time.perf_counter()
        run = _Run(self, requests, record_entropies, on_finish)
        # no_grad, not inference_mode: under inference_mode the CPU linear layers ran 24 % slower here
        with torch.no_grad(), self.stack.slot_attention():
            run.decode()
        if stats_for is not None:
            run.account(stats_for, time.perf_counter() - started)
        return run.outcomes

    def stop_criterion(self, stop_strings: tuple[str, ...]) -> StopStringCriteria:
        if stop_strings not in self._stop_criteria:
            self._stop_criteria[stop_strings] = StopStringCriteria(tokenizer=self.tokenizer, stop_strings=list(stop_strings))
        return self._stop_criteria[stop_strings]


class _Run:
    """The state of one ``ContinuousEngine.run``: slots, rows, buffers, accounting."""

    def __init__(self, engine: ContinuousEngine, requests: Sequence[Request], record_entropies: bool, on_finish):
        self.engine, self.stack, self.requests = engine, engine.stack, requests
        self.record_entropies, self.on_finish = record_entropies, on_finish
        self.outcomes = [Outcome() for _ in requests]
        # longest prompts first, as lm-eval orders them: memory peaks early, slots fill evenly
        self.waiting = deque(sorted(range(len(requests)), key=lambda i: -len(requests[i].prompt)))
        self.max_advancing = engine.max_batch
        headroom = math.ceil(engine.max_batch * engine.refine_headroom) if any(r.config.refines for r in requests) else 0
        self.num_slots = min(engine.max_batch + headroom, len(requests))
        self.rows: list[_Row | None] = [None] * self.num_slots
        capacity = max(len(r.prompt) + r.max_new_tokens for r in requests)
        self.cache = SlotCache(self.num_slots, capacity)
        self.device = self.stack.device
        self.anchor = self.h_prev = self.logp_prev = None  # (B, D), (B, D), (B, V): allocated at first use
        self.steps_by_config: Counter = Counter()
        self.refining_steps_by_config: Counter = Counter()

    # ---------------------------------------------------------------- the loop
    def decode(self) -> None:
        while self.waiting or any(self.rows):
            free = [s for s, row in enumerate(self.rows) if row is None]
            advancing = sum(1 for row in self.rows if row is not None and row.phase == _ADVANCE)
            admit = min(len(free), self.max_advancing - advancing, len(self.waiting))
            if admit > 0 and (admit >= min(self.engine.admit_at, len(self.waiting)) or len(free) == self.num_slots):
                self.prefill(free[:admit])
            if any(self.rows):
                self.step()

    def prefill(self, slots: list[int]) -> None:
        """Admit waiting requests into ``slots``: one forward of their prompts, right-padded."""
        for slot in slots:
            index = self.waiting.popleft()
            request = self.requests[index]
            generator = None
            if request.config.sampled:
                generator = torch.Generator(device=self.device).manual_seed(request.seed)
            self.rows[slot] = _Row(request, self.outcomes[index], index, position=len(request.prompt) - 1,
                                   generator=generator)
        prompts = [self.rows[s].request.prompt for s in slots]
        width = max(map(len, prompts))
        ids = torch.zeros(len(slots), width, dtype=torch.long)
        for g, prompt in enumerate(prompts):
            ids[g, :len(prompt)] = torch.tensor(prompt)
        ids = ids.to(self.device)
        lengths = torch.tensor([len(p) for p in prompts], device=self.device)
        positions = torch.arange(width, device=self.device)[None].expand(len(slots), width)
        rows = torch.tensor(slots, device=self.device)
        last = lengths - 1
        cache = self.cache
        cache.prefill, cache.rows = True, rows
        hidden = self.stack.embed(ids)  # (G, Q, D)
        self._ensure_buffers(hidden)
        angles = self.stack.rotary_angles(hidden, positions)
        views = {kind: SlotView(rows, mask, prefill=True) for kind, mask in prefill_masks(lengths, width, self.stack.windows).items()}
        anchors_at = self._anchor_layers(slots)
        picked = torch.arange(len(slots), device=self.device)
        for index in range(self.stack.num_layers):
            if index in anchors_at:
                members, where = anchors_at[index]
                self.anchor[where] = hidden[members, last[members]]
            kind = self.stack.layer_kinds[index]
            hidden = self.stack.layer(index, hidden, views[kind], angles[kind], positions, cache)
        last_hidden = hidden[picked, last]  # (G, D)
        cache.prefill = False
        self.settle(slots, [_ADVANCE] * len(slots), last_hidden, self.stack.logits(last_hidden))

    def step(self) -> None:
        """One decoding step: advancing rows feed their newest token, refining rows run one iteration."""
        advancing = [s for s, row in enumerate(self.rows) if row is not None and row.phase == _ADVANCE]
        refining = [s for s, row in enumerate(self.rows) if row is not None and row.phase == _REFINE]
        query = [0] * self.num_slots
        for s in advancing:
            query[s] = self.rows[s].position + 1
        for s in refining:
            query[s] = self.rows[s].position
        self.steps_by_config.update({self.rows[s].request.config for s in advancing + refining})  # once per step
        self.refining_steps_by_config.update({self.rows[s].request.config for s in refining})
        positions = torch.tensor(query, device=self.device)
        is_refining = torch.zeros(self.num_slots, dtype=torch.bool)
        is_refining[refining] = True
        width = max(query) + 2  # the scratch column and positions 0..max
        masks = decode_masks(positions, is_refining.to(self.device), width, self.stack.windows)
        self.cache.width = width
        angles_all = self.stack.rotary_angles(self.anchor[:, None], positions[:, None])  # per kind (B, 1, d)

        tokens = torch.tensor([self.rows[s].outcome.tokens[-1] for s in advancing], dtype=torch.long)
        order = list(advancing)
        columns = [self.rows[s].position + 2 for s in advancing]
        hidden = self.stack.embed(tokens.to(self.device)[:, None]) if advancing else None  # (G, 1, D)
        anchors_at = self._anchor_layers(advancing)
        joining = defaultdict(list)  # layer N-L -> refining slots that enter there
        for s in refining:
            joining[self.stack.num_layers - self.rows[s].request.config.L].append(s)
        views = angles = rows_pos = None
        for index in range(self.stack.num_layers):
            if index in joining:
                fused = self._fused(joining[index])  # (G', D)
                hidden = fused[:, None] if hidden is None else torch.cat([hidden, fused[:, None].to(hidden.dtype)])
                order += joining[index]
                columns += [0] * len(joining[index])  # a refined key/value goes to the scratch column
                views = None
            if hidden is None:
                continue
            if index in anchors_at:
                members, where = anchors_at[index]
                self.anchor[where] = hidden[members, 0]
            if views is None:
                rows = torch.tensor(order, device=self.device)
                self.cache.rows, self.cache.columns = rows, torch.tensor(columns, device=self.device)
                in_slot_order = order == list(range(self.num_slots))
                views = {kind: SlotView(None if in_slot_order else rows, mask) for kind, mask in masks.items()}
                angles = {kind: (cos[rows], sin[rows]) for kind, (cos, sin) in angles_all.items()}
                rows_pos = positions[rows][:, None]
            kind = self.stack.layer_kinds[index]
            hidden = self.stack.layer(index, hidden, views[kind], angles[kind], rows_pos, self.cache)
        for s in advancing:
            self.rows[s].position += 1
        last_hidden = hidden[:, 0]
        self.settle(order, [_ADVANCE] * len(advancing) + [_REFINE] * len(refining), last_hidden,
                    self.stack.logits(last_hidden))

    # ---------------------------------------------------------------- after a forward
    def settle(self, slots: list[int], phases: list[int], last_hidden: torch.Tensor, raw: torch.Tensor) -> None:
        """Gate the rows that advanced, run the KL exit of the rows that refined, emit tokens.

        slots, phases: the G rows of the forward in its order; last_hidden: (G, D) h^(N) before
        the final norm; raw: (G, V) logits before any soft-cap.
        """
        cap = self.stack.parts.logit_softcap
        final = softcap(raw.float(), cap)  # (G, V) fp32: what the gate and the KL exit read
        emitted = final if cap is None else self.stack.emitted(raw)  # what generate decodes from
        # rows whose distribution is read: advancing rows that may be gated (or whose entropy is
        # recorded) and refining rows (KL exit); plain rows only need their token
        gate_rows = [g for g, (s, p) in enumerate(zip(slots, phases))
                     if p == _ADVANCE and (self.record_entropies or self.rows[s].request.config.refines)]
        exit_rows = [g for g, p in enumerate(phases) if p == _REFINE]
        read = [emitted.argmax(dim=-1).float()]  # token ids are exact in fp32 (V < 2^24)
        if gate_rows or exit_rows:
            index = torch.tensor(gate_rows + exit_rows, device=self.device)
            slot_index = torch.tensor([slots[g] for g in gate_rows + exit_rows], device=self.device)
            logp = torch.log_softmax(final[index], dim=-1)
            n = len(gate_rows)
            read.append(entropy_of_log_probs(logp[:n]))
            read.append(kl_divergence(logp[n:], self.logp_prev[slot_index[n:]]))
            self.h_prev[slot_index] = last_hidden[index].to(self.h_prev.dtype)  # where an iteration starts from
            self.logp_prev[slot_index] = logp
        host = torch.cat(read).tolist()  # the step's one read
        greedy_tokens = host[:len(slots)]
        measures = dict(zip(gate_rows + exit_rows, host[len(slots):]))  # row -> entropy, or KL when refining
        nan = [math.isnan(measures[g]) for g in gate_rows]
        if any(nan):
            raise_on_nan_rows(torch.tensor(nan), "a decoding step of the continuous engine")
        emitting = []  # rows of the forward that emit a token this step
        for g, (slot, phase) in enumerate(zip(slots, phases)):
            row = self.rows[slot]
            config = row.request.config
            if phase == _ADVANCE:
                if self.record_entropies:
                    row.outcome.entropies.append(measures[g])
                if config.refines and measures[g] > config.tau_h:
                    row.phase, row.iterations_done = _REFINE, 0
                    row.outcome.gated += 1
                    continue
            else:
                row.iterations_done += 1
                if measures[g] >= config.tau_kl and row.iterations_done < config.k_max:
                    continue  # KL still above the exit threshold: another iteration next step
                row.outcome.iterations[row.iterations_done] += 1
                row.phase = _ADVANCE
            emitting.append(g)
        drawn = self._draws([g for g in emitting if self.rows[slots[g]].request.config.sampled], slots, emitted)
        for g in emitting:
            self._emit(slots[g], self.rows[slots[g]], drawn.get(g, int(greedy_tokens[g])))

    def _draws(self, sampled: list[int], slots: list[int], emitted: torch.Tensor) -> dict[int, int]:
        """Tokens of the sampled rows ``sampled`` (indices into ``emitted``, (G, V)), each drawn with
        its row's generator from its warped scores; one read from the device for all of them."""
        if not sampled:
            return {}
        configs = [self.rows[slots[g]].request.config for g in sampled]
        tokens = [None] * len(sampled)
        by_warp = _group_by(range(len(sampled)), lambda i: (configs[i].T, configs[i].top_k, configs[i].top_p))
        for (temperature, top_k, top_p), members in by_warp.items():
            scores = warp(emitted[torch.tensor([sampled[i] for i in members], device=self.device)], temperature, top_k, top_p)
            for i, row_scores in zip(members, scores):
                tokens[i] = draw(row_scores, self.rows[slots[sampled[i]]].generator)
        return dict(zip(sampled, torch.cat(tokens).tolist()))

    def _emit(self, slot: int, row: _Row, token: int) -> None:
        outcome = row.outcome
        outcome.tokens.append(token)
        if token in self.engine.eos:
            outcome.finish = "eos"
        elif row.request.stop_strings and self._stopped(row):
            outcome.finish = "stop"
        elif len(outcome.tokens) >= row.request.max_new_tokens:
            outcome.finish = "length"
        if outcome.finish:
            self.rows[slot] = None
            if self.on_finish is not None:
                self.on_finish(row.index, outcome)

    def _stopped(self, row: _Row) -> bool:
        criterion = self.engine.stop_criterion(row.request.stop_strings)
        tail = row.outcome.tokens[-criterion.maximum_token_len:]  # generated tokens only, never the prompt
        return bool(criterion(torch.tensor([tail]), None)[0])

    # ---------------------------------------------------------------- helpers
    def _ensure_buffers(self, hidden: torch.Tensor) -> None:
        if self.anchor is None:
            shape = (self.num_slots, hidden.shape[-1])
            self.anchor = hidden.new_zeros(shape)
            self.h_prev = hidden.new_zeros(shape)
            vocab = self.stack.parts.lm_head.weight.shape[0]
            self.logp_prev = torch.zeros(self.num_slots, vocab, device=self.device)

    def _anchor_layers(self, slots: list[int]) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Layer N-L -> (indices into the forward's rows, their slots) of rows whose anchor enters there."""
        by_layer = defaultdict(list)
        for g, slot in enumerate(slots):
            config = self.rows[slot].request.config
            if config.refines:
                by_layer[self.stack.num_layers - config.L].append((g, slot))
        return {layer: (torch.tensor([g for g, _ in pairs], device=self.device),
                        torch.tensor([s for _, s in pairs], device=self.device)) for layer, pairs in by_layer.items()}

    def _fused(self, slots: list[int]) -> torch.Tensor:
        """u = (1 - alpha)·a + alpha·norm_match(h, a) for refining ``slots``: (G', D), in their order."""
        parts = []
        for alpha, members in _group_by(slots, lambda s: self.rows[s].request.config.alpha).items():
            index = torch.tensor(members, device=self.device)
            anchor = self.anchor[index]
            parts.append((members, fuse(anchor, norm_match(self.h_prev[index], anchor), alpha)))
        if len(parts) == 1:
            return parts[0][1]
        position = {s: i for i, s in enumerate(slots)}
        out = torch.empty(len(slots), self.anchor.shape[-1], dtype=parts[0][1].dtype, device=self.device)
        for members, fused in parts:
            out[torch.tensor([position[s] for s in members], device=self.device)] = fused
        return out

    def account(self, stats_for: Callable[[EglrConfig], EglrStats], wall_time_s: float) -> None:
        """Add every config's totals to its stats (per-row FLOP accounting: nothing else ran)."""
        by_config: dict[EglrConfig, list[Outcome]] = defaultdict(list)
        for request, outcome in zip(self.requests, self.outcomes):
            by_config[request.config].append(outcome)
        n = self.stack.num_layers
        work = {c: sum(n * len(o.tokens) + c.L * sum(k * m for k, m in o.iterations.items()) for o in outs)
                for c, outs in by_config.items()}
        total_work = sum(work.values()) or 1
        for config, outs in by_config.items():
            tokens = sum(len(o.tokens) for o in outs)
            iterations = Counter()
            for o in outs:
                iterations.update(o.iterations)
            stats = stats_for(config)
            stats.num_layers = n
            stats.add_batch(steps=self.steps_by_config[config], gated_steps=self.refining_steps_by_config[config],
                            row_steps=tokens, tokens=tokens, iterations=dict(iterations), L=config.L,
                            pass_row_iterations=sum(k * m for k, m in iterations.items()))
            stats.wall_time_s += wall_time_s * work[config] / total_work


def _group_by(items, key) -> dict:
    groups: dict = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return groups
