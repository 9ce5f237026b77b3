"""Per-row seeded sampling, so that a sampled rollout does not depend on its batch.

Hugging Face's sampler draws the whole batch from the global RNG, so a row's tokens change with
the batch it lands in. Here every row owns a ``torch.Generator`` seeded from (seed, config,
repeat cycle, the row's prompt tokens). The temperature / top-k / top-p warpers stay Hugging
Face's own; this processor only performs the draw.
"""

from __future__ import annotations

import hashlib

import torch
from transformers import LogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper


def row_seed(seed: int, salt: str, prompt_tokens: list[int]) -> int:
    """A 63-bit seed from the base seed, a salt (config and cycle) and the prompt's token ids."""
    digest = hashlib.sha256(f"{seed}|{salt}|{','.join(map(str, prompt_tokens))}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def prompt_token_lists(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> list[list[int]]:
    """Each row's prompt without its (left) padding.  input_ids, attention_mask: (B, S)."""
    if attention_mask is None:
        return input_ids.tolist()
    return [row[mask.bool()].tolist() for row, mask in zip(input_ids, attention_mask)]


class SeededRowSampler(LogitsProcessor):
    """Draw each row's next token with its own generator; keep only that token's score.

    Put it last in the processor list and decode greedily: argmax then returns the drawn token.
    scores: (B, V) warped scores -> (B, V) with 0 at the drawn token and -inf elsewhere.
    """

    def __init__(self, seeds: list[int]):
        self.seeds = list(seeds)
        self._generators: list[torch.Generator] | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._generators is None:
            if len(self.seeds) != scores.shape[0]:
                raise ValueError(f"SeededRowSampler got {len(self.seeds)} seeds for a batch of {scores.shape[0]} rows.")
            self._generators = [torch.Generator(device=scores.device).manual_seed(s) for s in self.seeds]
        drawn = torch.stack([draw(row, g) for row, g in zip(scores, self._generators)])
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, drawn, 0.0)


def draw(scores: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token from softmax(scores) with the row's own generator.  scores: (V,) warped -> (1,) long."""
    return torch.multinomial(torch.softmax(scores.float(), dim=-1), 1, generator=generator)


def warp(scores: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Hugging Face's sampling warpers in ``generate``'s order and on its conditions (temperature
    unless 1, top-k unless 0, top-p below 1), for callers that draw outside ``generate``.

    scores: (B, V) fp32 -> (B, V), removed tokens at -inf.
    """
    if temperature != 1.0:
        scores = TemperatureLogitsWarper(temperature)(None, scores)
    if top_k:
        scores = TopKLogitsWarper(top_k=top_k, min_tokens_to_keep=1)(None, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p=top_p, min_tokens_to_keep=1)(None, scores)
    return scores
