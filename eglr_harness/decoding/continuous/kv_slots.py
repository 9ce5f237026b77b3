"""Per-row KV slots for the continuous engine, and the attention that reads them.

Each of the engine's B slots holds one running row. For every decoder layer the slot keeps keys
and values of shape (B, Hkv, C, d): column 0 is the slot's scratch column, column 1 + p holds
position p. A row that is refining its pending position t writes the key/value of its refined
input into the scratch column, which only its own query sees; its key/value at t (column 1 + t),
the one later tokens attend to, stays the normal pass's (eglr-method.md §2, "attention context").

When the step is captured, the storage is allocated once, at the capacity C of the run's longest
request (a length bucket), and never moves: a CUDA graph recorded on it stays valid for the engine's
life (``step_graphs.py``). Eager steps grow it by length buckets as rows get longer (``grow``), so
that a run whose rows end early never holds its longest request's K/V for every slot.
A decoding step's attention reads only the first W columns, W a length bucket of the running rows'
longest position, so its cost follows the live lengths, not the storage.

A decoding step runs one attention call per layer over all B slots, whatever mix of rows takes
part (advancing at their newest position, refining at their pending one, or idle): the queries of
the G rows of the layer are placed in their slots, one mask per layer kind says what each slot's
query may see, and the G outputs are read back. Nothing of the cache is copied. A prefill (a chunk
of each of G prompts, ``prefill_masks``) writes its keys/values into the slots first and attends to
the slots' columns up to the chunk's end, so that a long prompt can be prefilled in chunks.

Shape letters: the package's legend (``eglr_harness/decoding/__init__.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

ATTENTION_NAME = "eglr_slots"  # the name under which transformers' attention modules find slot_attention


@dataclass
class SlotView:
    """What the attention of one layer reads, handed to it as its ``attention_mask``.

    rows: (G,) slots of the layer's query rows, in the order of its hidden states.
    mask: what each query sees, bool: (B, 1, 1, W) over the slot storage's first W columns for a
        decoding step; (G, 1, Q, S) over the columns a prefill gathered (``prefill``).
    bias: the same as an additive mask (0 / -inf) in the queries' dtype, made once per forward and
        not per layer (sdpa would convert a bool mask in every layer).
    """

    rows: torch.Tensor
    mask: torch.Tensor
    bias: torch.Tensor
    prefill: bool = False

    @classmethod
    def of(cls, rows: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype, prefill: bool = False) -> "SlotView":
        bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
        return cls(rows, mask, bias, prefill)


@dataclass
class LayerWrite:
    """One layer's slot storage and where a decoding step's G rows write into it; stands in for
    transformers' cache in that layer's call. keys, values: (B, Hkv, C, d); rows, columns: (G,).
    gather: the W columns the attention reads, of the rows' own slots only (an eager step of few rows:
    ``fixed_step.gathers``), instead of every slot's; the step's ``SlotView`` then names the rows 0..G-1."""

    keys: torch.Tensor
    values: torch.Tensor
    rows: torch.Tensor
    columns: torch.Tensor
    gather: int | None = None  # W, when gathering

    def update(self, key_states, value_states, *args, **kwargs):
        """key_states, value_states: (G, Hkv, 1, d). Returns the whole storage, whose first W columns the
        attention reads; with ``gather``, the rows' slots' first W columns, (G, Hkv, W, d)."""
        self.keys[self.rows, :, self.columns] = key_states[:, :, 0]
        self.values[self.rows, :, self.columns] = value_states[:, :, 0]
        if self.gather is not None:
            width = self.gather
            return (self.keys[:, :, :width].index_select(0, self.rows),
                    self.values[:, :, :width].index_select(0, self.rows))
        return self.keys, self.values


# Columns the storage holds beyond its capacity, never written or read. With them, the W <= C columns a
# decoding step reads are always a strict slice of the storage, never all of it: inductor decides whether
# a slice is contiguous from its sizes, and a first step that read the whole storage (W == C) made the
# compiled layer guard on W == C, so that every later step with W < C compiled again.
SPARE_COLUMNS = 1


class SlotCache:
    """The KV slots of every layer.

    Storage per layer: (B, Hkv, C + SPARE_COLUMNS, d) for B slots (the engine's slots plus one trash
    slot that padding rows of a fixed-shape step write to) and C columns (``capacity``, a length
    bucket; the spare column is never used), allocated at the first prefill write of each layer. ``width`` (W <= C) is
    the number of columns
    the next decoding step's attention reads; the engine sets it between steps.

    In a prefill, the cache itself is the layers' cache: ``rows``, ``columns`` (G, Q) name where each
    chunk position's key/value goes (padding positions to the trash slot) and ``span`` how many columns
    the chunk's attention gathers. A decoding step hands each layer a ``LayerWrite`` (``layer``).
    """

    def __init__(self, num_slots: int, capacity: int):
        self.num_slots, self.capacity = num_slots, capacity
        self.width = capacity
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        self.rows: torch.Tensor | None = None  # prefill: (G, Q) slot of each chunk position
        self.columns: torch.Tensor | None = None  # prefill: (G, Q) its column
        self.gather: torch.Tensor | None = None  # prefill: (G,) the chunk rows' slots
        self.span = 0  # prefill: columns the chunk's attention reads

    def storage(self, layer_idx: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if layer_idx not in self.keys:
            shape = (self.num_slots, like.shape[1], self.capacity + SPARE_COLUMNS, like.shape[3])
            self.keys[layer_idx], self.values[layer_idx] = like.new_zeros(shape), like.new_zeros(shape)
        return self.keys[layer_idx], self.values[layer_idx]

    def grow(self, capacity: int) -> None:
        """Re-allocate every layer's storage with ``capacity`` columns, keeping the ones written (eager
        steps only: a recorded CUDA graph would still read the old storage)."""
        for store in (self.keys, self.values):
            for layer_idx, old in store.items():
                new = old.new_zeros((*old.shape[:2], capacity + SPARE_COLUMNS, old.shape[3]))
                new[:, :, :self.capacity] = old[:, :, :self.capacity]
                store[layer_idx] = new
        self.capacity = capacity

    def copy_prompt(self, source: int, targets: torch.Tensor, length: int) -> None:
        """Copy positions 0..length-1 (columns 1..length) of every layer's slot ``source`` into the slots
        ``targets`` (P,): rows take the K/V of a prompt that another row's prefill computed (shared prompts,
        ``scheduler.py``). One source broadcast to its targets: no gathered copy of the source in between. The
        scratch column is left: a row writes it before it reads it."""
        for store in (self.keys, self.values):
            for storage in store.values():
                storage[targets, :, 1:length + 1] = storage[source, :, 1:length + 1]

    def layer(self, layer_idx: int, rows: torch.Tensor, columns: torch.Tensor, gather: bool = False) -> LayerWrite:
        """What decoder layer ``layer_idx`` of a decoding step writes into: its storage at (rows, columns) (G,);
        gather: its attention reads the rows' own slots only (``LayerWrite.gather``)."""
        return LayerWrite(self.keys[layer_idx], self.values[layer_idx], rows, columns, self.width if gather else None)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        """A prefill chunk: key_states, value_states (G, Hkv, Q, d) go to their (rows, columns); returns the
        chunk rows' first ``span`` columns, (G, Hkv, S, d), which the chunk's attention reads."""
        keys, values = self.storage(layer_idx, key_states)
        keys[self.rows, :, self.columns] = key_states.transpose(1, 2)
        values[self.rows, :, self.columns] = value_states.transpose(1, 2)
        return keys[self.gather, :, :self.span], values[self.gather, :, :self.span]


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


