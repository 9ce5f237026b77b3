"""``eglr_generate``: EGLR as a transformers ``custom_generate`` decoding method.

Plain transformers use::

    from eglr_harness import eglr_generate
    out = model.generate(input_ids, attention_mask=mask, custom_generate=eglr_generate,
                         L=4, tau_h=1.5, max_new_tokens=256)                 # greedy EGLR
    out = model.generate(..., custom_generate=eglr_generate, L=4, tau_h=1.5,
                         do_sample=True, temperature=0.7, top_k=50, seed=1333)  # sampled EGLR

Temperature, top-k, top-p, stopping criteria and every other generation option are Hugging
Face's own; EGLR changes the logits of gated positions (``refiner.py``) and, when sampling,
draws each row with its own seeded generator (``sampling.py``).
"""

from __future__ import annotations

import copy
import math
import time

import torch
from transformers import GenerationMixin, LogitsProcessorList, StoppingCriteriaList

from eglr_harness.config import DEFAULT_ALPHA, DEFAULT_K_MAX, DEFAULT_SEED, DEFAULT_TAU_KL, EglrConfig
from eglr_harness.decoding.accounting import EglrStats
from eglr_harness.decoding.model_parts import find_model_parts
from eglr_harness.decoding.refiner import EglrRefiner
from eglr_harness.decoding.sampling import SeededRowSampler, prompt_token_lists, row_seed


class _FinishedRowsTracker(StoppingCriteriaList):
    """The generation's own stopping criteria, remembering which rows they have finished.

    ``_sample`` keeps its ``unfinished_sequences`` to itself; this is the same mask (EOS, stop
    strings, max length), so the refiner neither gates nor counts rows that are done.
    """

    def __init__(self, criteria: StoppingCriteriaList):
        super().__init__(criteria)
        self.finished: torch.Tensor | None = None

    def __call__(self, input_ids, scores, **kwargs):
        done = super().__call__(input_ids, scores, **kwargs)
        self.finished = done if self.finished is None else (self.finished | done)
        return done


def eglr_generate(
    model,
    input_ids,
    logits_processor: LogitsProcessorList,
    stopping_criteria,
    generation_config,
    synced_gpus: bool = False,
    streamer=None,
    L: int = 0,
    alpha: float = DEFAULT_ALPHA,
    k_max: int = DEFAULT_K_MAX,
    tau_kl: float = DEFAULT_TAU_KL,
    tau_h: float = math.inf,
    seed: int = DEFAULT_SEED,
    seed_salt: str = "",
    eglr_stats: EglrStats | None = None,
    eglr_refiner_sink: list | None = None,
    **model_kwargs,
):
    """Decode with EGLR (greedy or sampled, per ``generation_config.do_sample``).

    Args:
        L, alpha, k_max, tau_kl, tau_h: EGLR settings (eglr-method.md §2); L=0 is plain decoding.
        seed, seed_salt: sampled rows draw from generators seeded by (seed, salt, prompt tokens).
        eglr_stats: accounting to add to (tokens, gated tokens, iterations, FLOP ratios).
        eglr_refiner_sink: if a list, the refiner is appended to it (e.g. to read entropies).
    Returns what ``generate`` returns for the same options.
    """
    do_sample = bool(generation_config.do_sample)
    config = EglrConfig(
        L=L, T=float(generation_config.temperature or 0.0) if do_sample else 0.0, alpha=alpha, k_max=k_max,
        tau_kl=tau_kl, tau_h=tau_h, top_k=int(generation_config.top_k or 0),
        top_p=float(generation_config.top_p or 1.0), seed=seed,
    )
    parts = find_model_parts(model)
    if eglr_stats is not None:
        eglr_stats.num_layers = parts.num_layers

    if do_sample:
        prompts = prompt_token_lists(input_ids, model_kwargs.get("attention_mask"))
        sampler = SeededRowSampler([row_seed(seed, seed_salt, p) for p in prompts])
        logits_processor = LogitsProcessorList([*logits_processor, sampler])
        generation_config = copy.deepcopy(generation_config)
        generation_config.do_sample = False  # the warpers were built already; the sampler draws

    stopping_criteria = _FinishedRowsTracker(stopping_criteria)
    started = time.perf_counter()
    refiner = EglrRefiner(model, parts, config, stats=eglr_stats, finished_rows=lambda: stopping_criteria.finished,
                          record_entropies=eglr_refiner_sink is not None)
    with refiner:
        output = GenerationMixin._sample(
            model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus, streamer,
            **model_kwargs,
        )
    if eglr_stats is not None:
        eglr_stats.wall_time_s += time.perf_counter() - started
    if eglr_refiner_sink is not None:
        eglr_refiner_sink.append(refiner)
    return output
