"""Per-request EGLR settings inside a vLLM engine: ``SamplingParams(extra_args={"eglr": {...}})`` offline, or the
flat keys ``eglr_L``, ``eglr_tau_h``, ... (``vllm_xargs`` of vLLM's OpenAI server, which takes flat scalars only).

vLLM tells its logits processors which request holds which persistent slot of its batch; the model's
forward has no such view. ``EglrRowSettings`` is a logits processor that changes no logits and keeps, per
slot, the ``EglrConfig`` of the request in it, for the EGLR model of the same engine to read
(``settings_for``). One class has both of vLLM's logits-processor interfaces, so one ``engine_args`` serves
whichever model runner vLLM picks at engine start (``VllmConfig.use_v2_model_runner``: Triton, the
environment, the features asked for):

- V1's runner: ``update_state`` (rows removed, added, moved; called before every forward pass). Its slot is
  its persistent-batch row, and the forward's row i is batch row i (V1 condenses its batch).
- Model Runner V2 (MRV2, ``vllm/v1/worker/gpu/``): ``add_request`` per slot (MRV2 tells a processor of no
  removal: a freed slot's next ``add_request`` overwrites every field, as its interface asks). Its forward's
  batch position i holds slot ``idx_mapping[i]``, which MRV2 hands its logits processors only at sampling,
  after the forward; the model gets it through its own MRV2 model state (``model_state.py``).

The EGLR engine names it in its own arguments (``engine_args``: vLLM's ``logits_processors=``), never through
the ``vllm.logits_processors`` entry point, which vLLM loads into every engine (MRV2 refuses V1-interface classes
there: the entry point the project had stopped every engine of an environment with the project installed).
vLLM calls ``validate_params`` on each request as it arrives, so a bad setting is refused with a one-line error
(HTTP 400 behind a server) before it reaches the engine.

The engine's served spans are part of the class vLLM is given: ``processor_name(spans)`` names
``EglrRowSettings_L_<spans>``, a subclass this module makes on first lookup (``__getattr__``) whose
``validate_params`` also refuses an ``L`` the engine does not serve. ``validate_params`` is a classmethod
called in the front end with the request's parameters only, so what it checks must travel in the class:
a name survives vLLM's processes (the engine core and workers import it again) and its CLI.

The request's temperature, top-k, top-p and seed stay vLLM's own sampling parameters: EGLR only
changes the logits they are applied to (eglr-method.md §2, step 4).

Signals. A request whose settings carry a ``tag`` (a str) has, per generated token, its normal pass's
entropy, its refinement iterations k* and its last KL recorded under that tag, keyed by the token's
position in the request's output (the length of vLLM's live output list when the step runs: a chunked
prefill's earlier chunks and a preempted request's recomputation write the position again, and the
last write, the step whose token vLLM keeps, stays). The record lives in the worker's process: the
caller takes it through vLLM's RPC (``worker.py``) and ``take_signals`` removes it. Untagged requests
record nothing.
"""

from __future__ import annotations

import logging
import math
import weakref

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality
# MRV2's interface module is import-light (vLLM's front end loads it to validate requests): no Triton needed
from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsProcessor as RunnerV2LogitsProcessor
from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsProcRequestState

from eglr_harness.core.config import (
    LAYER_SPAN_RULE,
    SETTING_RULES,
    STOP_THRESHOLD_ARGS,
    EglrConfig,
    SettingRule,
    check_stop,
    has_gate,
    parse_tau_h,
)

EXTRA_ARGS_KEY = "eglr"
FLAT_PREFIX = "eglr_"  # vllm_xargs' flat form: extra_args["eglr_L"] is extra_args["eglr"]["L"]
# what a request may set, and what it gets when it sets nothing (plain decoding)
REQUEST_KEYS = ("L", "tau_h", "alpha", "k_max", "tau_kl", "stop", *STOP_THRESHOLD_ARGS, "tag")
# a request's refinement budget: every row of a step waits for the slowest one's iterations, so one request's
# k_max=10**9 (with tau_kl=0) would stall the whole batch. The paper's ablation spans k_max 1..5 (eglr-method.md
# §3); 16 leaves room for studies without letting one request hold the engine.
MAX_K_MAX = 16
# a request's k_max: eglr-hf's rule (SETTING_RULES["k_max"]) within MAX_K_MAX
K_MAX_RULE = SettingRule(True, lambda v: 1 <= v <= MAX_K_MAX, f"an int in [1, {MAX_K_MAX}] inside vLLM (every row "
                         "of a step waits for its slowest refinement)")
