"""Per-row KV slots for the continuous engine, and the attention that reads them.

Each of the engine's B slots holds one running row. For every decoder layer the slot keeps keys
and values of shape (B, H, 1 + S, d): column 0 is the slot's scratch column, column 1 + p holds
position p. A row that is refining its pending position t writes the key/value of its refined
input into the scratch column, which only its own query sees; its key/value at t (column 1 + t),
the one later tokens attend to, stays the normal pass's (eglr-method.md §2, "attention context").

A decoding step runs one attention call per layer over all B slots, whatever mix of rows takes
part (advancing at their newest position, refining at their pending one, or idle): the queries of
the G rows of the layer are placed in their slots, one boolean mask per layer kind says what each
slot's query may see, and the G outputs are read back. Nothing of the cache is copied.

Shape letters: B slots, G rows taking part in a layer, H heads (Hkv key/value heads), Q query
positions, S sequence length of the keys, d head size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

ATTENTION_NAME = "eglr_slots"  # the name under which transformers' attention modules find slot_attention


@dataclass
class SlotView:
    """What the attention of one layer reads, handed to it as its ``attention_mask``.

    rows: (G,) slots of the layer's query rows, in the order of its hidden states; None when the
        rows are every slot in slot order (nothing to place or read back).
    mask: (B, 1, 1, S) bool over the slot cache for a decoding step; (G, 1, Q, Q) over the fresh
        keys of a prefill (``prefill``).
    """

    rows: torch.Tensor | None
    mask: torch.Tensor
    prefill: bool = False


class SlotCache:
    """The KV slots of every layer; stands in for transformers' cache in the layers' calls.

    Storage per layer: (B, Hkv, 1 + C, d) for B slots (the engine's slots plus one trash slot that
    padding rows of a fixed-shape step write to) and a capacity of C positions. C is a length
    bucket (``length_bucket``): it grows and shrinks by buckets between steps (``resize``), never
    per token, and a decoding step's attention reads all 1 + C columns, so the attention sees as
    many distinct widths as there are buckets.

    ``rows`` and ``columns`` name, before each layer, where the layer's G rows write: a decoding
    step writes one column per row (1 + position, or 0 for a refining row's scratch); a prefill
    writes columns 1..Q of its rows. Storage is allocated at the first (prefill) write of each layer.
    """

    def __init__(self, num_slots: int, capacity: int, *, static_addresses: bool = False):
        self.num_slots, self.capacity = num_slots, capacity  # capacity: positions per slot
        self.static_addresses = static_addresses  # mark storage for CUDA graphs (torch.compile)
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        self.rows: torch.Tensor | None = None  # (G,)
        self.columns: torch.Tensor | None = None  # (G,), decoding steps only
        self.prefill = False

    @property
    def width(self) -> int:
        """Columns a decoding step's attention reads: the scratch column and C positions."""
        return 1 + self.capacity

    def _new(self, like: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
        storage = like.new_zeros((self.num_slots, heads, 1 + self.capacity, head_dim))
        if self.static_addresses:
            torch._dynamo.mark_static_address(storage)
        return storage

    def _storage(self, layer_idx: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if layer_idx not in self.keys:
            self.keys[layer_idx] = self._new(like, like.shape[1], like.shape[3])
            self.values[layer_idx] = self._new(like, like.shape[1], like.shape[3])
        return self.keys[layer_idx], self.values[layer_idx]

    def resize(self, capacity: int) -> None:
        """Re-allocate every layer's storage for ``capacity`` positions, keeping the first ones (eager)."""
        if capacity == self.capacity:
            return
        keep = 1 + min(capacity, self.capacity)
        self.capacity = capacity
        for store in (self.keys, self.values):
            for layer_idx, old in store.items():
                new = self._new(old, old.shape[1], old.shape[3])
                new[:, :, :keep] = old[:, :, :keep]
                store[layer_idx] = new

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        """key_states, value_states: (G, Hkv, Q, d). Returns what the layer's attention reads."""
        keys, values = self._storage(layer_idx, key_states)
        if self.prefill:
            q = key_states.shape[2]
            keys[self.rows, :, 1:1 + q] = key_states
            values[self.rows, :, 1:1 + q] = value_states
            return key_states, value_states  # a prefill attends to its own fresh keys
        keys[self.rows, :, self.columns] = key_states[:, :, 0]
        values[self.rows, :, self.columns] = value_states[:, :, 0]
        return keys, values


def length_bucket(positions: int, base: int) -> int:
    """The smallest bucket >= ``positions``: base · 1, 1.5, 2, 3, 4, 6, 8, 12, ... (at most 1.5x too large,
    log-many distinct sizes).  base: an even int >= 2."""
    size, step = base, 0
    while size < positions:
        size = size * 3 // 2 if step % 2 == 0 else size * 4 // 3
        step += 1
    return size


def decode_masks(positions: torch.Tensor, refining: torch.Tensor, width: int, windows: dict[str, int | None]
                 ) -> dict[str, torch.Tensor]:
    """One (B, 1, 1, width) bool mask per layer kind for a decoding step.

    positions: (B,) the query position of each slot (newest position when advancing, the pending
    position t when refining, 0 when idle: it sees position 0 only, so that no row of the attention
    is fully masked); refining: (B,) bool. An advancing query sees positions 0..p; a refining one
    sees positions < t and its scratch column; a sliding window of W keeps the positions > p - W.
    windows: layer kind -> W (None = full attention).
    """
    column = torch.arange(width, device=positions.device)[None]  # (1, width)
    key_pos = column - 1  # column 0 is the scratch column
    query = positions[:, None]
    refine = refining[:, None]
    causal = (key_pos >= 0) & (key_pos <= query) & ~(refine & (key_pos == query))
    scratch = refine & (column == 0)
    masks = {}
    for kind, window in windows.items():
        seen = causal if window is None else causal & (key_pos > query - window)
        masks[kind] = (seen | scratch)[:, None, None, :]
    return masks


def prefill_masks(lengths: torch.Tensor, width: int, windows: dict[str, int | None]) -> dict[str, torch.Tensor]:
    """One (G, 1, Q, Q) bool causal mask per layer kind for right-padded prompts of ``lengths`` (G,).

    Padding queries see the positions before them (their outputs are never read)."""
    pos = torch.arange(width, device=lengths.device)
    causal = pos[None, :] <= pos[:, None]  # (Q, Q): key <= query
    masks = {}
    for kind, window in windows.items():
        seen = causal if window is None else causal & (pos[None, :] > pos[:, None] - window)
        masks[kind] = seen[None, None].expand(lengths.numel(), 1, width, width)
    return masks


def slot_attention(module, query, key, value, attention_mask: SlotView, scaling=None, dropout=0.0, softcap=None,
                   **kwargs):
    """The attention function transformers' attention modules call (registered as ``ATTENTION_NAME``).

    query: (G, H, Q, d); key, value: (B, Hkv, S, d) slot storage in a decoding step, (G, Hkv, Q, d)
    in a prefill. Returns ((G, Q, H, d), None) as transformers' attention functions do.
    """
    view = attention_mask
    if view.prefill or view.rows is None:
        out = attend(query, key, value, view.mask, scaling, softcap)
    else:
        placed = query.new_zeros((key.shape[0], *query.shape[1:])).index_copy_(0, view.rows, query)
        out = attend(placed, key, value, view.mask, scaling, softcap).index_select(0, view.rows)
    return out.transpose(1, 2).contiguous(), None


def attend(query, key, value, mask, scaling, softcap):
    """Masked attention with grouped key/value heads.

    query: (B, H, Q, d); key, value: (B, Hkv, S, d); mask: (B, 1, Q, S) bool -> (B, H, Q, d).
    Soft-capped scores (Gemma-2) take the explicit path, as transformers' eager attention does.
    """
    groups = query.shape[1] // key.shape[1]
    if softcap is None:
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling, enable_gqa=groups > 1)
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(weights, value)
