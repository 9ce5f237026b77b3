"""Settings precedence of ``eglr-hf``: model args > gen kwargs (task or ``--gen_kwargs``) > preset > default.

:class:`RunSettings` is built once from a run's resolved arguments (``run/run_args.RunArgs``), and then answers
per request: the pool defaults, the sampling filters of a cell, the tau_h setting of a task, and
the :class:`RolloutSpec` of one (cell, cycle): the one object that carries a rollout from the pool
to the engine request, the store key and the results row.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from eglr_harness.core.benchmark_names import benchmark_of
from eglr_harness.core.cell import Cell
from eglr_harness.core.config import EglrConfig, check_layer_span, has_gate
from eglr_harness.core.model_args import SETTINGS_ARGS
from eglr_harness.decoding.sampling import row_seed
from eglr_harness.run.pool import TASK_POOL_KEYS, ResolvedPool, resolve_pool, task_axes
from eglr_harness.run.presets import NO_PRESET
from eglr_harness.run.run_args import RunArgs, resolve_run_args


def first(*values):
    """The first value that is not None (the precedence rule)."""
    return next((v for v in values if v is not None), None)


@dataclass(frozen=True)
class RolloutSpec:
    """One rollout's settings, built once per (task gen kwargs, cell, cycle) and read everywhere after.

    config: the cell's whole EGLR config (tau_h concrete: the task's value when L > 0, inf at L = 0);
    cycle: which draw of a sampled cell this is (a fresh seed per cycle; 0 for greedy cells);
    seed_index: which repeat of the pool under ``seeds`` (``config.seed`` = the base seed + it);
    task_kwargs: the gen kwargs lm-eval handed over, without the pool keys, as sorted pairs
    (``until``, ``max_gen_toks`` and generate's options such as ``repetition_penalty``).
    """

    config: EglrConfig
    cycle: int
    task_kwargs: tuple[tuple[str, object], ...]
    seed_index: int = 0  # which of the run's ``seeds`` repeats of the pool (0: the base seed; config.seed has it added)

    @property
    def cell(self) -> Cell:
        return Cell(self.config.L, self.config.T)

    def seed(self, prompt: list[int]) -> int | None:
        """The row seed of a sampled rollout of ``prompt`` (token ids); None when greedy."""
        if not self.config.sampled:
            return None
        return row_seed(self.config.seed, f"{self.cell.label},cycle={self.cycle}", list(prompt))

    def key_fields(self) -> dict:
        """What the rollout store keys on beside the model and the prompt: the generation kwargs with the
        cell's concrete settings (the layout of DECODING_VERSION 3's keys, so earlier stores stay readable)."""
        c = self.config
        gk = dict(self.task_kwargs)
        if c.sampled:
            gk.update(do_sample=True, temperature=c.T, top_k=c.top_k, top_p=c.top_p, eglr_cycle=self.cycle)
            if self.seed_index:  # the pool again under base seed + seed_index (absent at 0: earlier keys unchanged)
                gk["eglr_seed"] = c.seed
        else:
            gk.update(do_sample=False, temperature=0.0)
            gk.pop("top_k", None), gk.pop("top_p", None)
        gk.update(eglr_L=c.L, eglr_T=c.T)
        if c.gated:
            gk["eglr_tau_h"] = c.tau_h
        return gk


@dataclass(frozen=True)
class RunSettings:
    """What the user and the preset asked for, validated: built by :meth:`of` from a run's resolved arguments.

    Attributes:
        base: alpha, k_max, tau_kl, top_k, top_p, seed, the exit rule and its threshold (L and T are per cell).
        user_L, user_T: axes pinned through model args (None = not pinned).
        seeds: how many times the pool repeats, repeat s under the base seed + s (``seeds=10``).
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
    preset_tau_h: dict
    calib_limit: int
    explicit_sampling: dict  # top_k / top_p given as model args
    preset_sampling: dict
    L_given: object  # the L model arg as written, for messages
    seeds: int  # repeats of the whole pool, under seeds base, base + 1, ... (``seeds`` model arg)

    @classmethod
    def of(cls, run: RunArgs) -> "RunSettings":
        """The settings of a run whose arguments ``run`` resolved (``run/run_args.resolve_run_args``): nothing is
        read again."""
        return cls(
            base=run.config,
            user_L=run.L,
            user_T=run.T,
            default_L=run.default_L,
            default_T=run.default_T,
            tau_h=run.tau_h,
            preset_tau_h=run.preset_tau_h,
            calib_limit=run.calib_limit,
            explicit_sampling={k: getattr(run.config, k) for k in ("top_k", "top_p") if k in run.given},
            preset_sampling={k: v for k, v in (run.preset.get("eglr") or {}).items() if k in ("top_k", "top_p")},
            L_given=run.given.get("L"),
            seeds=run.seeds,
        )

    @classmethod
    def from_args(cls, preset: dict, **given) -> "RunSettings":
        """The settings from the model args ``given`` (any of ``core.model_args.SETTINGS_ARGS``; None or absent:
        not given, but for ``calib_limit``, refused) over ``preset``'s, resolved by ``run/run_args``."""
        unknown = [name for name in given if name not in SETTINGS_ARGS]
        if unknown:
            raise TypeError(f"RunSettings.from_args() got unexpected keyword arguments {unknown}; "
                            f"allowed: {', '.join(SETTINGS_ARGS)}.")
        return cls.of(resolve_run_args(given, preset=preset or NO_PRESET))

    def check_layers(self, num_layers: int | None) -> None:
        """The pinned L axis (and the preset's default L) against the model's decoder layer count N, where
        it is known before the pools (``core.config.check_layer_span``; None: not known yet, nothing checked)."""
        check_layer_span(self.user_L or (), num_layers, name="L", given=self.L_given)
        check_layer_span((self.default_L,), num_layers, name="preset L")

    @staticmethod
    def check_cells(cells, num_layers: int | None) -> None:
        """A task's pool against the model's layer count (the task, not the user, chose these L): the
        layer-count rule at pool resolution, which every cell decoded passes (the engines assert it)."""
        for cell in cells:
            check_layer_span((cell.L,), num_layers)

    def pool_for(self, task: str | None, gen_kwargs: dict, repeats: int) -> ResolvedPool:
        """The pool of a request (``pool.resolve_pool`` with this run's pinned axes and defaults)."""
        return resolve_pool(user_L=self.user_L, user_T=self.user_T, task=task_axes(gen_kwargs),
                            default_L=self.default_L, default_T=self.default_T, repeats=repeats, task_name=task,
                            seeds=self.seeds)

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

    def rollout(self, task_gen_kwargs: dict, cell: Cell, cycle: int, tau_h: float | None,
                seed_index: int = 0) -> RolloutSpec:
        """The spec of one rollout of ``cell``: the task's gen kwargs without its pool keys, the cell's
        config (sampling filters by precedence, tau_h when it refines, the base seed + ``seed_index``) and
        the cycle of a sampled cell."""
        kwargs = {k: v for k, v in task_gen_kwargs.items() if k not in TASK_POOL_KEYS}
        b = self.base
        top_k, top_p = (int(self.sampling_value("top_k", kwargs)), float(self.sampling_value("top_p", kwargs))) \
            if cell.sampled else (b.top_k, b.top_p)
        config = dataclasses.replace(b, L=cell.L, T=cell.T, top_k=top_k, top_p=top_p,
                                     tau_h=float(tau_h) if has_gate(cell.L) and tau_h is not None else math.inf,
                                     seed=b.seed + seed_index)
        return RolloutSpec(config, cycle if cell.sampled else 0, tuple(sorted(kwargs.items(), key=lambda kv: kv[0])),
                           seed_index)
