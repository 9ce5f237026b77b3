"""A rollout's text that remembers which (L, T) cell, cycle and seed produced it, and the model's signals.

``eglr-hf`` returns :class:`RolloutText` objects from ``generate_until``. They are plain ``str``
for lm-eval (its filters receive strings; caching, JSON), and the task code reads :func:`rollout_meta` to know
the configuration of each repeat and, when the engine recorded them, the rollout's signals
(``eglr_harness.core.signals``: entropies, log-probabilities, refinement). Texts from other models have
no metadata (``None``).
"""

from __future__ import annotations


class RolloutText(str):
    """One rollout's text (a ``str``, so that lm-eval's filters and metrics take it as they take any response)
    with its metadata: ``L``, ``T`` (its cell), ``cycle``, ``signals`` (a dict, or None when not recorded),
    ``engine`` (``continuous`` or ``hook``: which engine decoded it; None when not recorded) and ``seed``
    (the seed its repeat of the pool ran under when the run has ``seeds`` > 1; None otherwise)."""

    L: int
    T: float
    cycle: int
    signals: dict | None
    engine: str | None
    seed: int | None

    def __new__(cls, text: str, *, L: int, T: float, cycle: int = 0, signals: dict | None = None,
                engine: str | None = None, seed: int | None = None) -> "RolloutText":
        obj = super().__new__(cls, text)
        obj.L, obj.T, obj.cycle, obj.signals, obj.engine = int(L), float(T), int(cycle), signals, engine
        obj.seed = None if seed is None else int(seed)
        return obj

    def __reduce__(self):
        return (_rebuild, (str(self), self.L, self.T, self.cycle, self.signals, self.engine, self.seed))

    def meta(self) -> dict:
        """``{"L", "T", "cycle"}``, plus ``"signals"``, ``"engine"`` and ``"seed"`` when they were recorded."""
        meta = {"L": self.L, "T": self.T, "cycle": self.cycle}
        if self.signals is not None:
            meta["signals"] = self.signals
        if self.engine is not None:
            meta["engine"] = self.engine
        if self.seed is not None:
            meta["seed"] = self.seed
        return meta


def _rebuild(text: str, L: int, T: float, cycle: int, signals: dict | None = None,
             engine: str | None = None, seed: int | None = None) -> RolloutText:
    return RolloutText(text, L=L, T=T, cycle=cycle, signals=signals, engine=engine, seed=seed)


FINISHES = ("stop", "eos", "length", "cut")  # how a baseline answer ended (BaselineText.finish)


class BaselineText(str):
    """One answer of the ``eglr-baseline`` model (greedy or beam search, no EGLR): its text with how it ended and
    what it cost. ``finish``: ``stop`` (at one of the request's stop strings), ``eos`` (an end-of-sequence token),
    ``length`` (``max_gen_toks`` reached) or ``cut`` (none of these: the decoding ended early for no reason of
    the answer's own, as lm-eval's ``hf`` ends beams at batch > 1); ``search_tokens``: the tokens the decoding
    evaluated for it, summed over beams (``num_beams`` x the search's steps; an answer's own tokens for greedy)."""

    finish: str
    search_tokens: int

    def __new__(cls, text: str, *, finish: str, search_tokens: int) -> "BaselineText":
        if finish not in FINISHES:
            raise ValueError(f"`finish`={finish!r} is not allowed; allowed: {', '.join(FINISHES)}.")
        obj = super().__new__(cls, text)
        obj.finish, obj.search_tokens = finish, int(search_tokens)
        return obj

    def __reduce__(self):
        return (_rebuild_baseline, (str(self), self.finish, self.search_tokens))

    def meta(self) -> dict:
        """``{"L": None, "T": None, "cycle": None, "finish", "search_tokens"}`` (no cell: not an EGLR rollout)."""
        return {"L": None, "T": None, "cycle": None, "finish": self.finish, "search_tokens": self.search_tokens}


def _rebuild_baseline(text: str, finish: str, search_tokens: int) -> BaselineText:
    return BaselineText(text, finish=finish, search_tokens=search_tokens)


def rollout_meta(response) -> dict | None:
    """``{"L", "T", "cycle"[, "signals"][, "engine"][, "seed"]}`` of a response from eglr-hf, ``{"L": None, "T":
    None, "cycle": None, "finish", "search_tokens"}`` of one from eglr-baseline, or ``None`` for a plain string."""
    return response.meta() if isinstance(response, (RolloutText, BaselineText)) else None


def with_meta(text: str, like) -> str:
    """Return ``text`` carrying the metadata of ``like`` (e.g. after a filter rewrote it)."""
    if isinstance(like, BaselineText):
        return BaselineText(text, finish=like.finish, search_tokens=like.search_tokens)
    meta = rollout_meta(like)
    return RolloutText(text, **meta) if meta is not None else text
