"""``eglr-hf``: lm-eval's ``HFLM`` decoded with EGLR. Glue only: the rules live in leaf modules.

Everything HFLM accepts keeps working (``pretrained``, ``gguf_file``, ``dtype``, ``device``,
``batch_size``, ``parallelize``, chat templates, accelerate data parallel). On top of it the model
args of ``settings.RunSettings``. The class holds only what lm-eval asks of a model; its parts:
``EglrArgs`` (``harness/eglr_args.py``: every argument, checked before the weights load), the engines
(``harness/engine_choice.py``), ``RolloutDecoder`` (``harness/decode.py``) and ``PoolRunner``
(``harness/pool_runner.py``: instances -> pools -> tau_h -> rollouts, the accounting and
``config.eglr``).
"""

from __future__ import annotations

import logging

from lm_eval.api.instance import Instance
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from eglr_harness.core.distributed import process_gather
from eglr_harness.core.errors import RunArgError, model_arg_errors
from eglr_harness.core.model_args import (
    DEFAULT_CALIB_LIMIT,
    DEFAULT_COMPILE,
    DEFAULT_ENGINE,
    EGLR_ARGS,
    USE_CACHE_REFUSAL,
)
from eglr_harness.core.progress import announced_load
from eglr_harness.decoding.model_parts import find_model_parts
from eglr_harness.harness.cpu_threads import fit_cpu_threads
from eglr_harness.harness.decode import RolloutDecoder, TextCodec
from eglr_harness.harness.eglr_args import EglrArgs, intended_device
from eglr_harness.harness.engine_choice import build_engines, engine_name
from eglr_harness.harness.pool_runner import PoolRunner
from eglr_harness.run.stores import RolloutStore, loaded_model_fingerprint

logger = logging.getLogger(__name__)


@register_model("eglr-hf")
class EglrHFLM(HFLM):
    """Hugging Face causal LM decoded with Entropy-Gated Latent Recursion."""

    def __init__(self, pretrained=None, *, model_config: str | None = None, L=None, T=None, alpha: float | None = None,
                 k_max: int | None = None, tau_kl: float | None = None, tau_h=None, stop: str | None = None,
                 tau_latent: float | None = None, tau_accel: float | None = None, tau_margin: float | None = None,
                 tau_entropy: float | None = None, top_k: int | None = None, top_p: float | None = None,
                 seed: int | None = None, seeds: int | None = None, calib_limit: int = DEFAULT_CALIB_LIMIT,
                 rollout_cache: str | None = None, engine: str = DEFAULT_ENGINE, compile: str = DEFAULT_COMPILE,
                 **kwargs):
        """eglr's own model args by name (``core/model_args.MODEL_ARGS`` says each; None: not given, so the preset's
        or the default), ``pretrained`` and ``kwargs``: HFLM's and from_pretrained's, passed through. Every value is
        read once, before the weights load (``harness/eglr_args.EglrArgs``)."""
        _follow_lm_eval_logging()
        own = {name: value for name, value in locals().items() if name in EGLR_ARGS}
        self.args = EglrArgs.for_hf({"pretrained": pretrained, **own, **kwargs})  # every check before the weights load
        load_args, device = self.args.load_args, intended_device(self.args.load_args)
        fit_cpu_threads(device, logger)  # before the load: de-quantising a GGUF runs on them
        loads = "weights, tokenizer" + ("; a GGUF is de-quantised first, about a minute on a CPU"
                                        if load_args.get("gguf_file") else "")
        with announced_load(logger, "eglr-hf", self.args.run.model_name, loads, load_args.get("dtype", "auto"),
                            device) as then:
            super().__init__(**load_args)
            then.append(f"building engine={self.args.engine} (compile={self.args.compile})")
        parts = find_model_parts(self.model)
        num_layers = parts.num_layers
        self.args.check_loaded(num_layers, self.model.generation_config)
        fingerprint = loaded_model_fingerprint(self.model, self.args.load_args,
                                               settings=self.args.settings.base.as_dict(),
                                               max_length=self.max_length, add_bos_token=getattr(self, "add_bos_token",
                                                                                                 None))
        with model_arg_errors():
            self.engines, self.engine_used, self.compile_choice = build_engines(self, self.args.engine,
                                                                                self.args.compile)
        store = RolloutStore(self.args.rollout_cache, rank=self.rank) if self.args.rollout_cache else None
        self.decoder = RolloutDecoder(_codec(self), self.engines, fingerprint, store,
                                      strict=self.args.engine == "continuous",
                                      show_progress=self.rank == 0, names=[engine_name(e) for e in self.engines])
        self.runner = PoolRunner(self.args, self.decoder, num_layers=num_layers, gather=process_gather(self.world_size),
                                 rank=self.rank, model_name=self.args.run.model_name,
                                 generation_config=self.model.generation_config, max_gen_toks=self.max_gen_toks,
                                 batch_size=self.batch_size, head_layers=parts.head_layers)
        self.settings, self.tau_h_by_task = self.args.settings, self.runner.tau_h_by_task

    @property
    def accounts(self):
        return self.runner.accounts

    # ------------------------------------------------------------------ what lm-eval calls
    def set_cache_hook(self, cache_hook) -> None:
        if getattr(cache_hook, "dbdict", None) is not None:
            raise RunArgError(USE_CACHE_REFUSAL)
        super().set_cache_hook(cache_hook)

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        self.runner.warn_plain_scoring()
        return super().loglikelihood(requests, disable_tqdm=disable_tqdm)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        self.runner.warn_plain_scoring()
        return super().loglikelihood_rolling(requests, disable_tqdm=disable_tqdm)

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        return self.runner.generate(requests, disable_tqdm)

    def get_model_info(self) -> dict:
        fields = self.runner.engine_info(self.engines, self.args.engine, self.engine_used, self.compile_choice)
        return {**super().get_model_info(), "eglr": self.runner.eglr_info(fields)}

    # ------------------------------------------------------------------ eglr-calibrate, benchmarks
    def calibrate(self, requests: list[Instance], disable_tqdm: bool = False) -> dict[str, float]:
        """tau_h of every task of ``requests`` (calibrated or looked up), without decoding their rollouts."""
        return self.runner.calibrate(requests, disable_tqdm)

    def forget_rollouts(self) -> None:
        """Drop the rollouts and accounting of this run (benchmarks time repeated runs)."""
        self.runner.forget()


def _codec(lm: EglrHFLM) -> TextCodec:
    """HFLM's encoding (its add_bos rule, left truncation) and decoding, bound once."""

    def encode(context: str, max_ctx_len: int) -> tuple[int, ...]:
        ids, mask = lm.tok_batch_encode([context], left_truncate_len=max_ctx_len, truncation=lm.truncation)
        return tuple(ids[0][mask[0].bool()].tolist())

    return TextCodec(encode=encode, decode=lm.tok_decode,
                     eos_text=lm.tok_decode(lm.eot_token_id, skip_special_tokens=False),
                     think_end_token=lm.think_end_token, max_length=lm.max_length, default_max_gen_toks=lm.max_gen_toks)


def _follow_lm_eval_logging() -> None:
    """Show our INFO lines (pools, tau_h, reuse) where lm-eval shows its own, unless the program
    configured logging itself (root handlers)."""
    ours, theirs = logging.getLogger("eglr_harness"), logging.getLogger("lm_eval")
    if ours.handlers or logging.getLogger().handlers or not theirs.handlers:
        return
    ours.setLevel(theirs.getEffectiveLevel())
    for handler in theirs.handlers:
        ours.addHandler(handler)
    ours.propagate = False
