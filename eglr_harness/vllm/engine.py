"""The engine contract (``decoding/contract.py``) over a vLLM ``LLM`` whose model is an EGLR architecture.

Every request is added to vLLM's engine at once (vLLM batches and schedules them; its request id is its signal
tag) and the engine is stepped as ``LLM.generate`` steps it, so that each rollout is handed on (``on_finish``:
stored, counted by the progress bar) the step it finishes rather than when the last one does; the EGLR
settings of each (its exit rule and threshold included) travel in its ``SamplingParams.extra_args``
(``row_settings.py``), temperature, top-k, top-p and the row seed in vLLM's own parameters. Per token, the
entropy, k* and last exit signal (the KL with ``stop=kl``) come
from the workers' record (a tag per request), taken through vLLM's RPC in whatever process the workers
run (``worker.py``) once per step that finishes requests, the emitted token's log-probability from vLLM's own
``logprobs=0`` (raw: the refined logits, temperature 1). A run stopped midway (Ctrl-C, an error) aborts its
requests that are still running and drops their records, so the engine serves the next run clean.

Accounting: vLLM decides the batch of each step, which this side never sees; each rollout's figures
are its own (rows = its tokens, the refinement cost = its gated tokens' iterations x L, the LM-head projections
as its exit rule makes them), as the continuous engine counts a row; the run's wall time is shared among its
configs by their layer evaluations, as the continuous engine shares it.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections import Counter
from collections.abc import Callable, Sequence

from eglr_harness.core.config import EglrConfig
from eglr_harness.core.progress import tokens_emitted
from eglr_harness.decoding.contract import Outcome, Request
from eglr_harness.decoding.stats import EglrStats, RolloutAccount, own_account, share_wall_time
from eglr_harness.vllm.row_settings import EXTRA_ARGS_KEY

_TAGS = itertools.count()


class VllmEngine:
    """Decodes requests with ``llm`` (a ``vllm.LLM`` over an EGLR architecture, built with ``engine_args``)."""

    def __init__(self, llm):
        self.llm = llm

    def unsupported(self, request: Request) -> str | None:
        if request.options:
            names = ", ".join(name for name, _ in request.options)
            return f"eglr-vllm decodes the cell's settings only; generation options {names} are not applied"
        return None

    def sampling_params(self, request: Request, tag: str):
        """vLLM's ``SamplingParams`` of one request."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        config = request.config
        sampled = config.sampled
        settings = {"L": config.L, "alpha": config.alpha, "k_max": config.k_max, "tau_kl": config.tau_kl,
                    "tau_h": config.tau_h, "stop": config.stop,
                    config.stop_rule.threshold_arg: config.stop_threshold, "tag": tag}
        return SamplingParams(
            temperature=config.T if sampled else 0.0,
            top_k=(config.top_k or -1) if sampled else -1, top_p=config.top_p if sampled else 1.0,
            seed=request.seed if sampled else None, max_tokens=request.max_new_tokens,
            stop=list(request.stop_strings) or None, logprobs=0, extra_args={EXTRA_ARGS_KEY: settings},
            output_kind=RequestOutputKind.FINAL_ONLY,  # as LLM.generate asks: each request's output once, whole
        )

    def run(self, requests: Sequence[Request], *, stats_for: Callable[[EglrConfig], EglrStats] | None = None,
            on_finish: Callable[[int, Outcome], None] | None = None) -> list[Outcome]:
        from vllm.inputs import TokensPrompt

        for request in requests:
            reason = self.unsupported(request)
            if reason is not None:
                raise ValueError(reason + ".")
        tags = [f"eglr-{next(_TAGS)}" for _ in requests]  # each request's signal tag, and its request id
        index_of = {tag: i for i, tag in enumerate(tags)}
        outcomes: list[Outcome | None] = [None] * len(requests)
        engine = self.llm.llm_engine
        started = time.perf_counter()
        try:
            for request, tag in zip(requests, tags):
                engine.add_request(tag, TokensPrompt(prompt_token_ids=list(request.prompt)),
                                   self.sampling_params(request, tag))
            while engine.has_unfinished_requests():  # LLM.generate's loop, each rollout handed on as it finishes
                finished = {index_of[output.request_id]: output for output in engine.step()
                            if output.finished and output.request_id in index_of}
                if not finished:
                    continue
                records = self.llm.collective_rpc(  # rank 0's; every rank forgets its own
                    "eglr_take_signals", args=([tags[i] for i in finished],))[0]
                for i, output in finished.items():
                    outcome = _outcome(output.outputs[0], records[tags[i]])
                    outcome.account = row_account(outcome, requests[i].config)
                    if stats_for is not None:
                        stats_for(requests[i].config).add_rollout(outcome.account)
                    outcomes[i] = outcome
                    tokens_emitted(len(outcome.tokens))  # the progress bar, in tokens (core/progress.py)
                    if on_finish is not None:
                        on_finish(i, outcome)
        except BaseException:
            running = [request_id for request_id, i in index_of.items() if outcomes[i] is None]
            with contextlib.suppress(Exception):  # an engine that died cannot abort: the first error is the one to say
                engine.abort_request(running)  # else the next run's steps would decode them too
                self.llm.collective_rpc("eglr_take_signals", args=([tags[index_of[r]] for r in running],))
            raise
        lost = [tags[i] for i, outcome in enumerate(outcomes) if outcome is None]
        if lost:  # a request vLLM never reported finished (no abort was asked for here)
            raise RuntimeError(f"eglr-vllm: the engine ran out of requests before {', '.join(lost)} finished.")
        if stats_for is not None:  # the run's wall, as the continuous engine counts it: shared by each config's work
            work: Counter = Counter()
            for request, outcome in zip(requests, outcomes):
                layers = stats_for(request.config).num_layers
                work[request.config] += layers * outcome.account.tokens + outcome.account.refine_layer_evals
            share_wall_time({config: stats_for(config) for config in work}, work, time.perf_counter() - started)
        return outcomes


