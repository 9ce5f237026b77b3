"""``eglr_generate``: EGLR as a transformers ``custom_generate`` decoding method.

Plain transformers use::

    from eglr_harness import eglr_generate
    out = model.generate(input_ids, attention_mask=mask, custom_generate=eglr_generate,
                         L=4, tau_h=1.5, max_new_tokens=256)                 # greedy EGLR
    out = model.generate(..., custom_generate=eglr_generate, L=4, tau_h=1.5,
                         do_sample=True, temperature=0.7, top_k=50, seed=1333)  # sampled EGLR
    out = model.generate(..., custom_generate=eglr_generate,
                         eglr_config=EglrConfig(L=4, tau_h=1.5))             # the same, as one config

Temperature, top-k, top-p, stopping criteria and every other generation option are Hugging
Face's own; EGLR changes the logits of gated positions (``refiner.py``) and, when sampling,
draws each row with its own seeded generator (``sampling.py``).
"""

from __future__ import annotations

import copy
import math
import time
from collections import Counter

import torch
from transformers import GenerationMixin, LogitsProcessorList, StoppingCriteriaList, StopStringCriteria

from eglr_harness.core.config import DEFAULT_ALPHA, DEFAULT_K_MAX, DEFAULT_SEED, DEFAULT_TAU_KL, EglrConfig
from eglr_harness.core.progress import listening, tokens_emitted
from eglr_harness.decoding.cache_kwarg import CACHE_KWARG
from eglr_harness.decoding.contract import Outcome
from eglr_harness.decoding.hook.compat import check_refinable
from eglr_harness.decoding.hook.refiner import EglrRefiner
from eglr_harness.decoding.model_parts import find_model_parts
from eglr_harness.decoding.sampling import SeededRowSampler, prompt_token_lists, row_seed
from eglr_harness.decoding.stats import EglrStats


class _FinishedRowsTracker(StoppingCriteriaList):
    """The generation's own stopping criteria, remembering which rows they have finished.

    ``_sample`` keeps its ``unfinished_sequences`` to itself; this is the same mask (EOS, stop
    strings, max length), so the refiner neither gates nor counts rows that are done. Callers such
    as lm-eval stop on strings for the whole batch at once; ``stop_strings`` marks each row
    finished as soon as its own generated text contains one. They only feed this mask: what
    ``generate`` is told (and so every emitted token) is the criteria's answer, except that the
    batch ends once every row is finished (as lm-eval's own stop criterion ends it).
    """

    def __init__(self, criteria: StoppingCriteriaList, stop_strings: StopStringCriteria | None = None,
                 prompt_len: int = 0):
        super().__init__(criteria)
        self.stop_strings, self.prompt_len = stop_strings, prompt_len
        self.finished: torch.Tensor | None = None
        self.stopped: torch.Tensor | None = None  # rows that ended on a stop string

    def __call__(self, input_ids, scores, **kwargs):
        if listening():  # progress (core/progress.py): the rows still generating emitted this step's token
            tokens_emitted(input_ids.shape[0] - (0 if self.finished is None else int(self.finished.sum())))
        done = super().__call__(input_ids, scores, **kwargs)
        finished = done
        if self.stop_strings is not None:  # generated tokens only: a match must not reach into the prompt
            hits = self.stop_strings(input_ids[:, self.prompt_len:], scores).to(done.device)
            if self.finished is not None:
                hits = hits & ~self.finished  # a row's own end comes first
            self.stopped = hits if self.stopped is None else (self.stopped | hits)
            finished = finished | hits
        self.finished = finished if self.finished is None else (self.finished | finished)
        return done | self.finished.all()


