"""On-disk stores that let a run resume and reuse work: finished rollouts and calibrated thresholds.

Both are small sqlite key-value tables, so several processes may read and write one file at once
(sqlite locks; WAL journal so that readers never wait for a writer). A key is a hash of
everything that changes the generated text (:func:`content_key` over :func:`model_fingerprint`
and the concrete request), so a change of model weights, engine version, library version, dtype,
attention implementation or tokenisation gets a fresh key instead of stale text.

lm-eval's ``--use_cache`` keys on (context, gen_kwargs) and so would collapse a pool of greedy
configs into one answer; the rollout store keys on the concrete cell settings instead.

Nothing read back is trusted blindly: each record has a checksum and is validated (a tau_h is a
finite number > 0 or inf; a rollout by the rules its readers apply, ``core/run_format.py``, so that a resumed run
never writes a file its own reader refuses; a record without a checksum is dropped and computed again), every
record when the store opens (one warning with the count of the dropped ones) and each again as it is read; a damaged
file is moved aside with its sound records kept (:class:`_SqliteTable`); a store that cannot be
written raises :class:`StoreError` naming the file.

**Exports.** A store ``<name>.sqlite`` has a text form beside it, ``<name>.jsonl.gz`` (:func:`export_store`): one
``{"key", "value", "checksum"}`` line per sound record, sorted by key, gzip-compressed deterministically (the same
records give the same bytes). It is what ``results/`` commits instead of the binary file: a store that opens takes
every record of its export that it lacks (the file is created from it when missing), each checked as any stored
record is, so a committed ``run.sh`` resumes from what is committed.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import logging
import math
import os
import sqlite3
import time
from pathlib import Path

from eglr_harness.core.errors import FileFormatError, OutputError
from eglr_harness.core.interrupt import note_stored
from eglr_harness.core.jsonl import dumps, gzip_bytes, iter_jsonl
from eglr_harness.core.model_args import RENAMED_ENGINES, engine_named
from eglr_harness.core.run_format import ROLLOUT_FIELDS
from eglr_harness.decoding.stats import record_problem

logger = logging.getLogger(__name__)

EXPORT_SUFFIX = ".jsonl.gz"  # a store's text form beside it: rollouts_rank0.sqlite -> rollouts_rank0.jsonl.gz

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
    from eglr_harness.run.model_names import loaded_name  # noqa: PLC0415 -- a leaf; kept out of import time

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


def _checksum(key: str, value: str) -> str:
    """The checksum stored beside a record: a changed byte of its key or value no longer matches."""
    return hashlib.sha256(f"{key}\n{value}".encode()).hexdigest()[:32]


# sqlite's own words for a file that is not (or no longer) a sound database.
_DAMAGE_WORDS = ("malformed", "not a database", "corrupt", "encrypted")


def _is_damage(err: BaseException) -> bool:
    return isinstance(err, sqlite3.DatabaseError) and any(w in str(err).lower() for w in _DAMAGE_WORDS)


class StoreError(OutputError):
    """A store file that cannot be opened or written for a reason other than damage (permissions, a
    full disk); the message names the file and the fix."""


class _SqliteTable:
    """``key -> JSON value`` in one sqlite file, safe for several processes, that never hands back a
    damaged or invalid value.

    Every record carries a checksum of its key and value, and ``validate(value)`` (``None`` when the
    value is sound, else what is wrong) is applied on read and on write. A record that fails either
    is dropped (and so computed again by the caller), said once per file in the log. A file that
    sqlite finds damaged (on open: ``PRAGMA quick_check``; or later, mid-run) is moved aside as
    ``<name>.damaged-<time>``, the records that can still be read and pass their checks are copied
    into a fresh file, and a warning names both files.
    """

    _label = "store"
    _noun = "records"

    def __init__(self, path: Path, table: str, validate=None):
        self.path = Path(path)
        self._table = table
        self._validate = validate or (lambda value: None)
        self._warned_records = False
        self._db = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise StoreError(f"{self._label} {self.path}: its folder cannot be created ({err.strerror or err}); "
                             "give a writable folder.") from None
        try:
            self._open()
            self._check_integrity()
        except sqlite3.DatabaseError as err:
            if not _is_damage(err):
                raise self._error(err) from None
            self._recover(err)
        self._take_export()
        self._drop_unsound()

    @property
    def export_path(self) -> Path:
        """The store's export beside it (module docstring): ``<name>.jsonl.gz``."""
        return self.path.with_name(self.path.stem + EXPORT_SUFFIX)

    def _take_export(self) -> None:
        """Add the records of :attr:`export_path` (when there is one) that the file lacks; :meth:`_drop_unsound`
        then checks them as every stored record. A line that is not ``{"key": str, "value": str, "checksum": str}``
        raises ``FileFormatError`` naming ``file:line``."""
        if not self.export_path.is_file():
            return
        rows = []
        for number, row in iter_jsonl(self.export_path, 'one {"key", "value", "checksum"} record (strings) per line'):
            if not all(isinstance(row.get(name), str) for name in ("key", "value", "checksum")):
                raise FileFormatError(f"{self.export_path}:{number}: a record without the strings key, value and "
                                      f"checksum ({sorted(row)}); allowed: a line as export_store writes it.")
            rows.append((row["key"], row["value"], row["checksum"]))

        def insert() -> int:
            before = self._db.total_changes
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany(f"INSERT OR IGNORE INTO {self._table} (key, value, checksum) VALUES (?, ?, ?)", rows)
            self._db.execute("COMMIT")
            return self._db.total_changes - before

        added = self._run(insert)
        if added:
            logger.info("EGLR %s %s: %d %s taken from %s", self._label, self.path.name, added, self._noun,
                        self.export_path.name)

    def export_bytes(self) -> bytes:
        """The store's export (module docstring): its sound records, sorted by key, as gzip-compressed JSON lines."""
        rows = self._run(lambda: self._db.execute(
            f"SELECT key, value, checksum FROM {self._table} ORDER BY key").fetchall())
        text = "".join(dumps({"key": k, "value": v, "checksum": c}) + "\n"
                       for k, v, c in rows if self._examine(k, v, c)[1] is None)
        return gzip_bytes(text.encode("utf-8"))

    # ------------------------------------------------------------------ opening and recovery
    def _open(self) -> None:
        # Autocommit; writes take the write lock up front (BEGIN IMMEDIATE), which waits on the busy
        # timeout instead of failing when a reader's snapshot would need upgrading.
        self._db = self._connect(self.path, timeout=120, isolation_level=None)
        # Switching to WAL can answer "database is locked" at once, without waiting for the busy
        # timeout, while another process opens the same file: retry for as long as the timeout.
        for attempt in range(1200):
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute(f"CREATE TABLE IF NOT EXISTS {self._table} "
                                 "(key TEXT PRIMARY KEY, value TEXT NOT NULL, checksum TEXT)")
                columns = {row[1] for row in self._db.execute(f"PRAGMA table_info({self._table})")}
                if "checksum" not in columns:  # a file written before records had checksums
                    self._db.execute(f"ALTER TABLE {self._table} ADD COLUMN checksum TEXT")
                break
            except sqlite3.OperationalError as err:
                if "locked" not in str(err) or attempt == 1199:
                    raise
                time.sleep(0.1)

    def _check_integrity(self) -> None:
        verdict = [row[0] for row in self._db.execute("PRAGMA quick_check")]
        if verdict != ["ok"]:
            raise sqlite3.DatabaseError(f"database disk image is malformed ({'; '.join(map(str, verdict[:3]))})")

    def _error(self, err: BaseException) -> StoreError:
        return StoreError(f"{self._label} {self.path}: {err}; check that the file and its folder are writable "
                          "and the disk has space, or point the run at another folder.")

    def _salvage(self, path: Path) -> dict[str, str]:
        """The records of a damaged file that can still be read and pass their checks (maybe none):
        read by rowid ranges, so that one damaged page loses only the records on it."""
        found: dict[str, str] = {}

        def read(db, where: str = "", args: tuple = ()) -> None:
            for key, value, checksum in db.execute(f"SELECT key, value, checksum FROM {self._table} {where}", args):
                if self._decode(key, value, checksum) is not None:
                    found[key] = value

        try:
            db = self._connect(f"file:{path}?mode=ro", uri=True, timeout=1)
        except sqlite3.Error:
            return found
        try:
            last = db.execute(f"SELECT max(rowid) FROM {self._table}").fetchone()[0] or 0
            for start in range(1, last + 1, 64):
                try:
                    read(db, "WHERE rowid BETWEEN ? AND ?", (start, start + 63))
                except sqlite3.Error:
                    for rowid in range(start, start + 64):
                        with contextlib.suppress(sqlite3.Error):
                            read(db, "WHERE rowid = ?", (rowid,))
        except sqlite3.Error:
            with contextlib.suppress(sqlite3.Error):
                read(db)  # no rowid range: what one scan reads before the damaged page
        finally:
            db.close()
        return found

    @staticmethod
    def _connect(*args, **kwargs) -> sqlite3.Connection:
        db = sqlite3.connect(*args, **kwargs)
        # A damaged byte inside a stored text must fail the record's checksum, not the query.
        db.text_factory = lambda raw: raw.decode("utf-8", "replace")
        return db

    def _recover(self, err: BaseException) -> None:
        """Move the damaged file aside, start a fresh one with whatever records survive, say so once."""
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
            self._db = None
        stamp, n = time.strftime("%Y%m%dT%H%M%S"), 0
        while (aside := self.path.with_name(f"{self.path.name}.damaged-{stamp}" + (f"-{n}" if n else ""))).exists():
            n += 1
        try:
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):  # absent, or moved by another process just now
                    os.replace(f"{self.path}{suffix}", f"{aside}{suffix}")
        except OSError as move_err:
            raise StoreError(f"{self._label} {self.path} is damaged ({err}) and cannot be moved aside "
                             f"({move_err.strerror or move_err}); delete or move it, then run again.") from None
        kept = self._salvage(aside)
        try:
            self._open()
            if kept:
                self._insert([(k, v, _checksum(k, v)) for k, v in kept.items()])
        except sqlite3.Error as open_err:
            raise self._error(open_err) from None
        logger.warning(
            "EGLR %s %s was damaged (%s): moved aside to %s; %d sound records kept in a fresh file, the rest "
            "will be computed again. The old file may hold more (`sqlite3 %s .recover`); delete it when done.",
            self._label, self.path, err, aside.name, len(kept), aside.name)

    # ------------------------------------------------------------------ records
    def _examine(self, key: str, value: str, checksum: str | None) -> tuple[object, str | None]:
        """``(value, None)`` of a sound stored record, else ``(None, what is wrong)``: its checksum, its JSON or
        ``validate``'s answer."""
        # no checksum (a row written by an eglr-harness older than checksums, or behind the store's back):
        # nothing vouches for it, so it is computed again rather than trusted
        if checksum is None or checksum != _checksum(key, value):
            return None, "its checksum"
        try:
            decoded = json.loads(value)
        except (TypeError, ValueError):
            return None, "its JSON"
        problem = self._validate(decoded)
        return (decoded, None) if problem is None else (None, problem)

    def _decode(self, key: str, value: str, checksum: str | None):
        """The value of a stored record, or None when its checksum, JSON or validation fails."""
        return self._examine(key, value, checksum)[0]

    def _drop_unsound(self) -> None:
        """Every record checked once, as the store opens: the ones that fail are deleted (so computed again by the
        caller, a miss) and said in one warning naming the file, their count and the first one's fault. A record
        that fails later (written since by another process) is dropped by :meth:`get`."""
        bad: list[tuple[str, str]] = []

        def scan() -> None:
            bad.clear()
            for key, value, checksum in self._db.execute(f"SELECT key, value, checksum FROM {self._table}"):
                why = self._examine(key, value, checksum)[1]
                if why is not None:
                    bad.append((key, why))

        self._run(scan)
        if not bad:
            return
        self._warned_records = True
        logger.warning("EGLR %s %s: %d stored %s failed its check (the first: %s); dropped, they are computed again.",
                       self._label, self.path, len(bad), self._noun, bad[0][1])
        try:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany(f"DELETE FROM {self._table} WHERE key = ?", [(key,) for key, _ in bad])
            self._db.execute("COMMIT")
        except sqlite3.Error:  # left in the file: get() drops each one it meets
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")

    def _dropped(self, key: str, why: str) -> None:
        if not self._warned_records:
            self._warned_records = True
            logger.warning("EGLR %s %s: a stored record failed its check (%s); dropped, it is computed again "
                           "(further ones are dropped without a message).", self._label, self.path, why)
        with contextlib.suppress(sqlite3.Error):
            self._db.execute(f"DELETE FROM {self._table} WHERE key = ?", (key,))

    def _run(self, action):
        """``action()``; a file damaged mid-run is recovered and ``action`` tried once more."""
        try:
            return action()
        except sqlite3.DatabaseError as err:
            if not _is_damage(err):
                raise self._error(err) from None
            self._recover(err)
        try:
            return action()
        except sqlite3.Error as err:
            raise self._error(err) from None

    def __len__(self) -> int:
        return self._run(lambda: self._db.execute(f"SELECT COUNT(*) FROM {self._table}").fetchone()[0])

    def get(self, key: str):
        row = self._run(lambda: self._db.execute(
            f"SELECT value, checksum FROM {self._table} WHERE key = ?", (key,)).fetchone())
        if row is None:
            return None
        value, why = self._examine(key, *row)
        if why is not None:
            self._dropped(key, why)
        return value

    def _insert(self, rows: list[tuple[str, str, str]]) -> None:
        self._db.execute("BEGIN IMMEDIATE")  # one transaction
        try:
            self._db.executemany(
                f"INSERT OR REPLACE INTO {self._table} (key, value, checksum) VALUES (?, ?, ?)", rows)
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def put_many(self, records: dict) -> None:
        rows = []
        for key, value in records.items():
            problem = self._validate(value)
            if problem is not None:
                logger.warning("EGLR %s %s: not storing an invalid record (%s).", self._label, self.path, problem)
                continue
            text = json.dumps(value)
            rows.append((key, text, _checksum(key, text)))
        if rows:
            self._run(lambda: self._insert(rows))
            note_stored(f"{self._noun} in {self.path}", [key for key, _, _ in rows])  # for an interrupt's line

    def put(self, key: str, value) -> None:
        self.put_many({key: value})

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


