"""The per-slot device state of the continuous engine, and the invariants of one run (``StepInvariants``).

Every tensor here has the engine's B slots plus one trash slot (index B) as its first dimension,
for the whole run: a decoding step reads and writes them by slot index (``fixed_step.py``), and
the host writes a request's settings into its slot when it is admitted, between steps.

Shape letters: the package's legend (``eglr_harness/decoding/__init__.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

import torch

from eglr_harness.core.config import DEFAULT_STOP, EglrConfig
from eglr_harness.decoding.processors import LogitsOptions, ProcessorsInUse


class RowPhase(IntEnum):
    """Where a running row is. The host keeps one per row; a decoding step builds the same values per slot
    (``fixed_step.decode_step``), where PREFILL stands for every slot that takes no part in the step."""

    PREFILL = 0  # its prompt is not all in the K/V yet (or, in a step: the slot is idle)
    ADVANCE = 1  # feeds its newest token this step
    REFINE = 2  # runs one refinement iteration of its pending position this step


READ_FIELDS = ("token", "gated", "emitted", "entropy", "logprob", "kl", "iterations", "nan")
"""Columns of the one (G, len(READ_FIELDS)) fp32 read per step: the emitted token (-1 when none), whether
an advancing row was gated (it refines next), whether the row emitted, the normal pass's raw-logit
entropy (advancing rows), the emitted token's log-probability, the KL of the iteration (refining
rows), the iteration count k (refining rows), and whether the row's logits were non-finite."""


@dataclass(frozen=True)
class Packed:
    """Where ``HostPack.add`` put a value: its elements' offset and count in the pack, its shape and dtype."""

    offset: int
    numel: int
    shape: tuple[int, ...]
    dtype: torch.dtype


class HostPack:
    """Host values bound for the device, sent in one copy (the ~30 values of a refill: settings, indices, prompt
    ids): ``add`` each (ints, bools or floats, nested lists of one shape), then ``send`` once, and ``sent[handle]``
    is each on the device, a view of the one upload (or a cast of it). Ints and bools travel as int64, floats by
    the bits of their float64 value, cast on the device to their dtype (a Python float rounds to fp32 there as
    ``torch.tensor(values, dtype=torch.float32)`` rounds it). On CUDA the pack is pinned and copied without
    blocking, so a refill's uploads make the host wait for nothing."""

    def __init__(self):
        self._parts: list[torch.Tensor] = []
        self._size = 0

    def add(self, values, dtype: torch.dtype = torch.long) -> Packed:
        """values: a (nested) list of numbers; dtype: what ``sent[handle]`` is on the device."""
        floating = dtype.is_floating_point
        host = torch.tensor(values, dtype=torch.float64 if floating else torch.long)
        handle = Packed(self._size, host.numel(), tuple(host.shape), dtype)
        self._parts.append((host.view(torch.long) if floating else host).reshape(-1))
        self._size += host.numel()
        return handle

    def send(self, device: torch.device | str) -> Sent:
        """The one copy to ``device`` (pinned and non-blocking on CUDA)."""
        flat = torch.cat(self._parts) if self._parts else torch.zeros(0, dtype=torch.long)
        device = torch.device(device)
        if device.type == "cuda":
            flat = flat.pin_memory()
        return Sent(flat.to(device, non_blocking=True))


@dataclass
class Sent:
    """A ``HostPack`` on the device (``flat``: its int64 values); ``sent[handle]`` unpacks one value."""

    flat: torch.Tensor

    def __getitem__(self, handle: Packed) -> torch.Tensor:
        part = self.flat[handle.offset:handle.offset + handle.numel]
        if handle.dtype.is_floating_point:
            part = part.view(torch.float64).to(handle.dtype)
        elif handle.dtype == torch.bool:
            part = part != 0
        elif handle.dtype != torch.long:
            part = part.to(handle.dtype)
        return part.view(handle.shape)


