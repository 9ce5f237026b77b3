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

import json
import logging
import os
from pathlib import Path

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
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no such file. {DATA_DIR_ENV} must point at a folder laid out as "
            f"<folder>/<benchmark>/test.jsonl for benchmarks {', '.join(BENCHMARKS)} "
            f"(like ../shared/data); unset {DATA_DIR_ENV} to download from the hub instead."
        )
    rows = []
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(
                    f"{path}:{number}: not valid JSON ({err.msg}); expected one JSON object per line."
                ) from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{number}: expected a JSON object per line, got {type(row).__name__}.")
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: the file has no rows.")
    return rows


def _hub_rows(name: str, split: str) -> tuple[list[dict], str]:
    source = benchmark(name)
    import datasets  # heavy; only on the hub path

    where = f"hub dataset {source.hub_path}" + (f" ({source.hub_config})" if source.hub_config else "")
    try:
        dataset = datasets.load_dataset(source.hub_path, source.hub_config, split=split)
    except Exception as err:
        raise RuntimeError(
            f"Could not load {where}, split {split!r}: {err}. Offline? Set {DATA_DIR_ENV} to a folder "
            f"with <benchmark>/{split}.jsonl files (see the tasks README)."
        ) from err
    return [dict(row) for row in dataset], where


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
        from eglr_harness.data.demo import DEFAULT_N, DEFAULT_SEED, generate_problems

        n = DEFAULT_N if demo_n is None else demo_n
        return generate_problems(n, seed=DEFAULT_SEED if demo_seed is None else demo_seed, levels=demo_levels)
    source = benchmark(name)
    split = split or source.split
    folder = Path(data_dir).expanduser() if data_dir else data_dir_from_env()
    if folder is not None:
        path = folder / source.name / f"{split}.jsonl"
        rows, where = read_jsonl(path), str(path)
        logger.info("eglr: loading %s from %s", name, path)
    else:
        rows, where = _hub_rows(name, split)
    problems = [to_schema(source, row, i, where) for i, row in enumerate(rows)]
    seen: set[str] = set()
    for i, problem in enumerate(problems):  # ids must be unique: analysis joins on them
        if problem["id"] in seen:
            problem["id"] = f"{problem['id']}#{i}"
        seen.add(problem["id"])
    return problems


def load_dataset_dict(name: str, **kwargs):
    """``{split: datasets.Dataset}`` of :func:`load_problems` — the form lm-eval's ``custom_dataset`` returns."""
    import datasets

    split = kwargs.get("split") or (benchmark(name).split if name != DEMO else "test")
    return {split: datasets.Dataset.from_list(load_problems(name, **kwargs))}


__all__ = ["DATA_DIR_ENV", "load_problems", "load_dataset_dict", "read_jsonl", "data_dir_from_env", "expected_fields"]
