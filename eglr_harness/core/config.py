"""One frozen, validated configuration per (L, T) cell: the key of a grid cell, a cache entry, a row."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from decimal import Decimal, InvalidOperation

from eglr_harness.core.cell import Cell

# The paper's settings (eglr-method.md §3).
DEFAULT_ALPHA = 0.2
DEFAULT_K_MAX = 3
DEFAULT_TAU_KL = 5e-4
DEFAULT_TOP_K = 50
DEFAULT_TOP_P = 1.0
DEFAULT_SEED = 1333
DEFAULT_L = 4  # the paper's ablation setting; tasks and presets usually name their own
TAU_H_CAP = 2.5  # nats: the calibrated threshold never exceeds this
# the largest magnitude of a number a run records (a setting, a count, a figure): every int up to it is exact as
# a float, so readers sum and divide them exactly. eglr-hf accepts no setting beyond it and every reader
# (core/run_format.py) refuses one, so that whatever a run was made with, its files can be read.
HUGE = 2**53


@dataclass(frozen=True)
class SettingRule:
    """How one number setting is checked, the same by eglr-hf before the load (:class:`EglrConfig`) and by
    every reader of a run's ``config.eglr.settings`` (``core/run_format.NUMERIC_SETTINGS``).

    integer: an int (never a bool, a float or a string); else an int or a float. ok: the range, on a number
    already known to be finite and within +/-``HUGE``. allowed: the range, as an error message says it.
    """

    integer: bool
    ok: Callable[[float], bool]
    allowed: str

    def accepts(self, value) -> bool:
        """Whether ``value``, as a program or a run file holds it (a number, never its text), is in range."""
        if isinstance(value, bool) or not isinstance(value, int if self.integer else (int, float)):
            return False
        return abs(value) <= HUGE and self.ok(value)  # inf (1e309) and NaN are never within HUGE

    def check(self, name: str, value) -> None:
        """``accepts``, or ``ValueError``: one line naming ``name``, the value and what is allowed."""
        if not self.accepts(value):
            raise ValueError(f"`{name}`={value!r} is not allowed; allowed: {self.allowed}.")

    def read(self, name: str, value) -> int | float:
        """A number as a user wrote it (a model arg, a preset's value: lm-eval hands over ints, floats or their
        text), checked: the one reader of written numbers. An int setting takes 3, 3.0 and "3" (never 2.5, "2.5"
        or True: nothing is truncated); a real one any finite number or its text, as a float. ``ValueError``
        naming the value as written otherwise."""
        number = _number_written(value, self.integer)
        if number is None or not self.accepts(number):
            raise ValueError(f"`{name}`={value!r} is not allowed; allowed: {self.allowed}.")
        return number


def _number_written(value, integer: bool) -> int | float | None:
    """``value`` (a number or its text, ASCII digits only) as an int (``integer``: only an integral value) or a
    float; None if it is neither. A number's text is read exactly where an int is asked for
    (float("9007199254740993.0") is 2**53); a float that stands for an int is taken only below 2**53 in magnitude,
    where every integral float is the int it was written as."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        text = value.strip()
        if not text.isascii():  # int() and float() read a full-width '２' as 2
            return None
        if re.fullmatch(r"[+-]?[0-9]+", text):
            value = int(text)
        elif integer:
            return _integral_text(text)
        else:
            try:
                value = float(text)
            except ValueError:
                return None
    if not isinstance(value, (int, float)):
        return None
    if integer:
        if isinstance(value, float) and not abs(value) < HUGE:  # 2**53 + 1 written as a float reads 2**53
            return None
        return int(value) if isinstance(value, int) or value.is_integer() else None
    try:
        return float(value)
    except OverflowError:  # an int beyond a float's range
        return None


def _integral_text(text: str) -> int | None:
    """A float literal (``"3.0"``, ``"3e2"``) that names an int, read exactly; None otherwise."""
    try:
        number = Decimal(text)
    except InvalidOperation:
        return None
    # the magnitude first, by its exponent (int(Decimal("1e99999999")) takes minutes), then exactly, unrounded
    if not number.is_finite() or number.adjusted() > 15 or number.copy_abs() > HUGE:
        return None
    return int(number) if number == number.to_integral_value() else None


