"""The continuous engine: EGLR with refinement folded into the batch, and continuous batching.

``generate`` (the hook engine, ``engine=hook``, ``generate.py``) refines inside a decoding step: the step waits
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
admitted into the free slots, so the batch stays full.

Admitted prompts are prefilled within a token budget (``prefill_tokens``, as vLLM's
``max_num_batched_tokens`` and SGLang's ``chunked_prefill_size``): short prompts are packed into one
forward, a prompt longer than the budget is prefilled in chunks, each attending to the slot's
earlier columns, and decoding steps go on between chunks. No forward processes more prompt tokens
than the budget, so its activations do not grow with the prompts.

A prompt is prefilled once while a slot holds it (a row of it, or the freed slot of its last row;
``share_prompts``, the scheduler's "shared prompts"): the other rows of that prompt (a pool's cells, cycles
and seeds) get a copy of its K/V in their slots and its prompt state (the last position's h^(N) and logits,
its hidden state at each entry layer N - L, as the holder's prefill computed them), and each settles its first
token with its own settings and seed. Copied rather than shared read-only: a slot's columns are then its own,
as every step's attention expects, and the copies cost a few per cent of the one prefill that remains
(``prefill_report``; benchmarks/README.md).

The step itself (``fixed_step.decode_step``) is a function of fixed-shape tensors: the per-slot
state (``step_state.py``), K/V storage (``Workspace``, kept for the next run when it fits; allocated
once at the run's longest request when steps are captured, grown by buckets when eager) of which a
step reads a length bucket of columns, and two index
tensors of the advancing and the refining slots, padded to row-count buckets when the step is
compiled. How it is compiled (once) and captured (per bucket): ``step_graphs.py``; the sizes a step is
shaped by (``StepKey``: computed once per step, the run's invariants included) and their buckets:
``step_key.py``. Which request runs in which slot, and when, and every phase change and finish of a row
(admission, prefill chunks, gates, exits, EOS, stop strings, lengths, retirement): ``scheduler.py``, the
one row state machine. This module is the model runner, the host side of the steps: it asks the scheduler
what runs now, runs that prefill forward or step, reads one small tensor per forward (tokens and flags, by
the names of ``step_state.READ_FIELDS``) and hands it back, and picks the K/V width the next step reads.
A step's read is copied to the host without blocking (``StepRead``: pinned memory and an event on CUDA). When no
row of a run refines (``overlap_reads``), the host reads it one step later, after it launched the next step, as
vLLM's async scheduling does: a steady step then makes the host wait for nothing (a row that ended at step n runs
step n + 1, whose result is discarded: the scheduler's "overlapped reads"). When rows refine, a gate's decision at
step n decides which rows refine at step n + 1, and each step's read comes in before the next step is made.
Sampling draws per row from noise of (row seed, token index) (``sampling.py``), so a rollout does not depend on
its neighbours; ``fixed_step.py`` says what that means on a GPU.

Shape letters: the package's legend (``eglr_harness/decoding/__init__.py``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import StopStringCriteria

from eglr_harness.core.config import EglrConfig
from eglr_harness.core.progress import tokens_emitted
from eglr_harness.decoding.compile_setting import CUDA_GRAPHS
from eglr_harness.decoding.continuous.fixed_step import save_anchors, settle
from eglr_harness.decoding.continuous.kv_slots import SPARE_COLUMNS, SlotCache, SlotView, prefill_masks
from eglr_harness.decoding.continuous.scheduler import Drain, Prefill, Row, Scheduler, Step
from eglr_harness.decoding.continuous.stack import FALLBACK, ModelStack
from eglr_harness.decoding.continuous.step_graphs import EAGER_STEP_SHARE, StepRunner, WarmupReport
from eglr_harness.decoding.continuous.step_key import StepSizes, length_bucket
from eglr_harness.decoding.continuous.step_state import (READ_FIELDS, HostPack, Packed, Sent, SlotState,
                                                         StepInvariants)
from eglr_harness.decoding.contract import Outcome, Request
from eglr_harness.decoding.functional import raise_on_nan_rows
from eglr_harness.decoding.processors import LogitsOptions, ProcessorsInUse, not_applied
from eglr_harness.decoding.stats import EglrStats, RolloutAccount, own_account, share_wall_time

# the state's widths for every processor, so that one workspace serves any run (a few bool (B, V) tensors)
_EVERY_PROCESSOR = ProcessorsInUse(penalty=True, ngram_size=1, suppress=True, begin_suppress=True)
logger = logging.getLogger(__name__)
_F = {name: i for i, name in enumerate(READ_FIELDS)}
PREFILL_TOKENS = 4096  # the default prompt-token budget of one forward
AUTO_MEMORY_SHARE = 0.8  # of the free memory: the rest is the allocator's slack (fragmentation) and workspaces


@dataclass
class Workspace:
    """What the steps of a run read and write in place: the K/V storage and the slot state, for B slots
    and C columns, kept for the next run when that fits (CUDA graphs recorded on it stay valid)."""

    cache: SlotCache
    state: SlotState

    @property
    def num_slots(self) -> int:
        return self.cache.num_slots - 1  # the last slot is the trash slot

    def fits(self, num_slots: int, capacity: int) -> bool:
        # at most twice the slots: every step's attention runs over all of them
        return num_slots <= self.num_slots <= 2 * num_slots and capacity <= self.cache.capacity

    def nbytes(self) -> int:
        tensors = [*self.cache.keys.values(), *self.cache.values.values(), *self.state.tensors().values()]
        return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


class ContinuousEngine:
    """Decodes many requests with EGLR through one running batch of ``max_batch`` slots.

    Args:
        model: a transformers causal LM of a family ``stack.ModelStack`` supports, on one device. Its
            ``generation_config``'s logits processors are applied as ``generate`` applies them, where
            ``processors.py`` knows them; a request that needs another is refused (``unsupported``).
        max_batch: rows advancing together (the batch size of plain decoding), or ``"auto"``: as many as
            the free memory holds for each run's longest request (``auto_batch``), logged with the figures.
        eos_token_ids: tokens that end a row (``generate``'s ``eos_token_id``).
        tokenizer: needed when requests have stop strings.
        admit_at: prefill waiting requests once this many rows can be admitted (or the batch is
            empty); fewer, larger prefills read the weights fewer times.
        refine_headroom: extra slots, as a share of ``max_batch``, for rows that are refining. A
            refining row emits nothing that step; without headroom it would take an advancing
            row's place, and a step (whose cost is mostly reading the weights on an accelerator)
            would emit fewer tokens. With it, ``max_batch`` rows keep advancing while the refining
            ones ride along in the top L layers.
        kv_bucket: the smallest K/V length bucket (columns); a step reads ``step_key.length_bucket`` columns.
        prefill_tokens: the most prompt tokens one forward processes (rows x padded chunk length).
        share_prompts: prefill each distinct prompt once while a slot holds it, and copy its K/V and prompt
            state to the others (False: every row prefills its own prompt).
        compile: compile the decoder layer once (``step_graphs.py``), the step's row counts padded to
            buckets (powers of two from 2, ``max_batch``, the slot count); ``compile_mode``
            ``"reduce-overhead"`` also records one CUDA graph per (rows, width) bucket (CUDA only);
            ``compile_backend`` (``"eager"`` / ``"aot_eager"`` trace without generating code: a quick check).
        overlap_reads: in a run whose rows never refine, read each step's result after the next step is launched
            (the scheduler's overlapped reads); False: before, as in a run whose rows refine.
    """

    def __init__(self, model, *, max_batch: int, eos_token_ids: Sequence[int] = (), tokenizer=None,
                 admit_at: int | None = None, refine_headroom: float = 0.5, kv_bucket: int = 128,
                 prefill_tokens: int = PREFILL_TOKENS, share_prompts: bool = True, compile: bool = False,
                 compile_mode: str | None = None, compile_backend: str = "inductor", overlap_reads: bool = True):
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
        if isinstance(prefill_tokens, bool) or not isinstance(prefill_tokens, int) or prefill_tokens < 1:
            raise ValueError(f"`prefill_tokens`={prefill_tokens!r} is not allowed; allowed: an int >= 1.")
        self.prefill_tokens = prefill_tokens
        self.share_prompts = share_prompts
        if not isinstance(overlap_reads, bool):
            raise ValueError(f"`overlap_reads`={overlap_reads!r} is not allowed; allowed: True or False.")
        self.overlap_reads = overlap_reads
        self.prefill_totals = PrefillCounts()  # over the engine's runs
        self.compile = compile
        capture = compile and compile_mode == CUDA_GRAPHS
        if capture and self.stack.device.type != "cuda":
            raise ValueError(f"`compile_mode`={CUDA_GRAPHS!r} records CUDA graphs and needs a CUDA device; the model "
                             f"is on {self.stack.device}.")
        self.runner = StepRunner(compile=compile, capture=capture, backend=compile_backend, mode=compile_mode)
        self.step_fn = self.runner
        self.workspace: Workspace | None = None
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
            # the layer-count rule is checked where the cells are resolved (RunSettings.check_cells)
            assert request.config.L <= self.stack.num_layers, f"L={request.config.L} > {self.stack.num_layers} layers"
            if request.stop_strings and self.tokenizer is None:
                raise ValueError("requests with stop strings need the engine's `tokenizer`.")
            options.append(self.logits_options(request))
        if not requests:
            return []
        started = time.perf_counter()
        before = dataclasses.replace(self.runner.report)
        captured_before = len(self.runner.report.capture_keys)
        run = _Run(self, requests, options, on_finish)
        # no_grad, not inference_mode: under inference_mode the CPU linear layers ran slower (benchmarks/HISTORY.md)
        with torch.no_grad(), self.stack.slot_attention():
            run.decode()
        self._say_eager_steps(before)
        self._say_captures(self.runner.report.capture_keys[captured_before:])
        self.prefill_totals.add(run.prefill_counts)
        logger.info("continuous engine: %s", run.prefill_counts.said())
        if stats_for is not None:
            run.account(stats_for, time.perf_counter() - started)
        return run.outcomes

    def _say_eager_steps(self, before: WarmupReport) -> None:
        """At the end of a run: say it when more than ``EAGER_STEP_SHARE`` of its steps after warm-up ran a
        decoder layer eagerly because the compiled layer would have compiled again."""
        report = self.runner.report
        steps, eager = report.steps - before.steps, report.eager_steps - before.eager_steps
        if steps and eager > EAGER_STEP_SHARE * steps:
            logger.warning("continuous engine: %d of %d decoding steps of this run (%.0f %%) ran decoder layers "
                           "eagerly after warm-up, for want of a compilation (%d late compilations refused; the first "
                           "is logged above with dynamo's reason): this run was not the compiled run it was asked to "
                           "be; please "
                           "report it.", eager, steps, 100 * eager / steps, report.late_compiles - before.late_compiles)

    def _say_captures(self, keys: list) -> None:
        """At the end of a run that captures its steps: the step keys it recorded graphs for (none: every key
        it met was recorded before)."""
        if self.runner.capture:
            logger.info("continuous engine: this run captured %d step keys (advancing rows, refining rows, K/V "
                        "width)%s", len(keys), ": " + ", ".join(key.said() for key in keys) if keys else "")

    def prefill_report(self) -> dict:
        """What prefilling has cost this engine over its runs (``PrefillCounts``): the rows, the prompt tokens
        they needed and the tokens prefill forwards ran, the rows that took a copy of another row's prompt, the
        forwards, and the seconds (copies included, and apart)."""
        return dataclasses.asdict(self.prefill_totals)

    def warmup_report(self) -> dict:
        """What compiling and capturing the step has cost this engine: ``compiles``, ``captures``,
        ``compile_seconds``, ``capture_seconds``, ``late_compiles`` (layer calls after warm-up that would have
        compiled and ran eagerly: should be 0), ``steps`` after warm-up and ``eager_steps`` among them (steps
        that ran such a call) and the (advancing rows, refining rows, K/V width) of each capture
        (``step_graphs.WarmupReport``)."""
        return self.runner.report.as_dict()

    def auto_batch(self, requests: Sequence[Request]) -> int:
        """``max_batch=auto``: the running rows that fit in AUTO_MEMORY_SHARE of the device's free memory
        (a kept workspace counted as free: it is given back first): per row its K/V at the longest
        request's capacity, its slot state and its share of a decoding step, refining headroom included,
        after the larger of a budgeted prefill's activations and nothing."""
        capacity = self.capacity_for(requests)
        per_row = bytes_per_row(self.stack, capacity)
        prefill = prefill_bytes(self.stack, self.prefill_tokens, capacity)
        kept = self.workspace.nbytes() if self.workspace is not None else 0
        free = free_memory(self.stack.device) + kept
        usable = free * AUTO_MEMORY_SHARE - prefill
        rows = int(usable // (per_row * (1 + self.refine_headroom)))
        chosen = max(1, min(rows, len(requests)))
        slots = slot_count(chosen, self.refine_headroom, any(r.config.refines for r in requests), len(requests))
        logger.info("engine=continuous batch_size=auto: %d running rows (%d slots, refining headroom included) for %d "
                    "requests: %.2f GiB free on %s, %.0f%% of it usable, minus %.2f GiB for a prefill of %d tokens; "
                    "%.1f MiB per row (K/V at %d columns, slot state, a step's activations)",
                    chosen, slots, len(requests), free / 2**30,
                    self.stack.device, AUTO_MEMORY_SHARE * 100, prefill / 2**30, self.prefill_tokens,
                    per_row / 2**20, capacity)
        return chosen

    def capacity_for(self, requests: Sequence[Request]) -> int:
        """K/V columns a run needs: its longest request's prompt and new tokens, the scratch column and
        the column a last step writes, as a length bucket."""
        return length_bucket(max(len(r.prompt) + r.max_new_tokens for r in requests) + 3, self.kv_bucket)

    def workspace_for(self, num_slots: int, capacity: int) -> Workspace:
        """The engine's workspace if it fits, else a new one (the old one, and the graphs recorded on it, dropped
        first)."""
        if self.workspace is not None and self.workspace.fits(num_slots, capacity):
            return self.workspace
        self.workspace = None
        self.runner.forget()
        parts = self.stack.parts
        vocab, hidden = parts.lm_head.weight.shape
        cache = SlotCache(num_slots + 1, capacity)
        # every processor's tensors, whichever a run uses: the state then never moves between runs
        state = SlotState.allocate(num_slots, hidden, vocab, parts.lm_head.weight.dtype, self.stack.device,
                                   processors=_EVERY_PROCESSOR, eos_token_ids=sorted(self.eos), history_width=capacity)
        self.workspace = Workspace(cache, state)
        return self.workspace

    def stop_criterion(self, stop_strings: tuple[str, ...]) -> StopStringCriteria:
        if stop_strings not in self._stop_criteria:
            self._stop_criteria[stop_strings] = StopStringCriteria(tokenizer=self.tokenizer,
                                                                   stop_strings=list(stop_strings))
        return self._stop_criteria[stop_strings]


def free_memory(device: torch.device) -> int:
    """Free bytes on ``device``: CUDA's own figure plus what its caching allocator holds unused, else
    the host's available memory."""
    if device.type == "cuda":
        return (torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device)
                - torch.cuda.memory_allocated(device))
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _shapes(stack: ModelStack) -> tuple:
    config = stack.model.config
    config = getattr(config, "text_config", None) or config
    vocab, hidden = stack.parts.lm_head.weight.shape
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    intermediate = getattr(config, "intermediate_size", None) or 4 * hidden
    return vocab, hidden, heads, kv_heads, head_dim, intermediate, stack.parts.lm_head.weight.element_size()


def slot_count(max_batch: int, refine_headroom: float, refines: bool, requests: int) -> int:
    """The slots a run allocates (``_Run``'s rule): ``max_batch`` running rows, refining headroom only when a
    config refines, never more than its requests (the batch_size=auto line says this number, not a bound)."""
    headroom = math.ceil(max_batch * refine_headroom) if refines else 0
    return min(max_batch + headroom, requests)


def bytes_per_row(stack: ModelStack, capacity: int) -> int:
    """Memory one running row takes: its K/V over every layer at ``capacity`` columns, its slot state
    (the processors' included) and a decoding step's activations (logits and their fp32 copies, the
    MLP's widest tensors)."""
    vocab, hidden, heads, kv_heads, head_dim, intermediate, size = _shapes(stack)
    kv = 2 * stack.num_layers * kv_heads * head_dim * (capacity + SPARE_COLUMNS) * size
    # logp_prev, seen/suppress flags, anchor, h_prev, history
    state = vocab * 4 + vocab * 3 + 2 * hidden * size + capacity * 8
    step = vocab * 4 * 8 + 3 * intermediate * size  # logits, log-probs, noise, ...
    return kv + state + step


def prefill_bytes(stack: ModelStack, tokens: int, capacity: int) -> int:
    """Activations of one prefill forward of ``tokens`` prompt tokens (its budget) whose attention
    gathers up to max(tokens, capacity) columns: hidden states and the MLP's widest tensors per
    token, the gathered keys and values, the masks (bool and additive, per query head group and per
    layer kind) and the last positions' logits."""
    vocab, hidden, heads, kv_heads, head_dim, intermediate, size = _shapes(stack)
    columns = max(tokens, capacity)
    per_token = (4 * hidden + 3 * intermediate + (heads + 2 * kv_heads) * head_dim) * size
    gathered = 2 * columns * kv_heads * head_dim * size
    masks = tokens * columns * (1 + (heads // kv_heads) * size) * len(stack.windows)
    logits = min(tokens, 64) * vocab * 4 * 4
    return tokens * per_token + gathered + masks + logits


@dataclass
class PrefillCounts:
    """The prefill work of a run (or, summed, of an engine's runs). rows: rows whose prompt went into a slot;
    shared_rows: those among them that took a copy of another row's prompt instead of a forward; prompt_tokens:
    their prompts' tokens; prefilled_tokens: the prompt tokens prefill forwards ran (padding not counted);
    forwards: prefill forwards; seconds: the host's time in prefills (forwards, copies, the first token's
    settle; on a GPU what the host waited for); copy_seconds: the copies' share of it."""

    rows: int = 0
    shared_rows: int = 0
    prompt_tokens: int = 0
    prefilled_tokens: int = 0
    forwards: int = 0
    seconds: float = 0.0
    copy_seconds: float = 0.0

    def add(self, other: PrefillCounts) -> None:
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))

    def said(self) -> str:
        return (f"prefilled {self.prefilled_tokens:,} of {self.prompt_tokens:,} prompt tokens in {self.forwards} "
                f"forwards, {self.seconds:.2f} s; {self.shared_rows} of {self.rows} rows took a copy of a prompt "
                f"another row prefilled ({self.copy_seconds:.3f} s)")


@dataclass
class _Chunk:
    """A prefill forward's host side (``_Run.plan_chunk``): its work, rows, where each row's chunk starts and how
    many positions it takes, the rows (indices into ``work.slots``) and slots whose prompt it completes, and where
    its device values (ids, starts, takes, slots, done, entry) are in the refill's pack."""

    work: Prefill
    rows: list[Row]
    starts: list[int]
    takes: list[int]
    done: list[int]
    done_slots: list[int]
    values: dict[str, Packed]


@dataclass
class _Copies:
    """Prompt copies' host side (``_Run.plan_copies``): the followers; per source, the prompt's length and its
    followers in the pack; the followers' slots and entry layers in the pack."""

    followers: list[int]
    targets: dict[int, tuple[int, Packed]]
    slots: Packed
    entry: Packed


@dataclass
class StepRead:
    """A decoding step's read on its way to the host: ``host`` (rows, len(READ_FIELDS)), filled by a non-blocking
    copy (into pinned memory, an ``event`` recorded after it, on CUDA) when the step is launched; ``values`` waits
    for that copy only. Taken one step later (overlapped reads), the device is by then busy with the next step.
    work: the step; num_adv: its advancing rows, padded (the refining rows' results start there)."""

    host: torch.Tensor
    event: object | None
    work: Step
    num_adv: int

    @classmethod
    def start(cls, read: torch.Tensor, work: Step, num_adv: int) -> StepRead:
        cuda = read.device.type == "cuda"
        host = torch.empty(read.shape, dtype=read.dtype, pin_memory=cuda)
        host.copy_(read, non_blocking=True)
        event = None
        if cuda:
            event = torch.cuda.Event()
            event.record()
        return cls(host, event, work, num_adv)

    def values(self) -> list[list[float]]:
        """The step's rows (advancing, then refining; padding left out), by ``READ_FIELDS``."""
        if self.event is not None:
            self.event.synchronize()
        host = self.host.tolist()
        advancing = len(self.work.advancing)
        return host[:advancing] + host[self.num_adv:self.num_adv + len(self.work.refining)]


@dataclass
class PromptState:
    """What a prompt's prefill leaves for the rows that share the prompt, as its holder's forward computed it.
    anchors: (E, D) the last position's input of each entry layer N - L of the run (``invariants.entry_layers``
    order; None when no config refines); last_hidden: (D,) its h^(N) before the final norm; raw: (V,) its logits
    before any soft-cap."""

    anchors: torch.Tensor | None
    last_hidden: torch.Tensor
    raw: torch.Tensor


class _Run:
    """The state of one ``ContinuousEngine.run``: slots, rows, device state, accounting."""

    def __init__(self, engine: ContinuousEngine, requests: Sequence[Request], options: list[LogitsOptions], on_finish):
        self.engine, self.stack, self.requests, self.on_finish = engine, engine.stack, requests, on_finish
        self.options = options
        self.outcomes = [Outcome() for _ in requests]
        max_batch = engine.max_batch if engine.max_batch != "auto" else engine.auto_batch(requests)
        configs = [r.config for r in requests]
        self.num_slots = slot_count(max_batch, engine.refine_headroom, any(c.refines for c in configs), len(requests))
        self.overlap = engine.overlap_reads and not any(c.refines for c in configs)
        self.scheduler = Scheduler(requests, self.outcomes, num_slots=self.num_slots, max_advancing=max_batch,
                                   admit_at=engine.admit_at or max(1, max_batch // 8),
                                   prefill_tokens=engine.prefill_tokens, share_prompts=engine.share_prompts,
                                   overlap=self.overlap)
        self.in_flight: StepRead | None = None  # overlapped reads: the read of the step launched last
        self.prompt_states: dict[tuple[int, ...], PromptState] = {}  # of the prompts a live row holds
        self.prefill_counts = PrefillCounts()
        self.rows = self.scheduler.rows  # the scheduler's, by slot
        self.device = self.stack.device
        parts = self.stack.parts
        vocab = parts.lm_head.weight.shape[0]
        self.invariants = StepInvariants.of(configs, self.stack.num_layers, vocab, parts.logit_softcap, options)
        # captured steps: storage for the longest request at once (graphs must not see it move); eager
        # steps: for the longest prompt, grown by buckets as rows get longer (``step``)
        longest_prompt = max(len(r.prompt) for r in requests)
        capacity = (engine.capacity_for(requests) if engine.runner.capture else
                    length_bucket(longest_prompt + 3, engine.kv_bucket))
        workspace = engine.workspace_for(self.num_slots, capacity)
        self.cache, self.state = workspace.cache, workspace.state
        self.trash = workspace.num_slots  # padding rows of a step write to this slot
        self.sizes = StepSizes.of(self.num_slots, max_batch, engine.kv_bucket, engine.capacity_for(requests),
                                  engine.compile, invariants=self.invariants)
        if engine.compile:
            logger.info("continuous engine: %d slots, %s", self.num_slots, self.sizes.describe())
        self.steps_by_config: Counter = Counter()
        self.refining_steps_by_config: Counter = Counter()

    # ---------------------------------------------------------------- the loop
    def decode(self) -> None:
        """Run what the scheduler says runs, until it says nothing does."""
        while (work := self.scheduler.next_work()) is not None:
            if isinstance(work, Prefill):
                self.prefill(work)
            elif isinstance(work, Drain):
                self.take(self.in_flight)
                self.in_flight = None
            else:
                self.step(work)

    def admit(self, pack: HostPack, slots: list[int]) -> Callable[[Sent], None] | None:
        """The settings of the requests admitted into ``slots``, added to ``pack``; returns what writes them into
        the slot state once the pack is sent (None: nothing admitted). Their prompts are prefilled next."""
        if not slots:
            return None
        rows = [self.rows[s] for s in slots]
        for prompt in [p for p in self.prompt_states if p not in self.scheduler.holders]:
            del self.prompt_states[prompt]  # no slot keeps its K/V any more: no row will copy it
        return self.state.pack_admission(pack, slots, [r.request.config for r in rows], [r.request.seed for r in rows],
                                         [r.request.prompt for r in rows], [self.options[r.index] for r in rows])

    def prefill(self, work: Prefill) -> None:
        """Refill work: the admitted rows' settings (``admit``), one forward of the next chunk of the prompts the
        scheduler picked (``forward_prompts``), then the copies of complete prompts to their followers
        (``copy_prompts``); every row whose prompt is now complete gets its first distribution (gate, token) in one
        settle. Every host value of it (settings, prompt ids, indices) goes to the device in one copy
        (``HostPack``), and its settle's result is its one read."""
        started = time.perf_counter()
        pack = HostPack()
        write_admission = self.admit(pack, work.admitted)
        chunk = self.plan_chunk(pack, work) if work.slots else None
        copies = self.plan_copies(pack, work.copies) if work.copies else None
        followers = [follower for _, follower in work.copies]
        ready = (chunk.done_slots if chunk else []) + followers
        ready_at = pack.add(ready)
        sent = pack.send(self.device)
        if write_admission is not None:
            write_admission(sent)
        done, hidden, raw = self.forward_prompts(chunk, sent) if chunk else ([], None, None)
        if copies:
            copy_started = time.perf_counter()
            copied, copied_hidden, copied_raw = self.copy_prompts(copies, sent)
            assert copied == followers
            self.prefill_counts.copy_seconds += time.perf_counter() - copy_started
            hidden = copied_hidden if hidden is None else torch.cat([hidden, copied_hidden])
            raw = copied_raw if raw is None else torch.cat([raw, copied_raw])
        assert done + followers == ready
        counts = self.prefill_counts
        counts.rows += len(ready)
        counts.shared_rows += len(followers)
        counts.prompt_tokens += sum(len(self.rows[s].request.prompt) for s in ready)
        if ready:
            read = settle(self.stack, self.invariants, self.state, sent[ready_at], 0, hidden, raw)
            self.absorb(read.tolist(), ready)  # rows that end at their first token retire here
        counts.seconds += time.perf_counter() - started

    def plan_chunk(self, pack: HostPack, work: Prefill) -> _Chunk:
        """The host side of a prefill forward (``forward_prompts``): the next chunk of each prompt of ``work.slots``,
        right-padded to Q positions, its values added to ``pack``."""
        slots, chunk = work.slots, work.chunk
        rows = [self.rows[s] for s in slots]
        starts = [row.prefilled for row in rows]
        takes = [min(len(row.request.prompt) - row.prefilled, chunk) for row in rows]
        ids = [list(row.request.prompt[start:start + take]) + [0] * (chunk - take)
               for row, start, take in zip(rows, starts, takes)]
        done = [g for g, (row, start, take) in enumerate(zip(rows, starts, takes))
                if start + take == len(row.request.prompt)]
        entry = [self.stack.num_layers - rows[g].request.config.L for g in done]
        return _Chunk(work, rows, starts, takes, done, [slots[g] for g in done],
                      {name: pack.add(values) for name, values in (("ids", ids), ("starts", starts), ("takes", takes),
                                                                   ("slots", slots), ("done", done), ("entry", entry))})

    def forward_prompts(self, plan: _Chunk, sent: Sent) -> tuple[list[int], torch.Tensor | None, torch.Tensor | None]:
        """One prefill forward of ``plan``'s chunk (``plan_chunk``; ``sent``: its pack on the device), within the
        token budget. Returns the slots whose prompt is now complete, their last position's h^(N) (G', D) and
        logits (G', V) (None, None when none is); with shared prompts their ``PromptState`` is kept for the rows
        of the same prompt."""
        slots, chunk, rows, starts, takes, done = (plan.work.slots, plan.work.chunk, plan.rows, plan.starts,
                                                   plan.takes, plan.done)
        ids, starts_t, takes_t, slots_t, picked, entry = (sent[plan.values[name]] for name in
                                                          ("ids", "starts", "takes", "slots", "done", "entry"))
        offsets = torch.arange(chunk, device=self.device)[None]  # (1, Q)
        positions = starts_t[:, None] + offsets  # (G, Q)
        real = offsets < takes_t[:, None]  # (G, Q) positions of the prompt (the rest is padding)
        cache = self.cache
        # padding positions write to the trash slot
        cache.rows = torch.where(real, slots_t[:, None], self.trash)
        cache.columns = torch.where(real, positions + 1, offsets + 1).clamp(max=cache.capacity - 1)
        cache.gather, cache.span = slots_t, 1 + max(s + t for s, t in zip(starts, takes))
        dtype = self.state.anchor.dtype
        views = {kind: SlotView.of(slots_t, mask, dtype, prefill=True)
                 for kind, mask in prefill_masks(starts_t, chunk, cache.span, self.stack.windows).items()}
        hidden = self.stack.embed(ids)  # (G, Q, D)
        angles = self.stack.rotary_angles(hidden, positions)
        last = takes_t[picked] - 1
        done_slots = slots_t[picked]
        entry_inputs = {}  # entry layer -> (G', D): the prompt state of the rows that share these prompts
        for index in range(self.stack.num_layers):
            if index in self.invariants.entry_layers and done:
                entry_inputs[index] = hidden[picked, last]
                save_anchors(self.state.anchor, done_slots, entry_inputs[index], entry, index)
            kind = self.stack.layer_kinds[index]
            hidden = self.stack.layer(index, hidden, views[kind], angles[kind], positions, cache)
        self.prefill_counts.forwards += 1
        self.prefill_counts.prefilled_tokens += sum(takes)
        advancing = self.scheduler.prefilled(slots, takes)  # finished prompts decode, the others wait their turn
        assert advancing == plan.done_slots  # the forward anchored exactly these rows
        if not done:
            return [], None, None
        last_hidden = hidden[picked, last]  # (G', D)
        raw = self.stack.logits(last_hidden)  # (G', V)
        if self.engine.share_prompts:
            anchors = (torch.stack([entry_inputs[layer] for layer in self.invariants.entry_layers], dim=1)
                       if entry_inputs else None)  # (G', E, D)
            for i, g in enumerate(done):
                self.prompt_states[rows[g].request.prompt] = PromptState(
                    None if anchors is None else anchors[i], last_hidden[i], raw[i])
        return advancing, last_hidden, raw

    def plan_copies(self, pack: HostPack, copies: list[tuple[int, int]]) -> _Copies:
        """The host side of ``copy_prompts``: each source's followers (one prompt, one length; a follower that is
        its own source kept the prompt's K/V) and every follower's entry layer N - L, added to ``pack``."""
        targets: dict[int, list[int]] = defaultdict(list)  # source -> its followers
        for source, follower in copies:
            if source != follower:  # else its own slot kept the prompt's K/V
                targets[source].append(follower)
        followers = [follower for _, follower in copies]
        return _Copies(followers, {source: (len(self.rows[fs[0]].request.prompt), pack.add(fs))
                                   for source, fs in targets.items()}, pack.add(followers),
                       pack.add([self.stack.num_layers - self.rows[f].request.config.L for f in followers]))

    def copy_prompts(self, plan: _Copies, sent: Sent) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        """Give each follower of ``plan`` (``plan_copies``; the sources' prompts complete) the source's prompt K/V
        and the prompt's state: its anchor at its own entry layer N - L, and the last position's h^(N) (F, D) and
        logits (F, V), returned for its first settle. Returns the followers, now past their prompt."""
        for source, (length, followers) in plan.targets.items():
            self.cache.copy_prompt(source, sent[followers], length)
        states = [self.prompt_states[self.rows[f].request.prompt] for f in plan.followers]
        if self.invariants.entry_layers:
            slots, entry = sent[plan.slots], sent[plan.entry]
            anchors = torch.stack([state.anchors for state in states])  # (F, E, D)
            for e, layer in enumerate(self.invariants.entry_layers):
                save_anchors(self.state.anchor, slots, anchors[:, e], entry, layer)
        return (self.scheduler.copied(plan.followers), torch.stack([state.last_hidden for state in states]),
                torch.stack([state.raw for state in states]))

    def step(self, work: Step) -> None:
        """One decoding step: advancing rows feed their newest token, refining rows run one iteration. Its read is
        taken now, or, with overlapped reads, the previous step's is, this step's being taken next time."""
        advancing, refining = work.advancing, work.refining
        # the columns the step reads: the newest position an advancing row writes, a length bucket of it
        rows = work.rows  # with overlapped reads a row whose last step this is has left its slot already
        needed = max([row.position + 3 for row in rows[:len(advancing)]] +
                     [row.position + 2 for row in rows[len(advancing):]])
        # the step's one key (the run's invariants, its row buckets, its width): the step runner trusts it
        key = self.sizes.key(len(advancing), len(refining), needed)  # compiled: buckets; eager: exact row counts
        if key.width > self.cache.capacity:  # eager steps only: a captured run's storage holds its longest request
            self.engine.runner.forget()
            self.cache.grow(key.width)
            self.state.grow_history(key.width)
        self.cache.width = key.width
        num_adv, num_ref = key.advancing, key.refining
        slots = self._upload(advancing + [self.trash] * (num_adv - len(advancing)) +
                             refining + [self.trash] * (num_ref - len(refining)))
        read = self.engine.step_fn(self.stack, key, self.state, self.cache, slots[:num_adv], slots[num_adv:])
        for row in rows[:len(advancing)]:
            row.position += 1
        launched = StepRead.start(read, work, num_adv)
        if self.overlap:
            launched, self.in_flight = self.in_flight, launched
        if launched is not None:
            self.take(launched)

    def take(self, launched: StepRead) -> None:
        """Read a step's result (the step's one read) and hand it to the scheduler; the step counts for the configs
        of its rows that had not ended before it (with overlapped reads, a row that ended at the step before ran it
        and its result is discarded)."""
        values = launched.values()
        work = launched.work
        live = [not row.outcome.finish for row in work.rows]
        self.steps_by_config.update({row.request.config for row, on in zip(work.rows, live) if on})  # once per step
        refining = range(len(work.advancing), len(work.rows))
        self.refining_steps_by_config.update({work.rows[i].request.config for i in refining if live[i]})
        self.absorb(values, work.advancing + work.refining, step=work)

    def _upload(self, values: list[int]) -> torch.Tensor:
        """Host ints to the device without a host sync (pinned memory, non-blocking copy on CUDA): the reads of
        the steps' results (``StepRead``) stay the loop's only syncs."""
        host = torch.tensor(values, dtype=torch.long)
        if self.device.type == "cuda":
            host = host.pin_memory()
        return host.to(self.device, non_blocking=True)

    # ---------------------------------------------------------------- after a forward
    def absorb(self, read: list[list[float]], slots: list[int], step: Step | None = None) -> None:
        """Hand a forward's read (one row per slot of ``slots``; ``step``: the decoding step it is the read of) to
        the scheduler, which applies it (gates, exits, emitted tokens, finishes); each finished request is reported
        (``on_finish``)."""
        rows = step.rows if step is not None else [self.rows[s] for s in slots]
        raise_on_nan_rows([slot for slot, row, values in zip(slots, rows, read)
                           if values[_F["nan"]] and not row.outcome.finish],  # a discarded result raises nothing
                          "a decoding step of the continuous engine")
        for row in self.scheduler.absorb(read, slots, eos=self.engine.eos, stopped=self._stopped,
                                          on_emitted=tokens_emitted, step=step):
            row.outcome.account = row_account(row.outcome, row.request.config)
            if self.on_finish is not None:
                self.on_finish(row.index, row.outcome)

    def _stopped(self, rows: list[Row]) -> set[int]:
        """ids of the rows whose generated text now ends with one of their stop strings: one call of
        each stop-string set's criterion for all its rows of equal tail length (tokens, never the prompt)."""
        groups: dict[tuple, list[Row]] = defaultdict(list)
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
        for config, outs in by_config.items():
            tokens = sum(len(o.tokens) for o in outs)
            iterations = Counter()
            for o in outs:
                iterations.update(o.iterations)
            stats = stats_for(config)
            stats.num_layers, stats.head_layers = n, self.stack.parts.head_layers
            stats.add_batch(steps=self.steps_by_config[config], gated_steps=self.refining_steps_by_config[config],
                            computed_rows=tokens, tokens=tokens, iterations=dict(iterations), L=config.L,
                            computed_refine_rows=sum(k * m for k, m in iterations.items()),
                            head_per_iteration=config.stop_rule.head_per_iteration)
        share_wall_time({config: stats_for(config) for config in by_config}, work, wall_time_s)


def row_account(outcome: Outcome, config: EglrConfig) -> RolloutAccount:
    """A finished row's record, its part of the batch figures as this engine steps a row: once per emitted token
    after the prompt's pass and once per refinement iteration, in refining passes that hold the refining rows
    only. For a run of one row at a time these are the run's figures exactly; with more rows a step is shared
    (the harness replaces them by the row's share of the run's figures when the run ends)."""
    tokens, passes = len(outcome.tokens), sum(k * n for k, n in outcome.iterations.items())
    return own_account(tokens, outcome.iterations, config, steps=max(tokens - 1, 0) + passes, gated_steps=passes,
                       computed_refine_layer_evals=config.L * passes)
