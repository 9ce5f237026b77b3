"""``eglr-store``: a results tree's raw files in their committed form (results/README.md, "Raw files").

- ``eglr-store pack PATH...`` compresses every plain ``samples_*.jsonl`` under PATH into ``.jsonl.gz``
  (deterministic: the same text, the same bytes) and writes the export ``<name>.jsonl.gz`` of every store
  ``rollouts_rank<N>.sqlite`` / ``verifier_scores.sqlite`` under it (run/stores.py; a store without a record is
  not exported). Run it on a run's folder after the run, then ``eglr-store manifest``.
- ``eglr-store export PATH...``: the store exports alone.
- ``eglr-store manifest ROOT`` writes ``ROOT/MANIFEST.json`` (analysis/manifest.py); ``--check`` writes nothing
  and lists what differs (exit 1 when anything does).

A store is rebuilt from its export by opening it: a run with ``rollout_cache=FOLDER`` (or eglr-verify's OUT) takes
the export's records into the ``.sqlite`` it opens, creating it when missing. Bad input: exit 2 with one line.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from eglr_harness.analysis.manifest import check_manifest, compress_samples, write_manifest
from eglr_harness.core.errors import OutputError
from eglr_harness.core.outputs import atomic_write_bytes
from eglr_harness.run.stores import RolloutStore
from eglr_harness.verify.store import STORE_FILE, ScoreStore

__all__ = ["export_stores", "main"]

logger = logging.getLogger(__name__)


def _open(path: Path):
    """The store of a ``.sqlite`` file by its name, or None for another file."""
    rank = path.stem.removeprefix("rollouts_rank")
    if path.stem.startswith("rollouts_rank") and rank.isdigit():
        return RolloutStore(path.parent, int(rank))
    if path.name == STORE_FILE:
        return ScoreStore(path.parent)
    return None


def export_stores(root: str | Path) -> list[Path]:
    """Write the export of every store under ``root`` (a folder, or one ``.sqlite``); returns the exports written.
    A store with no sound record has nothing to resume from: no export (and a stale one is left alone)."""
    root = Path(root)
    written = []
    for path in [root] if root.is_file() else sorted(root.rglob("*.sqlite")):
        store = _open(path)
        if store is None:
            continue
        try:
            if len(store):
                atomic_write_bytes(store.export_path, store.export_bytes())
                written.append(store.export_path)
                logger.info("exported %s (%d records)", store.export_path, len(store))
            else:
                logger.warning("%s holds no record of its table; not exported.", path)
        finally:
            store.close()
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eglr-store", description="Raw run files in their committed form: "
                                     "compressed samples, store exports, the manifest (results/README.md).")
    sub = parser.add_subparsers(dest="action", required=True)
    for name, about in (("pack", "compress samples and export stores under PATH"),
                        ("export", "export the stores under PATH")):
        sub.add_parser(name, help=about).add_argument("paths", nargs="+", type=Path, metavar="PATH")
    manifest = sub.add_parser("manifest", help="write (or --check) ROOT/MANIFEST.json")
    manifest.add_argument("root", type=Path, metavar="ROOT")
    manifest.add_argument("--check", action="store_true", help="write nothing; list what differs (exit 1)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for path in getattr(args, "paths", None) or [args.root]:
        if not path.exists():
            print(f"eglr-store: error: `PATH`={str(path)!r} does not exist; allowed: a results folder or file.",
                  file=sys.stderr)
            return 2
    try:
        if args.action == "manifest":
            if args.check:
                problems = check_manifest(args.root)
                print("\n".join(problems) or f"{args.root}: the manifest lists every raw file as it is.")
                return 1 if problems else 0
            print(write_manifest(args.root))
            return 0
        for path in args.paths:
            written = compress_samples(path) if args.action == "pack" else []
            for file in [*written, *export_stores(path)]:
                print(file)
    except (ValueError, OutputError) as err:
        print(f"eglr-store: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
