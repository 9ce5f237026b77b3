"""lm-eval's side of decoding: (context, ``RolloutSpec``) items -> engine requests -> outcomes -> texts.

What a request means stays lm-eval's whichever engine decodes: the context is encoded and
left-truncated as ``HFLM`` encodes it, its ``until`` strings (plus the EOS text) end it, and its
text is decoded and cut at them by lm-eval's own ``postprocess_generated_text``. Finished rollouts
(text and signals) are reused from this run and from the rollout store, keyed by the model's
fingerprint, the context and ``RolloutSpec.key_fields``.

Under ``engine=auto`` a request goes to the continuous engine unless it asks for an option that
engine does not apply (beams, bad words, ...): then to the hook engine, said once per reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text

from eglr_harness.core.generation_options import SAMPLING_OPTIONS
from eglr_harness.core.progress import RolloutProgress, counting_tokens
from eglr_harness.core.signals import rollout_signals
from eglr_harness.decoding.contract import Engine, Outcome, Request
from eglr_harness.run.accounting import EngineRunAccounts, restored_account, rollout_accounts
from eglr_harness.run.settings import RolloutSpec
from eglr_harness.run.stores import content_key

logger = logging.getLogger(__name__)


def _options(kwargs: dict) -> dict:
    """generate's options among normalised gen kwargs: all but the cell's sampling settings."""
    return {k: v for k, v in kwargs.items() if k not in SAMPLING_OPTIONS}


@dataclass(frozen=True)
class TextCodec:
    """How HFLM turns a context into token ids and a continuation into text (its methods, bound once)."""

    encode: Callable[[str, int], tuple[int, ...]]  # (context, max context length) -> ids
    decode: Callable[[list[int]], str]
    eos_text: str
    think_end_token: int | str | None
    max_length: int
    default_max_gen_toks: int

    def request(self, context: str, spec: RolloutSpec) -> tuple[Request, list[str]]:
        """The engine request of one item, and its ``until`` strings (the EOS text included)."""
        kwargs = normalize_gen_kwargs(dict(spec.task_kwargs), self.default_max_gen_toks)
        until = handle_stop_sequences(kwargs.pop("until", None), eos=self.eos_text)
        max_gen_toks = kwargs.pop("max_gen_toks")
        if self.max_length - max_gen_toks <= 0:
            raise ValueError(f"max_gen_toks={max_gen_toks} leaves no room for the context in "
                             f"max_length={self.max_length}.")
        prompt = self.encode(context, self.max_length - max_gen_toks)
        return Request(prompt, spec.config, max_gen_toks, seed=spec.seed(prompt),
                       stop_strings=tuple(s for s in until if s), options=_options(kwargs)), until

    def options(self, spec: RolloutSpec) -> dict:
        """``generate``'s options of ``spec``'s requests (what picks their engine): the gen kwargs without
        lm-eval's ``until`` and length limit and without the cell's sampling settings."""
        kwargs = normalize_gen_kwargs(dict(spec.task_kwargs), self.default_max_gen_toks)
        kwargs.pop("until", None), kwargs.pop("max_gen_toks", None)
        return _options(kwargs)

    def text(self, tokens: list[int], until: list[str]) -> str:
        """``HFLM.generate_until``'s text of a continuation: thinking tokens, decode, cut at ``until``."""
        think = self.think_end_token
        if isinstance(think, int) and think in tokens:
            tokens = tokens[len(tokens) - tokens[::-1].index(think):]
        text = self.decode(tokens)
        if isinstance(think, int):
            text = text.lstrip()
        return postprocess_generated_text(generation=text, stop=until,
                                          think_end_token=think if isinstance(think, str) else None)


def outcome_signals(outcome: Outcome) -> dict:
    """The rollout's signals (``eglr_harness.core.signals``) from an engine's per-token values."""
    return rollout_signals(outcome.entropies, outcome.logprobs, outcome.token_iterations, outcome.final_kls)


@dataclass
class Decoded:
    """What ``RolloutDecoder.decode`` gives, per item: its record ``{"text", "signals"}`` and its fresh
    outcome (None where the rollout was reused or repeats an earlier item); and the specs of the
    distinct items that were reused (this run's memory or the rollout store)."""

    records: list[dict] = field(default_factory=list)
    outcomes: list[Outcome | None] = field(default_factory=list)
    reused: list[RolloutSpec] = field(default_factory=list)