def _rollout_problem(value) -> str | None:
    """What a rollout record has that its readers refuse, or None: ``text`` a str; ``signals`` and ``engine`` by the
    rules the samples file is read with (``core/run_format.ROLLOUT_FIELDS``); ``accounting`` by the rules of a
    run's ``config.eglr.stats`` (``decoding/stats.record_problem``), since a resumed run adds it there."""
    if not isinstance(value, dict) or not isinstance(value.get("text"), str):
        return "expected {'text': str, 'signals': dict or None}"
    for name in ("signals", "engine"):
        rule = ROLLOUT_FIELDS[name]
        if not rule.check(value.get(name)):
            return f"`{name}`={value.get(name)!r:.80} is not allowed; allowed: {rule.allowed}"
    accounting = value.get("accounting")
    return None if accounting is None else record_problem(accounting)


class RolloutStore(_SqliteTable):
    """``key -> {"text": str, "signals": dict or None, "engine": "continuous" | "hook" | "vllm", "accounting": dict}``
    (``engine`` and ``accounting`` since 2026-11-25: which engine decoded the rollout, and its compute
    accounting, ``decoding/stats.py``; a record without them is reused with no figures), one file per
    rank, written per rollout as it finishes (with its own part of the batch figures, ``shares``, as its
    engine counts a row: ``decoding/stats.RolloutAccount``) and again with its share of its batch's figures
    when its engine run ends. ``accounting["calibration"]`` marks a rollout tau_h calibration decoded: a pool
    that takes it counts it as reused (its compute is calibration's)."""

    _label = "rollout store"
    _noun = "rollouts"

    def __init__(self, folder: str | Path, rank: int = 0):
        super().__init__(Path(folder) / f"rollouts_rank{rank}.sqlite", "rollouts_v2", _rollout_problem)
        logger.info("EGLR rollout store %s: %d rollouts", self.path.name, len(self))

    def get(self, key: str):
        """The stored rollout, its engine under its current name (a store written before the hook engine's
        rename says ``hf``)."""
        value = super().get(key)
        if value is not None and value.get("engine") in RENAMED_ENGINES:
            value = {**value, "engine": engine_named(value["engine"])}
        return value


