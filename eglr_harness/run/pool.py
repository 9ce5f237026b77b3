"""The pool of (L, T) cells a request is decoded with, and which repeat runs which cell.

The rule (README "Pools"; tasks/README.md says the same):

1. Axes. ``L_axis`` = the user's ``L`` model arg if given, else the task's ``eglr_L`` gen kwarg,
   else the preset/built-in default L. ``T_axis`` likewise from ``T`` / ``eglr_T`` / the task's
   ``temperature`` gen kwarg / the default (0.0).
2. The unpinned axis carries the budget. If the user pins exactly one axis to a *single* value,
   the task's pool swept that axis (more than one value), and the task names a budget axis for
   the other one (``eglr_budget_T`` when L is pinned, ``eglr_budget_L`` when T is pinned), the
   other axis becomes that budget axis. Example: ``math500_eglr_sc`` sweeps L ∈ 1..10 at T=0 and
   names ``eglr_budget_T: 0.1-1.0:0.1``; ``--model_args L=4`` gives T ∈ 0.1..1.0 at L=4.
3. The pool is ``L_axis × T_axis`` (L-major order). It must not be larger than the task's
   repeats ``r``: that is an error naming the task to use instead.
4. Repeat ``i`` (0-based) runs cell ``pool[i mod |pool|]`` with cycle ``i // |pool|``. Sampled
   cells get a fresh seed per cycle; deterministic (T = 0) cells are decoded once and shared.
5. ``seeds=S`` (model arg) repeats the whole pool S times, seed-major: the pool's entries are
   ``(cell, s)`` for s in 0..S-1 and each cell in L-major order, entry s running under the base seed
   + s; rules 3 and 4 then count entries (|pool| × S must fit the repeats). A deterministic cell's
   text is the same under every seed (decoded once), but each rollout keeps its seed in the samples,
   so a pool is never collapsed: ``L=0,T=0.7,seeds=10`` on a ``_eglr_sc`` task is the seed-only pool.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from eglr_harness.core.cell import Cell
from eglr_harness.core.specs import parse_L_spec, parse_T_spec

logger = logging.getLogger(__name__)

# gen_kwargs keys through which a task declares its pool; removed before generation.
TASK_POOL_KEYS = ("eglr_L", "eglr_T", "eglr_budget_L", "eglr_budget_T")


@dataclass(frozen=True)
class ResolvedPool:
    """The resolved pool of one request. ``cells`` are (L, T) pairs in repeat order."""

    cells: tuple[Cell, ...]
    reason: str  # one line saying which rule produced it, for logs
    seeds: int = 1  # the pool's repeats under successive seeds (rule 5)

    @property
    def size(self) -> int:
        """Entries of the pool: its cells under each of its seeds."""
        return len(self.cells) * self.seeds

    def cell_for_repeat(self, repeat: int) -> tuple[Cell, int]:
        """Return ``(cell, cycle)`` for 0-based repeat index ``repeat``."""
        cell, _seed_index, cycle = self.entry_for_repeat(repeat)
        return cell, cycle

    def entry_for_repeat(self, repeat: int) -> tuple[Cell, int, int]:
        """Return ``(cell, seed index, cycle)`` for 0-based repeat index ``repeat`` (rules 4 and 5)."""
        entry = repeat % self.size
        return self.cells[entry % len(self.cells)], entry // len(self.cells), repeat // self.size

    def log(self, label: str, repeats: int) -> None:
        """Say which configs the repeats run, and warn when they do not divide evenly."""
        under = f" under {self.seeds} seeds" if self.seeds > 1 else ""
        logger.info("%s: pool of %d configs%s over %d repeats (%s): %s", label, len(self.cells), under, repeats,
                    self.reason, ", ".join(c.label for c in self.cells))
        if self.size < repeats and repeats % self.size:
            logger.warning("%s: %d repeats do not divide evenly over %d configs%s; configs repeat unevenly in "
                           "majority votes.", label, repeats, len(self.cells), under)


def task_axes(gen_kwargs: dict) -> dict:
    """Parse the task's pool axes out of its gen_kwargs (missing keys are None)."""
    axes = {}
    for key in TASK_POOL_KEYS:
        value = gen_kwargs.get(key)
        if value is None:
            axes[key] = None
        elif key.endswith("_L"):
            axes[key] = parse_L_spec(value, name=key)
        else:
            axes[key] = parse_T_spec(value, name=key)
    if axes["eglr_T"] is None and gen_kwargs.get("do_sample") is not False and gen_kwargs.get("temperature"):
        axes["eglr_T"] = parse_T_spec(gen_kwargs["temperature"], name="temperature")
    return axes