class RolloutMemory:
    """Finished rollouts, found again: this run's memory first, then the rollout store (``run/stores.py``).

    A record is ``{"text", "signals", "engine", "accounting"}``, as the rollout store keeps it; ``decoded``:
    the keys this run decoded, or counted as decoded (restored from the store with their accounting).
    """

    def __init__(self, store=None):
        self.store = store
        self.memo: dict[str, dict] = {}  # key -> its record
        self.decoded: set[str] = set()

    def lookup(self, key: str) -> dict | None:
        record = self.memo.get(key)
        if record is None and self.store is not None:
            record = self.store.get(key)
            if record is not None:
                self.memo[key] = record
        return record

    def stored(self, keys: list[str]) -> tuple[int, int]:
        """(distinct rollouts among ``keys``, how many of them are finished already)."""
        distinct = set(keys)
        return len(distinct), sum(self.lookup(k) is not None for k in distinct)

    def keep(self, key: str, record: dict) -> None:
        """Keep a finished rollout: in this run's memory, as decoded by this run, and in the rollout store."""
        self.memo[key] = record
        self.decoded.add(key)
        if self.store is not None:
            self.store.put(key, record)

    def keep_many(self, records: dict[str, dict]) -> None:
        """Store records kept already again (their accounting updated)."""
        if self.store is not None and records:
            self.store.put_many(records)

    def forget(self) -> None:
        """Drop this run's rollouts (the store keeps its own)."""
        self.memo.clear()
        self.decoded.clear()


class EngineRouter:
    """Which engine decodes a request: the first of ``engines`` (in order of preference, continuous first
    under auto) that supports it (``Engine.unsupported``), or the first always when ``strict``
    (engine=continuous then refuses what it cannot do, naming engine=hook). Each new reason to pass an
    engine by is logged once."""

    def __init__(self, engines: list[Engine], names: list[str], codec: TextCodec, *, strict: bool):
        self.engines, self.names, self.codec, self.strict = engines, names, codec, strict
        self._said: set[str] = set()

    def engine_of(self, spec: RolloutSpec) -> str:
        """The name of the engine that decodes ``spec``'s requests (the choice depends on their options only)."""
        probe = Request((0,), spec.config, 1, seed=0 if spec.config.sampled else None, options=self.codec.options(spec))
        return self.names[self.choice(probe, log=False)]

    def choice(self, request: Request, log: bool = True) -> int:
        """The index of the engine that decodes ``request``."""
        if self.strict:
            return 0
        for choice, engine in enumerate(self.engines):
            reason = engine.unsupported(request)
            if reason is None:
                return choice
            if log and reason not in self._said:
                self._said.add(reason)
                logger.info("eglr-hf: such requests decode with engine=%s: %s", self.names[choice + 1], reason)
        return len(self.engines) - 1

    def route(self, requests) -> list[tuple[int, list[int]]]:
        """Which engine (index) decodes which request (indices), in the engines' order."""
        shares: dict[int, list[int]] = {}
        for j, request in enumerate(requests):
            shares.setdefault(self.choice(request), []).append(j)
        return sorted(shares.items())