def prefill_masks(starts: torch.Tensor, chunk: int, span: int,
                  windows: dict[str, int | None]) -> dict[str, torch.Tensor]:
    """One (G, 1, Q, S) bool mask per layer kind for a prefill chunk: row g's queries are positions
    starts[g] + 0..Q-1 and its keys the slot columns 0..S-1 (column 1 + p holds position p; the
    scratch column is never seen). A query sees the positions up to its own (and within a window).

    starts: (G,); chunk: Q; span: S. Padding queries past a row's prompt see positions before them
    (their outputs are never read)."""
    query = starts[:, None, None] + torch.arange(chunk, device=starts.device)[None, :, None]  # (G, Q, 1)
    key_pos = torch.arange(span, device=starts.device)[None, None, :] - 1  # (1, 1, S)
    causal = (key_pos >= 0) & (key_pos <= query)
    masks = {}
    for kind, window in windows.items():
        seen = causal if window is None else causal & (key_pos > query - window)
        masks[kind] = seen[:, None]
    return masks


def slot_attention(module, query, key, value, attention_mask: SlotView, scaling=None, dropout=0.0, softcap=None,
                   **kwargs):
    """The attention function transformers' attention modules call (registered as ``ATTENTION_NAME``).

    query: (G, H, Q, d); key, value: (B, Hkv, C, d) slot storage in a decoding step, (G, Hkv, S, d)
    gathered columns in a prefill. Returns ((G, Q, H, d), None) as transformers' attention functions do.
    """
    view = attention_mask
    if view.prefill:
        out = attend(query, key, value, view, scaling, softcap)
    else:
        width = view.mask.shape[-1]
        key, value = key[:, :, :width], value[:, :, :width]  # the columns the step reads
        placed = query.new_zeros((key.shape[0], *query.shape[1:])).index_copy_(0, view.rows, query)
        out = attend(placed, key, value, view, scaling, softcap).index_select(0, view.rows)
    return out.transpose(1, 2).contiguous(), None


def attend(query, key, value, view: SlotView, scaling, softcap):
    """Masked attention with grouped key/value heads.

    query: (B, H, Q, d); key, value: (B, Hkv, S, d); view.mask / view.bias: (B, 1, Q, S) -> (B, H, Q, d).
    The query heads of each key/value head become that head's query rows, (B, Hkv, H/Hkv * Q, d): the
    same sums as grouped-head attention, without copying keys and values per head and without sdpa's
    grouped-head path (which takes the slow math kernel on CUDA when there is a mask). Soft-capped
    scores (Gemma-2) take the explicit path, as transformers' eager attention does.
    """
    batch, heads, length, head_dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    if softcap is None:
        bias = view.bias
        if groups > 1:
            query = query.reshape(batch, kv_heads, groups * length, head_dim)
            if length > 1:  # one mask row per query row: (B, 1, groups * Q, S)
                bias = bias[:, :, None].expand(-1, -1, groups, -1, -1).reshape(batch, 1, groups * length, -1)
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=bias, scale=scaling)
        return out.reshape(batch, heads, length, head_dim)
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~view.mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(weights, value)
