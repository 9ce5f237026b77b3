"""``eglr-baseline``: lm-eval's ``hf`` model for the baselines EGLR is compared with (greedy, beam search), with
stop strings applied per sequence and what each answer cost recorded.

Why not stock ``hf``: lm-eval 0.4.13 builds its stop-string criteria for the prompts of one batch
(``lm_eval/models/utils_hf.py`` ``stop_sequences_criteria``: one flag per prompt, and ``True`` for the whole batch
once every flag is set). transformers' beam search calls the criteria on the flattened beam candidates
(``batch x 2 num_beams`` rows), so the flags watch the first few candidates of the first prompt, and once those
show a stop string every prompt of the batch is ended where it stands: answers cut mid-sentence at a
batch-mate's stop (docs/baselines.md). Greedy decoding is unaffected (one row per prompt).

What this model changes, and nothing else (loading, chat templates, batching, the gen kwargs, the text lm-eval
returns are ``hf``'s):

- the stop strings are checked per row, as lm-eval checks them (the last ``len(stop tokens) + 2`` generated tokens
  decoded, the string found in them), and a row that shows one is finished on its own: for beam search that
  ends that hypothesis (transformers keeps the search going while an open beam can still win, as it does
  with the end-of-sequence token);
- beam search decodes one prompt at a time (each request's search is its own, independent of the batch and
  its padding; ``--batch_size`` still batches greedy requests), so its steps are known;
- each answer is a :class:`~eglr_harness.core.rollout.BaselineText`: its ``finish`` (``stop``, ``eos``,
  ``length`` or ``cut``) and ``search_tokens`` (``num_beams`` x the search's steps; the answer's own tokens for
  greedy), which the tasks log per rollout and the reports read: the real compute of a beam baseline, and a
  guard that names any answer that ended early.
"""

from __future__ import annotations

import logging
from collections import defaultdict, deque

import torch
import transformers
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs

from eglr_harness.core.rollout import BaselineText

__all__ = ["BaselineHFLM", "RowStopStrings", "answer_finish"]

logger = logging.getLogger(__name__)

LOOKBACK_SLACK = 2  # lm-eval's: a stop string's tokens may come out split differently (['\n', '\n'] for '\n\n')


class RowStopStrings(transformers.StoppingCriteria):
    """Per-row stop strings: ``True`` for each row whose last generated tokens (as many as the longest stop string
    encodes to, plus :data:`LOOKBACK_SLACK`) decode to a text holding one of ``stops``. ``calls`` counts the
    decoding steps it was asked about (one per step of ``generate``)."""

    def __init__(self, tokenizer, stops: list[str], prompt_length: int) -> None:
        self.tokenizer = tokenizer
        self.stops = [s for s in stops if s]
        self.prompt_length = prompt_length
        lengths = [len(tokenizer.encode(s, add_special_tokens=False)) for s in self.stops]
        self.lookback = max(lengths, default=0) + LOOKBACK_SLACK
        self.calls = 0

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        """input_ids: ``(rows, prompt_length + generated)``; returns ``(rows,)`` bool."""
        self.calls += 1
        if not self.stops:
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        tails = self.tokenizer.batch_decode(input_ids[:, self.prompt_length:][:, -self.lookback:])
        return torch.tensor([any(s in text for s in self.stops) for text in tails], dtype=torch.bool,
                            device=input_ids.device)


def answer_finish(tokens: list[int], decode, stops: list[str], eos_ids: set[int], pad_id: int | None,
                  max_new_tokens: int) -> tuple[str, int]:
    """How one generated row ended and its length in tokens: ``("stop", n)`` when a stop string shows within the
    tokens before the first end-of-sequence token (``n``: the shortest prefix that holds it), ``("eos", n)`` at
    an end-of-sequence token (``n`` counts it), ``("length", max_new_tokens)`` when the row filled its budget,
    else ``("cut", n)`` (trailing padding not counted). ``decode``: token ids -> text, special tokens kept."""
    end = next((i for i, t in enumerate(tokens) if t in eos_ids), None)
    body = tokens if end is None else tokens[:end]
    stops = [s for s in stops if s]
    if stops and any(s in decode(body) for s in stops):
        low, high = 1, len(body)  # the shortest prefix holding a stop string (holding one is monotone in length)
        while low < high:
            mid = (low + high) // 2
            if any(s in decode(body[:mid]) for s in stops):
                high = mid
            else:
                low = mid + 1
        return "stop", low
    if end is not None:
        return "eos", end + 1
    n = len(body)
    while n and pad_id is not None and body[n - 1] == pad_id:
        n -= 1
    return ("length", max_new_tokens) if n >= max_new_tokens else ("cut", n)


