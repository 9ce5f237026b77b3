"""What both engines take and give: a ``Request`` in, an ``Outcome`` (tokens and signals) out.

``ContinuousEngine`` (``continuous/engine.py``: the fixed-shape step, refinement folded into the batch)
and ``HookEngine`` (``hook/engine.py``: transformers' ``generate`` with EGLR hooks, any model,
any generation option) implement :class:`Engine`, so the lm-eval adapter turns its items into
requests once and outcomes into texts once, whichever engine decodes; results files, metrics and
reports never depend on which one did.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from eglr_harness.core.config import EglrConfig
from eglr_harness.decoding.stats import EglrStats, RolloutAccount


@dataclass(frozen=True)
class Request:
    """One rollout to decode.

    prompt: its token ids (no padding); config: its EGLR cell (L, T, alpha, k_max, tau_kl, tau_h,
    top_k, top_p); max_new_tokens: the most tokens it may generate; seed: the row's sampling seed
    when T > 0; stop_strings: texts that end it; options: ``generate``'s options beyond the cell
    (``repetition_penalty``, ``min_new_tokens``, ``num_beams``, ...), over the model's
    ``generation_config`` as in ``generate`` (given as a dict; kept as sorted (name, value) pairs).
    """

    prompt: tuple[int, ...]
    config: EglrConfig
    max_new_tokens: int
    seed: int | None = None
    stop_strings: tuple[str, ...] = ()
    options: tuple[tuple[str, object], ...] = ()

    def __post_init__(self) -> None:
        items = self.options.items() if isinstance(self.options, dict) else self.options
        object.__setattr__(self, "options",
                           tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in items)))
        if not self.prompt:
            raise ValueError("a Request needs a prompt of at least one token.")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"`max_new_tokens`={self.max_new_tokens!r} is not allowed; allowed: an int >= 1.")
        if self.config.sampled and self.seed is None:
            raise ValueError(f"a sampled Request (T={self.config.T}) needs its row `seed`.")


@dataclass
class Outcome:
    """What one request produced: its new tokens (the stop token included), why it ended
    (``"eos"``, ``"stop"`` or ``"length"``), its accounting, and per emitted token
    (``eglr_harness.core.signals`` turns these into the rollout's signals):

    entropies: the raw-logit entropy (nats) of the token's normal pass;
    logprobs: the token's log-probability under the distribution it was decoded from (log_softmax
        of the final, refined when gated, soft-capped fp32 logits at temperature 1, before any
        logits processor or warper);
    final_kls: the KL of the token's last refinement iteration (0.0 when not gated);
    token_iterations: the token's refinement iterations k* (0 when not gated);
    account: its record (``decoding/stats.RolloutAccount``), emitted by its engine as it finishes.
    """

    tokens: list[int] = field(default_factory=list)
    finish: str = ""
    gated: int = 0
    iterations: Counter = field(default_factory=Counter)  # k* -> gated tokens
    entropies: list[float] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    final_kls: list[float] = field(default_factory=list)
    token_iterations: list[int] = field(default_factory=list)
    account: RolloutAccount | None = None


class Engine(Protocol):
    """A decoder of EGLR requests."""

    def unsupported(self, request: Request) -> str | None:
        """Why this engine cannot decode ``request`` (a valid option it does not apply), or None. An invalid
        option value raises ``ValueError``: it is no reason to hand the request to another engine."""

    def run(self, requests: Sequence[Request], *, stats_for: Callable[[EglrConfig], EglrStats] | None = None,
            on_finish: Callable[[int, Outcome], None] | None = None) -> list[Outcome]:
        """Decode every request; their outcomes in request order. ``on_finish(index, outcome)`` as each
        ends (progress, storage); ``stats_for(config)`` is the accounting a config's rows add to."""
