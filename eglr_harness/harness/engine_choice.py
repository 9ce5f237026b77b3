"""Which engine decodes an ``eglr-hf`` run (``engine=auto|continuous|hook``), and how a run names them.

``auto`` takes the continuous engine wherever it can drive the model and the hook engine
(``generate`` with EGLR hooks) for the rest: the whole model (another family, a split device_map)
with one log line, single requests with valid options the continuous engine does not apply (beams,
...) with one line per reason (``harness/decode.py``). ``continuous`` refuses those, naming engine=hook.
The setting is read by ``core/model_args`` (``engine=hf``, the hook engine's earlier name, is read as ``hook``).
The plan line, ``config.eglr`` and the samples say which engine decoded each task, cell and rollout.
"""

from __future__ import annotations

import logging

from eglr_harness.decoding.compile_setting import CompileChoice, resolve_compile
from eglr_harness.decoding.continuous.engine import ContinuousEngine
from eglr_harness.decoding.contract import Engine
from eglr_harness.decoding.hook.engine import HookEngine

logger = logging.getLogger(__name__)


def build_engines(lm, engine: str, compile_setting: str) -> tuple[list[Engine], str, CompileChoice]:
    """The engines of an ``EglrHFLM`` in order of preference, the name of the one that decodes, and
    what the ``compile`` setting resolved to (``decoding/compile_setting.py``; refusals are raised,
    never taken for a reason to fall back)."""
    hook = HookEngine(lm.model, batch_size=_hook_batch_size(lm), pad_token_id=lm.tokenizer.pad_token_id,
                      tokenizer=lm.tokenizer, device=lm.device, autocast_dtype=getattr(lm, "mixed_precision_dtype",
                                                                                       None))
    if engine == "hook":
        return [hook], "hook", resolve_compile(compile_setting, lm.device, "hook")
    choice = resolve_compile(compile_setting, lm.device, engine)
    try:
        continuous = ContinuousEngine(lm.model, max_batch=lm.batch_size, eos_token_ids=_eos_ids(lm),
                                      tokenizer=lm.tokenizer, **choice.engine_kwargs())
    except ValueError as err:
        if engine == "continuous":
            raise
        logger.info("eglr-hf: decoding with engine=hook: %s", err)
        return [hook], "hook", resolve_compile(compile_setting, lm.device, "hook")
    return [continuous, hook], "continuous", choice


def engine_name(engine: Engine) -> str:
    """The name a run records for ``engine``: ``continuous`` or ``hook``."""
    return "continuous" if isinstance(engine, ContinuousEngine) else "hook"


def engines_said(names) -> str | None:
    """One name for the engines that decoded something (``continuous``, ``hook``, or ``mixed``), None for none."""
    names = set(names) - {None}
    return next(iter(names)) if len(names) == 1 else "mixed" if names else None


def _hook_batch_size(lm):
    """HFLM's batch size; ``auto`` is HFLM's own detection, on first use (at once under data parallel,
    where the detection is a collective step every rank takes together)."""
    if lm.batch_size != "auto":
        return int(lm.batch_size)
    if lm.world_size > 1:
        return lm._detect_batch_size()
    return lm._detect_batch_size


def _eos_ids(lm) -> list[int]:
    eos = lm.model.generation_config.eos_token_id
    if eos is None:
        eos = lm.tokenizer.eos_token_id
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