def valid_tau_h(value) -> bool:
    """A usable entropy gate: a finite number > 0 nats, or ``inf`` (nothing is gated)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and (value == math.inf or (math.isfinite(value) and value > 0)))


def _tau_h_problem(value) -> str | None:
    if not isinstance(value, dict) or not valid_tau_h(value.get("tau_h")):
        return f"tau_h must be a number > 0 or inf, got {value.get('tau_h') if isinstance(value, dict) else value!r}"
    prompts = value.get("prompts")
    if not isinstance(prompts, int) or isinstance(prompts, bool) or prompts < 0:
        return f"prompts must be an int >= 0, got {prompts!r}"
    return None


def check_rollout_cache(folder: str | Path) -> None:
    """Before a model loads: ``rollout_cache`` can be written, and its store files are sound (a damaged
    one is moved aside now, with its message, rather than after the load; a store's export is taken in now).
    Raises :class:`StoreError`, or ``FileFormatError`` for an export line that is not a record."""
    from eglr_harness.core.outputs import check_writable  # noqa: PLC0415

    check_writable(folder, "rollout_cache")
    folder = Path(folder).expanduser()
    patterns = ("rollouts_rank*.sqlite", "rollouts_rank*" + EXPORT_SUFFIX)
    ranks = {path.name.removeprefix("rollouts_rank").split(".", 1)[0] for p in patterns for path in folder.glob(p)}
    for rank in sorted(r for r in ranks if r.isdigit()):  # an export alone is taken in now too (a bad line refused)
        RolloutStore(folder, int(rank)).close()


def cache_dir() -> Path:
    return Path(os.environ.get("EGLR_CACHE_DIR", Path.home() / ".cache" / "eglr_harness"))


class TauHCache(_SqliteTable):
    """``key -> {"tau_h", "label", "prompts", "tokens"}`` in ``$EGLR_CACHE_DIR/tau_h.sqlite``; a
    ``tau_h`` that is not a finite number > 0 or inf is never handed back."""

    _label = "tau_h cache"
    _noun = "tau_h values"

    def __init__(self, path: Path | None = None):
        super().__init__(path or cache_dir() / "tau_h.sqlite", "tau_h", _tau_h_problem)
