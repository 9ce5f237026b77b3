"""Per-row reproducible sampling, so that a sampled rollout does not depend on its batch.

Hugging Face's sampler draws the whole batch from the global RNG, so a row's tokens change with
the batch it lands in. Here a draw is Gumbel-max with noise that is a pure function of
(row seed, token index, vocabulary id): token n of a row is

    argmax_v  warped_scores[v] + g(seed, n, v),   g = -log(-log(u)),  u = ((hash(seed, n, v) >> 9) + 0.5) / 2^23

which is a draw from softmax(warped_scores). The hash is counter-based integer arithmetic (below)
computed in int64 without overflow, so it is the same on CPU and CUDA, eager or compiled, for the
whole batch at once, and a row's draws do not depend on its neighbours, its slot or the step in
which it is drawn. Both engines draw this way (``generate``'s through ``SeededRowSampler``, after
transformers' warpers; the continuous engine through ``sample_rows``, whose warpers are HF's
applied per row).

The hash (32-bit words held in int64; ``mix`` is Wellons' lowbias32 finaliser):
    mix(x)   = x ^= x>>16; x = x*0x7feb352d mod 2^32; x ^= x>>15; x = x*0x846ca68b mod 2^32; x ^= x>>16
    row      = mix(mix((seed mod 2^32) ^ 0x9e3779b9) ^ (seed >> 32 mod 2^32))
    step     = mix(row ^ mix((n + 0x632be5ab) mod 2^32))
    bits     = mix(mix(step ^ v) ^ 0x85ebca6b);  u uses the top 23 bits: exact in fp32 and < 1
               (with 24 bits the largest u rounds to 1.0 in fp32 and its noise is inf)

Shape letters: the package's legend (``eglr_harness/decoding/__init__.py``).
"""

from __future__ import annotations

import hashlib

import torch
from transformers import LogitsProcessor

_MASK32 = 0xFFFFFFFF


