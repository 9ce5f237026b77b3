"""The continuous engine: EGLR with refinement folded into the batch, and continuous batching.

``generate`` (the ``hf`` engine, ``generate.py``) refines inside a decoding step: the step waits
while its gated rows re-run the top L layers, and a pass over a few rows costs about what the
whole batch's step costs, since the layers' weights are read once per call either way. Here every
running row is, at each step, either

- **advancing**: a normal forward of its newest token through all N layers, or
- **refining**: one EGLR iteration (eglr-method.md §2, step 3) of its pending position t, which
  joins the batch at layer N-L with its fused state ``u`` and runs the top L layers only,

so the top layers' weights are read once for both kinds of row. A refining row's key/value goes to
its scratch column (``kv_slots.py``); the cache keeps the normal pass's key/value at t. A row emits a
token when it is not gated, or when its refinement ends (KL exit or k_max), from the last
distribution computed; then it advances again. Finished rows leave and waiting requests are
prefilled into the free slots, so the batch stays full.

The step itself (``fixed_step.decode_step``) is a function of fixed-shape tensors: the per-slot
state (``step_state.py``), K/V storage sized by length buckets, and two index tensors of the
advancing and the refining slots, padded to row-count buckets when the step is compiled (one
graph per bucket; eager steps take the exact counts, since padding rows would cost compute). This module is
the host side: between steps it reads one small tensor (tokens and flags), admits and retires rows,
checks EOS, stop strings and lengths, and grows or shrinks the K/V storage by buckets. Sampling
draws per row from noise of (row seed, token index) (``sampling.py``), so a rollout does not depend
on its neighbours; ``fixed_step.py`` says what that means on a GPU.

Shape letters: B slots, G rows of a forward, D hidden size, V vocabulary, Q prompt positions.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import StopStringCriteria

from eglr_harness.config import EglrConfig
from eglr_harness.decoding.stats import EglrStats
from eglr_harness.decoding.contract import Outcome, Request
from eglr_harness.decoding.fixed_step import decode_step, settle
from eglr_harness.decoding.functional import raise_on_nan_rows
from eglr_harness.decoding.processors import LogitsOptions, not_applied
from eglr_harness.decoding.step_state import READ_FIELDS, SlotState, StepPlan
from eglr_harness.decoding.kv_slots import SlotCache, SlotView, length_bucket, prefill_masks
from eglr_harness.decoding.stack import FALLBACK, ModelStack

_ADVANCE, _REFINE = 1, 2
logger = logging.getLogger(__name__)
_F = {name: i for i, name in enumerate(READ_FIELDS)}


@dataclass
class _Row:
    request: Request
    outcome: Outcome
    index: int  # of the request
    position: int  # last position whose key/value is in the slot (a host mirror of the device's)
    phase: int = _ADVANCE


class ContinuousEngine:
    """Decodes many requests with EGLR through one running batch of ``max_batch`` slots.

    Args:
        model: a transformers causal LM of a family ``stack.ModelStack`` supports, on one device. Its
            ``generation_config``'s logits processors are applied as ``generate`` applies them, where
            ``processors.py`` knows them; a request that needs another is refused (``unsupported``).
        max_batch: rows advancing together (the batch size of plain decoding), or ``"auto"``: as many as
            the free memory holds for each run's longest request (``auto_batch``), logged with the figure.
        eos_token_ids: tokens that end a row (``generate``'s ``eos_token_id``).
        tokenizer: needed when requests have stop strings.
        admit_at: prefill waiting requests once this many rows can be admitted (or the batch is
            empty); fewer, larger prefills read the weights fewer times.
        refine_headroom: extra slots, as a share of ``max_batch``, for rows that are refining. A
            refining row emits nothing that step; without headroom it would take an advancing
            row's place, and a step (whose cost is mostly reading the weights on an accelerator)
            would emit fewer tokens. With it, ``max_batch`` rows keep advancing while the refining
            ones ride along in the top L layers.
        kv_bucket: the smallest K/V length bucket (positions); storage grows by ``slots.length_bucket``.
        compile: run the step through ``torch.compile(fullgraph=True)``, its row counts padded to
            buckets (powers of two, ``max_batch``, the slot count); ``compile_mode`` is passed on
            (``"reduce-overhead"`` on CUDA: CUDA graphs per (rows, width) bucket), and ``compile_backend``
            (``"eager"`` / ``"aot_eager"`` trace without generating code: a quick check). Default eager.
    """

    def __init__(self, model, *, max_batch: int, eos_token_ids: Sequence[int] = (), tokenizer=None,
                 admit_at: int | None = None, refine_headroom: float = 0.5, kv_bucket: int = 128,
                 compile: bool = False, compile_mode: str | None = None, compile_backend: str = "inductor"):
        if max_batch != "auto" and (isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1):
            raise ValueError(f"`max_batch`={max_batch!r} is not allowed; allowed: an int >= 1 or 'auto'.")
        self.stack = ModelStack.of(model)
        self.generation_config = getattr(model, "generation_config", None)
        self.max_batch = max_batch
        self.eos = frozenset(int(t) for t in eos_token_ids)
        self.tokenizer = tokenizer
        self.admit_at = admit_at
        if not 0 <= refine_headroom <= 1:
            raise ValueError(f"`refine_headroom`={refine_headroom!r} is not allowed; allowed: [0, 1].")
        self.refine_headroom = refine_headroom
        if isinstance(kv_bucket, bool) or not isinstance(kv_bucket, int) or kv_bucket < 2 or kv_bucket % 2:
            raise ValueError(f"`kv_bucket`={kv_bucket!r} is not allowed; allowed: an even int >= 2.")
        self.kv_bucket = kv_bucket
        self.compile = compile
        self.step_fn = decode_step
        if compile:
            self.step_fn = torch.compile(decode_step, fullgraph=True, dynamic=False, mode=compile_mode,
                                         backend=compile_backend, recompile_limit=RECOMPILE_LIMIT)
        self._stop_criteria: dict[tuple[str, ...], StopStringCriteria] = {}

    # ---------------------------------------------------------------- public
    def logits_options(self, request: Request) -> LogitsOptions:
        """The processors of ``request``; ``ValueError`` for an invalid option value, or naming what this
        engine does not apply (``unsupported``)."""
        reason = self.unsupported(request)
        if reason is not None:
            raise ValueError(reason)
        return LogitsOptions.resolve(self.generation_config, dict(request.options))

    def unsupported(self, request: Request) -> str | None:
        """Why this engine cannot decode ``request`` (valid options of generate that it does not apply), or
        None. An invalid option value raises ``ValueError``: it is no reason to hand the request to another engine."""
        reason = not_applied(self.generation_config, dict(request.options))
        return None if reason is None else f"{reason}; {FALLBACK}."

    def run(self, requests: Sequence[Request], *, stats_for: Callable[[EglrConfig], EglrStats] | None = None,
            on_finish: Callable[[int, Outcome], None] | None = None) -> list[Outcome]:
        """Decode every request; returns their outcomes in request order.

        stats_for: the accounting each config's rows add to (tokens, gated tokens, iterations,
        FLOP ratios; steps and wall time shared out by the rows' layer evaluations).
        on_finish: called with (request index, outcome) as each request ends (progress, storage).
        """
        options = []
        for request in requests:
            request.config.validate_for_model(self.stack.num_layers)
            if request.stop_strings and self.tokenizer is None:
                raise ValueError("requests with stop strings need the engine's `tokenizer`.")
            options.append(self.logits_options(request))
        if not requests:
            return []
        started = time.perf_counter()
        run = _Run(self, requests, options, on_finish)
        # no_grad, not inference_mode: under inference_mode the CPU linear layers ran 24 % slower here
        with torch.no_grad(), self.stack.slot_attention():
            run.decode()
        if stats_for is not None:
            run.account(stats_for, time.perf_counter() - started)
        return run.outcomes

    def auto_batch(self, requests: Sequence[Request]) -> int:
        """``max_batch=auto``: the running rows whose K/V (at the longest request's length bucket) and
        step activations fit in AUTO_MEMORY_SHARE of the device's free memory, refining headroom included."""
        longest = max(len(r.prompt) + r.max_new_tokens for r in requests)
        positions = length_bucket(longest + 2, self.kv_bucket)
        per_row = bytes_per_row(self.stack, positions)
        free = free_memory(self.stack.device)
        rows = int(free * AUTO_MEMORY_SHARE // (per_row * (1 + self.refine_headroom)))
        chosen = max(1, min(rows, len(requests)))
        logger.info("engine=continuous batch_size=auto: %d running rows (%.2f GiB free on %s, %.1f MiB per row "
                    "at %d positions, %d requests)", chosen, free / 2**30, self.stack.device, per_row / 2**20,
                    positions, len(requests))
        return chosen

    def stop_criterion(self, stop_strings: tuple[str, ...]) -> StopStringCriteria:
        if stop_strings not in self._stop_criteria:
            self._stop_criteria[stop_strings] = StopStringCriteria(tokenizer=self.tokenizer, stop_strings=list(stop_strings))
        return self._stop_criteria[stop_strings]


# graphs a compiled step may hold: one per (advancing-row bucket, refining-row bucket, K/V width bucket)
# and step plan; dynamo's default (8) stops a run with fullgraph=True at the 9th
RECOMPILE_LIMIT = 4096
AUTO_MEMORY_SHARE = 0.8  # of the free memory: the rest is the allocator's slack and the weights' workspace


def free_memory(device: torch.device) -> int:
    """Free bytes on ``device``: CUDA's own figure, else the host's available memory."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def bytes_per_row(stack: ModelStack, positions: int) -> int:
    """Memory one running row takes: its K/V over every layer at ``positions`` (+ the scratch column),
    its slot state and a step's activations (logits and their fp32 copies, the MLP's widest tensor)."""
    config = stack.model.config
    config = getattr(config, "text_config", None) or config
    weight = stack.parts.lm_head.weight
    vocab, hidden = weight.shape
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    size = weight.element_size()
    kv = 2 * stack.num_layers * kv_heads * head_dim * (positions + 1) * size
    state = vocab * 4 + 2 * hidden * size + positions * 8  # logp_prev, anchor and h_prev, token history
    step = vocab * 4 * 8 + 3 * getattr(config, "intermediate_size", 4 * hidden) * size  # logits, log-probs, noise, ...
    return kv + state + step


def row_buckets(limit: int, *also: int) -> list[int]:
    """Index-tensor sizes a step may use: powers of two below ``limit``, ``also`` (when below), and ``limit``."""
    sizes, size = set(), 1
    while size < limit:
        sizes.add(size)
        size *= 2
    return sorted({*sizes, *(a for a in also if 0 < a < limit), limit})


def _bucket(count: int, sizes: list[int]) -> int:
    return next(size for size in sizes if size >= count)


class _Run:
    """The state of one ``ContinuousEngine.run``: slots, rows, device state, accounting."""

    def __init__(self, engine: ContinuousEngine, requests: Sequence[Request], options: list[LogitsOptions], on_finish):
        self.engine, self.stack, self.requests, self.on_finish = engine, engine.stack, requests, on_finish
        self.options = options
        self.outcomes = [Outcome() for _ in requests]
        # longest prompts first, as lm-eval orders them: memory peaks early, slots fill evenly
        self.waiting = deque(sorted(range(len(requests)), key=lambda i: -len(requests[i].prompt)))
        max_batch = engine.max_batch if engine.max_batch != "auto" else engine.auto_batch(requests)
        self.max_advancing = max_batch
        self.admit_at = engine.admit_at or max(1, max_batch // 8)
        configs = [r.config for r in requests]
        headroom = math.ceil(max_batch * engine.refine_headroom) if any(c.refines for c in configs) else 0
        self.num_slots = min(max_batch + headroom, len(requests))
        self.trash = self.num_slots  # padding rows of a step write to this slot
        self.rows: list[_Row | None] = [None] * self.num_slots
        self.device = self.stack.device
        parts = self.stack.parts
        vocab, hidden = parts.lm_head.weight.shape
        self.plan = StepPlan.of(configs, self.stack.num_layers, vocab, parts.logit_softcap, options)
        static = engine.compile and self.device.type == "cuda"
        self.cache = SlotCache(self.num_slots + 1, engine.kv_bucket, static_addresses=static)
        self.state = SlotState.allocate(self.num_slots, hidden, vocab, parts.lm_head.weight.dtype, self.device,
                                        static_addresses=static, processors=self.plan.processors,
                                        eos_token_ids=sorted(engine.eos), history_width=self.cache.width)
        # advancing rows: up to max_batch, more for a step when refining rows exit together
        self.advance_sizes = row_buckets(self.num_slots, self.max_advancing)
        self.refine_sizes = row_buckets(self.num_slots)
        self.steps_by_config: Counter = Counter()
        self.refining_steps_by_config: Counter = Counter()

    # ---------------------------------------------------------------- the loop
    def decode(self) -> None:
        while self.waiting or any(self.rows):
            free = [s for s, row in enumerate(self.rows) if row is None]
            advancing = sum(1 for row in self.rows if row is not None and row.phase == _ADVANCE)
            admit = min(len(free), self.max_advancing - advancing, len(self.waiting))
            if admit > 0 and (admit >= min(self.admit_at, len(self.waiting)) or len(free) == self.num_slots):
                self.prefill(free[:admit])
            if any(self.rows):
                self.step()

    def _fit(self, positions_needed: int) -> None:
        """Grow the K/V storage to the bucket of ``positions_needed``, or shrink it to half when that is enough."""
        live = max((row.position + 2 for row in self.rows if row is not None), default=1)
        need = length_bucket(max(positions_needed, live), self.engine.kv_bucket)
        if need > self.cache.capacity or need * 2 <= self.cache.capacity:
            self.cache.resize(need)
            if self.plan.processors.ngram_size:
                self.state.resize_history(self.cache.width)

    def prefill(self, slots: list[int]) -> None:
        """Admit waiting requests into ``slots``: one (eager) forward of their prompts, right-padded."""
        for slot in slots:
            index = self.waiting.popleft()
            request = self.requests[index]
            self.rows[slot] = _Row(request, self.outcomes[index], index, position=len(request.prompt) - 1)
        requests = [self.rows[s].request for s in slots]
        prompts = [r.prompt for r in requests]
        width = max(map(len, prompts))
        self._fit(width + 1)
        self.state.admit(slots, [r.config for r in requests], [r.seed for r in requests], prompts,
                         [self.options[self.rows[s].index] for s in slots])
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
        angles = self.stack.rotary_angles(hidden, positions)
        views = {kind: SlotView(rows, mask, prefill=True) for kind, mask in prefill_masks(lengths, width, self.stack.windows).items()}
        entry = self.stack.num_layers - torch.tensor([r.config.L for r in requests], device=self.device)
        picked = torch.arange(len(slots), device=self.device)
        for index in range(self.stack.num_layers):
            if index in self.plan.entry_layers:
                takes = (entry == index)[:, None]
                self.state.anchor.index_copy_(0, rows, torch.where(takes, hidden[picked, last], self.state.anchor[rows]))
            kind = self.stack.layer_kinds[index]
            hidden = self.stack.layer(index, hidden, views[kind], angles[kind], positions, cache)
        last_hidden = hidden[picked, last]  # (G, D)
        cache.prefill = False
        read = settle(self.stack, self.plan, self.state, rows, 0, last_hidden, self.stack.logits(last_hidden))
        self.absorb(read.tolist(), slots, [_ADVANCE] * len(slots))

    def step(self) -> None:
        """One decoding step: advancing rows feed their newest token, refining rows run one iteration."""
        advancing = [s for s, row in enumerate(self.rows) if row is not None and row.phase == _ADVANCE]
        refining = [s for s, row in enumerate(self.rows) if row is not None and row.phase == _REFINE]
        self.steps_by_config.update({self.rows[s].request.config for s in advancing + refining})  # once per step
        self.refining_steps_by_config.update({self.rows[s].request.config for s in refining})
        self._fit(max((self.rows[s].position + 3 for s in advancing), default=1))
        if self.engine.compile:  # few distinct shapes: a compiled step (a CUDA graph) per bucket
            num_adv = _bucket(len(advancing), self.advance_sizes) if advancing else 1
            num_ref = _bucket(len(refining), self.refine_sizes) if refining else 0
        else:  # eager: any shape costs nothing extra, padding rows would
            num_adv, num_ref = max(len(advancing), 1), len(refining)
        slots = self._upload(advancing + [self.trash] * (num_adv - len(advancing)) +
                             refining + [self.trash] * (num_ref - len(refining)))
        read = self.engine.step_fn(self.stack, self.plan, self.state, self.cache, slots[:num_adv], slots[num_adv:])
        host = read.tolist()  # the step's one read
        for s in advancing:
            self.rows[s].position += 1
        self.absorb(host[:len(advancing)] + host[num_adv:num_adv + len(refining)], advancing + refining,
                    [_ADVANCE] * len(advancing) + [_REFINE] * len(refining))

    def _upload(self, values: list[int]) -> torch.Tensor:
        """Host ints to the device without a host sync (pinned memory, non-blocking copy on CUDA):
        the step's one read of its result stays the loop's only sync."""
        host = torch.tensor(values, dtype=torch.long)
        if self.device.type == "cuda":
            host = host.pin_memory()
        return host.to(self.device, non_blocking=True)

    # ---------------------------------------------------------------- after a forward
    def absorb(self, read: list[list[float]], slots: list[int], phases: list[int]) -> None:
        """Apply a forward's read (one row per slot of ``slots``): gates, exits, emitted tokens, finishes."""
        raise_on_nan_rows([slot for slot, values in zip(slots, read) if values[_F["nan"]]],
                          "a decoding step of the continuous engine")
        emitted: list[tuple[int, _Row]] = []
        for slot, phase, values in zip(slots, phases, read):
            row = self.rows[slot]
            outcome = row.outcome
            if phase == _ADVANCE:
                outcome.entropies.append(values[_F["entropy"]])
                if values[_F["gated"]]:
                    row.phase = _REFINE
                    outcome.gated += 1
                    continue
            if not values[_F["emitted"]]:
                continue  # KL still above the exit threshold: another iteration next step
            k = int(values[_F["iterations"]])
            if phase == _REFINE:
                outcome.iterations[k] += 1
                row.phase = _ADVANCE
            outcome.tokens.append(int(values[_F["token"]]))
            outcome.logprobs.append(values[_F["logprob"]])
            outcome.final_kls.append(values[_F["kl"]])
            outcome.token_iterations.append(k)
            emitted.append((slot, row))
        stopped = self._stopped([row for _, row in emitted if row.request.stop_strings])
        for slot, row in emitted:
            outcome = row.outcome
            if outcome.tokens[-1] in self.engine.eos:
                outcome.finish = "eos"
            elif id(row) in stopped:
                outcome.finish = "stop"
            elif len(outcome.tokens) >= row.request.max_new_tokens:
                outcome.finish = "length"
            if outcome.finish:
                self.rows[slot] = None
                if self.on_finish is not None:
                    self.on_finish(row.index, outcome)

    def _stopped(self, rows: list[_Row]) -> set[int]:
        """ids of the rows whose generated text now ends with one of their stop strings: one call of
        each stop-string set's criterion for all its rows of equal tail length (tokens, never the prompt)."""
        groups: dict[tuple, list[_Row]] = defaultdict(list)
        for row in rows:
            criterion = self.engine.stop_criterion(row.request.stop_strings)
            tail = min(len(row.outcome.tokens), criterion.maximum_token_len)
            groups[(row.request.stop_strings, tail)].append(row)
        stopped = set()
        for (stop_strings, tail), members in groups.items():
            ids = torch.tensor([m.outcome.tokens[-tail:] for m in members])
            hits = self.engine.stop_criterion(stop_strings)(ids, None)
            stopped.update(id(m) for m, hit in zip(members, hits.tolist()) if hit)
        return stopped

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

