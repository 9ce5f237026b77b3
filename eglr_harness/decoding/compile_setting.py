"""The ``compile`` model argument: how the continuous engine runs its decoding step.

| value | the step runs | where |
|---|---|---|
| ``auto`` (default) | CUDA graphs on a CUDA device, eager elsewhere | anywhere |
| ``none`` | eager | anywhere |
| ``reduce-overhead`` | the decoder layer (its rotary angles inside) and the unembedding compiled once each (inductor),
the step recorded as one CUDA graph per (rows, K/V width) bucket | CUDA devices |
| ``default`` | the decoder layer and the unembedding compiled once each (inductor kernels), no CUDA graphs | anywhere a
compiler works |

How it is compiled (once per process, whatever the runs) and captured: ``step_graphs.py``.

``auto`` is eager off CUDA because compiling the step gains nothing on a CPU (measured:
``benchmarks/HISTORY.md``); on a GPU the step is bound by
kernel launches and host work, which CUDA graphs remove. Only the continuous engine's step can be
compiled: ``engine=hook`` decodes through transformers' ``generate`` with EGLR module hooks, which
``torch.compile`` cannot see into, so an explicit ``compile`` there is refused
(``check_compile_for_engine``); ``auto`` and ``none`` mean eager there.

What ran is recorded beside what was asked (``CompileChoice.recorded`` / ``.requested``), as the
results record ``engine`` beside ``engine_requested``.

The adapter's sequence: ``check_compile_setting(value)`` and ``check_compile_for_engine(value,
engine)`` before the model loads (bad values, and an explicit compile with ``engine=hook``, are
refused before any weight is read); ``resolve_compile(value, model.device, engine)`` once the
device is known (``reduce-overhead`` off CUDA refused there), its ``engine_kwargs()`` passed to
``ContinuousEngine``; if ``engine=auto`` falls back to ``hook``, ``resolve_compile(value, device,
"hook")`` again (an explicit compile is then refused, ``auto`` records ``none``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eglr_harness.core.model_args import COMPILE_SETTINGS, DEFAULT_COMPILE
from eglr_harness.core.model_args import read_compile as check_compile_setting  # the model arg's one reading

__all__ = ["COMPILE_SETTINGS", "DEFAULT_COMPILE", "CompileChoice", "check_compile_for_engine", "check_compile_setting",
           "compile_refusal", "resolve_compile"]

CUDA_GRAPHS = "reduce-overhead"  # the torch.compile mode that captures CUDA graphs
ENGINES_THAT_COMPILE = ("continuous",)
UNDECIDED_ENGINE = "auto"  # engine=auto before it has chosen: the plan is the continuous engine's


@dataclass(frozen=True)
class CompileChoice:
    """What the ``compile`` setting resolves to on one device.

    requested: the setting as given (normalised); compile, mode: ``ContinuousEngine``'s
    ``compile`` and ``compile_mode`` arguments (``engine_kwargs``).
    """

    requested: str
    compile: bool
    mode: str | None

    @property
    def recorded(self) -> str:
        """What ran, for the results: ``"none"`` (eager), ``"reduce-overhead"`` or ``"default"``."""
        return self.mode if self.compile else "none"

    def engine_kwargs(self) -> dict:
        """Keyword arguments for ``ContinuousEngine(model, ..., **plan.engine_kwargs())``."""
        return {"compile": self.compile, "compile_mode": self.mode}


def _device_type(device) -> str:
    if isinstance(device, torch.device):
        return device.type
    try:
        return torch.device(device).type
    except (RuntimeError, TypeError):
        raise ValueError(f"`device`={device!r} is not a torch device (e.g. 'cuda', 'cuda:0', 'cpu').") from None


def resolve_compile(setting, device, engine: str = "continuous") -> CompileChoice:
    """The step's compilation for ``setting`` on ``device`` (a ``torch.device`` or its name) with
    ``engine`` (the engine that decodes: ``continuous`` or ``hook``; ``auto`` before it has chosen,
    which resolves as ``continuous``: call again with ``hook`` if it falls back).

    ``auto``: CUDA graphs on CUDA, eager elsewhere; ``reduce-overhead`` off CUDA: ``ValueError``
    (CUDA graphs need a CUDA device), naming what is allowed there; an explicit compilation with
    an engine that cannot compile: ``ValueError`` (``compile_refusal``); ``auto``/``none`` there: eager.
    """
    requested = check_compile_setting(setting)
    check_compile_for_engine(requested, engine)
    if engine not in (*ENGINES_THAT_COMPILE, UNDECIDED_ENGINE):
        return CompileChoice(requested=requested, compile=False, mode=None)
    on_cuda = _device_type(device) == "cuda"
    if requested == CUDA_GRAPHS and not on_cuda:
        raise ValueError(
            f"`compile`={CUDA_GRAPHS!r} captures CUDA graphs and needs a CUDA device; the model is on {str(device)!r}. "
            "Allowed here: auto (eager on this device), none (eager), default (torch.compile's inductor).")
    if requested == "auto":
        mode = CUDA_GRAPHS if on_cuda else None
    else:
        mode = None if requested == "none" else requested
    return CompileChoice(requested=requested, compile=mode is not None, mode=mode)


def compile_refusal(setting, engine: str) -> str | None:
    """Why ``setting`` cannot apply with ``engine`` (the engine that decodes), or None when it can.

    Only an explicit compilation (``reduce-overhead``, ``default``) is refused, and only for an
    engine other than the continuous one: ``auto`` and ``none`` mean eager there. ``engine=auto``
    before it has chosen is not refused (it may choose the continuous engine).
    """
    setting = check_compile_setting(setting)
    if setting in ("auto", "none") or engine in (*ENGINES_THAT_COMPILE, UNDECIDED_ENGINE):
        return None
    return (f"`compile`={setting!r} applies to engine=continuous only; engine={engine} decodes through "
            "transformers' generate with EGLR module hooks, which torch.compile cannot see into. Use "
            "engine=continuous (or engine=auto where the continuous engine can drive the model), or compile=auto/none.")


def check_compile_for_engine(setting, engine: str) -> None:
    """``ValueError`` with ``compile_refusal``'s message when ``setting`` cannot apply with ``engine``."""
    message = compile_refusal(setting, engine)
    if message is not None:
        raise ValueError(message)
