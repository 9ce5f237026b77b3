"""Scoring saved runs: read every rollout of the runs' samples, score what the store lacks in
batches, and write a copy of each run with the scores (the runs' own files are never written).

Output layout: ``OUT/<run>/...`` mirrors each run folder (the results JSON copied as it is, each
samples file rewritten with ``rollouts[i].verifier_scores``, gzip-compressed when the run's is), so
``eglr-report OUT/<run>...`` and ``eglr-export`` read the copy as they read the run.
``OUT/verifier_scores.sqlite`` is the resumable store (:mod:`~eglr_harness.verify.store`; rebuilt from its export
``verifier_scores.jsonl.gz`` when that is there: :mod:`eglr_harness.run.stores`); ``OUT/eglr_verify.json`` records
the command, the verifiers and what each scored. Scoring several verifiers into one OUT keeps the earlier ones'
scores in the copy.

``rollouts[i].verifier_scores`` (docs/run-format.md) maps a verifier spec (``self:p_true``,
``qwen-prm:PATH``) to ``{"steps": [...], "last": x, "min": x, "prod": x, "model": NAME}``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import platform
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from eglr_harness.analysis.load import RunFiles, find_runs, read_results
from eglr_harness.analysis.metrics.bestofn import AGGREGATIONS, SCORES_FIELD
from eglr_harness.core.jsonl import dumps, encode_lines, iter_jsonl
from eglr_harness.core.outputs import atomic_write_bytes, atomic_writer, refuse_writing_into
from eglr_harness.core.run_format import SampleLine, completions_of, prompt_of, read_samples_file
from eglr_harness.run.model_names import parse_model_args
from eglr_harness.verify.heads import aggregate
from eglr_harness.verify.scorers import Item, Scorer, check_weights, load_scorer, self_model_args
from eglr_harness.verify.spec import VerifierSpec
from eglr_harness.verify.store import ScoreStore, score_key

__all__ = ["SCORES_FIELD", "RunCopy", "VerifyPlan", "plan_copies", "plan_verification", "question_of", "score_rollouts",
           "verify_runs", "write_copies"]

logger = logging.getLogger(__name__)

RECORD_FILE = "eglr_verify.json"
LOCK_FILE = ".eglr-verify.lock"  # held while the copies and the record are rewritten


@dataclass
class RunCopy:
    """One run and where its copy goes: ``samples`` maps each source samples file to its copy."""

    files: RunFiles
    results_out: Path
    samples: dict[Path, Path] = field(default_factory=dict)


def question_of(sample: Mapping) -> str:
    """The problem's own text (the data's ``problem`` or ``question``), else the prompt the model got."""
    doc = sample.get("doc") if isinstance(sample.get("doc"), Mapping) else {}
    for key in ("problem", "question"):
        if isinstance(doc.get(key), str) and doc[key].strip():
            return doc[key]
    return prompt_of(_line(sample))


def _line(sample: Mapping, where: str = "") -> SampleLine:
    """A samples line as ``run_format``'s readers take it (the run's files were checked by ``read_samples_file``)."""
    return SampleLine(where, sample.get("doc_id"), dict(sample), None)


def plan_copies(run_paths: Sequence[str | Path], out: Path, task: str | None = None) -> list[RunCopy]:
    """The runs under ``run_paths`` and their copies under ``out``; a ValueError (nothing loaded) when
    ``out`` lies inside a run, two runs would land on one copy, or no samples are found."""
    out = Path(out).resolve()
    copies, targets = [], {}
    for path in run_paths:
        root = Path(path).resolve()
        root_dir = root.parent if root.is_file() else root
        if out == root_dir or root_dir in out.parents:
            raise ValueError(f"`--out`={str(out)!r} lies inside the run {str(path)!r}; the run's own files stay "
                             "untouched: give a folder outside it.")
        for files in find_runs(path):
            samples = {t: p for t, p in files.samples.items() if task is None or t == task}
            if not samples:
                continue
            results_out = out / files.name
            if results_out in targets:
                raise ValueError(f"runs {targets[results_out]!r} and {str(files.results)!r} would be copied to one "
                                 f"place ({files.name}); give run folders with different names.")
            targets[results_out] = str(files.results)
            copies.append(RunCopy(files, results_out, {p: results_out.parent / p.name for p in samples.values()}))
    # a copy that lands on a run's own file (OUT = the run's parent: OUT/<run>/... is the run) or inside it
    refuse_writing_into([p for c in copies for p in (c.results_out, *c.samples.values())], run_paths, "`--out`")
    if not copies:
        raise ValueError(f"no samples files{'' if task is None else f' of task {task!r}'} under "
                         f"{[str(p) for p in run_paths]}; pass folders given to lm_eval --output_path with "
                         "--log_samples.")
    return copies


def _read_lines(copy: RunCopy, source: Path) -> list[dict]:
    """The samples lines to write into: the existing copy's (keeping earlier verifiers' scores) when it
    holds the same documents, else the run's."""
    lines = [s for _, s in iter_jsonl(source)]
    target = copy.samples[source]
    if target.is_file():
        kept = [s for _, s in iter_jsonl(target)]
        if [(s.get("doc_id"), s.get("filter")) for s in kept] == [(s.get("doc_id"), s.get("filter")) for s in lines]:
            return kept
        logger.warning("%s holds other documents than %s; it is written afresh from the run.", target, source)
    return lines


