"""Inputs shared by the tests: token prompts for the engine, text requests for the adapter."""

from __future__ import annotations

from eglr_harness.run.accounting import PER_DECODE_FIGURES

# Text prompts for eglr-hf tests (a tiny random model with SmolLM2's tokenizer).
CONTEXTS = [
    "Question: what is 2 + 3?\nAnswer:",
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away, there lived a",
    "1, 1, 2, 3, 5, 8,",
]


def requests_for(contexts, gen_kwargs, repeats=1, task="unit_task"):
    """lm-eval ``generate_until`` instances, one document per context, each passed ``repeats`` times."""
    from lm_eval.api.instance import Instance

    out = []
    for doc_id, context in enumerate(contexts):
        inst = Instance("generate_until", doc={"i": doc_id}, arguments=(context, dict(gen_kwargs)), idx=0,
                        metadata=(task, doc_id, repeats))
        out.extend([inst] * repeats)  # lm-eval passes the same instance `repeats` times
    return out


# Figures of config.eglr.stats that depend on how the rollouts were batched (a resumed run batches the
# rollouts left differently); every other figure of a resumed run equals an uninterrupted run's (the package's
# one list: run/accounting.py; with the hook engine batched_flop_ratio too, per_decode_figures).
BATCH_DEPENDENT = PER_DECODE_FIGURES


def batch_independent(stats: dict, also: tuple[str, ...] = ()) -> dict:
    """``config.eglr.stats`` without the batch-dependent figures (and ``also``), per part (total, cells)."""
    drop = (*BATCH_DEPENDENT, *also)
    return {part: {k: v for k, v in figures.items() if k not in drop}
            for part, figures in [("total", stats["total"]), *stats["cells"].items()]}


ENGINE_VOCAB, ENGINE_PAD = 96, 0  # the engine tests' tiny models


def random_prompts(seed: int = 0, lengths=(9, 5, 7, 3), vocab: int = ENGINE_VOCAB) -> list[list[int]]:
    """Token prompts of different lengths (ids 3..vocab-1: never pad, BOS or EOS)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def left_pad(prompts, pad: int = ENGINE_PAD):
    """``(input_ids, attention_mask)``, both (B, S), left-padded as generate expects."""
    import torch

    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):] = torch.tensor(p)
        mask[r, width - len(p):] = 1
    return ids, mask


class CharTokenizer:
    """Just enough of a tokenizer for transformers' ``StopStringCriteria``: one character per token id (Greek and
    beyond: no byte-level markers), ``vocab`` ids."""

    def __init__(self, vocab: int = ENGINE_VOCAB):
        self.CHARS = [chr(c) for c in range(0x3B1, 0x3B1 + vocab)]

    def get_vocab(self):
        return {c: i for i, c in enumerate(self.CHARS)}

    def convert_ids_to_tokens(self, ids):
        return [self.CHARS[i] for i in ids]

    def convert_tokens_to_string(self, tokens):
        return "".join(tokens)

    def decode(self, ids, **kwargs):
        return "".join(self.CHARS[i] for i in ids)

    def __len__(self):
        return len(self.CHARS)

    def __call__(self, text, add_special_tokens=False):  # StopStringCriteria tokenizes a fixed prefix once
        return {"input_ids": [-1]}

    def _convert_id_to_token(self, index):
        return "abcdef" if index == -1 else self.CHARS[index]