NO_TAG = "no tag (the per-token signals are taken back by eglr-vllm's offline engine only)"
PROCESSOR_CLASS = "EglrRowSettings"
NO_SPANS = "none"  # the name's spans part for an engine that refines with no L (plain decoding only)
UNTAGGED = "_untagged"  # the name's suffix of a processor that refuses signal tags (``processor_name``)
# MRV2: the keyword argument of the model's forward that carries the slot of each of its rows (model_state.py)
REQUEST_SLOTS_ARG = "eglr_request_slots"
_PLAIN = EglrConfig(L=0, tau_h=math.inf)
logger = logging.getLogger(__name__)

# id(vllm_config) -> the engine's tracker; the model of the same engine (same worker process,
# same config object) looks it up. A re-built input batch re-creates its logits processors: the
# newest wins. An entry goes with its config (``_track``): a process that builds engine after engine keeps only
# the live ones' trackers and records.
_TRACKERS: dict[int, "EglrRowSettings"] = {}
# the signal tags admitted by this process's front end (``admit_tag``): a few bytes per tagged request
_ADMITTED_TAGS: set[str] = set()


def request_settings(extra_args: dict | None) -> dict | None:
    """The EGLR settings a request names, as a dict of ``REQUEST_KEYS``, from either form of ``extra_args``:
    nested (``{"eglr": {"L": 4, ...}}``) or flat (``{"eglr_L": 4, ...}``); None when it names none.
    ValueError (one line) for a key outside ``REQUEST_KEYS`` or both forms at once."""
    extra_args = extra_args or {}
    if not isinstance(extra_args, dict):
        raise ValueError(f"extra_args={extra_args!r} is not allowed; allowed: a dict.")
    flat = {key[len(FLAT_PREFIX):]: value for key, value in extra_args.items()
            if isinstance(key, str) and key.startswith(FLAT_PREFIX)}
    nested = extra_args.get(EXTRA_ARGS_KEY)
    if nested is not None and flat:
        raise ValueError(f"extra_args has both {EXTRA_ARGS_KEY!r} and {FLAT_PREFIX}* keys "
                         f"({FLAT_PREFIX}{sorted(flat)[0]}); allowed: one of the two forms.")
    if nested is None and not flat:
        return None
    if nested is not None and not isinstance(nested, dict):
        raise ValueError(f"extra_args[{EXTRA_ARGS_KEY!r}]={nested!r} is not allowed; allowed: a dict with keys "
                         f"{', '.join(REQUEST_KEYS)}.")
    given, where = (nested, f"extra_args[{EXTRA_ARGS_KEY!r}] key ") if nested is not None else (flat, "extra_args key ")
    unknown = sorted(set(given) - set(REQUEST_KEYS), key=repr)  # a key of any type (JSON's are str, Python's any)
    if unknown:
        prefix = "" if nested is not None else FLAT_PREFIX
        named = unknown[0] if nested is not None else prefix + unknown[0]
        raise ValueError(f"{where}{named!r} is not allowed; allowed: "
                         f"{', '.join(prefix + key for key in REQUEST_KEYS)}.")
    return dict(given)


def request_config(extra_args: dict | None, served: frozenset[int] | None = None,
                   takes_tags: bool = True) -> EglrConfig:
    """The EGLR settings of one request, validated; plain decoding when it names none.

    extra_args: ``SamplingParams.extra_args`` (``request_settings``'s two forms); served: the spans L the engine
    refines with (None: not known here; the worker decodes an unserved L plainly, ``_set_slot``); takes_tags: whether
    a signal ``tag`` is allowed (False behind a server).
    Each value is read as eglr-hf reads its model args (``SettingRule.read`` of ``core/config``): a number or its
    text, an int setting from an integral value (``L`` 4, 4.0 and "4"; never 2.5 or true); ``tau_h`` by
    ``parse_tau_h``, ``stop`` by ``check_stop`` (any case, any surrounding spaces); a threshold of a rule other than
    the request's is checked and unread, as eglr-hf takes it.
    ValueError (one line, naming what this engine allows) for an unknown key, a value outside its range, an L > 0
    without ``tau_h`` (the spec's default is calibrated per task, which a single request cannot do), a ``k_max``
    above ``MAX_K_MAX``, an L not served, or a tag where none is taken (``takes_tags``) or that is not a str.
    """
    settings = request_settings(extra_args)
    if settings is None:
        return _PLAIN
    tag = settings.pop("tag", None)
    if tag is not None and not takes_tags:
        # a server's clients cannot take a record back (the OpenAI API has no route to the workers): a tagged
        # request's record, and its tag in the front end, would stay for the server's life
        raise ValueError(f"`tag`={tag!r} is not allowed by this server; allowed: {NO_TAG}.")
    if tag is not None and not isinstance(tag, str):
        raise ValueError(f"`tag`={tag!r} is not allowed; allowed: a str, or no tag.")
    values = {name: _read_setting(name, value, served) for name, value in settings.items()}
    if values.get("tau_h") == "auto":
        raise ValueError("`tau_h`='auto' is not allowed inside vLLM; allowed: a float >= 0 nats or 'inf' "
                         "(calibrate first: eglr-calibrate, or lm_eval --model eglr-vllm).")
    config = EglrConfig(**{"L": 0, "tau_h": math.inf, **values})
    if has_gate(config.L) and "tau_h" not in values:
        raise ValueError(f"`L`={config.L} needs `tau_h`; allowed: a float >= 0 nats or 'inf' (the spec's default "
                         "is calibrated per task: eglr-calibrate, or lm_eval --model eglr-vllm).")
    if served is not None and config.L > 0 and config.L not in served:
        raise ValueError(f"`L`={config.L} is not served by this engine; allowed: {_served_list(served)}.")
    return config