def _items(sample: Mapping) -> list[Item] | None:
    rollouts = sample.get("rollouts")
    if not isinstance(rollouts, list):
        return None
    texts = completions_of(_line(sample), len(rollouts))
    prompt, question = prompt_of(_line(sample)), question_of(sample)
    return [Item(question, prompt, text) for text in texts]


def _chosen_docs(lines: Sequence[Mapping], limit: int | None, doc_ids: Sequence[int] | None = None) -> set:
    """The documents to score: those of ``doc_ids`` (all without), the first ``limit`` of them."""
    docs = []
    for s in lines:
        if s.get("doc_id") not in docs and (doc_ids is None or s.get("doc_id") in doc_ids):
            docs.append(s.get("doc_id"))
    return set(docs if limit is None else docs[:limit])


def _record(scorer: Scorer, steps: list[float]) -> dict:
    return {"steps": steps, **{how: aggregate(steps, how) for how in AGGREGATIONS}, "model": scorer.name}


@dataclass
class VerifyPlan:
    """What a verification reads and writes, settled before any verifier loads: the runs and their copies,
    the samples lines to score into (keyed by copy and source file), the documents chosen, and the
    settings every verifier loads with."""

    out: Path
    copies: list[RunCopy]
    lines_of: dict[tuple[int, Path], list[dict]]
    limit: int | None
    doc_ids: Sequence[int] | None
    device: str
    dtype: str
    trust_remote_code: bool
    own_args: dict | None
    system_prompt: str | None

    def wanted(self) -> list[tuple[tuple, Item]]:
        """Each rollout of the chosen documents, keyed ``(copy, source, line index, rollout index)``."""
        wanted: list[tuple[tuple, Item]] = []
        for c in self.copies:
            for src in c.samples:
                lines = self.lines_of[(id(c), src)]
                chosen = _chosen_docs(lines, self.limit, self.doc_ids)
                for li, sample in enumerate(lines):
                    items = _items(sample) if sample.get("doc_id") in chosen else None
                    wanted += [((id(c), src, li, ri), item) for ri, item in enumerate(items or [])]
        return wanted


