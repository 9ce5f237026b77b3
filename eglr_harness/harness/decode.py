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
from collections.abc import Callable
from dataclasses import dataclass, field

from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from tqdm import tqdm

from eglr_harness.decoding.contract import Engine, Outcome, Request
from eglr_harness.decoding.processors import SAMPLING_OPTIONS
from eglr_harness.settings import RolloutSpec
from eglr_harness.signals import rollout_signals
from eglr_harness.stores import content_key

logger = logging.getLogger(__name__)


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
            raise ValueError(f"max_gen_toks={max_gen_toks} leaves no room for the context in max_length={self.max_length}.")
        prompt = self.encode(context, self.max_length - max_gen_toks)
        options = {k: v for k, v in kwargs.items() if k not in SAMPLING_OPTIONS}
        return Request(prompt, spec.config, max_gen_toks, seed=spec.seed(prompt),
                       stop_strings=tuple(s for s in until if s), options=options), until

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
    """The rollout's signals (``eglr_harness.signals``) from an engine's per-token values."""
    return rollout_signals(outcome.entropies, outcome.logprobs, outcome.token_iterations, outcome.final_kls)


@dataclass
class Decoded:
    """What ``RolloutDecoder.decode`` gives, per item: its record ``{"text", "signals"}`` and its fresh
    outcome (None where the rollout was reused or repeats an earlier item); and the specs of the
    distinct items that were reused (this run's memory or the rollout store)."""

    records: list[dict] = field(default_factory=list)
    outcomes: list[Outcome | None] = field(default_factory=list)
    reused: list[RolloutSpec] = field(default_factory=list)


class RolloutDecoder:
    """Decodes (context, spec) items with reuse: this run's memory, then the store, then an engine.

    engines: the engines in order of preference (continuous first under auto); a request goes to the
    first that supports it (``Engine.unsupported``); ``strict``: the first always (engine=continuous
    then refuses what it cannot do, naming engine=hf).
    """

    def __init__(self, codec: TextCodec, engines: list[Engine], fingerprint: dict, store=None, *,
                 strict: bool = False, show_progress: bool = True):
        self.codec, self.engines, self.fingerprint, self.store = codec, engines, fingerprint, store
        self.strict, self.show_progress = strict, show_progress
        self.memo: dict[str, dict] = {}  # key -> {"text", "signals"} (as in the rollout store)
        self._said: set[str] = set()

    def key(self, context: str, spec: RolloutSpec) -> str:
        return content_key(self.fingerprint, context, spec.key_fields())

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

    def decode(self, items: list[tuple[str, RolloutSpec]], *, stats_for, desc: str, disable_tqdm: bool = False,
               reuse: bool = True, keys: list[str] | None = None) -> Decoded:
        """Every item's rollout; identical items (deterministic cells across cycles) decode once.
        stats_for(config): the accounting a config's fresh rollouts add to; keys: the items' keys when
        the caller has them already."""
        keys = keys or [self.key(c, s) for c, s in items]
        first = {}  # key -> index of its first item
        for i, key in enumerate(keys):
            first.setdefault(key, i)
        found = {key: self.lookup(key) if reuse else None for key in first}
        missing = [i for key, i in first.items() if found[key] is None]
        done = Decoded(reused=[items[i][1] for key, i in first.items() if found[key] is not None])
        if done.reused:
            logger.info("eglr-hf: %d of %d rollouts reused from earlier work", len(done.reused), len(first))
        fresh: dict[int, Outcome] = {}
        requests, untils = zip(*(self.codec.request(*items[i]) for i in missing)) if missing else ((), ())
        bar = tqdm(total=len(missing), desc=desc, disable=disable_tqdm or not self.show_progress)
        try:
            for engine, share in self._route(requests):
                def finished(j, outcome, share=share):
                    i = missing[share[j]]
                    record = {"text": self.codec.text(outcome.tokens, untils[share[j]]), "signals": outcome_signals(outcome)}
                    self.memo[keys[i]], found[keys[i]], fresh[i] = record, record, outcome
                    if self.store is not None:
                        self.store.put(keys[i], record)
                    bar.update(1)
                engine.run([requests[j] for j in share], stats_for=stats_for, on_finish=finished)
        finally:
            bar.close()
        done.records = [found[key] for key in keys]
        done.outcomes = [fresh.get(i) for i in range(len(items))]
        return done

    def _route(self, requests) -> list[tuple[Engine, list[int]]]:
        """Which engine decodes which request (indices), in the engines' order."""
        shares: dict[int, list[int]] = {}
        for j, request in enumerate(requests):
            choice = 0
            if not self.strict:
                for choice, engine in enumerate(self.engines):
                    reason = engine.unsupported(request)
                    if reason is None:
                        break
                    if reason not in self._said:
                        self._said.add(reason)
                        logger.info("eglr-hf: such requests decode with engine=hf: %s", reason)
            shares.setdefault(choice, []).append(j)
        return [(self.engines[choice], share) for choice, share in sorted(shares.items())]
