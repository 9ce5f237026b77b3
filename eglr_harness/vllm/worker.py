"""The per-token signals back from vLLM's worker processes, through vLLM's own RPC.

vLLM carries a request's outputs from the worker to the caller in fixed fields (``ModelRunnerOutput``:
sampled token ids, logprobs, pooler output; the engine core turns them into ``EngineCoreOutputs``, msgpack
over ZMQ, and the front end into ``RequestOutput``). Its one per-token side channel, the auxiliary output
connector, is built in for MoE routed experts; a model plugin cannot add a field to any of them. What vLLM
offers plugins is a worker extension (``LLM(worker_extension_cls=...)``): methods mixed into every worker,
called by name from the front end with ``LLM.collective_rpc`` in whatever process or rank the worker runs
(the way RL trainers reach vLLM's workers to load new weights). ``VllmEngine`` calls ``eglr_take_signals``
after each ``generate``: each worker hands over, and forgets, the records of the requests it was given.

Tensor parallel: every rank runs the whole EGLR forward on the same all-reduced states and records the
same signals; the caller reads rank 0's, and every rank forgets its own copy.
"""

from __future__ import annotations

WORKER_EXTENSION = "eglr_harness.vllm.worker.EglrWorkerExtension"  # vLLM resolves "module.Class"


class EglrWorkerExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``): the signals' way out of the worker."""

    def eglr_take_signals(self, tags: list[str]) -> dict[str, list[tuple[float, int, float]]]:
        """{tag: [(entropy, k*, last KL) per generated token, in order]} of this worker, removed from its record."""
        from eglr_harness.vllm.row_settings import take_signals

        return {tag: take_signals(tag) for tag in tags}
