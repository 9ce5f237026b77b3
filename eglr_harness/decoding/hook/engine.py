"""The hook engine: the engine contract (``contract.py``) over transformers' ``generate`` with EGLR hooks.

Any causal LM, any generation option ``generate`` takes (beams, bad words, split device maps, ...):
requests of one config, options, length and stop strings are decoded together, longest prompts
first in batches of ``batch_size`` (as lm-eval's ``HFLM`` batches them), left-padded, through
``generate(custom_generate=eglr_generate)``. EGLR runs inside the model's forward passes
(``refiner.py``); each row's tokens end where the row ended (EOS, a stop string, the length limit)
and carry the same signals as the continuous engine's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

import torch

from eglr_harness.core.config import EglrConfig
from eglr_harness.decoding.contract import Outcome, Request
from eglr_harness.decoding.hook.generate import eglr_generate
from eglr_harness.decoding.stats import EglrStats, RolloutAccount, own_account


class HookEngine:
    """Decodes requests through ``model.generate`` with EGLR's hooks, ``batch_size`` rows at a time.

    Args:
        model: any transformers causal LM (``compat.py`` refuses the settings EGLR cannot refine).
        batch_size: rows per ``generate`` call, or a function that finds it on first use (``batch_size=auto``).
        pad_token_id: what left padding is made of (the tokenizer's).
        tokenizer: needed when requests have stop strings.
        device: where the prompts go (the model's input device).
        autocast_dtype: ``generate`` runs under ``torch.autocast`` to it (HFLM's ``mixed_precision_dtype``).
    """

    def __init__(self, model, *, batch_size, pad_token_id: int | None, tokenizer=None, device=None,
                 autocast_dtype=None):
        if not callable(batch_size) and (isinstance(batch_size, bool) or not isinstance(batch_size,
                                                                                        int) or batch_size < 1):
            raise ValueError(f"`batch_size`={batch_size!r} is not allowed; allowed: an int >= 1.")
        self.model, self._batch_size, self.pad, self.tokenizer = model, batch_size, pad_token_id, tokenizer
        self.device = torch.device(device if device is not None else model.device)
        self.autocast_dtype = autocast_dtype

    @property
    def batch_size(self) -> int:
        if callable(self._batch_size):
            self._batch_size = int(self._batch_size())
        return self._batch_size

    def unsupported(self, request: Request) -> str | None:
        return None  # generate takes any option; the model refuses what it cannot do

    def run(self, requests: Sequence[Request], *, stats_for: Callable[[EglrConfig], EglrStats] | None = None,
            on_finish: Callable[[int, Outcome], None] | None = None) -> list[Outcome]:
        outcomes: list[Outcome | None] = [None] * len(requests)
        groups: dict[tuple, list[int]] = defaultdict(list)  # one generate call's shared settings
        for i, r in enumerate(requests):
            groups[(r.config, r.options, r.max_new_tokens, r.stop_strings)].append(i)
        for members in groups.values():
            members.sort(key=lambda i: -len(requests[i].prompt))  # longest first: memory peaks early
            for start in range(0, len(members), self.batch_size):
                batch = members[start:start + self.batch_size]
                for i, outcome in zip(batch, self._generate([requests[i] for i in batch], stats_for)):
                    outcomes[i] = outcome
                    if on_finish is not None:
                        on_finish(i, outcome)
        return outcomes

    def _generate(self, batch: list[Request], stats_for) -> list[Outcome]:
        """One ``generate`` call over requests that share config, options, length and stop strings."""
        first, config = batch[0], batch[0].config
        width = max(len(r.prompt) for r in batch)
        pad = self.pad if self.pad is not None else 0
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, request in enumerate(batch):  # left padding, as generate expects
            ids[row, width - len(request.prompt):] = torch.tensor(request.prompt)
            mask[row, width - len(request.prompt):] = 1
        if config.sampled:
            sampling = dict(do_sample=True, temperature=config.T, top_k=config.top_k, top_p=config.top_p,
                            eglr_row_seeds=[r.seed for r in batch])
        else:
            sampling = dict(do_sample=False)
        outcomes: list[Outcome] = []
        with torch.autocast(self.device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None):
            self.model.generate(
                ids.to(self.device), attention_mask=mask.to(self.device), max_new_tokens=first.max_new_tokens,
                pad_token_id=self.pad, use_cache=True, custom_generate=eglr_generate, eglr_config=config,
                eglr_stats=stats_for(config) if stats_for is not None else None,
                eglr_stop_strings=list(first.stop_strings) or None, eglr_tokenizer=self.tokenizer,
                eglr_outcomes=outcomes, **sampling, **dict(first.options),
            )
        for outcome in outcomes:
            outcome.account = row_account(outcome, config)
        return outcomes


def row_account(outcome: Outcome, config: EglrConfig) -> RolloutAccount:
    """A finished row's record, its part of the batch figures as ``generate`` steps a row: once per token, and
    ``k_max`` refinement iterations per gated token (the refinement pass runs k_max iterations, no sync). For
    ``batch_size=1`` these are the call's figures exactly; with more rows a step is shared (the harness replaces
    them by the row's share of the run's figures when the run ends)."""
    tokens, gated = len(outcome.tokens), sum(outcome.iterations.values())
    return own_account(tokens, outcome.iterations, config, steps=tokens, gated_steps=gated,
                       computed_refine_layer_evals=config.L * config.k_max * gated)
