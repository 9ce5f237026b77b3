"""``results/MANIFEST.json`` against the committed raw files (results/README.md, "Raw files"): every raw file
listed, every listed file present with its sha256 and size, the samples committed compressed; and the check
itself names what it finds (a file changed, gone, or not listed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eglr_harness.analysis.manifest import MANIFEST_FILE, check_manifest, make_manifest, raw_files, write_manifest
from eglr_harness.core.jsonl import gzip_bytes

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README); about a second of hashing

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results"


def test_the_manifest_lists_every_raw_file_as_it_is():
    assert check_manifest(RESULTS) == [], "regenerate: eglr-store manifest results"


def test_committed_samples_are_compressed():
    plain = [str(p.relative_to(REPO)) for p in raw_files(RESULTS) if p.name.endswith(".jsonl")]
    assert plain == [], "compress them: eglr-store pack <run folder>, then eglr-store manifest results"


def test_each_entry_names_its_command_script_and_commit():
    entries = json.loads((RESULTS / MANIFEST_FILE).read_text(encoding="utf-8"))["files"]
    assert entries and [e["path"] for e in entries] == sorted(e["path"] for e in entries)
    for entry in entries:
        if "/samples_" in f"/{entry['path']}":
            task = Path(entry["path"]).name.removeprefix("samples_").rsplit("_", 1)[0]
            assert entry["command"].startswith("lm_eval --model ") and f" --tasks {task} " in entry["command"], entry
        else:
            assert entry["command"].startswith("eglr-store export results/"), entry
        # none only for a leaderboard run without its eglr_leaderboard_run.json (its command: results/README.md)
        assert entry["scripts"] or "/leaderboard/" in entry["path"], entry
        assert all((REPO / script).is_file() for script in entry["scripts"]), entry
        assert entry["commit"] is None or len(entry["commit"]) == 40, entry


def _tree(root: Path) -> Path:
    run = root / "exp" / "run" / "model"
    run.mkdir(parents=True)
    (run / "samples_t_2026-01-01T00-00-00.jsonl.gz").write_bytes(gzip_bytes(b'{"doc_id": 0}\n'))
    (run / "results_2026-01-01T00-00-00.json").write_text(json.dumps(
        {"config": {"model": "eglr-hf", "model_args": {"L": 4}, "limit": 3.0, "gen_kwargs": {"max_gen_toks": 8}}}))
    (root / "exp" / "run.sh").write_text("lm_eval ... rollout_cache=$HERE/rollouts --output_path $HERE/run\n")
    (root / "exp" / "rollouts").mkdir()
    (root / "exp" / "rollouts" / "rollouts_rank0.jsonl.gz").write_bytes(gzip_bytes(b"{}\n"))
    return root


def test_the_check_names_a_changed_a_missing_and_an_unlisted_file(tmp_path):
    root = _tree(tmp_path / "results")
    write_manifest(root)
    assert check_manifest(root) == []
    listed = json.loads((root / MANIFEST_FILE).read_text())["files"]
    assert [e["path"] for e in listed] == ["exp/rollouts/rollouts_rank0.jsonl.gz",
                                           "exp/run/model/samples_t_2026-01-01T00-00-00.jsonl.gz"]
    assert listed[1]["command"] == ("lm_eval --model eglr-hf --model_args L=4 --tasks t --limit 3 --gen_kwargs "
                                    "max_gen_toks=8 --log_samples")
    assert listed[1]["scripts"] == ["results/exp/run.sh"] == listed[0]["scripts"]
    samples = root / "exp" / "run" / "model" / "samples_t_2026-01-01T00-00-00.jsonl.gz"
    samples.write_bytes(gzip_bytes(b'{"doc_id": 1}\n'))
    (root / "exp" / "rollouts" / "rollouts_rank0.jsonl.gz").unlink()
    (root / "exp" / "run" / "model" / "samples_u_2026-01-01T00-00-00.jsonl").write_text('{"doc_id": 0}\n')
    problems = check_manifest(root)
    assert len(problems) == 3, problems
    assert problems[0].startswith("exp/run/model/samples_u_2026-01-01T00-00-00.jsonl: a raw file the manifest does "
                                  "not list")
    assert problems[1] == "exp/rollouts/rollouts_rank0.jsonl.gz: listed in MANIFEST.json but absent."
    assert problems[2].startswith(f"exp/run/model/{samples.name}: {samples.stat().st_size} bytes, sha256 ")


def test_a_commit_is_kept_while_the_file_is_unchanged(tmp_path):
    root = _tree(tmp_path / "results")
    first = make_manifest(root)
    first["files"][0]["commit"] = "a" * 40
    assert make_manifest(root, first)["files"][0]["commit"] == "a" * 40
    (root / "exp" / "rollouts" / "rollouts_rank0.jsonl.gz").write_bytes(gzip_bytes(b"{}\n{}\n"))
    assert make_manifest(root, first)["files"][0]["commit"] != "a" * 40  # changed: looked up again
