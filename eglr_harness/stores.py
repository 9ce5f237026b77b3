"""On-disk stores that let a run resume and reuse work: finished rollouts and calibrated thresholds.

Both are small sqlite key-value tables, so several processes may read and write one file at once
(sqlite locks; WAL journal so that readers never wait for a writer). A key is a hash of
everything that changes the generated text (:func:`content_key` over :func:`model_fingerprint`
and the concrete request), so a change of model weights, engine version, library version, dtype,
attention implementation or tokenisation gets a fresh key instead of stale text.

lm-eval's ``--use_cache`` keys on (context, gen_kwargs) and so would collapse a pool of greedy
configs into one answer; the rollout store keys on the concrete cell settings instead.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import sqlite3
import time
from pathlib import Path

logger = logging.getLogger(__name__)

# Bump when a change to eglr_harness/decoding can change generated text: every stored rollout and
# cached threshold made before then stops matching.
DECODING_VERSION = 3  # 3: sampled draws are Gumbel-max with counter-hash noise (decoding/sampling.py), both engines


def content_key(*parts) -> str:
    """A stable hash of JSON-able parts (dict order does not matter)."""
    payload = json.dumps(list(parts), sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()


def weights_fingerprint(path_or_id: str, gguf_file: str | None = None, commit_hash: str | None = None) -> str | None:
    """What identifies the weights: the hub commit when known, else the weight files' names, sizes
    and modification times (cheap; no multi-GB hashing). ``None`` when nothing local is found."""
    if commit_hash:
        return f"commit:{commit_hash}"
    root = Path(path_or_id)
    if not root.exists():
        return None
    files = [root / gguf_file] if gguf_file else sorted(
        p for p in (root.iterdir() if root.is_dir() else [root])
        if p.suffix in {".safetensors", ".bin", ".gguf", ".pt", ".pth"} or p.name == "config.json"
    )
    stats = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files if p.is_file()]
    return "files:" + content_key(stats)[:16] if stats else None


def model_fingerprint(*, model_id: str, gguf_file: str | None, revision: str | None, weights: str | None,
                      dtype: str, attn_implementation: str | None, add_bos_token: bool | None,
                      max_length: int, settings: dict, library_versions: dict) -> dict:
    """Everything about the model and the software that changes the text of a rollout."""
    return {
        "model": model_id, "gguf_file": gguf_file, "revision": revision or "main", "weights": weights,
        "dtype": dtype, "attn_implementation": attn_implementation, "add_bos_token": add_bos_token,
        "max_length": max_length, "settings": settings, "decoding_version": DECODING_VERSION,
        "versions": library_versions,
    }


def loaded_model_fingerprint(model, hf_args: dict, *, settings: dict, max_length: int,
                             add_bos_token: bool | None) -> dict:
    """:func:`model_fingerprint` of a model loaded from ``hf_args`` (HFLM's arguments)."""
    from eglr_harness.model_names import loaded_name  # noqa: PLC0415 -- a leaf; kept out of import time

    pretrained, gguf = hf_args["pretrained"], hf_args.get("gguf_file")
    config = model.config
    local = isinstance(pretrained, str)
    return model_fingerprint(
        model_id=loaded_name(pretrained), gguf_file=gguf, revision=hf_args.get("revision"),
        weights=weights_fingerprint(pretrained, gguf, getattr(config, "_commit_hash", None)) if local else None,
        dtype=str(model.dtype), attn_implementation=getattr(config, "_attn_implementation", None),
        add_bos_token=add_bos_token, max_length=max_length, settings=settings,
        library_versions={name: _version(name) for name in ("transformers", "torch", "eglr-harness")},
    )


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


class _SqliteTable:
    """``key -> JSON value`` in one sqlite file, safe for several processes."""

    def __init__(self, path: Path, table: str):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._table = table
        # Autocommit; writes take the write lock up front (BEGIN IMMEDIATE), which waits on the busy
        # timeout instead of failing when a reader's snapshot would need upgrading.
        self._db = sqlite3.connect(self.path, timeout=120, isolation_level=None)
        # Switching to WAL can answer "database is locked" at once, without waiting for the busy
        # timeout, while another process opens the same file: retry for as long as the timeout.
        for attempt in range(1200):
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute(f"CREATE TABLE IF NOT EXISTS {table} (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
                break
            except sqlite3.OperationalError as err:
                if "locked" not in str(err) or attempt == 1199:
                    raise
                time.sleep(0.1)

    def __len__(self) -> int:
        return self._db.execute(f"SELECT COUNT(*) FROM {self._table}").fetchone()[0]

    def get(self, key: str):
        row = self._db.execute(f"SELECT value FROM {self._table} WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def put_many(self, records: dict) -> None:
        rows = [(k, json.dumps(v)) for k, v in records.items()]
        self._db.execute("BEGIN IMMEDIATE")  # one transaction
        try:
            self._db.executemany(f"INSERT OR REPLACE INTO {self._table} (key, value) VALUES (?, ?)", rows)
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def put(self, key: str, value) -> None:
        self.put_many({key: value})


class RolloutStore(_SqliteTable):
    """``key -> {"text": str, "entropies": [float] or None}``, one file per rank, written per batch.

    ``entropies`` are the raw-logit entropies of the generated tokens of a greedy (L=0, T=0)
    rollout, kept so that a later ``tau_h=auto`` calibration on the same prompts needs no decoding.
    """

    def __init__(self, folder: str | Path, rank: int = 0):
        super().__init__(Path(folder) / f"rollouts_rank{rank}.sqlite", "rollouts_v2")
        logger.info("EGLR rollout store %s: %d rollouts", self.path.name, len(self))


def cache_dir() -> Path:
    return Path(os.environ.get("EGLR_CACHE_DIR", Path.home() / ".cache" / "eglr_harness"))


class TauHCache(_SqliteTable):
    """``key -> {"tau_h", "task", "model", "prompts", "tokens"}`` in ``$EGLR_CACHE_DIR/tau_h.sqlite``."""

    def __init__(self, path: Path | None = None):
        super().__init__(path or cache_dir() / "tau_h.sqlite", "tau_h")
