"""A config-aware, resumable store of finished rollouts (sqlite, one file per rank).

lm-eval's ``--use_cache`` keys on (context, gen_kwargs) and so would collapse a pool of greedy
configs into one answer. This store keys on the model, the context and the concrete per-cell
generation settings (L, T, cycle, thresholds, ...), and is written after every batch: a killed
run started again with the same ``rollout_cache`` recomputes only what was not finished.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
from pathlib import Path

logger = logging.getLogger(__name__)


def rollout_key(model_fingerprint: dict, context: str, gen_kwargs: dict) -> str:
    payload = json.dumps([model_fingerprint, context, gen_kwargs], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()


class RolloutStore:
    """``key -> generated text``; safe to read while another process appends."""

    def __init__(self, folder: str | Path, rank: int = 0):
        self.path = Path(folder) / f"rollouts_rank{rank}.sqlite"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, timeout=60)
        self._db.execute("CREATE TABLE IF NOT EXISTS rollouts (key TEXT PRIMARY KEY, text TEXT NOT NULL)")
        self._db.commit()
        logger.info("EGLR rollout store at %s (%d rollouts)", self.path, len(self))

    def __len__(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM rollouts").fetchone()[0]

    def get(self, key: str) -> str | None:
        row = self._db.execute("SELECT text FROM rollouts WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def put(self, key: str, text: str) -> None:
        self._db.execute("INSERT OR REPLACE INTO rollouts (key, text) VALUES (?, ?)", (key, text))
        self._db.commit()
