"""What the docs tell a user to run, run as a user runs it (issue 38).

Every fenced command block of ``README.md``, ``docs/*.md`` and ``tasks/README.md`` carries a marker on
the line above its opening fence:

- ``<!-- journey: NAME -->``: run here, in the document's order, through the real console scripts (the
  venv's ``bin`` first on ``PATH``, this checkout on ``PYTHONPATH``), in one temporary folder (cwd; nothing
  of the checkout is copied) per entry of :data:`JOURNEY_RUNS` (the README and the pages it sends a user to
  share one, in the order a user reads them: ``docs/analyses.md`` reports on the README's run), at tiny sizes:
  :data:`JOURNEYS` names, per block, the
  substitutions that shrink it (each must still match the doc, so a doc edit that drops one fails here)
  and the files its commands promise. Each block must exit 0, leave those files, and change no file git
  tracks in the checkout.
- ``<!-- ci:install -->`` / ``<!-- ci:test -->``: run by ``.ci/run``; the ``lm_eval`` demo inside the
  install block is also a journey here (``demo``).
- ``<!-- vllm: install -->`` / ``<!-- vllm: request -->`` (docs/vllm.md): run in vLLM's own environment, the install
  block by ``.ci/vllm`` itself, the request block by ``tests/eglr_vllm/test_serve.py`` against its server
  (:func:`test_the_vllm_blocks_are_the_ones_ci_runs` holds that both read them).
- ``<!-- not-run: REASON -->``: a command this machine cannot run (a GPU, a hub model, new environments),
  with the reason in the doc itself.

A command block without a marker fails :func:`test_every_command_block_is_marked_and_every_journey_known`,
so a new command in the docs is either run here or says why not.

Runtime (2026-11-26, 2 CPU cores shared with five other sessions, load 6-9): the README and its pages
1,282 s (the demo, EGLR-SC_L, calibration, two Python snippets, report/export/score, the 4-run leaderboard),
tasks/README.md 511 s; the marker checks < 2 s. Each SmolLM2 ``lm_eval`` process is ~25-40 s of CPU, mostly start-up.
"""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "tasks/README.md",
        *sorted(str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "docs").glob("*.md")))
COMMAND_LANGUAGES = {"", "bash", "sh", "shell", "console", "python", "py"}  # other fences hold data (json, yaml, text)
# The documents whose journeys run in one temporary folder, in this order (a later page uses an earlier one's
# output: the analyses run on the README's EGLR-SC_L run). Every document with a journey is in exactly one.
JOURNEY_RUNS: dict[str, tuple[str, ...]] = {
    "README.md": ("README.md", "docs/lm-eval.md", "docs/transformers.md", "docs/analyses.md"),
    "tasks/README.md": ("tasks/README.md",),
}
MARKER = re.compile(r"<!-- (journey: ([a-z0-9_-]+)|not-run: (.+\S)|ci:(install|test)|vllm: (install|request)) -->")


@dataclass(frozen=True)
class Journey:
    """How one marked block runs here: ``(old, new)`` replacements (each must occur in the block) and the
    files (globs under the document's temporary folder) that must exist after it."""

    substitutions: tuple[tuple[str, str], ...] = ()
    outputs: tuple[str, ...] = ()
    check: str | None = None  # the name of an extra check in CHECKS


TINY_DEMO = (("--limit 16", "--limit 2"), ("--log_samples", "--log_samples --gen_kwargs max_gen_toks=16"))