@register_model("eglr-baseline")
class BaselineHFLM(HFLM):
    """lm-eval's ``HFLM`` whose stop strings end each row on its own and whose answers say how they ended and what
    they cost (module docstring). Takes every model arg ``hf`` takes."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._batch_contexts: list[str] = []
        self._answers: dict[tuple, deque] = defaultdict(deque)  # (context, stops, max_gen_toks) -> (finish, cost)

    def tok_batch_encode(self, strings, *args, **kwargs):
        self._batch_contexts = list(strings)  # generate_until encodes each batch right before it generates it
        return super().tok_batch_encode(strings, *args, **kwargs)

    def _model_generate(self, context, max_length, stop, **generation_kwargs):
        """``context``: ``(batch, prompt)`` left-padded ids, one row per string of the last ``tok_batch_encode``;
        returns ``(batch, prompt + new)`` ids as ``hf``'s does."""
        num_beams = int(generation_kwargs.get("num_beams") or 1)
        max_new = max_length - context.shape[1]
        contexts = self._batch_contexts
        if len(contexts) != context.shape[0]:
            raise RuntimeError(f"eglr-baseline: {context.shape[0]} rows to generate but {len(contexts)} contexts "
                               "encoded; lm-eval's generate_until changed its order of calls.")
        mask = generation_kwargs.pop("attention_mask", None)
        if num_beams == 1:
            out, _ = self._generate(context, mask, max_length, stop, generation_kwargs)
            rows = [out[i, context.shape[1]:].tolist() for i in range(out.shape[0])]
            for text, row in zip(contexts, rows):
                finish, n = self._finish(row, stop, max_new)
                self._answers[(text, tuple(stop), max_new)].append((finish, n))
            return out
        news = []
        for i, text in enumerate(contexts):  # each search alone: its steps are its own, not the batch's
            ids = context[i:i + 1] if mask is None else context[i:i + 1, mask[i].bool()]
            out, steps = self._generate(ids, None, ids.shape[1] + max_new, stop, generation_kwargs)
            row = out[0, ids.shape[1]:].tolist()
            finish, _ = self._finish(row, stop, max_new)
            self._answers[(text, tuple(stop), max_new)].append((finish, num_beams * steps))
            news.append(row)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eot_token_id
        width = max(map(len, news))
        new = torch.tensor([row + [pad] * (width - len(row)) for row in news], dtype=context.dtype,
                           device=context.device)
        return torch.cat([context, new], dim=1)

    def _generate(self, ids, mask, max_length, stop, generation_kwargs) -> tuple[torch.Tensor, int]:
        """``hf``'s ``_model_generate`` with :class:`RowStopStrings`; returns the ids and the steps taken."""
        kwargs = dict(generation_kwargs)
        kwargs["temperature"] = kwargs.get("temperature", 0.0)
        do_sample = kwargs.get("do_sample")
        if kwargs["temperature"] == 0.0 and do_sample is None:
            kwargs["do_sample"] = do_sample = False
        if do_sample is False and kwargs["temperature"] == 0.0:
            kwargs.pop("temperature")
        criteria = RowStopStrings(self.tokenizer, list(stop), ids.shape[1])
        with torch.autocast(device_type=self.device.type, dtype=self.mixed_precision_dtype,
                            enabled=self.mixed_precision_dtype is not None):
            out = self.model.generate(input_ids=ids, attention_mask=mask, max_length=max_length,
                                      stopping_criteria=transformers.StoppingCriteriaList([criteria]),
                                      pad_token_id=self.tokenizer.pad_token_id, use_cache=True, **kwargs)
        return out, criteria.calls

    def _finish(self, row: list[int], stop, max_new: int) -> tuple[str, int]:
        eos = self.model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
        eos_ids.add(self.eot_token_id)
        return answer_finish(row, lambda ids: self.tokenizer.decode(ids, skip_special_tokens=False), list(stop),
                             eos_ids, self.tokenizer.pad_token_id, max_new)

    def generate_until(self, requests, disable_tqdm: bool = False):
        """``hf``'s answers, each a :class:`BaselineText` (module docstring)."""
        self._answers.clear()
        texts = super().generate_until(requests, disable_tqdm=disable_tqdm)
        eos = self.tok_decode(self.eot_token_id, skip_special_tokens=False)
        answers = []
        for request, text in zip(requests, texts, strict=True):
            context, gen_kwargs = request.args
            kwargs = normalize_gen_kwargs(dict(gen_kwargs), self.max_gen_toks)
            until = kwargs.pop("until", None)  # a copy: lm-eval's handle_stop_sequences appends to the list it gets
            stops = handle_stop_sequences([until] if isinstance(until, str) else list(until or []), eos=eos)
            queue = self._answers.get((context, tuple(stops), kwargs["max_gen_toks"]))
            if not queue:  # an answer lm-eval's cache gave (--use_cache): nothing was decoded for it here
                answers.append(text)
                continue
            finish, cost = queue.popleft()
            answers.append(BaselineText(text, finish=finish, search_tokens=cost))
        if cut := sum(isinstance(a, BaselineText) and a.finish == "cut" for a in answers):
            logger.warning("eglr-baseline: %d of %d answers ended early (no stop string, no end of sequence, under "
                           "max_gen_toks); the reports name them.", cut, len(answers))
        return answers