def plan_verification(run_paths: Sequence[str | Path], specs: Sequence[VerifierSpec], out: str | Path, *,
                      task: str | None = None, limit: int | None = None, doc_ids: Sequence[int] | None = None,
                      batch_size: int = 8, device: str | None = None, dtype: str = "auto",
                      trust_remote_code: bool = False, model_args: Mapping | None = None,
                      system_prompt: str | None = None) -> VerifyPlan:
    """Every check before a verifier loads (the values, the copies' places, the weights, each samples
    file's lines: FILE:LINE on a bad one, as eglr-report and eglr-export say it), and the plan."""
    if limit is not None and limit < 1:
        raise ValueError(f"`--limit`={limit!r} is not allowed; allowed: an int >= 1 (documents per samples file).")
    if batch_size < 1:
        raise ValueError(f"`--batch_size`={batch_size!r} is not allowed; allowed: an int >= 1.")
    out = Path(out)
    copies = plan_copies(run_paths, out, task)
    for spec in specs:
        check_weights(spec, trust_remote_code)
    own_args = None
    if any(s.is_self for s in specs):
        runs_args = [parse_model_args((read_results(c.files.results).get("config") or {}).get("model_args"))
                     for c in copies]
        own_args = self_model_args([{**a, **(model_args or {})} for a in runs_args])
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    for c in copies:
        for src in c.samples:
            read_samples_file(src, require_rollouts=False)
    lines_of = {(id(c), src): _read_lines(c, src) for c in copies for src in c.samples}
    return VerifyPlan(out, copies, lines_of, limit, doc_ids, device, dtype, trust_remote_code, own_args,
                      system_prompt)


def score_rollouts(plan: VerifyPlan, spec: VerifierSpec, store: ScoreStore, *, batch_size: int,
                   progress: bool) -> dict:
    """Score the plan's rollouts with one verifier: the store's scores reused, the rest scored in batches
    (stored per batch: a killed run resumes from there) and written into ``plan.lines_of``. Returns what
    ``eglr_verify.json`` records of the verifier."""
    from tqdm.auto import tqdm

    started = time.monotonic()
    wanted = plan.wanted()
    stored: dict[str, list[float]] = {}
    scorer = load_scorer(spec, device=plan.device, dtype=plan.dtype, trust_remote_code=plan.trust_remote_code,
                         model_args=plan.own_args, system_prompt=plan.system_prompt)

    def key_of(item: Item) -> str:
        return score_key(spec.key, scorer.fingerprint, scorer.dtype, item.question,
                         item.prompt if spec.key == "self:certainty" else "", item.solution)

    todo: dict[str, Item] = {}
    for _, item in wanted:
        key = key_of(item)
        if key in stored or key in todo:
            continue
        value = store.get(key)
        if value is None:
            todo[key] = item
        else:
            stored[key] = value["steps"]
    reused = len(stored)
    encoded = {k: scorer.encode(it) for k, it in todo.items()}
    order = sorted(encoded, key=lambda k: len(encoded[k].input_ids))  # less padding per batch
    bar = tqdm(total=len(order), desc=f"eglr-verify {spec.key}", unit="rollout", disable=not progress)
    for start in range(0, len(order), batch_size):
        keys = order[start : start + batch_size]
        scores = scorer.score([encoded[k] for k in keys])
        batch = {k: {"steps": s} for k, s in zip(keys, scores)}
        store.put_many(batch)  # per batch: a killed run resumes from here
        stored.update({k: v["steps"] for k, v in batch.items()})
        bar.update(len(keys))
    bar.close()
    for (cid, src, li, ri), item in wanted:
        rollout = plan.lines_of[(cid, src)][li]["rollouts"][ri]
        rollout.setdefault(SCORES_FIELD, {})[spec.key] = _record(scorer, stored[key_of(item)])
    logger.info("%s: %d rollouts, %d texts scored, %d from the store", spec.key, len(wanted), len(order), reused)
    return {"model": scorer.name, "rollouts": len(wanted), "texts_scored": len(order), "texts_from_store": reused,
            "seconds": round(time.monotonic() - started, 1)}