def _outcome(completion, signals: list[tuple[float, int, float]]) -> Outcome:
    """An ``Outcome`` from vLLM's completion and the worker's per-row record of it."""
    tokens = list(completion.token_ids)
    if len(signals) != len(tokens):
        raise RuntimeError(f"eglr-vllm: {len(signals)} signal records for {len(tokens)} tokens "
                           "(one per token expected; none: the engine was not built with "
                           "eglr_harness.vllm.engine_args).")
    logprobs = [float(step[token].logprob) for step, token in zip(completion.logprobs or [], tokens)]
    finish = finish_of(completion.finish_reason, completion.stop_reason)
    iterations = Counter(k for _, k, _ in signals if k > 0)
    return Outcome(tokens=tokens, finish=finish, gated=sum(iterations.values()), iterations=iterations,
                   entropies=[e for e, _, _ in signals], logprobs=logprobs,
                   final_kls=[kl for _, _, kl in signals], token_iterations=[k for _, k, _ in signals])


def finish_of(finish_reason: str | None, stop_reason) -> str:
    """An ``Outcome.finish`` from vLLM's ``finish_reason`` and ``stop_reason``: "stop" with no stop reason is the
    EOS token ("eos"), with one a stop string or token ("stop"); "length" stays; any other reason vLLM gives
    ("abort", ...) is passed on as it is, never read as an EOS."""
    if finish_reason == "stop":
        return "stop" if stop_reason is not None else "eos"
    return str(finish_reason)


def row_account(outcome: Outcome, config: EglrConfig) -> RolloutAccount:
    """A finished rollout's record, counted as its own rows (vLLM's batches are not visible here): a step per
    token, a refinement pass of its own k* per gated token."""
    tokens, passes = len(outcome.tokens), sum(k * n for k, n in outcome.iterations.items())
    return own_account(tokens, outcome.iterations, config, steps=tokens, gated_steps=outcome.gated,
                       computed_refine_layer_evals=config.L * passes)
