"""Tokens as the engines emit them, for progress that moves with each token rather than with each finished rollout;
and the model load, said before it starts and timed after (:func:`announced_load`).

A rollout of a few thousand tokens on a CPU takes minutes; a bar that moves only when rollouts finish sits at
0/16 meanwhile and looks hung. The engines call :func:`tokens_emitted` once per decoding step with the number
of tokens that step emitted (a host-side count they hold already: no extra device read); whoever shows progress
listens within :func:`counting_tokens`. With no listener the call is a no-op.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["RolloutProgress", "announced_load", "counted", "counting_tokens", "listening", "tokens_emitted"]

_listeners: list[Callable[[int], None]] = []


def counted(n: int, noun: str) -> str:
    """``"2 rollouts"``, ``"1 rollout"``: ``n`` and ``noun``, a regular plural (it ends in s), singular for one. A noun
    followed by `` in PLACE`` (``"rollouts in DIR"``) is made singular before it: ``"1 rollout in DIR"``."""
    if n == 1:
        head, sep, place = noun.partition(" in ")
        noun = head.removesuffix("s") + sep + place
    return f"{n} {noun}"


@contextmanager
def counting_tokens(listener: Callable[[int], None]) -> Iterator[None]:
    """Call ``listener(n)`` with the ``n`` tokens each decoding step emits while the block runs."""
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)


def listening() -> bool:
    """Whether anyone counts tokens now (an engine whose count costs a device read skips it otherwise)."""
    return bool(_listeners)


def tokens_emitted(n: int) -> None:
    """A decoding step emitted ``n`` tokens (one per row that emitted one)."""
    if n:
        for listener in _listeners:
            listener(n)


@contextmanager
def announced_load(logger: logging.Logger, label: str, name: str, parts: str, dtype, device) -> Iterator[list[str]]:
    """Say the load of ``name`` before it starts and its seconds after: a model load is start-up's longest part
    (up to minutes on a CPU). The block may append to the list it gets what the second line adds
    (e.g. the engine it builds next). label: the model (``eglr-hf``); parts: what loads (``weights, tokenizer``)."""
    started, then = time.perf_counter(), []
    logger.info("%s: loading %s (%s; dtype %s, device %s) ...", label, name, parts, dtype, device)
    yield then
    logger.info("%s: model loaded in %.0f s%s", label, time.perf_counter() - started, "".join(f"; {t}" for t in then))


class RolloutProgress:
    """A progress bar in tokens over a set of rollouts: its total is their token budgets (``max_new_tokens``
    each), it moves with every emitted token (:func:`counting_tokens`), and a rollout that ends early adds the
    budget it left unused, so the bar is full exactly when the last rollout ends. tqdm's rate is then tokens/s and
    its ETA an upper bound that falls as rollouts end early; the postfix counts finished rollouts."""

    def __init__(self, budgets: list[int], *, desc: str, disable: bool = False, file=None):
        from tqdm import tqdm  # noqa: PLC0415 -- only where a bar is shown

        self.rollouts, self.finished_rollouts = len(budgets), 0
        # whole tokens (unit_scale printed "4.00/4.10k": a count is an int)
        self.bar = tqdm(total=sum(budgets), desc=desc, disable=disable, unit="tok",
                        file=file)
        self._postfix()

    def _postfix(self) -> None:
        self.bar.set_postfix_str(f"rollouts {self.finished_rollouts}/{self.rollouts}", refresh=False)

    def tokens(self, n: int) -> None:
        """``n`` tokens were emitted (the listener of :func:`counting_tokens`)."""
        self.bar.update(n)

    def rollout_ended(self, budget: int, generated: int) -> None:
        """A rollout of token budget ``budget`` ended after ``generated`` tokens (counted as they came)."""
        self.finished_rollouts += 1
        self._postfix()
        self.bar.update(max(budget - generated, 0))

    def close(self) -> None:
        self.bar.close()