def write_copies(plan: VerifyPlan, record: dict) -> dict:
    """Write each run's copy (its results JSON as it is, its samples with the scores) and ``eglr_verify.json``
    (``record``, with the verifiers an earlier eglr-verify on this OUT recorded). Returns the record written.

    Another eglr-verify on this OUT may have written since the plan read the copies: under one lock, read
    them again and add these scores to theirs (the last writer kept only its own before)."""
    out = plan.out
    with _out_lock(out):
        for c in plan.copies:
            c.results_out.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(c.results_out, c.files.results.read_bytes())  # whole or absent
            for src, target in c.samples.items():
                merged = _with_scores_of(_read_lines(c, src), plan.lines_of[(id(c), src)])
                # in the source's form: a .jsonl.gz run's copy is .jsonl.gz (core/jsonl.encode_lines)
                atomic_write_bytes(target, encode_lines(target, "".join(dumps(sample) + "\n" for sample in merged)))
        previous = {}
        if (out / RECORD_FILE).is_file():
            try:
                previous = json.loads((out / RECORD_FILE).read_text(encoding="utf-8")).get("verifiers", {})
            except ValueError:
                previous = {}
        record["verifiers"] = {**previous, **record["verifiers"]}
        record["versions"] = _versions()
        with atomic_writer(out / RECORD_FILE) as handle:
            handle.write(dumps(record, indent=2) + "\n")
    return record


def verify_runs(
    run_paths: Sequence[str | Path],
    specs: Sequence[VerifierSpec],
    out: str | Path,
    *,
    task: str | None = None,
    limit: int | None = None,
    doc_ids: Sequence[int] | None = None,
    batch_size: int = 8,
    device: str | None = None,
    dtype: str = "auto",
    trust_remote_code: bool = False,
    model_args: Mapping | None = None,
    system_prompt: str | None = None,
    progress: bool = True,
    argv: Sequence[str] | None = None,
) -> dict:
    """Score every rollout of the runs under ``run_paths`` with each verifier of ``specs`` and write the
    copies under ``out`` (module docstring): plan, score, write. Returns the record written to
    ``OUT/eglr_verify.json``."""
    plan = plan_verification(run_paths, specs, out, task=task, limit=limit, doc_ids=doc_ids, batch_size=batch_size,
                             device=device, dtype=dtype, trust_remote_code=trust_remote_code, model_args=model_args,
                             system_prompt=system_prompt)
    record = {"command": ["eglr-verify", *(argv or [])], "runs": [c.files.name for c in plan.copies], "limit": limit,
              "doc_ids": None if doc_ids is None else sorted(doc_ids),
              "device": plan.device, "dtype": dtype, "python": platform.python_version(), "verifiers": {}}
    store = ScoreStore(plan.out)
    try:
        for spec in specs:
            record["verifiers"][spec.key] = score_rollouts(plan, spec, store, batch_size=batch_size, progress=progress)
    finally:
        store.close()
    return write_copies(plan, record)


@contextlib.contextmanager
def _out_lock(out: Path):
    """An exclusive lock on ``out`` among eglr-verify processes (``OUT/.eglr-verify.lock``, flock)."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / LOCK_FILE, "a") as handle:
        try:
            import fcntl  # noqa: PLC0415 -- POSIX; elsewhere the writes are only atomic
        except ImportError:
            fcntl = None
        if fcntl is not None:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _with_scores_of(current: list[dict], ours: list[dict]) -> list[dict]:
    """``ours`` with each rollout's ``verifier_scores`` added to those ``current`` (the copy as it is on disk
    now) holds for the same document and rollout: scores another writer added meanwhile are kept."""
    if [(s.get("doc_id"), s.get("filter")) for s in current] != [(s.get("doc_id"), s.get("filter")) for s in ours]:
        return ours
    for now, mine in zip(current, ours):
        theirs, new = now.get("rollouts"), mine.get("rollouts")
        if not (isinstance(theirs, list) and isinstance(new, list) and len(theirs) == len(new)):
            continue
        for a, b in zip(theirs, new):
            if isinstance(a, dict) and isinstance(b, dict) and isinstance(a.get(SCORES_FIELD), dict):
                b[SCORES_FIELD] = {**a[SCORES_FIELD], **(b.get(SCORES_FIELD) or {})}
    return ours


def _versions() -> dict:
    import importlib.metadata as md

    out = {"python": sys.version.split()[0]}
    for dist in ("torch", "transformers", "eglr-harness"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = None
    return out
