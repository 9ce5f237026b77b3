"""``eglr-hf engine=continuous``: lm-eval requests decoded by ``decoding.continuous.ContinuousEngine``.

``HFLM.generate_until`` batches requests by their generation kwargs and runs each batch through
``generate`` until its longest row ends. The continuous engine takes every request at once (any
mix of cells), keeps ``batch_size`` rows running and folds refinement into the batch. What a
request means stays lm-eval's: the context is encoded and left-truncated as ``HFLM`` does, its
``until`` strings (plus the EOS text) end it, and its text is decoded and cut at them by lm-eval's
own ``postprocess_generated_text``, so a rollout's text is what the ``hf`` engine gives.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from tqdm import tqdm

from eglr_harness.cell import Cell
from eglr_harness.decoding.continuous import ContinuousEngine, Outcome, Request
from eglr_harness.decoding.sampling import row_seed
from eglr_harness.decoding.stack import FALLBACK
from eglr_harness.settings import cell_config
from eglr_harness.signals import rollout_signals

ENGINES = ("auto", "continuous", "hf")
DEFAULT_ENGINE = "auto"
# generation options the continuous engine applies itself; any other is generate's business
_ENGINE_OPTIONS = {"do_sample", "temperature", "top_k", "top_p"}
logger = logging.getLogger(__name__)


def check_engine(engine: str) -> str:
    if engine not in ENGINES:
        raise ValueError(f"`engine`={engine!r} is not allowed; allowed: {', '.join(ENGINES)} (auto: continuous "
                         "where it can drive the model, else hf; continuous: refinement folded into the batch; "
                         "hf: transformers' generate).")
    return engine


def choose_engine(lm, engine: str) -> ContinuousEngine | None:
    """The continuous engine for ``lm``, or None for ``generate`` (the hf engine).

    ``auto`` takes the continuous engine where it can drive the model and says in one log line why
    not otherwise (another family, a split device_map, ``batch_size=auto``, generation-config
    processors it does not apply); ``continuous`` raises those reasons instead.
    """
    if engine == "hf":
        return None
    try:
        return build_engine(lm)
    except ValueError as err:
        if engine == "continuous":
            raise
        logger.info("eglr-hf: decoding with engine=hf: %s", err)
        return None


def unsupported_options(lm, gen_kwargs: dict) -> list[str]:
    """The generation options of one request that the continuous engine does not apply (beam search,
    repetition penalties, caches, ...): such a request needs ``generate``."""
    kwargs = normalize_gen_kwargs(dict(gen_kwargs), lm.max_gen_toks)
    kwargs.pop("until", None), kwargs.pop("max_gen_toks", None)
    return _foreign(cell_config(lm.settings, kwargs)[2])


def _foreign(options: dict) -> list[str]:
    """The names among a cell's HF generation options that the continuous engine does not apply."""
    return sorted(set(options) - _ENGINE_OPTIONS)


def build_engine(lm) -> ContinuousEngine:
    """The engine of an ``EglrHFLM``: its model, batch size, EOS tokens and tokenizer."""
    batch = lm.batch_size
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise ValueError(f"engine=continuous needs a fixed batch_size (running rows), not {batch!r}: "
                         "e.g. --batch_size 32.")
    eos = lm.model.generation_config.eos_token_id
    if eos is None:
        eos = lm.tokenizer.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    return ContinuousEngine(lm.model, max_batch=batch, eos_token_ids=eos, tokenizer=lm.tokenizer)


def generate_continuous(lm, engine: ContinuousEngine, items: list[tuple[str, dict]], *, disable_tqdm: bool,
                        entropy_sink: list | None = None,
                        on_text: Callable[[str, dict, str, dict | None], None] | None = None,
                        desc: str = "eglr-hf generation (continuous engine)") -> list[str]:
    """Texts of (context, concrete gen kwargs) items, as ``HFLM.generate_until`` would return them.

    on_text(context, gen_kwargs, text, signals) is called as each rollout finishes (the rollout store),
    with the rollout's ``eglr_harness.signals`` dict;
    entropy_sink, when given, receives each request's ``Outcome`` with its entropies (tau_h calibration).
    """
    eos_text = lm.tok_decode(lm.eot_token_id, skip_special_tokens=False)
    encoded: dict[tuple[str, int], tuple[int, ...]] = {}
    requests, untils = [], []
    for context, gen_kwargs in items:
        kwargs = normalize_gen_kwargs(dict(gen_kwargs), lm.max_gen_toks)
        until = handle_stop_sequences(kwargs.pop("until", None), eos=eos_text)
        max_gen_toks = kwargs.pop("max_gen_toks")
        config, cycle, options = cell_config(lm.settings, kwargs)
        other = _foreign(options)
        if other:
            raise ValueError(f"engine=continuous applies temperature, top_k and top_p only; the generation "
                             f"options {other} need generate: {FALLBACK}.")
        max_ctx_len = lm.max_length - max_gen_toks
        if max_ctx_len <= 0:
            raise ValueError(f"max_gen_toks={max_gen_toks} leaves no room for the context in max_length={lm.max_length}.")
        key = (context, max_ctx_len)
        if key not in encoded:  # as HFLM encodes a batch: its add_bos rule, left truncation
            ids, mask = lm.tok_batch_encode([context], left_truncate_len=max_ctx_len, truncation=lm.truncation)
            encoded[key] = tuple(ids[0][mask[0].bool()].tolist())
        prompt = encoded[key]
        seed = row_seed(config.seed, f"{Cell(config.L, config.T).label},cycle={cycle}", list(prompt)) if config.sampled else None
        requests.append(Request(prompt, config, max_gen_toks, seed=seed, stop_strings=tuple(s for s in until if s)))
        untils.append(until)

    texts: list[str | None] = [None] * len(items)
    bar = tqdm(total=len(items), disable=disable_tqdm or lm.rank != 0, desc=desc)

    def finished(index: int, outcome: Outcome) -> None:
        texts[index] = _text(lm, outcome.tokens, untils[index])
        if on_text is not None:
            on_text(*items[index], texts[index], outcome_signals(outcome))
        bar.update(1)

    try:
        outcomes = engine.run(requests, record_entropies=entropy_sink is not None, on_finish=finished,
                              stats_for=lambda config: lm.stats_for(Cell(config.L, config.T)))
    finally:
        bar.close()
    if entropy_sink is not None:
        entropy_sink.extend(outcomes)
    return texts


def outcome_signals(outcome: Outcome) -> dict:
    """The rollout's signals (``eglr_harness.signals``) from the engine's per-token values."""
    return rollout_signals(outcome.entropies, outcome.logprobs, outcome.token_iterations, outcome.final_kls)


def _text(lm, tokens: list[int], until: list[str]) -> str:
    """``HFLM.generate_until``'s decoding of a continuation: thinking tokens, decode, cut at ``until``."""
    think = lm.think_end_token
    if isinstance(think, int) and think in tokens:
        tokens = tokens[len(tokens) - tokens[::-1].index(think):]
    text = lm.tok_decode(tokens)
    if isinstance(think, int):
        text = text.lstrip()
    return postprocess_generated_text(generation=text, stop=until,
                                      think_end_token=think if isinstance(think, str) else None)
