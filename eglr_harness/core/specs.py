"""Parse the L (layer span) and T (temperature) axis specs that users write.

L: ``4``, ``"1,4,7"``, ``"1-10"`` (inclusive). T: ``0.7``, ``"0.1,0.5"``, ``"0.1-1.0:0.1"``
(inclusive start-stop:step). Because lm_eval splits ``--model_args`` on commas, lists may also
be written with ``|`` or ``;`` (``L=1|4|7``), or as JSON model_args (``{"L": "1,4,7"}``).

A spec names at most :data:`MAX_AXIS_VALUES` values: a range is counted from its ends (arithmetic)
before it is expanded, so ``L=0-100000000`` is refused at once instead of filling memory.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from eglr_harness.core.cell import T_DECIMALS

_LIST_SEPARATORS = re.compile(r"[,|;\s]+")
# the forms of an L spec, as a refusal suggests them: a list with `|`, which `--model_args` does not split
_L_FORMS = "a non-negative int (4), a list (1|4|7) or an inclusive range (1-10)"
_T_FORMS = "a float >= 0 (0.7), a list (0.1|0.5) or an inclusive range with step (0.1-1.0:0.1)"
# An axis is a pool axis: no task repeats a problem more often (the largest, ``_eglr_lxt``, 121 times).
MAX_AXIS_VALUES = 10_000


def _check_count(count: int, spec, name: str) -> None:
    """``ValueError`` when a spec would name more than :data:`MAX_AXIS_VALUES` values (counted, not built)."""
    if count > MAX_AXIS_VALUES:
        raise ValueError(f"`{name}`={spec!r} names {count} values; allowed: at most {MAX_AXIS_VALUES} "
                         "(a pool axis: each value is one rollout per problem).")


def _split(spec: str) -> list[str]:
    return [part for part in _LIST_SEPARATORS.split(spec.strip()) if part]


def _dedupe(values: Iterable) -> tuple:
    return tuple(dict.fromkeys(values))


def parse_L_spec(spec, *, name: str = "L") -> tuple[int, ...]:
    """Parse an L spec into a tuple of distinct layer spans, in the order written.

    Raises ``ValueError`` naming the argument and the accepted forms. The upper bound (the
    model's layer count N) is checked later, when the model is known.
    """
    if isinstance(spec, bool):
        raise ValueError(f"`{name}`={spec!r} is not a layer span; allowed: {_L_FORMS}.")
    if isinstance(spec, int):
        values = [spec]
    elif isinstance(spec, float) and spec.is_integer():
        values = [int(spec)]
    elif isinstance(spec, (list, tuple)):
        values = [v for item in spec for v in parse_L_spec(item, name=name)]
    elif isinstance(spec, str) and spec.strip():
        values = []
        for part in _split(spec):
            if re.fullmatch(r"[0-9]+", part):  # ASCII digits: int() would read '２' as 2
                values.append(int(part))
            elif m := re.fullmatch(r"([0-9]+)-([0-9]+)", part):
                lo, hi = int(m[1]), int(m[2])
                if lo > hi:
                    raise ValueError(f"`{name}`={spec!r}: range {part!r} runs backwards; write '{hi}-{lo}'.")
                _check_count(len(values) + hi - lo + 1, spec, name)
                values.extend(range(lo, hi + 1))
            else:
                raise ValueError(f"`{name}`={spec!r}: {part!r} is not a layer span; allowed: {_L_FORMS}.")
    else:
        raise ValueError(f"`{name}`={spec!r} is not a layer span; allowed: {_L_FORMS}.")
    for v in values:
        if v < 0:
            raise ValueError(f"`{name}`={spec!r}: layer span {v} is negative; allowed: 0..N (N = the model's layer "
                             "count).")
    return _dedupe(values)


def _parse_float(part: str, spec, name: str) -> float:
    try:
        value = float(part)
    except ValueError:
        raise ValueError(f"`{name}`={spec!r}: {part!r} is not a temperature; allowed: {_T_FORMS}.") from None
    return value


def parse_T_spec(spec, *, name: str = "T") -> tuple[float, ...]:
    """Parse a T spec into a tuple of distinct temperatures (rounded), in the order written."""
    if isinstance(spec, bool):
        raise ValueError(f"`{name}`={spec!r} is not a temperature; allowed: {_T_FORMS}.")
    if isinstance(spec, (int, float)):
        values = [float(spec)]
    elif isinstance(spec, (list, tuple)):
        values = [v for item in spec for v in parse_T_spec(item, name=name)]
    elif isinstance(spec, str) and spec.strip():
        values = []
        for part in _split(spec):
            if m := re.fullmatch(r"([0-9.eE+]+)-([0-9.eE+]+):([0-9.eE+]+)", part):
                lo, hi, step = (_parse_float(g, spec, name) for g in m.groups())
                if step <= 0 or lo > hi:
                    raise ValueError(
                        f"`{name}`={spec!r}: range {part!r} needs start <= stop and a positive step."
                    )
                if not all(map(math.isfinite, (lo, hi, step))):
                    raise ValueError(f"`{name}`={spec!r}: range {part!r} needs finite start, stop and step.")
                span = (hi - lo) / step  # 1e308 / 1e-10 is inf: counted as a float, never int() of it
                if not math.isfinite(span):
                    raise ValueError(f"`{name}`={spec!r}: range {part!r} names more than {MAX_AXIS_VALUES} values; "
                                     f"allowed: at most {MAX_AXIS_VALUES} (a pool axis: each value is one rollout "
                                     "per problem).")
                n = int(math.floor(span + 1e-9))
                _check_count(len(values) + n + 1, spec, name)
                values.extend(lo + i * step for i in range(n + 1))
            else:
                values.append(_parse_float(part, spec, name))
    else:
        raise ValueError(f"`{name}`={spec!r} is not a temperature; allowed: {_T_FORMS}.")
    for v in values:
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"`{name}`={spec!r}: temperature {v} is not allowed; allowed: finite T >= 0 (0 = greedy).")
    return _dedupe(round(v, T_DECIMALS) for v in values)
