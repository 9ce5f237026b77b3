"""Per-request EGLR settings inside a vLLM engine: ``SamplingParams(extra_args={"eglr": {...}})``.

vLLM's v1 engine tells its logits processors which request sits in which row of the persistent
batch (``update_state``, called before every forward pass); the model's forward has no such
view. ``EglrRowSettings`` is a logits processor that changes no logits and keeps, per batch row,
the ``EglrConfig`` of the request in that row, for the EGLR model of the same engine to read
(``settings_for``). vLLM loads it for every engine through the ``vllm.logits_processors`` entry
point (pyproject.toml), and calls ``validate_params`` on each request as it arrives, so a bad
setting is refused with a one-line error before it reaches the engine.

The request's temperature, top-k, top-p and seed stay vLLM's own sampling parameters: EGLR only
changes the logits they are applied to (eglr-method.md §2, step 4).

Signals. A request whose settings carry a ``tag`` (a str) has, per generated token, its normal pass's
entropy, its refinement iterations k* and its last KL recorded under that tag, keyed by the token's
position in the request's output (the length of vLLM's live output list when the step runs: a chunked
prefill's earlier chunks and a preempted request's recomputation write the position again, and the
last write, the step whose token vLLM keeps, stays). The record lives in the worker's process: the
caller takes it through vLLM's RPC (``worker.py``) and ``take_signals`` removes it.
"""

from __future__ import annotations

import math

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from eglr_harness.core.config import EglrConfig, parse_tau_h

EXTRA_ARGS_KEY = "eglr"
# what a request may set, and what it gets when it sets nothing (plain decoding)
REQUEST_KEYS = ("L", "tau_h", "alpha", "k_max", "tau_kl", "tag")
_PLAIN = EglrConfig(L=0, tau_h=math.inf)

# id(vllm_config) -> the engine's tracker; the model of the same engine (same worker process,
# same config object) looks it up. A re-built input batch re-creates its logits processors: the
# newest wins.
_TRACKERS: dict[int, "EglrRowSettings"] = {}


def request_config(extra_args: dict | None) -> EglrConfig:
    """The EGLR settings of one request, validated; plain decoding when it names none.

    extra_args: ``SamplingParams.extra_args``; its ``"eglr"`` entry is a dict of ``REQUEST_KEYS``.
    ValueError (one line) for an unknown key or a value outside its range.
    """
    given = (extra_args or {}).get(EXTRA_ARGS_KEY)
    if given is None:
        return _PLAIN
    if not isinstance(given, dict):
        raise ValueError(f"extra_args[{EXTRA_ARGS_KEY!r}]={given!r} is not allowed; allowed: a dict with keys "
                         f"{', '.join(REQUEST_KEYS)}.")
    unknown = sorted(set(given) - set(REQUEST_KEYS))
    if unknown:
        raise ValueError(f"extra_args[{EXTRA_ARGS_KEY!r}] key {unknown[0]!r} is not allowed; allowed: "
                         f"{', '.join(REQUEST_KEYS)}.")
    settings = dict(given)
    tag = settings.pop("tag", None)
    if tag is not None and not isinstance(tag, str):
        raise ValueError(f"extra_args[{EXTRA_ARGS_KEY!r}]['tag']={tag!r} is not allowed; allowed: a str.")
    if "tau_h" in settings:
        settings["tau_h"] = parse_tau_h(settings["tau_h"])
        if settings["tau_h"] == "auto":
            raise ValueError("extra_args['eglr']['tau_h']='auto' is not allowed inside vLLM; allowed: a float >= 0 "
                             "nats or 'inf' (calibrate first: eglr-calibrate, or lm_eval --model eglr-vllm).")
    return EglrConfig(**{"L": 0, "tau_h": math.inf, **settings})


class EglrRowSettings(LogitsProcessor):
    """Tracks each batch row's ``EglrConfig``; leaves the logits alone."""

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        request_config(sampling_params.extra_args)

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self._rows: dict[int, EglrConfig] = {}
        self._tags: dict[int, str] = {}
        self._outputs: dict[int, list[int]] = {}  # row -> the request's live output token ids (vLLM's list)
        self.signals: dict[str, dict[int, tuple[float, int, float]]] = {}  # tag -> {output position: signals}
        _TRACKERS[id(vllm_config)] = self

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits

    def is_argmax_invariant(self) -> bool:
        return True  # it changes nothing, greedy rows included

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:  # vLLM's order: removed, added, moved
            self._rows.pop(index, None)
            self._tags.pop(index, None)
            self._outputs.pop(index, None)
        for index, params, _prompt, output in batch_update.added:
            self._rows[index] = request_config(params.extra_args)
            self._outputs[index] = output
            tag = request_tag(params.extra_args)
            if tag is None:
                self._tags.pop(index, None)
            else:
                self._tags[index] = tag
        for a, b, direction in batch_update.moved:
            for table in (self._rows, self._tags, self._outputs):
                moved_a = table.pop(a, None)
                if direction == MoveDirectionality.SWAP:
                    moved_b = table.pop(b, None)
                    if moved_b is not None:
                        table[a] = moved_b
                if moved_a is not None:
                    table[b] = moved_a

    def configs(self, num_rows: int) -> list[EglrConfig]:
        """The settings of batch rows 0..num_rows-1 (plain decoding for a row it never saw)."""
        return [self._rows.get(row, _PLAIN) for row in range(num_rows)]

    def records(self, num_rows: int) -> bool:
        """Whether any of batch rows 0..num_rows-1 has its signals recorded."""
        return any(row < num_rows for row in self._tags)

    def record(self, entropies: list[float], iterations: list[int], kls: list[float]) -> None:
        """One step's signals of batch rows 0..R-1 (each list R long); kept for the tagged rows, at the position
        of the token the step samples for each."""
        for row, tag in self._tags.items():
            if row < len(entropies):
                position = len(self._outputs.get(row) or ())
                self.signals.setdefault(tag, {})[position] = (entropies[row], iterations[row], kls[row])


def request_tag(extra_args: dict | None) -> str | None:
    """The request's signal tag (``extra_args["eglr"]["tag"]``), or None."""
    given = (extra_args or {}).get(EXTRA_ARGS_KEY)
    return given.get("tag") if isinstance(given, dict) else None


def take_signals(tag: str) -> list[tuple[float, int, float]]:
    """The signals recorded under ``tag`` by this process's engines, removed from the record: one
    (entropy, k*, last KL) per generated token of the request, in order."""
    for tracker in _TRACKERS.values():
        if tag in tracker.signals:
            by_position = tracker.signals.pop(tag)
            return [by_position[position] for position in sorted(by_position)]
    return []


def settings_for(vllm_config) -> EglrRowSettings | None:
    """The tracker of the engine built from ``vllm_config`` (None when vLLM did not load it)."""
    return _TRACKERS.get(id(vllm_config))
