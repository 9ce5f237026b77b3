"""``generate``'s logits processors that the continuous engine applies itself, and the ones it refuses.

``generate`` builds logits processors from the model's ``generation_config`` even when decoding
greedily (Qwen2.5-Instruct ships ``repetition_penalty: 1.05``), and from a request's own options.
The continuous engine draws its tokens itself, so it applies these in ``generate``'s order, as
tensor functions over the rows of a step (``fixed_step.settle``), on the logits it emits (refined
at gated tokens), after the entropy gate and the KL exit have read the raw distribution:

    repetition_penalty -> no_repeat_ngram_size -> min_length -> min_new_tokens -> suppress_tokens
    -> begin_suppress_tokens, then the sampling warpers temperature -> top_k -> top_p -> min_p
    (``sampling.warp_candidates``).

Every other active processor (beams, bad words, sequence bias, typical-p, ...) is named by
:func:`not_applied` (``eglr_harness/core/generation_options.py`` holds the list and the one check of every
option's value), so a request never decodes other text than ``engine=hook`` would: the engine refuses it
and ``engine=auto`` hands it to ``engine=hook``. An invalid value is an error, never such a reason.

Where the engines can differ (documented, not hidden): ``generate`` counts ``min_length`` on the
left-padded prompt of its batch and lets ``no_repeat_ngram_size`` see the padding; the continuous
engine counts each row's own prompt. For one prompt per batch, or prompts of equal length, they agree.

Shape letters: the package's legend (``eglr_harness/decoding/__init__.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

import torch

from eglr_harness.core.generation_options import (

    APPLIED_BY_CONTINUOUS, SAMPLING_OPTIONS, check_generation_options, continuous_refusals,

    generation_config_options,

)

__all__ = ["LogitsOptions", "ProcessorsInUse", "SAMPLING_OPTIONS", "ban_ngram_repeats", "ban_tokens", "not_applied",
           "penalize_repeats"]


@dataclass(frozen=True)
class LogitsOptions:
    """One request's logits processors, as ``generate`` would build them (off by default).

    repetition_penalty: > 0, 1.0 = off; over the prompt's and the generated tokens.
    no_repeat_ngram_size: 0 = off; bans tokens that would repeat an n-gram of prompt + generated tokens.
    min_length: EOS banned while prompt + generated tokens < it; min_new_tokens: while generated < it.
    suppress_tokens: never emitted; begin_suppress_tokens: not as the first generated token.
    min_p: sampling only, 0.0 = off: drops tokens below min_p × the best token's probability.
    """

    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    min_length: int = 0
    min_new_tokens: int = 0
    suppress_tokens: tuple[int, ...] = ()
    begin_suppress_tokens: tuple[int, ...] = ()
    min_p: float = 0.0

    def __post_init__(self) -> None:
        check_generation_options(asdict(self), "LogitsOptions")

    @classmethod
    def resolve(cls, generation_config, options: Mapping) -> "LogitsOptions":
        """The processors of a request: its ``options`` over the model's ``generation_config``, as
        ``generate`` merges them. ``ValueError`` for an invalid value (``check_generation_options``) or
        naming every active setting the engine does not apply (``not_applied``)."""
        reason = not_applied(generation_config, options)
        if reason is not None:
            raise ValueError(reason)

        def setting(name):
            return options[name] if name in options else getattr(generation_config, name, None)

        penalty, min_p = setting("repetition_penalty"), setting("min_p")
        return cls(
            repetition_penalty=1.0 if penalty is None else float(penalty),
            no_repeat_ngram_size=int(setting("no_repeat_ngram_size") or 0),
            min_length=int(setting("min_length") or 0), min_new_tokens=int(setting("min_new_tokens") or 0),
            suppress_tokens=tuple(int(t) for t in setting("suppress_tokens") or ()),
            begin_suppress_tokens=tuple(int(t) for t in setting("begin_suppress_tokens") or ()),
            min_p=0.0 if min_p is None else float(min_p),
        )

    def eos_blocked_until(self, prompt_length: int) -> int:
        """Generated tokens before which EOS is banned (min_length counts the prompt, min_new_tokens not)."""
        return max(self.min_new_tokens, self.min_length - prompt_length, 0)


def not_applied(generation_config, options: Mapping) -> str | None:
    """Why the continuous engine cannot decode a request with ``options`` (over ``generation_config``):
    the valid settings it does not apply, named; None when it applies them all. An invalid value of
    either is a ``ValueError`` (``check_generation_options``), never a reason."""
    check_generation_options(options, "a request's generation options")
    check_generation_options(generation_config_options(generation_config), "the model's generation_config")
    refused = continuous_refusals(options, generation_config)
    if not refused:
        return None
    return (f"the continuous engine does not apply the generation setting(s) {', '.join(refused)} "
            f"(it applies {', '.join(APPLIED_BY_CONTINUOUS)} and temperature/top_k/top_p)")


@dataclass(frozen=True)
class ProcessorsInUse:
    """Which processors any request of a run uses (a compiled step specialises on it)."""

    penalty: bool = False
    ngram_size: int = 0
    eos_block: bool = False
    suppress: bool = False
    begin_suppress: bool = False
    min_p: bool = False

    @classmethod
    def of(cls, options: list[LogitsOptions], sampled: list[bool]) -> "ProcessorsInUse":
        sizes = {o.no_repeat_ngram_size for o in options} - {0}
        if len(sizes) > 1:
            raise ValueError(f"`no_repeat_ngram_size` takes one value per engine run, not {sorted(sizes)}; "
                             "decode the requests of each value in runs of their own.")
        return cls(penalty=any(o.repetition_penalty != 1.0 for o in options), ngram_size=next(iter(sizes), 0),
                   eos_block=any(o.min_length or o.min_new_tokens for o in options),
                   suppress=any(o.suppress_tokens for o in options),
                   begin_suppress=any(o.begin_suppress_tokens for o in options),
                   min_p=any(o.min_p > 0 and s for o, s in zip(options, sampled)))


# ---------------------------------------------------------------- the processors as tensor functions
def penalize_repeats(scores: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """RepetitionPenaltyLogitsProcessor per row.  scores: (G, V) fp32; seen: (G, V) bool; penalty: (G,) fp32."""
    p = penalty[:, None]
    return torch.where(seen, torch.where(scores < 0, scores * p, scores / p), scores)


def ban_ngram_repeats(scores: torch.Tensor, history: torch.Tensor, length: torch.Tensor, size: int,
                      active: torch.Tensor) -> torch.Tensor:
    """NoRepeatNGramLogitsProcessor per row, on a fixed-width token history.

    scores: (G, V); history: (G, C) long, a row's tokens at positions 0 .. length-1 (the rest stale);
    length: (G,) tokens so far; size: n; active: (G,) bool rows that use it. -> (G, V).
    """
    vocab, width = scores.shape[-1], history.shape[-1]
    if width < size:
        return scores
    start = (length - (size - 1)).clamp(min=0)
    prefix = history.gather(1, (start[:, None] + torch.arange(size - 1, device=history.device)).clamp(max=width - 1))
    windows = history.unfold(1, size, 1)  # (G, C - n + 1, n): window j holds positions j .. j + n - 1
    complete = torch.arange(windows.shape[1], device=history.device)[None] <= (length - size)[:, None]
    matches = (windows[..., :-1] == prefix[:, None]).all(dim=-1) & complete & active[:, None]
    # a matching window bans its own last token; the others go to a spare column past the vocabulary
    banned = torch.zeros(scores.shape[0], vocab + 1, dtype=torch.bool, device=scores.device)
    banned.scatter_(1, torch.where(matches, windows[..., -1].clamp(max=vocab), vocab), True)
    return scores.masked_fill(banned[:, :vocab], float("-inf"))


def ban_tokens(scores: torch.Tensor, banned: torch.Tensor) -> torch.Tensor:
    """Suppress tokens per row.  scores: (G, V); banned: (G, V) or (G, 1) & (1, V) broadcastable bool."""
    return scores.masked_fill(banned, float("-inf"))