@dataclass(frozen=True)
class StepInvariants:
    """What a run's steps share, fixed for the run (a compiled step specialises on it).

    join_layer: N - max L of the refining configs, where refining rows enter the step (N: none).
    entry_layers: the layers N - L of every refining L (anchors are saved there, refined states enter).
    sampled: whether any request samples (else the draw is left out of the step).
    num_candidates: tokens a draw considers per row (>= every top_k; V when some top_k is 0).
    logit_softcap: the model's final-logit soft-cap, or None.
    processors: which of generate's logits processors some request uses (``processors.py``).
    stop: the exit rule of the run's refinement (``core.config.STOP_RULES``): one per run, as the step
        computes one rule's signal.
    """

    num_layers: int
    join_layer: int
    entry_layers: tuple[int, ...]
    sampled: bool
    num_candidates: int
    logit_softcap: float | None
    processors: ProcessorsInUse = ProcessorsInUse()
    stop: str = DEFAULT_STOP

    @classmethod
    def of(cls, configs: list[EglrConfig], num_layers: int, vocab: int, logit_softcap: float | None,
           options: list[LogitsOptions] | None = None) -> "StepInvariants":
        spans = sorted({c.L for c in configs if c.refines})
        rules = sorted({c.stop for c in configs if c.refines})
        if len(rules) > 1:
            raise ValueError(f"`stop`={rules!r} in one continuous run is not allowed; allowed: one exit rule per run.")
        sampled = [c for c in configs if c.sampled]
        if any(c.top_k == 0 for c in sampled):
            candidates = vocab
        else:
            # a margin of 8 keeps tokens tied with a row's k-th best, as TopKLogitsWarper keeps them
            candidates = min(vocab, max((c.top_k for c in sampled), default=1) + 8)
        return cls(num_layers=num_layers, join_layer=num_layers - max(spans, default=0),
                   entry_layers=tuple(num_layers - L for L in reversed(spans)), sampled=bool(sampled),
                   num_candidates=candidates, logit_softcap=logit_softcap,
                   processors=ProcessorsInUse.of(options or [], [c.sampled for c in configs]),
                   stop=rules[0] if rules else DEFAULT_STOP)


@dataclass
class SlotSettings:
    """Per-slot settings of the requests in the slots (first dimension B + 1): written when a request is
    admitted, read by the steps, never written by them (as vLLM keeps sampling metadata apart from the batch).

    L, alpha, k_max, stop_threshold (the exit rule's: ``tau_kl`` for stop=kl), tau_h: the EGLR cell;
    temperature, top_k, top_p, sampled, seed, min_p: the draw;
    penalty, ngram, eos_blocked_until, suppress, begin_suppress: generate's logits processors
    (``processors.py``; suppress, begin_suppress: (B+1, V|1) banned tokens, a V axis only where the run's
    invariants use them); eos: (V,) the engine's EOS tokens.
    """

    L: torch.Tensor
    alpha: torch.Tensor  # fp32
    one_minus_alpha: torch.Tensor  # fp32, 1 - alpha taken in float64 as a Python scalar would be
    k_max: torch.Tensor
    stop_threshold: torch.Tensor  # float64: compared as the Python floats of the config
    tau_h: torch.Tensor  # float64; inf for configs that never refine
    temperature: torch.Tensor  # fp32; 1.0 (a placeholder) for greedy rows
    top_k: torch.Tensor
    top_p: torch.Tensor  # fp32
    sampled: torch.Tensor  # bool
    seed: torch.Tensor
    penalty: torch.Tensor  # fp32, 1.0 = off
    ngram: torch.Tensor  # bool: the row bans repeated n-grams
    eos_blocked_until: torch.Tensor  # long: EOS banned while drawn < it
    suppress: torch.Tensor
    begin_suppress: torch.Tensor
    min_p: torch.Tensor  # fp32, 0 = off
    eos: torch.Tensor


