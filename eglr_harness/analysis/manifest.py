"""The manifest of a results tree's raw files, ``results/MANIFEST.json``: what makes each committed run checkable.

Raw files are the runs' samples (``samples_*.jsonl.gz``, or plain ``.jsonl`` before :func:`compress_samples`) and
the stores' exports (``rollouts_rank<N>.jsonl.gz``, ``verifier_scores.jsonl.gz``: :mod:`eglr_harness.run.stores`).
The manifest lists each, sorted by path (relative to the tree), as::

    {"path": str, "sha256": str, "bytes": int, "command": str, "scripts": [str], "commit": str or null}

``command`` is what made the file: for samples, the ``lm_eval`` command rebuilt from the run's results file
(``config``: model, model_args, limit, gen_kwargs, batch size, device) and the task in the file's name; for an
export, the ``eglr-store export`` command that writes it. ``scripts`` are the committed files that ran it: the
nearest ``run.sh`` (or eglr-leaderboard's record ``eglr_leaderboard_run.json``) above a samples file; every
``run.sh`` whose text (or the ``env.sh`` it sources) names a store's folder (none for a leaderboard run made
before eglr-leaderboard kept its record: results/README.md quotes its command). ``commit`` is the git commit that
last changed the file's content (the plain ``.jsonl`` or the ``.sqlite`` it was made from, before compression):
kept from the previous manifest while the sha256 is unchanged, looked up with ``git log`` for a new or changed
file, null when git has none (an uncommitted run: the commit that adds its entry).

:func:`check_manifest` compares a manifest with the tree: every raw file listed, every listed file present with
its sha256 and size. No model is loaded; only :func:`write_manifest` runs ``git`` (when it is installed).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shlex
import subprocess
from pathlib import Path

from eglr_harness.core.jsonl import dumps, gzip_bytes
from eglr_harness.core.outputs import atomic_write_bytes
from eglr_harness.core.run_format import samples_files, samples_stem

__all__ = ["MANIFEST_FILE", "STORE_EXPORTS", "check_manifest", "compress_samples", "make_manifest", "raw_files",
           "write_manifest"]

logger = logging.getLogger(__name__)

MANIFEST_FILE = "MANIFEST.json"
# the exports of the stores results/ keeps (run/stores.py: <store stem>.jsonl.gz beside <store stem>.sqlite)
STORE_EXPORTS = ("rollouts_rank*.jsonl.gz", "verifier_scores.jsonl.gz")
_STAMP = re.compile(r"_(\d{4}-\d{2}-\d{2}T[\d.-]+)$")


def raw_files(root: str | Path) -> list[Path]:
    """Every raw file under ``root`` (module docstring), sorted."""
    root = Path(root)
    found = set(samples_files(root, recursive=True))
    found |= {p for pattern in STORE_EXPORTS for p in root.rglob(pattern) if p.is_file()}
    return sorted(found)


def compress_samples(root: str | Path) -> list[Path]:
    """Replace every plain ``samples_*.jsonl`` under ``root`` by its ``.jsonl.gz`` (core/jsonl.gzip_bytes: the same
    text, the same bytes); returns the files written. The plain file is removed once its copy is whole."""
    written = []
    for path in samples_files(root, recursive=True):
        if path.name.endswith(".gz"):
            continue
        target = path.with_name(path.name + ".gz")
        atomic_write_bytes(target, gzip_bytes(path.read_bytes()))
        path.unlink()
        written.append(target)
        logger.info("compressed %s", target)
    return written


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _lm_eval_command(samples: Path) -> str:
    """The ``lm_eval`` command of a samples file, from the results file beside it (empty config: what is known)."""
    stem = samples_stem(samples).removeprefix("samples_")
    match = _STAMP.search(stem)
    task = stem[: match.start()] if match else stem
    config: dict = {}
    if match and (results := samples.with_name(f"results_{match.group(1)}.json")).is_file():
        try:
            config = json.loads(results.read_text(encoding="utf-8")).get("config") or {}
        except ValueError:
            config = {}
    argv = ["lm_eval", "--model", str(config.get("model", "?"))]
    args = config.get("model_args")
    if isinstance(args, dict):
        args = ",".join(f"{k}={v}" for k, v in args.items())
    if args:
        argv += ["--model_args", str(args)]
    argv += ["--tasks", task]
    if config.get("limit") is not None:
        limit = config["limit"]
        argv += ["--limit", str(int(limit) if float(limit).is_integer() else limit)]
    gen = config.get("gen_kwargs")
    if isinstance(gen, dict) and gen:
        argv += ["--gen_kwargs", ",".join(f"{k}={v}" for k, v in gen.items())]
    elif isinstance(gen, str) and gen:
        argv += ["--gen_kwargs", gen]
    for flag in ("batch_size", "device"):
        if config.get(flag) not in (None, ""):
            argv += [f"--{flag}", str(config[flag])]
    return shlex.join([*argv, "--log_samples"])


def _scripts(root: Path) -> list[tuple[Path, str]]:
    """Every ``run.sh`` under ``root`` with its text (and that of the ``../env.sh`` it sources)."""
    found = []
    for script in sorted(root.rglob("run.sh")):
        text = script.read_text(encoding="utf-8")
        env = script.parent.parent / "env.sh"
        if "env.sh" in text and env.is_file():
            text += env.read_text(encoding="utf-8")
        found.append((script, text))
    return found


def _scripts_of(raw: Path, root: Path, repo: Path, scripts: list[tuple[Path, str]]) -> list[str]:
    """The committed scripts that made ``raw`` (module docstring), relative to ``repo``."""
    if samples_stem(raw) is not None:
        for folder in raw.parents:
            for name in ("run.sh", "eglr_leaderboard_run.json"):
                if (folder / name).is_file():
                    return [str((folder / name).relative_to(repo))]
            if folder == root:
                return []
    folder = raw.parent
    named = str(folder.relative_to(repo))
    return [str(script.relative_to(repo)) for script, text in scripts
            if named in text or (script.parent == folder.parent and re.search(rf"/{re.escape(folder.name)}\b", text))]


def _git_commit(paths: list[Path], repo: Path) -> str | None:
    """The last commit that changed any of ``paths`` (None without git or history)."""
    try:
        done = subprocess.run(["git", "log", "-1", "--format=%H", "--", *map(str, paths)], cwd=repo,
                              capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def make_manifest(root: str | Path, previous: dict | None = None, repo: str | Path | None = None) -> dict:
    """The manifest of ``root``'s raw files (module docstring); ``previous``: the manifest it replaces (its commits
    are kept for unchanged files); ``repo``: the repository root paths are named from (``root``'s parent)."""
    root = Path(root).resolve()
    repo = Path(repo).resolve() if repo else root.parent
    before = {e["path"]: e for e in (previous or {}).get("files", []) if isinstance(e, dict) and "path" in e}
    entries, scripts = [], _scripts(root)
    for raw in raw_files(root):
        rel = str(raw.relative_to(root))
        sha, size = _sha256(raw), raw.stat().st_size
        old = before.get(rel, {})
        if samples_stem(raw) is not None:
            command = _lm_eval_command(raw)
            sources = [raw.with_name(samples_stem(raw) + ".jsonl"), raw]
        else:
            command = shlex.join(["eglr-store", "export", str(raw.parent.relative_to(repo))])
            sources = [raw.with_name(raw.name.removesuffix(".jsonl.gz") + ".sqlite"), raw]
        commit = old.get("commit") if old.get("sha256") == sha and old.get("commit") else None
        if commit is None:
            commit = _git_commit([p.relative_to(repo) for p in sources], repo)
        entries.append({"path": rel, "sha256": sha, "bytes": size, "command": command,
                        "scripts": _scripts_of(raw, root, repo, scripts), "commit": commit})
    return {"about": "results/README.md, 'Raw files'", "files": entries}


def write_manifest(root: str | Path, repo: str | Path | None = None) -> Path:
    """Write ``root/MANIFEST.json`` (:func:`make_manifest`, keeping the commits of the one there); returns its path."""
    path = Path(root) / MANIFEST_FILE
    previous = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    atomic_write_bytes(path, (dumps(make_manifest(root, previous, repo), indent=2) + "\n").encode("utf-8"))
    return path


def check_manifest(root: str | Path) -> list[str]:
    """What differs between ``root/MANIFEST.json`` and the raw files under ``root``, one line each (empty: none)."""
    root = Path(root)
    path = root / MANIFEST_FILE
    if not path.is_file():
        return [f"{path}: no manifest; write it with `eglr-store manifest {root}`."]
    listed = {e["path"]: e for e in json.loads(path.read_text(encoding="utf-8")).get("files", [])}
    problems = []
    present = {str(p.relative_to(root)): p for p in raw_files(root)}
    for rel in sorted(set(present) - set(listed)):
        problems.append(f"{rel}: a raw file the manifest does not list; run `eglr-store manifest {root}`.")
    for rel, entry in sorted(listed.items()):
        file = root / rel
        if not file.is_file():
            problems.append(f"{rel}: listed in {MANIFEST_FILE} but absent.")
        elif file.stat().st_size != entry.get("bytes") or _sha256(file) != entry.get("sha256"):
            problems.append(f"{rel}: {file.stat().st_size} bytes, sha256 {_sha256(file)}; the manifest has "
                            f"{entry.get('bytes')} bytes, sha256 {entry.get('sha256')}.")
    return problems