def row_seed(seed: int, salt: str, prompt_tokens: list[int]) -> int:
    """A 63-bit seed from the base seed, a salt (config and cycle) and the prompt's token ids."""
    digest = hashlib.sha256(f"{seed}|{salt}|{','.join(map(str, prompt_tokens))}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def prompt_token_lists(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> list[list[int]]:
    """Each row's prompt without its (left) padding.  input_ids, attention_mask: (B, S)."""
    if attention_mask is None:
        return input_ids.tolist()
    return [row[mask.bool()].tolist() for row, mask in zip(input_ids, attention_mask)]


# ---------------------------------------------------------------- the counter-based hash
def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """x * c mod 2^32 for x in [0, 2^32) (int64), without int64 overflow: 16-bit halves of x."""
    low = (x & 0xFFFF) * c
    high = (((x >> 16) * c) & 0xFFFF) << 16
    return (low + high) & _MASK32


def _mix(x: torch.Tensor) -> torch.Tensor:
    """lowbias32: a bijection of 32-bit words with good avalanche.  int64 in [0, 2^32) -> same."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def row_keys(seeds: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """The key of each row's draw number ``counters``.  seeds: (B,) int64 >= 0; counters: (B,) int64 -> (B,)."""
    row = _mix(_mix((seeds & _MASK32) ^ 0x9E3779B9) ^ ((seeds >> 32) & _MASK32))
    return _mix(row ^ _mix((counters + 0x632BE5AB) & _MASK32))


def gumbel_noise(keys: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """Gumbel noise of each row's candidate tokens.  keys: (B,) from ``row_keys``; token_ids: (B, M) -> (B, M) fp32."""
    bits = _mix(_mix(keys[:, None] ^ token_ids) ^ 0x85EBCA6B)
    u = ((bits >> 9).float() + 0.5) * (1.0 / (1 << 23))  # in (0, 1), exact in fp32: 1 - 2^-24 at most
    return -torch.log(-torch.log(u))


# ---------------------------------------------------------------- warpers, per row
def warp_candidates(scores: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                    num_candidates: int, min_p: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' warpers in ``generate``'s order (temperature, top-k, top-p, min-p), each row with its
    own settings, on the ``num_candidates`` best tokens of each row.

    scores: (B, V) fp32 logits; temperature: (B,) > 0; top_k: (B,) int (0 = off); top_p: (B,) in
    (0, 1] (1 = off); num_candidates: C >= every row's top_k (V when a row has top_k = 0); min_p: (B,)
    in [0, 1] (0 = off) or None (no row uses it).
    Returns (warped (B, M) with removed tokens at -inf, their token ids (B, M)), best first.
    Tokens tied with a row's k-th best are kept, as ``TopKLogitsWarper`` keeps them, up to C.
    """
    scaled = scores / temperature[:, None]
    values, ids = torch.topk(scaled, num_candidates, dim=-1)  # (B, M) descending
    kth = values.gather(1, (top_k.clamp(min=1, max=num_candidates) - 1)[:, None])
    values = values.masked_fill((top_k[:, None] > 0) & (values < kth), float("-inf"))
    # TopPLogitsWarper: ascending order, drop tokens whose cumulative mass (them and all worse) <= 1 - top_p
    ascending = values.flip(-1)
    mass = ascending.softmax(dim=-1).cumsum(dim=-1)
    drop = mass <= (1 - top_p.double()).float()[:, None]
    drop[:, -1] = False  # min_tokens_to_keep = 1: the best token stays
    drop = drop & (top_p[:, None] < 1.0)
    values = ascending.masked_fill(drop, float("-inf")).flip(-1)
    if min_p is not None:  # MinPLogitsWarper: below min_p x the best token's probability; the best stays
        probs = values.softmax(dim=-1)
        below = probs < min_p[:, None] * probs[:, :1]
        below[:, 0] = False
        values = values.masked_fill(below, float("-inf"))
    return values, ids


def sample_rows(scores: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                seeds: torch.Tensor, counters: torch.Tensor, num_candidates: int,
                min_p: torch.Tensor | None = None) -> torch.Tensor:
    """One draw per row from its warped scores, Gumbel-max with the row's own noise.

    scores: (B, V) fp32; temperature, top_k, top_p, seeds, counters: (B,) -> (B,) int64 token ids.
    Rows with temperature 0 must be given a positive placeholder temperature (their draw is unused).
    """
    warped, ids = warp_candidates(scores, temperature, top_k, top_p, num_candidates, min_p)
    noisy = warped + gumbel_noise(row_keys(seeds, counters), ids)
    return ids.gather(1, noisy.argmax(dim=-1, keepdim=True))[:, 0]


class SeededRowSampler(LogitsProcessor):
    """Draw each row's next token with its own seeded noise; keep only that token's score.

    Put it last in the processor list (after transformers' warpers) and decode greedily: argmax
    then returns the drawn token. Draw n of the sampler is token n of every row of the batch.
    scores: (B, V) warped scores -> (B, V) with 0 at the drawn token and -inf elsewhere.
    """

    def __init__(self, seeds: list[int]):
        self.seeds = list(seeds)
        self.draws = 0

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if len(self.seeds) != scores.shape[0]:
            raise ValueError(f"SeededRowSampler got {len(self.seeds)} seeds for a batch of {scores.shape[0]} rows.")
        seeds = torch.tensor(self.seeds, dtype=torch.long, device=scores.device)
        counters = torch.full_like(seeds, self.draws)
        self.draws += 1
        drawn = draw(scores, seeds, counters)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, drawn[:, None], 0.0)


def draw(scores: torch.Tensor, seeds: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """Gumbel-max over already warped scores (removed tokens at -inf), every vocabulary entry a candidate.

    scores: (B, V); seeds, counters: (B,) int64 -> (B,) int64.
    """
    ids = torch.arange(scores.shape[-1], device=scores.device).expand(scores.shape[0], -1)
    return (scores.float() + gumbel_noise(row_keys(seeds, counters), ids)).argmax(dim=-1)