JOURNEYS: dict[str, Journey] = {
    "demo": Journey(TINY_DEMO, ("out/demo/*/results_*.json", "out/demo/*/samples_eglr_demo_*.jsonl")),
    "first-run": Journey(
        (("--limit 2", "--limit 1"), ("max_gen_toks=256", "max_gen_toks=12")),
        ("out/*/results_*.json", "out/*/samples_gsm8k_eglr_sc_*.jsonl"),
        check="eglr_sc_L_pool",
    ),
    "calibrate": Journey(
        (("max_gen_toks=256", "max_gen_toks=8 --calib_limit 2 --allow_few_tokens"),),
        ("model_configs/smollm2-135m-instruct.yaml",),
        check="calibrated_preset",
    ),
    "transformers-generate": Journey((("max_new_tokens=64", "max_new_tokens=8"),)),
    "continuous-engine": Journey((("max_new_tokens=64", "max_new_tokens=8"), ("64, seed", "8, seed"))),
    "leaderboard": Journey(
        (("--tasks gsm8k,math500", "--tasks gsm8k"), ("--limit gsm8k=100,math500=50", "--limit 1"),
         ("--max_gen_toks 256", "--max_gen_toks 8")),
        ("out/leaderboard/smollm2-135m-instruct/leaderboard.md",
         "out/leaderboard/smollm2-135m-instruct/leaderboard.csv"),
        check="every_leaderboard_cell_done",
    ),
    "analyses": Journey(
        (),
        ("out/report/report.md", "out/pool.parquet", "out/scored/*/results_*.json", "out/verified/report/report.md",
         "out/verified/verifier_scores.sqlite"),
    ),
    "quickstart-plain": Journey(
        (("--limit 16", "--limit 1"), ("--batch_size 8", "--batch_size 8 --gen_kwargs max_gen_toks=8")),
    ),
    "demo-levels": Journey(
        (("max_gen_toks=48 ...", "max_gen_toks=4 --apply_chat_template --limit 1 --output_path out/levels"),
         ('"eglr_demo_n": 100', '"eglr_demo_n": 1')),
        ("out/levels/*/results_*.json",),
    ),
    "score": Journey(
        (("--predict_only", "--predict_only --limit 1 --gen_kwargs max_gen_toks=8"),),
        ("out/run/*/samples_gsm8k_eglr_sc_*.jsonl", "out/scored/*/results_*.json", "out/scored/*/samples_*.jsonl"),
    ),
}


@dataclass(frozen=True)
class Block:
    doc: str
    line: int  # of the opening fence, 1-based
    language: str
    marker: str | None  # the marker's text, or None
    text: str

    @property
    def journey(self) -> str | None:
        found = MARKER.fullmatch(self.marker or "")
        return found.group(2) if found else None

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def fenced_blocks(doc: str) -> list[Block]:
    """Every fenced block of ``doc`` with the marker on the line above its opening fence (if any)."""
    lines = (REPO_ROOT / doc).read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = re.match(r"^(```+|~~~+)\s*([\w+-]*)", lines[i])
        if not opening:
            i += 1
            continue
        fence, language = opening.group(1), opening.group(2).lower()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith(fence)), len(lines))
        above = lines[i - 1].strip() if i else ""
        blocks.append(Block(doc, i + 1, language, above if above.startswith("<!--") else None,
                            "\n".join(lines[i + 1 : end]) + "\n"))
        i = end + 1
    return blocks


def demo_commands(install_block: str) -> str:
    """The ``lm_eval`` command(s) of the ci:install block (with their continuation lines), not the installs."""
    commands, current = [], []
    for line in install_block.splitlines():
        if current or line.startswith("lm_eval "):
            current.append(line)
            if not line.rstrip().endswith("\\"):
                commands.append("\n".join(current))
                current = []
    return "\n".join(commands) + "\n"


def journey_blocks(doc: str) -> list[tuple[str, Block, str]]:
    """``(name, block, text to run)`` of ``doc``'s journeys, in document order (the demo from ci:install)."""
    found = []
    for block in fenced_blocks(doc):
        if block.marker == "<!-- ci:install -->":
            found.append(("demo", block, demo_commands(block.text)))
        elif block.journey:
            found.append((block.journey, block, block.text))
    return found


def shrink(name: str, block: Block, text: str) -> str:
    for old, new in JOURNEYS[name].substitutions:
        assert old in text, (f"{block.where}: journey {name!r} no longer contains {old!r}; update JOURNEYS in "
                             f"{Path(__file__).name} to what the doc says now")
        text = text.replace(old, new)
    return text


