"""Files a run writes: a folder checked for writing before anything is decoded, and whole-file
writes that never leave a file cut mid-line (write a temporary file beside it, then rename).

A leaf: the lm-eval hook (``harness/autoload.py``), the stores, ``eglr-score`` and the reports use it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from eglr_harness.core.errors import OutputError

__all__ = ["OutputError", "atomic_writer", "atomic_write_bytes", "atomic_write_text", "check_writable", "remedy",
           "refuse_writing_into"]

_PROBE_BYTES = 64 * 1024  # a probe write of this size meets a full disk (a bare create may not)


def _existing_ancestor(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path.cwd()


def check_writable(folder: str | Path, what: str) -> Path:
    """Raise :class:`OutputError` unless files can be written under ``folder`` (created if missing).

    Creates the folder (and its parents), writes, flushes to disk and removes a
    :data:`_PROBE_BYTES` file in it, then removes the folders it created: a read-only mount, a
    missing permission and a full disk are met here, before a model loads, instead of after the
    run. ``what`` names the argument (``--output_path``, ``rollout_cache``).
    """
    folder = Path(folder).expanduser()
    created = [p for p in (folder, *folder.parents) if not p.exists()]  # removed again: the run makes them
    try:
        if folder.exists() and not folder.is_dir():
            raise NotADirectoryError(20, "exists and is not a folder")
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".eglr-write-probe-") as probe:
            probe.write(b"\0" * _PROBE_BYTES)
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as err:
        where = folder if folder.exists() else _existing_ancestor(folder)
        at = "" if where == folder else f" at {where}"
        if isinstance(err, (NotADirectoryError, FileExistsError)) or not where.is_dir():
            raise OutputError(f"{what}={str(folder)!r} is not a folder ({where} is a file); allowed: a folder, created "
                              "if missing.") from None
        raise OutputError(
            f"{what}={str(folder)!r} cannot be written ({err.strerror or err}{at}); {remedy(err, 'there')}."
        ) from None
    finally:
        for path in created:  # deepest first
            with contextlib.suppress(OSError):
                path.rmdir()
    return folder


_NO_SPACE = {errno.ENOSPC, errno.EDQUOT}
_NOT_PERMITTED = {errno.EROFS, errno.EACCES, errno.EPERM}


def remedy(err: OSError, where: str = "") -> str:
    """What to do about a failed write, by its cause: space for a full disk or quota, another folder (or the
    permissions) for a read-only one, a writable folder otherwise. ``where``: ``"there"`` to say where."""
    at = f" {where}" if where else ""
    if err.errno in _NO_SPACE:
        return f"free space{at} or give a folder on another disk"
    if err.errno in _NOT_PERMITTED:
        read_only = "read-only" if err.errno == errno.EROFS else "not writable for this user"
        return f"the folder{at} is {read_only}: give a writable folder (or change its permissions)"
    return "give a writable folder"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_writer(path: str | Path, mode: str = "w", encoding: str | None = "utf-8",
                  newline: str | None = None) -> Iterator:
    """A file handle whose content replaces ``path`` only when the block ends without error.

    It writes ``.<name>.tmp-<random>`` beside ``path``, flushes it to disk and renames it over
    ``path``; on any error the temporary file is removed and ``path`` is left as it was (absent or
    whole). An :class:`OSError` becomes an :class:`OutputError` naming ``path``. A ``path`` that is a
    symbolic link is replaced by the file, never written through (its target is left alone).
    """
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-")
    except OSError as err:
        raise OutputError(f"{path}: cannot be written ({err.strerror or err}); {remedy(err)}.") from None
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding,
                       newline=None if "b" in mode else newline) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # as open() would create it (mkstemp makes it 0600)
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(err, OSError) and not isinstance(err, OutputError):
            raise OutputError(
                f"{path}: cannot be written ({err.strerror or err}); nothing was left half-written. "
                f"{remedy(err).capitalize()}, then run again."
            ) from None
        raise


def atomic_write_text(path: str | Path, text: str, encoding: str = "utf-8") -> None:
    """``path.write_text(text)`` through :func:`atomic_writer`: the file is whole or unchanged."""
    with atomic_writer(path, "w", encoding=encoding) as handle:
        handle.write(text)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """``path.write_bytes(data)`` through :func:`atomic_writer`: the file is whole or unchanged."""
    with atomic_writer(path, "wb") as handle:
        handle.write(data)


def refuse_writing_into(targets: Iterable[str | Path], inputs: Iterable[str | Path], what: str) -> None:
    """Raise :class:`OutputError` when a path a command would write (``targets``) is, or lies inside,
    one of its ``inputs`` (run folders or files), with links resolved: a command never writes over or
    into what it reads. ``what`` names the argument (``--out``). Call it before anything is loaded.

    An input that is a file (a run named by its ``results_*.json``) stands for the folder that holds it: the
    command reads the files beside it too (the run's samples), so none of them is written over."""
    roots = []
    for given in inputs:
        root = Path(given).expanduser().resolve()
        roots.append((str(given), root.parent, True) if root.is_file() else (str(given), root, False))
    for target in targets:
        resolved = Path(target).expanduser().resolve()
        for given, root, a_file in roots:
            if resolved == root or root in resolved.parents:
                inside = "is" if resolved == root else "lies inside"
                of = f"the folder of the input {given!r} (the run's files beside it)" if a_file else \
                    f"the input {given!r}"
                raise OutputError(f"{what}={str(target)!r} {inside} {of}"
                                  f"{'' if resolved == Path(target).absolute() else f' (as {resolved})'}: the command "
                                  "never writes over or into what it reads; allowed: a path outside every input.")
