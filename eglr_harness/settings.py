"""Settings precedence of ``eglr-hf``: model args > gen kwargs (task or ``--gen_kwargs``) > preset > default.

:class:`RunSettings` is built once from the model args and the preset, validated, and then answers
per request: the pool defaults, the sampling filters of a cell, the tau_h setting of a task, and
the concrete generation kwargs of one (cell, cycle) — which also serve as that rollout's key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from eglr_harness import config as defaults
from eglr_harness.benchmarks import benchmark_of
from eglr_harness.calibrate import DEFAULT_CALIB_LIMIT
from eglr_harness.cell import Cell
from eglr_harness.config import EglrConfig, parse_tau_h
from eglr_harness.pool import TASK_POOL_KEYS, PoolPlan, resolve_pool, task_axes
from eglr_harness.specs import parse_L_spec, parse_T_spec

# Gen kwargs that carry one concrete cell from generate_until to _model_generate (and into the key).
CELL_KEYS = ("eglr_L", "eglr_T", "eglr_cycle", "eglr_tau_h")


def one_value(name: str, value):
    """``value`` unchanged, or ``ValueError`` when a model arg that takes one value per run is a list."""
    if isinstance(value, (list, tuple)) or (isinstance(value, str) and any(sep in value for sep in "|;,")):
        raise ValueError(
            f"`{name}`={value!r} is a list; eglr-hf decodes one {name} per run (only L and T are pool axes). "
            f"To compare values, run `eglr-sweep --sweep {name}=...` (one lm_eval run per value, e.g. "
            f"eglr-sweep --model_args ... --tasks ... --sweep {name}=v1,v2)."
        )
    return value


def first(*values):
    """The first value that is not None (the precedence rule)."""
    return next((v for v in values if v is not None), None)


@dataclass(frozen=True)
class RunSettings:
    """What the user and the preset asked for, validated.

    Attributes:
        base: alpha, k_max, tau_kl, top_k, top_p, seed (L and T are per cell).
        user_L, user_T: axes pinned through model args (None = not pinned).
        default_L, default_T: preset or built-in defaults of the pool.
        tau_h: the ``tau_h`` model arg (float or ``'auto'``), None when not given.
        preset_tau_h: the preset's table (task or benchmark name or ``default`` -> nats).
        calib_limit: prompts used by ``tau_h=auto``.
    """

    base: EglrConfig
    user_L: tuple[int, ...] | None
    user_T: tuple[float, ...] | None
    default_L: int
    default_T: float
    tau_h: float | str | None
    preset_tau_h: dict = field(default_factory=dict)
    calib_limit: int = DEFAULT_CALIB_LIMIT
    explicit_sampling: dict = field(default_factory=dict)  # top_k / top_p given as model args
    preset_sampling: dict = field(default_factory=dict)

    @classmethod
    def from_args(cls, preset: dict, *, L=None, T=None, alpha=None, k_max=None, tau_kl=None, tau_h=None,
                  top_k=None, top_p=None, seed=None, calib_limit=DEFAULT_CALIB_LIMIT) -> "RunSettings":
        pe = preset.get("eglr", {})
        alpha, k_max, tau_kl, tau_h = (one_value(n, v) for n, v in
                                       (("alpha", alpha), ("k_max", k_max), ("tau_kl", tau_kl), ("tau_h", tau_h)))
        if isinstance(calib_limit, bool) or not isinstance(calib_limit, int) or calib_limit < 1:
            raise ValueError(f"`calib_limit`={calib_limit!r} is not allowed; allowed: an int >= 1.")
        base = EglrConfig(
            L=0, alpha=float(first(alpha, pe.get("alpha"), defaults.DEFAULT_ALPHA)),
            k_max=int(first(k_max, pe.get("k_max"), defaults.DEFAULT_K_MAX)),
            tau_kl=float(first(tau_kl, pe.get("tau_kl"), defaults.DEFAULT_TAU_KL)),
            top_k=int(first(top_k, pe.get("top_k"), defaults.DEFAULT_TOP_K)),
            top_p=float(first(top_p, pe.get("top_p"), defaults.DEFAULT_TOP_P)),
            seed=int(first(seed, pe.get("seed"), defaults.DEFAULT_SEED)),
        )
        return cls(
            base=base,
            user_L=parse_L_spec(L) if L is not None else None,
            user_T=parse_T_spec(T) if T is not None else None,
            default_L=parse_L_spec(pe.get("L", defaults.DEFAULT_L), name="preset L")[0],
            default_T=parse_T_spec(pe.get("T", 0.0), name="preset T")[0],
            tau_h=parse_tau_h(tau_h) if tau_h is not None else None,
            preset_tau_h=dict(preset.get("tau_h", {})),
            calib_limit=calib_limit,
            explicit_sampling={k: v for k, v in (("top_k", top_k), ("top_p", top_p)) if v is not None},
            preset_sampling={k: pe[k] for k in ("top_k", "top_p") if k in pe},
        )

    def pool_plan(self, task: str | None, gen_kwargs: dict, repeats: int) -> PoolPlan:
        """The pool of a request (``pool.resolve_pool`` with this run's pinned axes and defaults)."""
        return resolve_pool(user_L=self.user_L, user_T=self.user_T, task=task_axes(gen_kwargs),
                            default_L=self.default_L, default_T=self.default_T, repeats=repeats, task_name=task)

    def tau_h_setting(self, task: str | None) -> float | str:
        """Model arg, else the preset's value for the task, its benchmark or ``default``, else ``'auto'``."""
        if self.tau_h is not None:
            return self.tau_h
        for key in (task, benchmark_of(task), "default"):
            if key in self.preset_tau_h:
                return self.preset_tau_h[key]
        return "auto"

    def sampling_value(self, name: str, gen_kwargs: dict):
        """``top_k`` / ``top_p``: model args > gen kwargs > preset > default."""
        return first(self.explicit_sampling.get(name), gen_kwargs.get(name), self.preset_sampling.get(name),
                     getattr(self.base, name))

    def concrete_gen_kwargs(self, task_gen_kwargs: dict, cell: Cell, cycle: int, tau_h: float | None) -> dict:
        """The task's gen kwargs with its pool keys replaced by one concrete cell (HF generation options
        plus the ``CELL_KEYS``). Sampled cells carry their cycle (a fresh seed per cycle)."""
        gk = {k: v for k, v in task_gen_kwargs.items() if k not in TASK_POOL_KEYS}
        if cell.sampled:
            gk.update(do_sample=True, temperature=cell.T, top_k=int(self.sampling_value("top_k", gk)),
                      top_p=float(self.sampling_value("top_p", gk)), eglr_cycle=cycle)
        else:
            gk.update(do_sample=False, temperature=0.0)
            gk.pop("top_k", None), gk.pop("top_p", None)
        gk.update(eglr_L=cell.L, eglr_T=cell.T)
        if cell.L > 0:
            gk["eglr_tau_h"] = tau_h
        return gk


def cell_config(settings: RunSettings, gen_kwargs: dict) -> tuple[EglrConfig, int, dict]:
    """Split concrete gen kwargs into ``(EglrConfig of the cell, cycle, HF generation kwargs)``."""
    hf_kwargs = {k: v for k, v in gen_kwargs.items() if k not in CELL_KEYS}
    cell = Cell.of(int(gen_kwargs.get("eglr_L", 0)), float(gen_kwargs.get("eglr_T", 0.0)))
    tau_h = gen_kwargs.get("eglr_tau_h")
    b = settings.base
    config = EglrConfig(L=cell.L, T=cell.T, alpha=b.alpha, k_max=b.k_max, tau_kl=b.tau_kl,
                        tau_h=math.inf if tau_h is None else float(tau_h),
                        top_k=int(hf_kwargs.get("top_k") or 0) if cell.sampled else b.top_k,
                        top_p=float(hf_kwargs.get("top_p") or 1.0) if cell.sampled else b.top_p, seed=b.seed)
    return config, int(gen_kwargs.get("eglr_cycle", 0)), hf_kwargs