@dataclass
class SlotState:
    """The running state of every slot (first dimension B + 1), written by the steps (and reset at
    admission), beside the requests' ``settings``.

    token: the row's newest token (fed when it advances); position: its last position with a key/value
    in the slot; iterations: refinement iterations done at the pending position; drawn: tokens emitted
    so far (the draw counter of the sampling noise); anchor, h_prev: (B+1, D) a and h^(N'k) of the
    pending position; h_prev2: (B+1, D) h^(N) one iteration before h_prev (stop=accel only); streak:
    (B+1,) consecutive exit-rule hits of the pending position (``functional.hit_streak``); logp_prev:
    (B+1, V) fp32 log-probabilities of the last distribution computed.
    The processors' state has a V axis only where the run's invariants use it, else 1: seen: (B+1, V|1) tokens
    of the prompt and the generation (repetition penalty); history: (B+1, C) the row's tokens by position
    (no_repeat_ngram; C: the K/V storage's columns).
    """

    token: torch.Tensor
    position: torch.Tensor
    iterations: torch.Tensor
    drawn: torch.Tensor
    anchor: torch.Tensor
    h_prev: torch.Tensor
    h_prev2: torch.Tensor
    streak: torch.Tensor
    logp_prev: torch.Tensor
    seen: torch.Tensor
    history: torch.Tensor
    settings: SlotSettings

    @classmethod
    def allocate(cls, num_slots: int, hidden: int, vocab: int, dtype, device, *,
                 processors: ProcessorsInUse = ProcessorsInUse(), eos_token_ids=(), history_width: int = 1):
        n = num_slots + 1  # the trash slot
        long = dict(dtype=torch.long, device=device)
        f32, f64 = dict(dtype=torch.float32, device=device), dict(dtype=torch.float64, device=device)
        settings = SlotSettings(
            L=torch.zeros(n, **long), alpha=torch.zeros(n, **f32), one_minus_alpha=torch.ones(n, **f32),
            k_max=torch.ones(n, **long), stop_threshold=torch.zeros(n, **f64), tau_h=torch.full((n,), math.inf, **f64),
            temperature=torch.ones(n, **f32), top_k=torch.zeros(n, **long), top_p=torch.ones(n, **f32),
            sampled=torch.zeros(n, dtype=torch.bool, device=device), seed=torch.zeros(n, **long),
            penalty=torch.ones(n, **f32), ngram=torch.zeros(n, dtype=torch.bool, device=device),
            eos_blocked_until=torch.zeros(n, **long), suppress=_flags(n, vocab if processors.suppress else 1, device),
            begin_suppress=_flags(n, vocab if processors.begin_suppress else 1, device),
            min_p=torch.zeros(n, **f32), eos=_flags(1, vocab, device)[0],
        )
        ids = torch.tensor([t for t in eos_token_ids if 0 <= t < vocab], dtype=torch.long)
        settings.eos[ids.to(device)] = True
        return cls(
            token=torch.zeros(n, **long), position=torch.zeros(n, **long), iterations=torch.zeros(n, **long),
            drawn=torch.zeros(n, **long), anchor=torch.zeros(n, hidden, dtype=dtype, device=device),
            h_prev=torch.zeros(n, hidden, dtype=dtype, device=device),
            h_prev2=torch.zeros(n, hidden, dtype=dtype, device=device), streak=torch.zeros(n, **long),
            logp_prev=torch.zeros(n, vocab, **f32),
            seen=_flags(n, vocab if processors.penalty else 1, device),
            history=torch.zeros(n, history_width if processors.ngram_size else 1, **long), settings=settings,
        )

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor of the slots, running state and settings, by name (``settings.`` before a setting's)."""
        tensors = {name: value for name, value in vars(self).items() if isinstance(value, torch.Tensor)}
        tensors.update({f"settings.{name}": value for name, value in vars(self.settings).items()})
        return tensors

    def grow_history(self, width: int) -> None:
        """Keep the token history as wide as the K/V storage when it grows (eager, between steps)."""
        history = self.history.new_zeros(self.history.shape[0], width)
        history[:, :self.history.shape[1]] = self.history
        self.history = history

    def admit(self, slots: list[int], configs: list[EglrConfig], seeds: list[int | None],
              prompts: list[tuple[int, ...]], options: list[LogitsOptions]) -> None:
        """Write the settings of newly admitted requests into ``slots`` and reset their running state
        (host -> device in one copy, eager)."""
        pack = HostPack()
        write = self.pack_admission(pack, slots, configs, seeds, prompts, options)
        write(pack.send(self.position.device))

    def pack_admission(self, pack: HostPack, slots: list[int], configs: list[EglrConfig], seeds: list[int | None],
                       prompts: list[tuple[int, ...]], options: list[LogitsOptions]) -> Callable[[Sent], None]:
        """``admit`` in two halves, so that a refill sends its admission with its other values in one copy: adds
        the admission's values to ``pack`` and returns what writes them into the slots once ``pack`` is sent."""
        settings = self.settings
        index = pack.add(slots)
        values = {  # tensor -> its values for the admitted rows
            "L": [c.L for c in configs], "alpha": [c.alpha for c in configs],
            "one_minus_alpha": [1.0 - c.alpha for c in configs], "k_max": [c.k_max for c in configs],
            "stop_threshold": [c.stop_threshold for c in configs], "tau_h": [c.gate_tau_h for c in configs],
            "temperature": [c.T if c.sampled else 1.0 for c in configs], "top_k": [c.top_k for c in configs],
            "top_p": [c.top_p for c in configs], "sampled": [c.sampled for c in configs],
            "seed": [s or 0 for s in seeds], "penalty": [o.repetition_penalty for o in options],
            "ngram": [o.no_repeat_ngram_size > 0 for o in options],
            "eos_blocked_until": [o.eos_blocked_until(len(p)) for o, p in zip(options, prompts)],
            "min_p": [o.min_p if c.sampled else 0.0 for o, c in zip(options, configs)],
        }
        targets = {name: getattr(settings, name) for name in values}
        values["position"], targets["position"] = [len(p) - 1 for p in prompts], self.position
        puts = [(targets[name], pack.add(v, targets[name].dtype)) for name, v in values.items()]
        # per-slot token sets: (slot, token) pairs set True after the slots' rows are cleared
        flags = []
        for tensor, tokens in ((self.seen, prompts), (settings.suppress, [o.suppress_tokens for o in options]),
                               (settings.begin_suppress, [o.begin_suppress_tokens for o in options])):
            if tensor.shape[1] > 1:
                pairs = [(slot, t) for slot, ids in zip(slots, tokens) for t in ids if t < tensor.shape[1]]
                flags.append((tensor, pack.add([p[0] for p in pairs]), pack.add([p[1] for p in pairs])))
        history = None
        if self.history.shape[1] > 1:  # the prompt by position: (slot, column, token) triples
            width = self.history.shape[1]
            triples = [(slot, c, t) for slot, prompt in zip(slots, prompts) for c, t in enumerate(prompt[:width])]
            history = [pack.add([triple[i] for triple in triples]) for i in range(3)]

        def write(sent: Sent) -> None:
            rows = sent[index]
            for tensor, handle in puts:
                tensor.index_copy_(0, rows, sent[handle])
            for tensor in (self.iterations, self.drawn):
                tensor.index_fill_(0, rows, 0)
            for tensor, at, ids in flags:
                tensor.index_fill_(0, rows, False)
                tensor.index_put_((sent[at], sent[ids]), torch.ones_like(sent[ids], dtype=torch.bool))
            if history is not None:
                self.history.index_put_(tuple(sent[h] for h in history[:2]), sent[history[2]])
        return write


def _flags(rows: int, width: int, device) -> torch.Tensor:
    return torch.zeros(rows, width, dtype=torch.bool, device=device)
