"""``eglr-export RUN... --out FILE.jsonl|FILE.parquet``: saved runs -> one row per rollout, for RL
(GRPO groups) and best-of-N / reranking pipelines.

Columns (:data:`COLUMNS`): ``prompt`` (the context lm-eval sent, chat template applied),
``completion`` (the rollout's text, lm-eval's ``resps``) — the names TRL's GRPO and best-of-N
utilities read —, ``reward`` (1.0 when the extracted answer is right, else 0.0), ``correct``,
``answer`` (extracted, null = none), ``gold``, ``group_id`` (one per problem:
``<task>/<doc_hash>``, shared by the problem's rollouts in every run exported; a GRPO group), ``deterministic`` (T == 0:
greedy-decoded cells, identical on a rerun), the cell ``L``, ``T``, ``cycle``, ``repeat``, the
other settings from ``config.eglr`` (``alpha``, ``k_max``, ``tau_kl``, ``tau_h``), ``signals``
(:mod:`eglr_harness.core.signals` dict, null when not recorded), ``cluster``, ``task``, ``doc_id``,
``doc_hash``, ``model`` and ``run`` (the results file, relative), and ``verifier_scores`` (null unless the run
is a copy scored by ``eglr-verify``: verifier spec -> step scores and last/min/prod). Reads only lm-eval's files,
checked as eglr-report checks them (:mod:`eglr_harness.core.run_format`): a value the contract does not allow is
refused.

    eglr-export out/demo --out pool.parquet
    python -c "import datasets; print(datasets.load_dataset('parquet', data_files='pool.parquet'))"
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

from eglr_harness.analysis.load import find_runs, read_results, run_info
from eglr_harness.core.errors import OutputError
from eglr_harness.core.jsonl import dumps
from eglr_harness.core.outputs import atomic_writer
from eglr_harness.core.run_format import completions_of, prompt_of, read_samples_file

__all__ = ["COLUMNS", "export_rows", "write_rows"]

logger = logging.getLogger(__name__)

COLUMNS = (
    "prompt", "completion", "reward", "correct", "answer", "gold", "group_id", "deterministic", "L", "T", "cycle",
    "seed", "repeat", "alpha", "k_max", "tau_kl", "tau_h", "signals", "cluster", "task", "doc_id", "doc_hash", "model",
    "run", "verifier_scores",
)


def export_rows(run_paths: Sequence[str | Path], task: str | None = None) -> Iterator[dict]:
    """Rows (:data:`COLUMNS`) of every rollout of the runs under ``run_paths`` (first filter of each file),
    every line and rollout checked as the report checks them (:mod:`eglr_harness.core.run_format`)."""
    for path in run_paths:
        for files in find_runs(path):
            results = read_results(files.results)
            info = run_info(results, files.results, files.name)
            eglr = info.eglr or {}
            settings = eglr.get("settings") or {}
            for name, samples_path in sorted(files.samples.items()):
                if task is not None and name != task:
                    continue
                tau_h = eglr.get("tau_h")
                tau_h = tau_h.get(name) if isinstance(tau_h, dict) else tau_h  # per task; one number in older runs
                for line in read_samples_file(samples_path).lines:
                    sample = line.sample
                    prompt = prompt_of(line)
                    texts = completions_of(line, len(line.rollouts))
                    doc_hash = str(sample.get("doc_hash") or line.doc_id)
                    for r, text in zip(line.rollouts, texts):
                        T = r.get("T")
                        yield {
                            "prompt": prompt, "completion": text, "reward": float(r["correct"]),
                            "correct": int(r["correct"]), "answer": r.get("answer"),
                            "gold": None if sample.get("target") is None else str(sample["target"]),
                            "group_id": f"{name}/{doc_hash}", "deterministic": None if T is None else T == 0,
                            "L": r.get("L"), "T": None if T is None else float(T), "cycle": r.get("cycle"),
                            # the seed of the rollout's repeat of the pool (``seeds=``), else the run's base seed
                            "seed": r.get("seed", settings.get("seed")),
                            "repeat": r.get("repeat"), "alpha": settings.get("alpha"), "k_max": settings.get("k_max"),
                            "tau_kl": settings.get("tau_kl"), "tau_h": None if tau_h is None else float(tau_h),
                            "signals": r.get("signals"), "cluster": r.get("cluster"), "task": name,
                            "doc_id": line.doc_id, "doc_hash": doc_hash, "model": info.model,
                            "run": files.name, "verifier_scores": r.get("verifier_scores"),
                        }  # fmt: skip


def write_rows(rows: Sequence[dict], out: str | Path) -> Path:
    """Write ``rows`` as JSON lines (``.jsonl``/``.json``) or Parquet (``.parquet``)."""
    out = Path(out)
    suffix = out.suffix.lower()
    if suffix not in {".jsonl", ".json", ".parquet"}:
        raise ValueError(f"`--out`={str(out)!r}: allowed endings: .jsonl (JSON lines) or .parquet.")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputError(f"`--out`={str(out)!r}: its folder cannot be created ({err.strerror or err}); "
                          "give a writable path.") from None
    if suffix == ".parquet":
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError as err:  # pragma: no cover - pyarrow comes with datasets
            raise ImportError("Parquet export needs pyarrow: pip install pyarrow (or write .jsonl).") from err
        with atomic_writer(out, "wb") as handle:  # whole or not at all
            pq.write_table(pa.Table.from_pylist(list(rows)), handle)
    else:
        with atomic_writer(out) as handle:
            for row in rows:
                handle.write(dumps(row) + "\n")
    return out