# ------------------------------------------------------------------ the docs are marked (fast)
def test_every_command_block_is_marked_and_every_journey_known():
    unmarked, unknown_marker, seen = [], [], []
    for doc in DOCS:
        for block in fenced_blocks(doc):
            if block.marker is not None and not MARKER.fullmatch(block.marker):
                unknown_marker.append(f"{block.where}: {block.marker}")
            if block.language in COMMAND_LANGUAGES and block.marker is None:
                unmarked.append(f"{block.where} ({block.language or 'no language'})")
            if block.journey:
                seen.append(block.journey)
    assert not unmarked, (
        "command blocks without a marker (add <!-- journey: NAME --> and an entry in JOURNEYS, or "
        f"<!-- not-run: REASON -->; a data block gets a language such as text): {unmarked}"
    )
    assert not unknown_marker, f"markers this test does not know: {unknown_marker}"
    assert len(seen) == len(set(seen)), f"a journey name is used twice: {sorted(seen)}"
    assert set(seen) | {"demo"} == set(JOURNEYS), (
        f"journeys in the docs {sorted(seen)} and in JOURNEYS {sorted(JOURNEYS)} differ")


def test_every_journey_runs_in_one_folder():
    """A document with a journey belongs to exactly one entry of JOURNEY_RUNS (else its journeys would not run)."""
    listed = [doc for docs in JOURNEY_RUNS.values() for doc in docs]
    assert len(listed) == len(set(listed)), f"a document is in JOURNEY_RUNS twice: {sorted(listed)}"
    with_journeys = {doc for doc in DOCS if journey_blocks(doc)}
    assert with_journeys <= set(listed), (
        f"documents with journeys that no JOURNEY_RUNS entry runs: {sorted(with_journeys - set(listed))}")
    assert set(listed) <= set(DOCS), (f"JOURNEY_RUNS names documents that do not exist: "
                                      f"{sorted(set(listed) - set(DOCS))}")


def test_the_marker_rules_catch_an_unmarked_block(tmp_path, monkeypatch):
    """The check above can fail: an unmarked bash block and an unknown journey are both reported."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("intro\n\n```bash\nlm_eval --tasks x\n```\n\n<!-- journey: nope -->\n"
                                        "```bash\neglr-report out\n```\n\n```json\n{}\n```\n")
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "README.md").write_text("<!-- not-run: needs a GPU -->\n```bash\nnvidia-smi\n```\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO_ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "DOCS", ("README.md", "tasks/README.md"))
    with pytest.raises(AssertionError, match=r"README.md:3 \(bash\)"):
        test_every_command_block_is_marked_and_every_journey_known()
    (tmp_path / "README.md").write_text("<!-- journey: nope -->\n```bash\neglr-report out\n```\n")
    with pytest.raises(AssertionError, match="differ"):
        test_every_command_block_is_marked_and_every_journey_known()


def test_the_vllm_blocks_are_the_ones_ci_runs():
    """docs/vllm.md's ``vllm:`` blocks run in vLLM's environment, where this module does not: ``.ci/vllm`` reads its
    install block from the page (not a copy of its lines), and the serve test reads the request block."""
    blocks = {MARKER.fullmatch(b.marker).group(5): b for b in fenced_blocks("docs/vllm.md")
              if b.marker and MARKER.fullmatch(b.marker) and MARKER.fullmatch(b.marker).group(5)}
    assert set(blocks) == {"install", "request"}, sorted(blocks)
    ci = (REPO_ROOT / ".ci/vllm").read_text()
    assert "<!-- vllm: install -->" in ci and "docs/vllm.md" in ci, \
        ".ci/vllm does not read docs/vllm.md's install block"
    code = "\n".join(line.split("#")[0] for line in ci.splitlines() if not line.lstrip().startswith("#"))
    commands = [line.split("#")[0].strip() for line in blocks["install"].text.splitlines() if line.strip()]
    assert not any(command in code for command in commands), \
        ".ci/vllm repeats a line of docs/vllm.md's install block instead of reading it"
    assert "pip uninstall -y torchvision" in blocks["install"].text  # import vllm fails without it (PyPI's builds)
    serve_test = (REPO_ROOT / "tests/eglr_vllm/test_serve.py").read_text()
    assert "<!-- vllm: request -->" in serve_test


# ------------------------------------------------------------------ extra checks of what a journey promises
def _eglr_sc_L_pool(tmp: Path, name: str) -> None:
    """The paper's EGLR-SC_L command runs the L pool 1..10 at T=0 (not temperature SC at one L)."""
    import json

    results = sorted(tmp.glob("out/*/results_*.json"))[-1]
    cells = json.loads(results.read_text())["config"]["eglr"]["stats"]["cells"]
    assert sorted(cells) == sorted(f"L={L},T=0.0" for L in range(1, 11)), sorted(cells)