def _stop_string_criterion(stop_strings, tokenizer) -> StopStringCriteria | None:
    if stop_strings is None:
        return None
    if isinstance(stop_strings, str) or not all(isinstance(s, str) for s in stop_strings):
        raise ValueError(f"`eglr_stop_strings`={stop_strings!r} is not allowed; allowed: a list of strings.")
    stop_strings = [s for s in stop_strings if s]
    if not stop_strings:
        return None
    if tokenizer is None:
        raise ValueError("`eglr_stop_strings` needs `eglr_tokenizer` (the model's tokenizer) to find them in tokens.")
    return StopStringCriteria(tokenizer=tokenizer, stop_strings=stop_strings)


def decoding_config(eglr_config: EglrConfig | None, loose: dict, generation_config) -> EglrConfig:
    """The one config of this decode: ``eglr_config``, or the loose keyword settings folded into one.

    Sampling (T, top-k, top-p) is the generation config's, since its warpers are already built;
    a given ``eglr_config`` must agree with it on T.
    """
    do_sample = bool(generation_config.do_sample)
    temperature = float(generation_config.temperature or 1.0) if do_sample else 0.0
    given = sorted(name for name, value in loose.items() if value is not None)
    if eglr_config is not None:
        if given:
            raise ValueError(f"eglr_generate got eglr_config and the loose settings {given}; pass one of them: "
                             f"eglr_config=EglrConfig({', '.join(f'{n}=...' for n in given)}, ...) or the loose ones.")
        if not isinstance(eglr_config, EglrConfig):
            raise ValueError(f"`eglr_config`={eglr_config!r} is not allowed; allowed: an EglrConfig.")
        if eglr_config.T != temperature:
            raise ValueError(f"eglr_config.T={eglr_config.T} but generate decodes "
                             f"{'at temperature ' + str(temperature) if do_sample else 'greedily'}: set "
                             "do_sample/temperature to match the config (T=0 is greedy).")
        return eglr_config
    settings = {name: value for name, value in loose.items() if value is not None}
    return EglrConfig(
        **{"L": 0, "alpha": DEFAULT_ALPHA, "k_max": DEFAULT_K_MAX, "tau_kl": DEFAULT_TAU_KL, "tau_h": math.inf,
           "seed": DEFAULT_SEED, **settings},
        T=temperature, top_k=int(generation_config.top_k or 0), top_p=float(generation_config.top_p or 1.0),
    )