@dataclass(frozen=True)
class StopRule:
    """One exit rule of refinement (eglr-method.md, "Exit rules"): what ends a gated token's iterations
    before k_max.

    Attributes:
        name: the ``stop`` model arg's value.
        threshold_arg: the model arg (and ``EglrConfig`` field) holding its threshold.
        default: the threshold's default (argued in eglr-method.md).
        allowed: the threshold's range, as an error message says it.
        exits_above: a hit is ``signal > threshold`` (margin); else ``signal < threshold``.
        head_per_iteration: the rule reads the LM head's distribution at every iteration (else the
            head runs once, at the exit): what the FLOP accounting counts.
        hits_needed: consecutive iterations that must hit before the row exits (accel's two-hit check).
        first_hit: the first iteration whose signal is defined (accel's second difference needs k >= 2).
    """

    name: str
    threshold_arg: str
    default: float
    allowed: str
    exits_above: bool = False
    head_per_iteration: bool = True
    hits_needed: int = 1
    first_hit: int = 1

    @property
    def setting(self) -> SettingRule:
        """The threshold's check (:class:`SettingRule`): finite, in its range."""
        return SettingRule(False, (lambda v: 0.0 <= v <= 1.0) if self.name == "margin" else (lambda v: v >= 0.0),
                           self.allowed)


DEFAULT_STOP = "kl"  # the paper's rule
STOP_RULES = {rule.name: rule for rule in (
    StopRule("kl", "tau_kl", DEFAULT_TAU_KL, "a finite float in [0, 2**53]"),
    StopRule("latent", "tau_latent", 0.03, "a finite float in [0, 2**53]", head_per_iteration=False),
    StopRule("accel", "tau_accel", 0.03, "a finite float in [0, 2**53]", head_per_iteration=False, hits_needed=2,
             first_hit=2),
    StopRule("margin", "tau_margin", 0.5, "a float in [0, 1]", exits_above=True),
    StopRule("entropy", "tau_entropy", 1e-3, "a finite float in [0, 2**53] nats"),
)}
# the thresholds of the rules other than the paper's, as EglrConfig fields and model args
STOP_THRESHOLD_ARGS = tuple(rule.threshold_arg for rule in STOP_RULES.values() if rule.name != DEFAULT_STOP)

# the layer span of one cell (its upper bound, the model's N, is ``check_layer_span``'s)
LAYER_SPAN_RULE = SettingRule(True, lambda v: v >= 0, "0..N (N = the model's decoder layer count)")

# the number settings of a run (EglrConfig's fields but L, T and tau_h, which have their own checks) -> their rule:
# the one table eglr-hf checks them by and the readers read ``config.eglr.settings`` by
SETTING_RULES: dict[str, SettingRule] = {
    "alpha": SettingRule(False, lambda v: 0.0 <= v <= 1.0, "a float in [0, 1]"),
    "k_max": SettingRule(True, lambda v: v >= 1, "an int in [1, 2**53]"),
    "top_k": SettingRule(True, lambda v: v >= 0, "an int in [0, 2**53] (0 disables top-k)"),
    "top_p": SettingRule(False, lambda v: 0.0 < v <= 1.0, "a float in (0, 1]"),
    "seed": SettingRule(True, lambda v: True, "an int in [-2**53, 2**53] (every seed of the run, seed + seeds - 1 "
                                              "included)"),
    **{rule.threshold_arg: rule.setting for rule in STOP_RULES.values()},
}


def check_stop(value) -> str:
    """The ``stop`` model arg: one of ``STOP_RULES``; one line naming the value otherwise."""
    if not isinstance(value, str) or value.strip().lower() not in STOP_RULES:
        raise ValueError(f"`stop`={value!r} is not allowed; allowed: {', '.join(STOP_RULES)}.")
    return value.strip().lower()


def has_gate(L: int) -> bool:
    """The one statement of "L = 0 means no gate": a span of 0 layers is plain decoding, whatever tau_h says,
    and needs no tau_h."""
    return L > 0


def check_layer_span(values, num_layers: int | None, *, name: str = "L", given=None) -> None:
    """The layer-count rule, stated once: a layer span L re-applies at most the model's N decoder layers.

    values: the spans asked for (an L axis, or one L); num_layers: N (None: not known yet, nothing checked);
    name, given: the argument and its value as written, for the message (default: the one value).
    ``ValueError`` naming the value and the range allowed.
    """
    if num_layers is None:
        return
    values = tuple(values)
    too_big = [v for v in values if v > num_layers]
    if too_big:
        given = values[0] if given is None else given
        span = "" if values == (given,) else f": layer span {max(too_big)}"
        raise ValueError(f"`{name}`={given!r}{span} exceeds the model's {num_layers} decoder layers; "
                         f"allowed: 0..{num_layers}.")