def _calibrated_preset(tmp: Path, name: str) -> None:
    import yaml

    written = (tmp / "model_configs" / "smollm2-135m-instruct.yaml").read_text()
    assert "# A chat model" in written  # the preset's comment kept
    assert 0 < yaml.safe_load(written)["tau_h"]["gsm8k"] <= 2.5


def _every_leaderboard_cell_done(tmp: Path, name: str) -> None:
    """Every cell kind of the leaderboard ran: greedy, both beams, EGLR (best L), EGLR-SC_L and the oracle."""
    with open(tmp / "out/leaderboard/smollm2-135m-instruct/leaderboard_cells.csv", newline="") as handle:
        status = {row["method"]: row["status"] for row in csv.DictReader(handle)}
    assert status == dict.fromkeys(("greedy", "beam4", "beam11", "eglr_best", "eglr_sc", "oracle"), "done"), status


CHECKS = {"eglr_sc_L_pool": _eglr_sc_L_pool, "calibrated_preset": _calibrated_preset,
          "every_leaderboard_cell_done": _every_leaderboard_cell_done}


# ------------------------------------------------------------------ the journeys (slow: real CLI, SmolLM2)
def _tracked_state() -> str | None:
    """``git status --porcelain`` of the checkout's tracked files (None outside a git checkout)."""
    done = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                          capture_output=True, text=True, check=False)
    return done.stdout if done.returncode == 0 else None


def _environment(tmp: Path) -> dict:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO_ROOT), env.get("PYTHONPATH"))))
    env["EGLR_CACHE_DIR"] = str(tmp / ".eglr_cache")  # no calibration or store of another run is reused
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


@pytest.mark.slow
@pytest.mark.parametrize("doc", sorted(JOURNEY_RUNS))
def test_the_documented_journeys_run(doc, tmp_path, shared_data_dir):
    """Each journey of ``doc`` and its pages (JOURNEY_RUNS), in order, in one temporary folder: exit 0, its files,
    no tracked file changed."""
    journeys = [found for page in JOURNEY_RUNS[doc] for found in journey_blocks(page)]
    assert all(journey_blocks(page) for page in JOURNEY_RUNS[doc]), f"a page of {doc} has no journeys"
    before = _tracked_state()
    env = _environment(tmp_path)
    for name, block, text in journeys:
        script = shrink(name, block, text)
        if block.language in {"python", "py"}:
            path = tmp_path / f"{name}.py"
            path.write_text(script)
            argv = [sys.executable, str(path)]
        else:
            argv = ["bash", "-euo", "pipefail", "-c", script]
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
        assert done.returncode == 0, (f"{block.where} journey {name!r} exited {done.returncode}:\n{script}\n"
                                      f"--- output (last 4000 characters)\n{(done.stdout + done.stderr)[-4000:]}")
        missing = [pattern for pattern in JOURNEYS[name].outputs if not list(tmp_path.glob(pattern))]
        assert not missing, f"{block.where} journey {name!r} did not write {missing}"
        if JOURNEYS[name].check:
            CHECKS[JOURNEYS[name].check](tmp_path, name)
        assert _tracked_state() == before, f"{block.where} journey {name!r} changed files git tracks in the checkout"