class RolloutDecoder:
    """Decodes (context, spec) items with reuse: this run's memory, then the store, then an engine.

    Its parts: ``memory`` (``RolloutMemory``: store and reuse), ``router`` (``EngineRouter``: which engine
    decodes a request) and the accounting of ``run/accounting.py`` (each rollout's figures, an engine
    run's shared out). engines: in order of preference; ``strict``: the first always; names: the engines'
    names (``continuous``, ``hook``), recorded with each rollout it decodes (``record["engine"]``).
    """

    def __init__(self, codec: TextCodec, engines: list[Engine], fingerprint: dict, store=None, *,
                 strict: bool = False, show_progress: bool = True, names: list[str] | None = None):
        self.codec, self.engines, self.fingerprint = codec, engines, fingerprint
        self.label = "eglr-hf"  # the model its lines name (PoolRunner sets eglr-vllm's)
        self.names = names or [type(e).__name__ for e in engines]
        self.show_progress = show_progress
        self.memory = RolloutMemory(store)
        self.router = EngineRouter(engines, self.names, codec, strict=strict)
        self._config_of: dict[str, object] = {}  # key -> its EglrConfig (which batch figures it shares)

    def key(self, context: str, spec: RolloutSpec) -> str:
        return content_key(self.fingerprint, context, spec.key_fields())

    def lookup(self, key: str) -> dict | None:
        return self.memory.lookup(key)

    def stored(self, keys: list[str]) -> tuple[int, int]:
        return self.memory.stored(keys)

    def engine_of(self, spec: RolloutSpec) -> str:
        return self.router.engine_of(spec)

    def forget(self) -> None:
        """Drop this run's rollouts (the store keeps its own)."""
        self.memory.forget()

    def decode(self, items: list[tuple[str, RolloutSpec]], *, stats_for, desc: str, disable_tqdm: bool = False,
               reuse: bool = True, keys: list[str] | None = None, calibration: bool = False) -> Decoded:
        """Every item's rollout; identical items (deterministic cells across cycles) decode once: found finished
        (``_find_finished``), else decoded (``_decode_missing``) and kept as each finishes.
        stats_for(config): the accounting a config's fresh rollouts add to; keys: the items' keys when
        the caller has them already; calibration: the items are tau_h calibration's greedy prompts, whose
        compute is accounted apart: their rollouts are stored marked so (``accounting["calibration"]``)
        and count as reused wherever a pool takes them, in this run or, from the store, a later one."""
        keys = keys or [self.key(c, s) for c, s in items]
        self._config_of.update((key, spec.config) for key, (_, spec) in zip(keys, items))
        first = {}  # key -> index of its first item
        for i, key in enumerate(keys):
            first.setdefault(key, i)
        found, reused = self._find_finished(first, items, reuse, stats_for)
        missing = [(key, i) for key, i in first.items() if found[key] is None]
        fresh = self._decode_missing(missing, items, found, stats_for=stats_for, desc=desc,
                                     disable_tqdm=disable_tqdm, calibration=calibration)
        return Decoded(records=[found[key] for key in keys], outcomes=[fresh.get(i) for i in range(len(items))],
                       reused=reused)

    def _find_finished(self, first: dict[str, int], items, reuse: bool, stats_for) -> tuple[dict, list[RolloutSpec]]:
        """``({key: its finished record or None}, specs of the reused)`` of the distinct items (``first``:
        key -> index of its first item). A rollout an earlier run stored with its accounting counts as
        decoded (a resumed run reports what an uninterrupted one does): its accounting is added to
        ``stats_for`` here; this run's own rollouts, stored ones without accounting and ones calibration
        decoded (their compute is calibration's, as in the run that decoded them) count as reused."""
        found = {key: self.memory.lookup(key) if reuse else None for key in first}
        restored = [key for key in first if found[key] is not None and key not in self.memory.decoded
                    and found[key].get("accounting") is not None and stats_for is not None
                    and not found[key]["accounting"].get("calibration")]
        for key in restored:
            record, config = found[key], items[first[key]][1].config
            stats_for(config).add_rollout(restored_account(record))
            self.memory.decoded.add(key)
        reused = [items[i][1] for key, i in first.items() if found[key] is not None and key not in restored]
        if reused or restored:
            logger.info("%s: %d of %d rollouts reused from earlier work (%d of them from the rollout store "
                        "with their accounting)", self.label, len(reused) + len(restored), len(first), len(restored))
        return found, reused

    def _decode_missing(self, missing: list[tuple[str, int]], items, found: dict, *, stats_for, desc: str,
                        disable_tqdm: bool, calibration: bool) -> dict[int, Outcome]:
        """Decode the ``missing`` items ((key, index)), each through its engine (``router``); each finished
        rollout's record goes into ``found`` and is kept at once. Returns ``{index: its Outcome}``."""
        fresh: dict[int, Outcome] = {}
        if not missing:  # every rollout found (a rerun of a finished run): no empty bar
            return fresh
        requests, untils = zip(*(self.codec.request(*items[i]) for _, i in missing))
        bar = RolloutProgress([r.max_new_tokens for r in requests], desc=desc,
                              disable=disable_tqdm or not self.show_progress)
        try:
            for choice, share in self.router.route(requests):
                clock = [time.perf_counter()]  # when the engine run started, then when its last rollout finished

                def finished(j, outcome, share=share, name=self.names[choice], clock=clock):
                    key, i = missing[share[j]]
                    record = self._record(outcome, untils[share[j]], name, calibration, clock)
                    found[key], fresh[i] = record, outcome
                    self.memory.keep(key, record)
                    bar.rollout_ended(requests[share[j]].max_new_tokens, len(outcome.tokens))
                with counting_tokens(bar.tokens):  # the bar moves with every token the engine emits
                    batches = self._run([requests[j] for j in share], self.engines[choice], stats_for, finished)
                self._keep_shares(batches, [missing[j][0] for j in share], found)
        finally:
            bar.close()
        return fresh

    def _record(self, outcome: Outcome, until: list[str], engine: str, calibration: bool, clock: list) -> dict:
        """A finished rollout as this run and the store keep it: ``{"text", "signals", "engine", "accounting"}``
        (``run/accounting.rollout_accounts`` of the engine's ``outcome.account``, with the time since the previous
        rollout finished; ``clock[0]``: when that was, moved on to now)."""
        now = time.perf_counter()
        accounting = rollout_accounts(outcome.account, calibration=calibration, wall_time_s=now - clock[0])
        clock[0] = now
        return {"text": self.codec.text(outcome.tokens, until), "signals": outcome_signals(outcome), "engine": engine,
                "accounting": accounting}

    @staticmethod
    def _run(requests: list[Request], engine: Engine, stats_for, on_finish) -> EngineRunAccounts:
        """``engine.run`` with each config's figures gathered apart (``EngineRunAccounts``), then added to
        ``stats_for(config)``."""
        batches = EngineRunAccounts(stats_for)
        engine.run(requests, stats_for=batches.stats_for if stats_for is not None else None, on_finish=on_finish)
        batches.merge()
        return batches

    def _keep_shares(self, batches: EngineRunAccounts, keys: list[str], found: dict) -> None:
        """Store each rollout of a finished engine run with its share of its config's batch figures."""
        self.memory.keep_many(batches.share_out(keys, found, self._config_of))