def _read_setting(name: str, value, served: frozenset[int] | None):
    """One request value as eglr-hf reads the model arg of that name (``request_config``); one-line ValueError."""
    if name == "tau_h":
        return parse_tau_h(value)
    if name == "stop":
        return check_stop(value)
    if name == "L":
        if served is None:
            return LAYER_SPAN_RULE.read(name, value)
        return SettingRule(True, lambda v: v >= 0, _served_list(served)).read(name, value)
    return (K_MAX_RULE if name == "k_max" else SETTING_RULES[name]).read(name, value)


def _served_list(served: frozenset[int]) -> str:
    """The L values an engine serving ``served`` admits, as a message says them: ``0, 4, 10``."""
    return ", ".join(["0", format_spans(served)] if served else ["0"])


def format_spans(spans) -> str:
    """``[1, 2, 3, 4, 10]`` -> ``'1-4, 10'`` (runs of consecutive spans as ranges)."""
    return ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in _runs(spans))


def _runs(spans) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for span in sorted(set(spans)):
        if runs and span == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], span)
        else:
            runs.append((span, span))
    return runs


def processor_name(spans, tags: bool = True) -> str:
    """The fully qualified name (vLLM's ``module:Class``) of the row-settings processor of an engine that serves
    ``spans`` (None: spans unknown; the step checks them): what ``engine_args`` passes as ``logits_processors``.
    ``tags=False``: the processor refuses a request's signal tag (``UNTAGGED``: behind a server)."""
    suffix = "" if tags else UNTAGGED
    if spans is None:
        return f"{__name__}:{PROCESSOR_CLASS}{suffix}"
    runs = "_".join(f"{a}to{b}" if a != b else str(a) for a, b in _runs(spans)) or NO_SPANS
    return f"{__name__}:{PROCESSOR_CLASS}_L_{runs}{suffix}"


def _spans_of(name: str) -> frozenset[int] | None:
    """The spans of a ``processor_name`` class name (its ``UNTAGGED`` suffix left out); None when it is not one."""
    name = name.removesuffix(UNTAGGED)
    prefix = f"{PROCESSOR_CLASS}_L_"
    if not name.startswith(prefix):
        return None
    if name == prefix + NO_SPANS:
        return frozenset()
    spans: set[int] = set()
    for part in name[len(prefix):].split("_"):
        low, _, high = part.partition("to")
        if not (low.isdigit() and (high or low).isdigit()):
            return None
        spans.update(range(int(low), int(high or low) + 1))
    return frozenset(spans) if spans and min(spans) >= 1 else None


def __getattr__(name: str):
    """``EglrRowSettings_L_<spans>``: the row-settings class of an engine serving those spans, made once per process
    (vLLM's loaders and pickle look the class up by this name in each of vLLM's processes)."""
    spans = None if name == PROCESSOR_CLASS + UNTAGGED else _spans_of(name)
    if spans is None and name != PROCESSOR_CLASS + UNTAGGED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = type(name, (EglrRowSettings,), {"served": spans, "takes_tags": not name.endswith(UNTAGGED),
                                          "__module__": __name__, "__qualname__": name})
    globals()[name] = cls
    return cls