def resolve_pool(
    *,
    user_L: tuple[int, ...] | None,
    user_T: tuple[float, ...] | None,
    task: dict,
    default_L: int,
    default_T: float,
    repeats: int,
    task_name: str | None = None,
    seeds: int = 1,
) -> ResolvedPool:
    """Apply the pool rule (module docstring) to one request.

    Args:
        user_L, user_T: axes pinned through model args (None = not pinned).
        task: output of :func:`task_axes` for the request's gen_kwargs.
        default_L, default_T: preset / built-in defaults used when neither pins nor task say.
        repeats: how many times lm-eval repeats the request (the budget).
        seeds: repeats of the whole pool under successive seeds (rule 5).
    """
    task_L, task_T = task.get("eglr_L"), task.get("eglr_T")
    L_axis = user_L or task_L or (default_L,)
    T_axis = user_T or task_T or (default_T,)
    reason = "model args, task gen_kwargs, then defaults"

    only_L_pinned = user_L is not None and user_T is None and len(user_L) == 1
    only_T_pinned = user_T is not None and user_L is None and len(user_T) == 1
    if only_L_pinned and task_L and len(task_L) > 1 and task.get("eglr_budget_T"):
        T_axis = task["eglr_budget_T"]
        reason = f"L pinned to {user_L[0]}: the budget moves to the task's T axis"
    elif only_T_pinned and task_T and len(task_T) > 1 and task.get("eglr_budget_L"):
        L_axis = task["eglr_budget_L"]
        reason = f"T pinned to {user_T[0]}: the budget moves to the task's L axis"

    size = len(L_axis) * len(T_axis) * seeds  # counted before the cells are built (two long axes multiply)
    if size > repeats:
        where = f"task {task_name!r}" if task_name else "this task"
        hint = (
            "use a `_eglr_sc` task (10 repeats) or `_eglr_lxt` (121) for pools"
            if repeats < 10
            else "use the `_eglr_lxt` task (121 repeats) or pin fewer values"
        )
        under = f" under {seeds} seeds" if seeds > 1 else ""
        raise ValueError(
            f"The pool L={_shown(L_axis)} × T={_shown(T_axis)}{under} has {size} configs but {where} "
            f"repeats each problem only {repeats} time(s); {hint}."
        )
    return ResolvedPool(cells=tuple(Cell.of(L, T) for L in L_axis for T in T_axis), reason=reason, seeds=seeds)


def _shown(axis: tuple) -> str:
    """An axis as a message shows it: the values, or the first and last few of a long one."""
    if len(axis) <= 12:
        return str(list(axis))
    return f"[{', '.join(map(str, axis[:3]))}, ..., {axis[-1]}] ({len(axis)} values)"


@dataclass(frozen=True)
class Job:
    """One repeat of one request, assigned to its cell."""

    task: str | None
    doc_id: int
    context: str
    gen_kwargs: dict  # the task's gen kwargs (pool keys included)
    cell: Cell
    cycle: int  # 0 for deterministic cells: every cycle of one is the same rollout
    seed_index: int = 0  # which of the pool's seeds repeats (rule 5)
    seeds: int = 1  # the pool's seeds: a rollout is labelled with its seed only when the pool has several


def assign_jobs(requests: Iterable[tuple], pool_of: Callable[[str | None, dict, int], ResolvedPool]) -> list[Job]:
    """Repeat i of a request (lm-eval passes it i+1 times) runs pool cell i mod |pool| (rule 4).

    requests: ``(task, doc_id, idx, context, gen_kwargs, repeats)`` in lm-eval's order;
    pool_of(task, gen_kwargs, repeats) resolves (and may cache) the pool of a request.
    """
    seen: Counter = Counter()
    jobs = []
    for task, doc_id, idx, context, gen_kwargs, repeats in requests:
        repeat_key = (task, doc_id, idx, context)
        repeat = seen[repeat_key]
        seen[repeat_key] += 1
        plan = pool_of(task, gen_kwargs, max(int(repeats or 1), 1))
        cell, seed_index, cycle = plan.entry_for_repeat(repeat)
        jobs.append(Job(task=task, doc_id=doc_id, context=context, gen_kwargs=gen_kwargs, cell=cell,
                        cycle=cycle if cell.sampled else 0, seed_index=seed_index, seeds=plan.seeds))
    return jobs


def frozen(value):
    """A hashable, order-independent form of gen kwargs (a pool plan's cache key)."""
    if isinstance(value, dict):
        return tuple(sorted((k, frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(frozen(v) for v in value)
    return value
