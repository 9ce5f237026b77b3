"""One (L, T) decoding configuration: the key of a pool entry, a grid cell, a stats row and a store key.

``Cell`` is a ``NamedTuple`` so it sorts L-major, unpacks as ``L, T = cell`` and hashes as the
``(L, T)`` pairs older code passed around. Build one with ``Cell.of(L, T)`` (normalises and
validates), read its one label ``cell.label`` (``"L=4,T=0.0"``, the key format of
``config.eglr.stats.cells`` in results JSON) and parse that label back with ``Cell.parse``.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

T_DECIMALS = 6  # temperatures are rounded so that 0.1*3 and 0.3 name the same config
_LABEL = re.compile(r"L=(\d+),T=([0-9.eE+-]+)")


class Cell(NamedTuple):
    """A layer span ``L`` (0 = plain decoding) and a temperature ``T`` (0 = greedy)."""

    L: int
    T: float

    @classmethod
    def of(cls, L, T) -> "Cell":
        """The normalised cell: ``L`` an int >= 0, ``T`` a finite float >= 0 rounded to T_DECIMALS."""
        if isinstance(L, bool) or not isinstance(L, int) and not (isinstance(L, float) and L.is_integer()) or L < 0:
            raise ValueError(f"`L`={L!r} is not allowed; allowed: an int 0..N (N = the model's decoder layer count).")
        if isinstance(T, bool) or not isinstance(T, (int, float)) or not math.isfinite(T) or T < 0:
            raise ValueError(f"`T`={T!r} is not allowed; allowed: a finite float >= 0 (0 = greedy).")
        return cls(int(L), round(float(T), T_DECIMALS))

    @classmethod
    def parse(cls, label: str) -> "Cell":
        """``'L=4,T=0.1'`` -> ``Cell(4, 0.1)``; ``ValueError`` naming the label for any other form."""
        match = _LABEL.fullmatch(label.strip()) if isinstance(label, str) else None
        if match is None:
            raise ValueError(f"cell label {label!r} is not of the form 'L=<int>,T=<float>' (e.g. 'L=4,T=0.1').")
        return cls.of(int(match.group(1)), float(match.group(2)))

    @property
    def label(self) -> str:
        """``'L=4,T=0.1'``: the one printed and stored form of a cell."""
        return f"L={self.L},T={self.T}"

    @property
    def sampled(self) -> bool:
        return self.T > 0

    @property
    def greedy(self) -> bool:
        """Plain greedy decoding: L = 0 and T = 0."""
        return self.L == 0 and self.T == 0