class EglrRowSettings(LogitsProcessor, RunnerV2LogitsProcessor):
    """Tracks each slot's ``EglrConfig``; leaves the logits alone. ``served``: the spans the engine refines with,
    checked at admission (None here: the subclasses ``processor_name`` names set it).

    Both runners feed one slot table (slot -> settings, tag, where its output position is read); the model asks
    it for the slots of its forward's rows (``batch_slots``) and reads those slots' settings."""

    served: frozenset[int] | None = None
    takes_tags: bool = True  # False behind a server (``processor_name(spans, tags=False)``)

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        request_config(sampling_params.extra_args, cls.served, cls.takes_tags)
        admit_tag(request_tag(sampling_params.extra_args), sampling_params.n)

    def __init__(self, vllm_config, device_or_request_state, is_pin_memory: bool | None = None) -> None:
        # V1 builds it as (vllm_config, device, is_pin_memory), MRV2 as (vllm_config, LogitsProcRequestState)
        hf_config = vllm_config.model_config.hf_config
        check_admits_served(self.served, hf_config)
        self._model_spans = model_spans(hf_config)  # what the model refines with (a request outside: plain)
        self._request_state = (device_or_request_state
                               if isinstance(device_or_request_state, LogitsProcRequestState) else None)
        self._rows: dict[int, EglrConfig] = {}  # slot -> settings
        self._tags: dict[int, str] = {}
        self._outputs: dict[int, list[int]] = {}  # V1: slot -> the request's live output token ids (vLLM's list)
        self.signals: dict[str, dict[int, tuple[float, int, float]]] = {}  # tag -> {output position: signals}
        _track(vllm_config, self)

    def apply(self, logits: torch.Tensor, ctx=None) -> torch.Tensor:
        return logits  # V1 calls apply(logits), MRV2 apply(logits, ctx)

    def is_argmax_invariant(self) -> bool:
        return True  # it changes nothing, greedy rows included

    def add_request(self, req_idx: int, sampling_params) -> bool:
        """MRV2: the request entering slot ``req_idx`` (a recycled slot's previous occupant is overwritten whole).
        False: it modifies no logits (MRV2's sampler then skips its logits-processing copy for such a batch)."""
        self._set_slot(req_idx, sampling_params.extra_args, None)
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """V1: the step's batch changes (its rows are the slots)."""
        if batch_update is None:
            return
        for index in batch_update.removed:  # vLLM's order: removed, added, moved
            self._rows.pop(index, None)
            self._tags.pop(index, None)
            self._outputs.pop(index, None)
        for index, params, _prompt, output in batch_update.added:
            self._set_slot(index, params.extra_args, output)
        for a, b, direction in batch_update.moved:
            for table in (self._rows, self._tags, self._outputs):
                moved_a = table.pop(a, None)
                if direction == MoveDirectionality.SWAP:
                    moved_b = table.pop(b, None)
                    if moved_b is not None:
                        table[a] = moved_b
                if moved_a is not None:
                    table[b] = moved_a

    def _set_slot(self, slot: int, extra_args: dict | None, output: list[int] | None) -> None:
        """Every field of ``slot`` from its new request, nothing left of the one before. A request whose ``L`` the
        model does not serve (one admission let through: an engine whose processor names no spans) decodes plainly,
        with a warning: refusing it here, at its step, would stop the engine and every request in it."""
        config = request_config(extra_args)
        if config.L > 0 and config.L not in self._model_spans:
            logger.warning("eglr-vllm: a request's L=%d is not served by this engine (allowed: 0, %s); it decodes "
                           "plainly (engine_args without spans or num_layers cannot refuse it at admission)",
                           config.L, format_spans(self._model_spans) or "none")
            config = _PLAIN
        self._rows[slot] = config
        tag = request_tag(extra_args)
        for table, value in ((self._tags, tag), (self._outputs, output)):
            if value is None:
                table.pop(slot, None)
            else:
                table[slot] = value

    def batch_slots(self, num_rows: int, request_slots: list[int] | None) -> list[int] | None:
        """The slot of each of the forward's rows 0..num_rows-1; None when they are not known (no row refines).

        request_slots: MRV2's ``idx_mapping`` of the step, as its model state hands it to the forward (None in
        its dummy runs, whose made-up requests hold no slot). V1 passes none: its row i is its slot i."""
        if self._request_state is None:
            return list(range(num_rows))
        if request_slots is None or len(request_slots) != num_rows:
            return None
        return list(request_slots)

    def configs(self, slots: list[int]) -> list[EglrConfig]:
        """The settings of the requests in ``slots`` (plain decoding for a slot it never saw)."""
        return [self._rows.get(slot, _PLAIN) for slot in slots]

    def records(self, slots: list[int]) -> bool:
        """Whether any request in ``slots`` has its signals recorded."""
        return any(slot in self._tags for slot in slots)

    def record(self, slots: list[int], entropies: list[float], iterations: list[int], kls: list[float]) -> None:
        """One step's signals of the rows whose requests are in ``slots`` (each list as long); kept for the tagged
        requests, at the position of the token the step samples for each."""
        tagged = [row for row, slot in enumerate(slots) if slot in self._tags]
        for row, position in zip(tagged, self._output_positions([slots[row] for row in tagged])):
            self.signals.setdefault(self._tags[slots[row]], {})[position] = (entropies[row], iterations[row],
                                                                              kls[row])

    def _output_positions(self, slots: list[int]) -> list[int]:
        """The output position of the token each request in ``slots`` samples this step: the length of its live
        output list (V1), or MRV2's committed tokens less its prompt (``total_len - prompt_len``, as vLLM's own
        trace replay reads it; total_len grows after sampling, so during the forward it counts the tokens before)."""
        if self._request_state is None:
            return [len(self._outputs.get(slot) or ()) for slot in slots]
        index = torch.tensor(slots, dtype=torch.long)
        total = self._request_state.total_len.gpu[index.to(self._request_state.total_len.gpu.device)].cpu()
        return (total - torch.from_numpy(self._request_state.prompt_len.np[index.numpy()])).tolist()


