"""Generated texts that remember which (L, T) cell and cycle produced them.

``eglr-hf`` returns :class:`Rollout` objects from ``generate_until``. They are plain ``str``
for lm-eval (filters, caching, JSON), and the task code reads :func:`rollout_meta` to know
the configuration of each repeat. Texts from other models have no metadata (``None``).
"""

from __future__ import annotations


class Rollout(str):
    """A ``str`` with ``L``, ``T`` and ``cycle`` attributes."""

    L: int
    T: float
    cycle: int

    def __new__(cls, text: str, *, L: int, T: float, cycle: int = 0) -> "Rollout":
        obj = super().__new__(cls, text)
        obj.L, obj.T, obj.cycle = int(L), float(T), int(cycle)
        return obj

    def __reduce__(self):
        return (_rebuild, (str(self), self.L, self.T, self.cycle))

    def meta(self) -> dict:
        return {"L": self.L, "T": self.T, "cycle": self.cycle}


def _rebuild(text: str, L: int, T: float, cycle: int) -> Rollout:
    return Rollout(text, L=L, T=T, cycle=cycle)


def rollout_meta(response) -> dict | None:
    """``{"L", "T", "cycle"}`` of a response from eglr-hf, or ``None`` for a plain string."""
    return response.meta() if isinstance(response, Rollout) else None


def with_meta(text: str, like) -> str:
    """Return ``text`` carrying the metadata of ``like`` (e.g. after a filter rewrote it)."""
    meta = rollout_meta(like)
    return Rollout(text, **meta) if meta is not None else text
