"""A run's arguments, resolved once: :func:`resolve_run_args` -> :class:`RunArgs`, frozen.

Every caller asks it and passes the result down: ``eglr-hf`` and ``eglr-vllm`` (``harness/eglr_args.py``, which adds
what needs lm-eval and the model's config), the checks before lm-eval indexes its tasks (``harness/preflight.py``),
``eglr-leaderboard`` and ``eglr-sweep`` (``leaderboard/``), GRPO rollouts (``rl/rollouts.py``) and
``run/settings.RunSettings`` (the per-request answers). The rule: each of eglr's own model args is read once, by its
row of ``core/model_args.MODEL_ARGS`` (``read_model_arg``), from the first of: the value given, the preset's
``eglr:`` value (the rows a preset may set, ``PRESET_KEYS``), the row's default. A ``None`` given is "not given",
except for the rows that refuse it (``engine``, ``calib_limit``: ``none_absent`` False). The preset is loaded
once. Each refusal is one line naming the value and what is allowed (``ValueError``).

Light on purpose (no torch, no lm-eval): the leaderboard, the sweep and the CLI's checks import it before any model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from eglr_harness.core.config import HUGE, SETTING_RULES, EglrConfig
from eglr_harness.core.model_args import EGLR_ARGS, MODEL_ARGS, read_model_arg
from eglr_harness.core.specs import parse_L_spec, parse_T_spec
from eglr_harness.run.model_names import name_of
from eglr_harness.run.presets import NO_PRESET, load_preset, under_preset

__all__ = ["CONFIG_ARGS", "RunArgs", "resolve_run_args"]

# the rows that make the base EglrConfig (L and T are per cell, tau_h per task)
CONFIG_ARGS = tuple(name for name, arg in MODEL_ARGS.items() if arg.preset and name not in ("L", "T"))


@dataclass(frozen=True)
class RunArgs:
    """What a run was asked for, each value read once (module docstring).

    config: the base EGLR config (alpha, k_max, tau_kl, top_k, top_p, seed, the exit rule and its thresholds; L and T
    are a cell's, tau_h a task's); L, T: the axes the model args pin (None: the task's pool, else the preset's);
    default_L, default_T: the pool's defaults (the preset's, else the built-in); tau_h: the model arg (a float or
    ``'auto'``; None: the preset's table, else auto); preset_tau_h: the preset's table; engine, compile: eglr-hf's
    settings (``vllm`` and ``none`` where ``own_names`` has neither: eglr-vllm's); store: the rollout store's folder
    (``rollout_cache``; None: none); calib_limit; seeds; model_name: the model's name in results
    (``run/model_names.name_of``; None when the args name none); preset: the preset (``run/presets.NO_PRESET`` when
    none); load_args: the preset's model args under the given ones, eglr's own left out and ``pretrained`` over both
    (what lm-eval's model is built with); given: eglr's own args as given, for messages (``L`` as written) and for
    what only the model args may pin (``top_k``, ``top_p``).
    """

    config: EglrConfig
    L: tuple[int, ...] | None
    T: tuple[float, ...] | None
    default_L: int
    default_T: float
    tau_h: float | str | None
    preset_tau_h: Mapping
    engine: str
    compile: str
    store: str | None
    calib_limit: int
    seeds: int
    model_name: str | None
    preset: Mapping = field(repr=False)
    load_args: Mapping = field(default_factory=dict)
    given: Mapping = field(default_factory=dict)


def resolve_run_args(model_args: Mapping, *, own_names=EGLR_ARGS, preset: Mapping | None = None) -> RunArgs:
    """``model_args`` (eglr's own and lm-eval's model's, one dict as the model receives them; ``own_names``: eglr-hf's
    ``EGLR_ARGS``, eglr-vllm's ``VLLM_ARGS``) resolved once (module docstring). ``preset``: the preset already loaded
    (``run/presets.preset_of``); None: the one ``model_config`` names, loaded here. ``ValueError``, one line naming the
    value and what is allowed, for a value its row refuses."""
    own = {k: v for k, v in model_args.items() if k in own_names or k == "pretrained"}
    given = {k: v for k, v in own.items() if v is not None or (k in MODEL_ARGS and not MODEL_ARGS[k].none_absent)}
    if preset is None:
        preset = load_preset(str(given["model_config"])) if given.get("model_config") else NO_PRESET
    pe = preset.get("eglr") or {}
    read = {}
    for name in own_names:  # given > preset > default, each by its row; the axes and tau_h only as given
        arg = MODEL_ARGS[name]
        if name in given:
            read[name] = read_model_arg(name, given[name])
        elif name not in ("L", "T", "tau_h"):
            read[name] = read_model_arg(name, pe[name] if arg.preset and name in pe else arg.default)
    config = EglrConfig(L=0, **{name: read[name] for name in CONFIG_ARGS})
    if config.seed + read["seeds"] - 1 > HUGE:  # the last repeat's seed is recorded too (rollouts[i].seed)
        raise ValueError(f"`seed`={config.seed} with `seeds`={read['seeds']} is not allowed: the last repeat runs "
                         f"under seed + seeds - 1 = {config.seed + read['seeds'] - 1}; allowed: "
                         f"{SETTING_RULES['seed'].allowed}.")
    load_args = under_preset(preset, {k: v for k, v in model_args.items() if k not in own})
    if own.get("pretrained") is not None:
        load_args["pretrained"] = own["pretrained"]
    return RunArgs(
        config=config,
        L=read.get("L"),
        T=read.get("T"),
        default_L=parse_L_spec(pe.get("L", MODEL_ARGS["L"].default), name="preset L")[0],
        default_T=parse_T_spec(pe.get("T", MODEL_ARGS["T"].default), name="preset T")[0],
        tau_h=read.get("tau_h"),
        preset_tau_h=dict(preset.get("tau_h") or {}),
        engine=read.get("engine", "vllm"),  # eglr-vllm (no engine among its args): one engine, nothing compiled
        compile=read.get("compile", "none"),
        store=read["rollout_cache"] or None,
        calib_limit=read["calib_limit"],
        seeds=read["seeds"],
        model_name=name_of(load_args),
        preset=preset,
        load_args=load_args,
        given={k: v for k, v in given.items() if k != "pretrained"},
    )
