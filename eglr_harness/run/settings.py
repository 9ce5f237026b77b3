"""Settings precedence of ``eglr-hf``: model args > gen kwargs (task or ``--gen_kwargs``) > preset > default.

:class:`RunSettings` is built once from the model args and the preset, validated, and then answers
per request: the pool defaults, the sampling filters of a cell, the tau_h setting of a task, and
the :class:`RolloutSpec` of one (cell, cycle): the one object that carries a rollout from the pool
to the engine request, the store key and the results row.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field

from eglr_harness.core import config as defaults
from eglr_harness.core.benchmark_names import benchmark_of
from eglr_harness.core.cell import Cell
from eglr_harness.core.config import EglrConfig, check_layer_span, has_gate, parse_tau_h
from eglr_harness.core.model_args import SETTINGS_ARGS
from eglr_harness.core.specs import MAX_AXIS_VALUES, parse_L_spec, parse_T_spec
from eglr_harness.decoding.sampling import row_seed
from eglr_harness.run.calibration import DEFAULT_CALIB_LIMIT
from eglr_harness.run.pool import TASK_POOL_KEYS, ResolvedPool, resolve_pool, task_axes


def one_value(name: str, value):
    """``value`` unchanged, or ``ValueError`` when a model arg that takes one value per run is a list."""
    if isinstance(value, (list, tuple)) or (isinstance(value, str) and any(sep in value for sep in "|;,")):
        raise ValueError(
            f"`{name}`={value!r} is a list; eglr-hf decodes one {name} per run (only L and T are pool axes). "
            f"To compare values, run `eglr-sweep --sweep {name}=...` (one lm_eval run per value, e.g. "
            f"eglr-sweep --model_args ... --tasks ... --sweep {name}=v1,v2)."
        )
    return value


def check_seeds(value) -> int:
    """The ``seeds`` model arg: how many times the pool repeats under successive seeds, an int in
    1..MAX_AXIS_VALUES; one line naming the value otherwise (before the load)."""
    allowed = (f"an int in 1..{MAX_AXIS_VALUES}, a count (seeds=3 repeats the whole pool under seed, seed + 1, "
               "seed + 2; `seed` sets the first)")
    count = as_int("seeds", value, allowed)
    if not 1 <= count <= MAX_AXIS_VALUES:
        raise ValueError(f"`seeds`={value!r} is not allowed; allowed: {allowed}.")
    return count


def first(*values):
    """The first value that is not None (the precedence rule)."""
    return next((v for v in values if v is not None), None)


def as_int(name: str, value, allowed: str) -> int:
    """An integer model arg (lm-eval passes ints, floats or strings): 3, 3.0 and "3" are 3; 2.5, "2.5"
    and "abc" are refused naming the argument, never truncated."""
    number = value
    if isinstance(value, str):
        text = value.strip()
        try:  # an int's text exactly (float("99999999999999999999999") is another number), else "3.0"
            number = int(text) if re.fullmatch(r"[+-]?\d+", text) else float(text) if text else value
        except ValueError:
            number = value
    if isinstance(number, bool) or not isinstance(number, (int, float)) or (
            isinstance(number, float) and not number.is_integer()):
        raise ValueError(f"`{name}`={value!r} is not allowed; allowed: {allowed}.")
    return int(number)


def as_float(name: str, value, allowed: str) -> float:
    """A real model arg: a number or its text; "abc" (or an int too big for a float) is refused naming the argument.
    Its range, finite included, is the setting's own rule (``core/config.SETTING_RULES``)."""
    try:
        if isinstance(value, bool):
            raise ValueError
        return float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"`{name}`={value!r} is not allowed; allowed: {allowed}.") from None


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
    """What the user and the preset asked for, validated.

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
    preset_tau_h: dict = field(default_factory=dict)
    calib_limit: int = DEFAULT_CALIB_LIMIT
    explicit_sampling: dict = field(default_factory=dict)  # top_k / top_p given as model args
    preset_sampling: dict = field(default_factory=dict)
    L_given: object = None  # the L model arg as written, for messages
    seeds: int = 1  # repeats of the whole pool, under seeds base, base + 1, ... (``seeds`` model arg)

    @classmethod
    def from_args(cls, preset: dict, **given) -> "RunSettings":
        """The settings from the model args ``given`` (any of ``core.model_args.SETTINGS_ARGS``; None or absent:
        not given) over ``preset``'s. stop: the exit rule; tau_latent, ...: the other rules' thresholds
        (``core.config.STOP_RULES``); seeds: repeats of the whole pool; calib_limit: ``DEFAULT_CALIB_LIMIT`` when
        absent."""
        unknown = [name for name in given if name not in SETTINGS_ARGS]
        if unknown:
            raise TypeError(f"RunSettings.from_args() got unexpected keyword arguments {unknown}; "
                            f"allowed: {', '.join(SETTINGS_ARGS)}.")
        L, T, alpha, k_max, tau_kl, tau_h, top_k, top_p, seed, seeds, stop = (given.get(name) for name in (
            "L", "T", "alpha", "k_max", "tau_kl", "tau_h", "top_k", "top_p", "seed", "seeds", "stop"))
        calib_limit = given.get("calib_limit", DEFAULT_CALIB_LIMIT)  # None given is refused below
        pe = preset.get("eglr", {})
        alpha, k_max, tau_kl, tau_h, stop = (one_value(n, v) for n, v in (
            ("alpha", alpha), ("k_max", k_max), ("tau_kl", tau_kl), ("tau_h", tau_h), ("stop", stop)))
        allowed = {name: rule.allowed for name, rule in defaults.SETTING_RULES.items()}
        thresholds = {rule.threshold_arg: as_float(rule.threshold_arg, one_value(rule.threshold_arg, first(
            given.get(rule.threshold_arg), pe.get(rule.threshold_arg), rule.default)), rule.allowed)
            for rule in defaults.STOP_RULES.values() if rule.threshold_arg in defaults.STOP_THRESHOLD_ARGS}
        seeds = check_seeds(1 if seeds is None else seeds)
        calib_limit = as_int("calib_limit", calib_limit, "an int >= 1")
        if calib_limit < 1:
            raise ValueError(f"`calib_limit`={calib_limit!r} is not allowed; allowed: an int >= 1.")
        base = EglrConfig(
            L=0, alpha=as_float("alpha", first(alpha, pe.get("alpha"), defaults.DEFAULT_ALPHA), allowed["alpha"]),
            k_max=as_int("k_max", first(k_max, pe.get("k_max"), defaults.DEFAULT_K_MAX), allowed["k_max"]),
            tau_kl=as_float("tau_kl", first(tau_kl, pe.get("tau_kl"), defaults.DEFAULT_TAU_KL), allowed["tau_kl"]),
            top_k=as_int("top_k", first(top_k, pe.get("top_k"), defaults.DEFAULT_TOP_K), allowed["top_k"]),
            top_p=as_float("top_p", first(top_p, pe.get("top_p"), defaults.DEFAULT_TOP_P), allowed["top_p"]),
            seed=as_int("seed", first(seed, pe.get("seed"), defaults.DEFAULT_SEED), allowed["seed"]),
            stop=defaults.check_stop(first(stop, pe.get("stop"), defaults.DEFAULT_STOP)), **thresholds,
        )
        if base.seed + seeds - 1 > defaults.HUGE:  # the last repeat's seed is recorded too (rollouts[i].seed)
            raise ValueError(f"`seed`={base.seed} with `seeds`={seeds} is not allowed: the last repeat runs under "
                             f"seed + seeds - 1 = {base.seed + seeds - 1}; allowed: {allowed['seed']}.")
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
            L_given=L,
            seeds=seeds,
        )

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