def eglr_generate(
    model,
    input_ids,
    logits_processor: LogitsProcessorList,
    stopping_criteria,
    generation_config,
    synced_gpus: bool = False,
    streamer=None,
    eglr_config: EglrConfig | None = None,
    L: int | None = None,
    alpha: float | None = None,
    k_max: int | None = None,
    tau_kl: float | None = None,
    tau_h: float | None = None,
    seed: int | None = None,
    stop: str | None = None,
    tau_latent: float | None = None,
    tau_accel: float | None = None,
    tau_margin: float | None = None,
    tau_entropy: float | None = None,
    seed_salt: str = "",
    eglr_stats: EglrStats | None = None,
    eglr_outcomes: list | None = None,
    eglr_row_seeds: list[int] | None = None,
    eglr_stop_strings: list[str] | None = None,
    eglr_tokenizer=None,
    **model_kwargs,
):
    """Decode with EGLR (greedy or sampled, per ``generation_config.do_sample``).

    Args:
        eglr_config: the EGLR settings (eglr-method.md §2) as one :class:`EglrConfig`; its T must
            match the generation config. Or, for plain transformers use, the loose settings
            L (default 0 = plain decoding), alpha, k_max, tau_kl, tau_h (default inf), seed, stop (the exit
            rule, default kl) and its threshold (tau_latent, tau_accel, tau_margin, tau_entropy); not both.
        seed_salt: sampled rows draw from generators seeded by (seed, salt, prompt tokens), unless
        eglr_row_seeds gives each row's seed.
        eglr_stats: accounting to add to (tokens, gated tokens, iterations, FLOP ratios).
        eglr_outcomes: if a list, one ``contract.Outcome`` per row is appended to it: the row's tokens up
            to its end (EOS, a stop string, the length limit) and their signals.
        eglr_stop_strings, eglr_tokenizer: strings that end a row for EGLR (no more refinement,
            accounting or signals for it) while the batch goes on until every row has ended; the
            emitted tokens are what ``generate`` decides.
    Returns what ``generate`` returns for the same options.
    """
    config = decoding_config(eglr_config, dict(L=L, alpha=alpha, k_max=k_max, tau_kl=tau_kl, tau_h=tau_h, seed=seed,
                                                stop=stop, tau_latent=tau_latent, tau_accel=tau_accel,
                                                tau_margin=tau_margin, tau_entropy=tau_entropy), generation_config)
    parts = find_model_parts(model)
    config.validate_for_model(parts.num_layers)
    if config.refines:
        top = range(parts.num_layers - config.L, parts.num_layers)
        cache = model_kwargs.get(CACHE_KWARG) if model_kwargs.get("use_cache", True) else None
        check_refinable(model, cache, generation_config, top)
        # transformers compiles the forward on accelerators with a static cache; the hooks must see
        # the eager pass (they read the gate and write the replayed slot), so refinement decodes eagerly
        generation_config = copy.deepcopy(generation_config)
        generation_config.disable_compile = True
    stop_strings = _stop_string_criterion(eglr_stop_strings, eglr_tokenizer)
    if eglr_stats is not None:
        eglr_stats.num_layers, eglr_stats.head_layers = parts.num_layers, parts.head_layers

    if config.sampled:
        prompts = prompt_token_lists(input_ids, model_kwargs.get("attention_mask"))
        sampler = SeededRowSampler(eglr_row_seeds if eglr_row_seeds is not None else
                                   [row_seed(config.seed, seed_salt, p) for p in prompts])
        logits_processor = LogitsProcessorList([*logits_processor, sampler])
        generation_config = copy.deepcopy(generation_config)
        generation_config.do_sample = False  # the warpers were built already; the sampler draws

    stopping_criteria = _FinishedRowsTracker(stopping_criteria, stop_strings, prompt_len=input_ids.shape[1])
    started = time.perf_counter()
    refiner = EglrRefiner(model, parts, config, stats=eglr_stats, finished_rows=lambda: stopping_criteria.finished,
                          record_signals=eglr_outcomes is not None)
    with refiner:
        output = GenerationMixin._sample(
            model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus, streamer,
            **model_kwargs,
        )
    if eglr_stats is not None:
        eglr_stats.wall_time_s += time.perf_counter() - started
    if eglr_outcomes is not None:
        sequences = output if isinstance(output, torch.Tensor) else output.sequences
        refiner.add_tokens(sequences[:, -1])
        eglr_outcomes.extend(row_outcomes(refiner.signals.per_row(), sequences[:, input_ids.shape[1]:].tolist(),
                                          stopping_criteria.stopped, generation_config))
    return output


def row_outcomes(signals: list[dict], new_tokens: list[list[int]], stopped, generation_config) -> list[Outcome]:
    """One ``Outcome`` per row of a ``generate`` call: its tokens while it was generating, why it ended,
    its signals and accounting. new_tokens: the rows' generated ids (padding after a row's end)."""
    eos = generation_config.eos_token_id
    eos = set() if eos is None else {eos} if isinstance(eos, int) else set(eos)
    stopped = [False] * len(new_tokens) if stopped is None else stopped.tolist()
    outcomes = []
    for tokens, values, by_stop in zip(new_tokens, signals, stopped):
        ks = values["token_iterations"]
        tokens = tokens[:len(ks)]
        finish = "eos" if tokens and tokens[-1] in eos else "stop" if by_stop else "length"
        outcomes.append(Outcome(tokens=tokens, finish=finish, gated=sum(k > 0 for k in ks),
                                iterations=Counter(k for k in ks if k > 0), **values))
    return outcomes
