"""Load a benchmark as a list of problems in the internal schema (see :mod:`eglr_harness.data.sources`).

Where the rows come from:

- ``data_dir`` argument, else the ``EGLR_DATA_DIR`` environment variable: a folder laid out like
  ``../shared/data`` — ``<data_dir>/<benchmark>/<split>.jsonl`` (one JSON object per line). This is
  how tests, CI and offline users run.
- otherwise the usual Hugging Face hub dataset (``datasets.load_dataset``), e.g.
  ``HuggingFaceH4/MATH-500``.
- benchmark ``demo``: generated on the fly (:mod:`eglr_harness.data.demo`), never downloaded.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from eglr_harness.core.errors import FileFormatError
from eglr_harness.core.hub import hub_unreachable
from eglr_harness.core.jsonl import iter_jsonl
from eglr_harness.data.sources import BENCHMARKS, benchmark, expected_fields, to_schema

logger = logging.getLogger(__name__)

DATA_DIR_ENV = "EGLR_DATA_DIR"
DEMO = "demo"


def data_dir_from_env() -> Path | None:
    """The folder named by ``EGLR_DATA_DIR``, or ``None`` when the variable is unset/empty."""
    value = os.environ.get(DATA_DIR_ENV, "").strip()
    return Path(value).expanduser() if value else None


def read_jsonl(path: Path) -> list[dict]:
    """Rows of a JSONL file; errors name the file (and line) and say what was expected."""
    return [row for _number, row in _numbered_rows(path)]


def _numbered_rows(path: Path) -> list[tuple[int, dict]]:
    """``(1-based line, row)`` of a local data file (see :func:`read_jsonl`)."""
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no such file. {DATA_DIR_ENV} must point at a folder laid out as "
            f"<folder>/<benchmark>/test.jsonl for benchmarks {', '.join(BENCHMARKS)} "
            f"(each a JSON line per problem); unset {DATA_DIR_ENV} to download from the hub instead."
        )
    rows = list(iter_jsonl(path, "one JSON object (a problem) per line"))
    if not rows:
        raise ValueError(f"{path}: the file has no rows.")
    return rows


def hub_refusal(name: str, split: str, err: BaseException) -> str:
    """One line saying that benchmark ``name`` could not be had and the two ways to get it."""
    source = benchmark(name)
    where = f"hub dataset {source.hub_path}" + (f" ({source.hub_config})" if source.hub_config else "")
    reason = " ".join(f"{type(err).__name__}: {err}".split())
    if len(reason) > 200:
        reason = reason[:197] + "..."
    return (f"benchmark {name!r} cannot be had: {DATA_DIR_ENV} is not set and the {where}, split {split!r}, is "
            f"neither reachable nor cached ({reason}); either let the run reach the Hugging Face hub (once: it is "
            f"cached after), or set {DATA_DIR_ENV} to a folder holding {source.name}/{split}.jsonl (one JSON object "
            "per line; tasks/README.md).")


_SAID: set[tuple[str, str]] = set()  # (benchmark, where) already logged by this process


def _say_loading(name: str, where) -> None:
    """Log "eglr: loading NAME from WHERE" once per process (a run's preflight and tasks read a benchmark several
    times: the line was logged 5 times)."""
    if (name, str(where)) not in _SAID:
        _SAID.add((name, str(where)))
        logger.info("eglr: loading %s from %s", name, where)


def _hub_rows(name: str, split: str) -> tuple[list[dict], str]:
    source = benchmark(name)
    import datasets  # heavy; only on the hub path

    where = f"hub dataset {source.hub_path}" + (f" ({source.hub_config})" if source.hub_config else "")
    _say_loading(name, f"the {where} (or its cache)")
    unreachable = hub_unreachable()  # then the cache only: datasets would retry the hub for a minute first
    try:
        with _cache_only(unreachable is not None):
            dataset = datasets.load_dataset(source.hub_path, source.hub_config, split=split)
    except Exception as err:
        raise FileFormatError(hub_refusal(name, split, err if unreachable is None else
                                          ConnectionError(f"{unreachable}; not in the datasets cache"))) from err
    return [dict(row) for row in dataset], where


@contextlib.contextmanager
def _cache_only(on: bool):
    """``datasets`` and ``huggingface_hub`` in offline mode (the cache only) while the block runs, when ``on``: what
    ``HF_DATASETS_OFFLINE=1`` does, for a hub found unreachable after they were imported."""
    if not on:
        yield
        return
    import datasets.config  # noqa: PLC0415
    import huggingface_hub.constants  # noqa: PLC0415

    saved = datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = huggingface_hub.constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE = saved


def load_problems(
    name: str,
    *,
    split: str | None = None,
    data_dir: str | Path | None = None,
    demo_n: int | None = None,
    demo_seed: int | None = None,
    demo_levels=None,
) -> list[dict]:
    """Problems of benchmark ``name`` in the internal schema, in dataset order.

    Args:
        name: one of ``gsm8k, math500, minerva_math, amc23, aime24, aime25`` or ``demo``.
        split: dataset split (default: the benchmark's test split).
        data_dir: local folder (overrides ``EGLR_DATA_DIR``); ``None`` = env var, else the hub.
        demo_n, demo_seed, demo_levels: size, seed and levels (``None``: all; ``"1,2"``, ``[1, 2]``)
            of the generated demo set (``demo`` only).
    """
    if name == DEMO:
        from eglr_harness.data.demo import DEFAULT_N, PROBLEMS_SEED, generate_problems

        n = DEFAULT_N if demo_n is None else demo_n
        return generate_problems(n, seed=PROBLEMS_SEED if demo_seed is None else demo_seed, levels=demo_levels)
    source = benchmark(name)
    split = split or source.split
    folder = Path(data_dir).expanduser() if data_dir else data_dir_from_env()
    if folder is not None:
        path = folder / source.name / f"{split}.jsonl"
        numbered = _numbered_rows(path)
        rows, wheres = [row for _n, row in numbered], [f"{path}:{n}" for n, _row in numbered]
        _say_loading(name, path)
    else:
        rows, where = _hub_rows(name, split)
        wheres = [f"{where}, row {i + 1}" for i in range(len(rows))]
    problems = [to_schema(source, row, i, at) for i, (row, at) in enumerate(zip(rows, wheres))]
    seen: set[str] = set()
    for i, problem in enumerate(problems):  # ids must be unique: analysis joins on them
        if problem["id"] in seen:
            problem["id"] = f"{problem['id']}#{i}"
        seen.add(problem["id"])
    return problems


# benchmarks this process has read from the hub (or its cache) already: the check runs twice per lm_eval run
_HAD_FROM_HUB: set[str] = set()


def check_local_data(tasks, data_dir: str | Path | None = None) -> None:
    """Read every data file that ``tasks`` will load, so that a bad line (``file:line``), a missing file
    or a benchmark that cannot be had stops the run before a model loads rather than after.

    Only eglr tasks (names with ``_eglr``, and the groups in ``tasks/groups``) are checked. With a local
    folder (``data_dir``, else ``EGLR_DATA_DIR``) its files are read; without one each benchmark is loaded
    from the hub (or the ``datasets`` cache) as the task will load it, so that a benchmark that cannot be
    had is one line naming both ways to get it. Raises :class:`~eglr_harness.core.errors.FileFormatError`.
    """
    folder = Path(data_dir).expanduser() if data_dir else data_dir_from_env()
    for name in sorted(_benchmarks_of_tasks(tasks)):
        if folder is None and name in _HAD_FROM_HUB:
            continue
        try:  # a missing file too: the task would read it (and fail) only after the model loaded
            load_problems(name, data_dir=folder)
        except FileFormatError:
            raise
        except (ValueError, FileNotFoundError) as err:
            raise FileFormatError(str(err)) from None
        if folder is None:
            _HAD_FROM_HUB.add(name)


def _benchmarks_of_tasks(tasks) -> set[str]:
    from eglr_harness.core.benchmark_names import benchmark_of
    from eglr_harness.core.resources import tasks_dir

    found: set[str] = set()
    pending = [t for t in (tasks or []) if isinstance(t, str)]
    seen: set[str] = set()
    while pending:
        task = pending.pop()
        if task in seen:
            continue
        seen.add(task)
        group = tasks_dir() / "groups" / f"{task}.yaml"
        if group.is_file():
            import yaml

            members = (yaml.safe_load(group.read_text(encoding="utf-8")) or {}).get("task") or []
            pending += [m for m in members if isinstance(m, str)]
            continue
        if "_eglr" not in task:
            continue
        try:
            name = benchmark_of(task)
        except ValueError:
            continue
        if name in BENCHMARKS:
            found.add(name)
    return found


def load_dataset_dict(name: str, **kwargs):
    """``{split: datasets.Dataset}`` of :func:`load_problems` — the form lm-eval's ``custom_dataset`` returns."""
    import datasets

    split = kwargs.get("split") or (benchmark(name).split if name != DEMO else "test")
    return {split: datasets.Dataset.from_list(load_problems(name, **kwargs))}


__all__ = ["DATA_DIR_ENV", "check_local_data", "load_problems", "load_dataset_dict", "read_jsonl", "data_dir_from_env",
           "expected_fields"]