@dataclass(frozen=True)
class EglrConfig:
    """EGLR hyper-parameters for one decoding configuration.

    Attributes:
        L: layer span re-applied on refinement (0 = plain decoding).
        T: sampling temperature (0 = greedy argmax).
        alpha: fusion weight of the norm-matched refined state against the anchor.
        k_max: refinement budget (iterations) per gated token.
        tau_kl: early exit when KL(p_k || p_{k-1}) falls below it.
        tau_h: entropy gate in nats; ``math.inf`` never refines.
        top_k: top-k filter when T > 0 (0 disables it).
        top_p: nucleus filter when T > 0 (1.0 disables it).
        seed: base seed of sampled rollouts.
        stop: the exit rule of refinement (``STOP_RULES``; ``kl``, the paper's, uses ``tau_kl``).
        tau_latent, tau_accel, tau_margin, tau_entropy: the other rules' thresholds (read only by their rule).
    """

    L: int = DEFAULT_L
    T: float = 0.0
    alpha: float = DEFAULT_ALPHA
    k_max: int = DEFAULT_K_MAX
    tau_kl: float = DEFAULT_TAU_KL
    tau_h: float = math.inf
    top_k: int = DEFAULT_TOP_K
    top_p: float = DEFAULT_TOP_P
    seed: int = DEFAULT_SEED
    stop: str = DEFAULT_STOP
    tau_latent: float = STOP_RULES["latent"].default
    tau_accel: float = STOP_RULES["accel"].default
    tau_margin: float = STOP_RULES["margin"].default
    tau_entropy: float = STOP_RULES["entropy"].default

    def __post_init__(self) -> None:
        LAYER_SPAN_RULE.check("L", self.L)
        Cell.of(self.L, self.T)  # the one check of a cell's (L, T)
        check_tau_h(self.tau_h)
        if self.stop not in STOP_RULES:
            check_stop(self.stop)
        for name in SETTING_RULES:
            check_setting_value(name, getattr(self, name))

    @property
    def stop_rule(self) -> StopRule:
        return STOP_RULES[self.stop]

    @property
    def stop_threshold(self) -> float:
        """The threshold the exit rule compares with (``tau_kl`` for ``kl``)."""
        return float(getattr(self, self.stop_rule.threshold_arg))

    @property
    def refines(self) -> bool:
        """Whether this config can ever run a refinement pass: a gate whose threshold some entropy can pass."""
        return self.gate_tau_h != math.inf

    @property
    def sampled(self) -> bool:
        return self.T > 0

    @property
    def gated(self) -> bool:
        """Whether the entropy gate is part of this config at all (``has_gate``: L = 0 is plain decoding)."""
        return has_gate(self.L)

    @property
    def gate_tau_h(self) -> float:
        """The effective tau_h: the gate's threshold, ``inf`` where there is no gate (L = 0)."""
        return self.tau_h if self.gated else math.inf

    def validate_for_model(self, num_layers: int) -> None:
        """The layer-count rule (``check_layer_span``) for this config's L."""
        check_layer_span((self.L,), num_layers)

    def as_dict(self) -> dict:
        """The fields, with the exit rule's only where it is not the paper's: a ``kl`` config keys, prints
        and fingerprints as before the rules existed (stores and results stay readable), and another rule
        names itself and its own threshold, not the thresholds it never reads."""
        values = asdict(self)
        for name in ("stop", *STOP_THRESHOLD_ARGS):
            values.pop(name)
        if self.stop != DEFAULT_STOP:
            values.update(stop=self.stop, **{self.stop_rule.threshold_arg: self.stop_threshold})
        return values


def check_setting_value(name: str, value) -> None:
    """``value`` of the setting ``name`` against :data:`SETTING_RULES`; one line naming the value otherwise."""
    SETTING_RULES[name].check(name, value)


TAU_H_ALLOWED = "a float in [0, 2**53] nats, 'inf', or 'auto'"


def check_tau_h(value) -> float:
    """The one check of a concrete tau_h (nats): a real in [0, 2**53], ``inf`` allowed (no gate); one line naming
    the value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < 0 or (
            value != math.inf and value > HUGE):
        raise ValueError(f"`tau_h`={value!r} is not allowed; allowed: {TAU_H_ALLOWED}.")
    return float(value)


def parse_tau_h(value) -> float | str:
    """``'auto'`` stays a marker (calibrated per task later); anything else becomes a float (``check_tau_h``)."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "auto":
            return "auto"
        if text in {"inf", "infinity", "none", "off"}:
            return math.inf
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"`tau_h`={value!r} is not allowed; allowed: {TAU_H_ALLOWED}.") from None
    if value is None:
        return math.inf
    return check_tau_h(value)