def request_tag(extra_args: dict | None) -> str | None:
    """The request's signal tag (``tag`` in either form of ``request_settings``), or None."""
    return (request_settings(extra_args) or {}).get("tag")


def admit_tag(tag: str | None, n: int = 1) -> None:
    """Admission of a signal tag: each tag names one request's record, so a tag this process admitted before, or a
    request of ``n`` > 1 completions (vLLM's children share its parameters, tag included), is refused (one line):
    two requests writing one record would hand one of them the other's signals."""
    if tag is None:
        return
    if n != 1:
        raise ValueError(f"`tag`={tag!r} with n={n} is not allowed; allowed: n=1 (each completion needs a tag of "
                         "its own: send n requests).")
    if tag in _ADMITTED_TAGS:
        raise ValueError(f"`tag`={tag!r} is already in use; allowed: a tag no earlier request of this process used.")
    _ADMITTED_TAGS.add(tag)


def check_admits_served(admitted: frozenset[int] | None, hf_config) -> None:
    """At engine start: the spans the processor admits (``admitted``; None: not checked at admission) must be ones
    the model serves (its config's ``eglr_spans``, else every L in 1..N), or a request admitted here would not refine
    (the worker decodes it plainly). One-line ValueError naming both."""
    if admitted is None:
        return
    served = model_spans(hf_config)
    extra = sorted(admitted - served)
    if extra:
        raise ValueError(f"eglr-vllm: the row-settings processor admits L={extra[0]}, which the model does not serve; "
                         f"allowed: {format_spans(served) or 'none'} (engine_args names both from one span list).")


def model_spans(hf_config) -> frozenset[int]:
    """The spans L the engine's model refines with: its config's ``eglr_spans``, else every L in 1..N (N: the config's
    decoder layers, the count vLLM builds the model with; ``models.served_spans``)."""
    num_layers = getattr(getattr(hf_config, "text_config", None) or hf_config, "num_hidden_layers", None)
    served = getattr(hf_config, "eglr_spans", None)
    return frozenset(served) if served is not None else frozenset(range(1, (num_layers or 0) + 1))


def take_signals(tag: str) -> list[tuple[float, int, float]]:
    """The signals recorded under ``tag`` by this process's engines, removed from the record: one
    (entropy, k*, last KL) per generated token of the request, in order."""
    for tracker in _TRACKERS.values():
        if tag in tracker.signals:
            by_position = tracker.signals.pop(tag)
            return [by_position[position] for position in sorted(by_position)]
    return []


def _track(vllm_config, tracker: EglrRowSettings) -> None:
    """``tracker`` as the one of the engine built from ``vllm_config``, until that config is collected (the engine,
    its model and its input batch gone): a process that builds several engines keeps no tracker (nor its records)
    of an engine that ended. A config that takes no weak reference keeps its entry for the process's life."""
    key = id(vllm_config)
    _TRACKERS[key] = tracker
    try:
        weakref.finalize(vllm_config, _drop_tracker, key, weakref.ref(tracker))
    except TypeError:  # not weakly referable (a stand-in config of a test)
        pass


def _drop_tracker(key: int, tracker: weakref.ref) -> None:
    """The entry of a collected config, unless a newer engine's tracker took its id since."""
    if _TRACKERS.get(key) is tracker():
        _TRACKERS.pop(key, None)


def settings_for(vllm_config) -> EglrRowSettings | None:
    """The tracker of the engine built from ``vllm_config`` (None when vLLM did not load it)."""
    return _TRACKERS.get(id(vllm_config))
