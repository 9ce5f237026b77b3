"""``eglr-verify`` as users run it: bad input before anything loads, a copy with every rollout's scores
(the run untouched), resume after a kill, and the scores carried by eglr-export."""

from __future__ import annotations

import hashlib
import json

from helpers import lmeval_fakes
import pytest

from eglr_harness.analysis.export import export_rows
from eglr_harness.commands import verify as cli
from eglr_harness.verify import scorers
from eglr_harness.verify.scorers import Scorer

CELLS = [(0, 0.0), (0, 0.5), (1, 0.0)]


def _run(tmp_path, model_dir, docs=3):
    rollouts = {d: [{"repeat": i, "L": L, "T": T, "cycle": 0, "answer": f"a{i}", "correct": int(i == d % 3)}
                    for i, (L, T) in enumerate(CELLS)] for d in range(docs)}
    lmeval_fakes.write_run(tmp_path / "run", task="toy_eglr_sc", docs=rollouts, model_args=f"pretrained={model_dir}")
    return tmp_path / "run"


def _digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("spec, message", [
    ("prm:/x", "`--verifier`='prm:/x' is not allowed; allowed: qwen-prm:PATH"),
    ("self:judge", "allowed self-verifiers"),
    ("orm:/no/such/folder", "does not exist"),
    ("orm:some/id", "`--verifier`='orm:some/id': the hub model 'some/id' is not in the local cache and the Hugging "
                    "Face hub cannot be asked (HF_HUB_OFFLINE=1 is set)"),
])
def test_bad_verifier_is_one_line_before_loading(tmp_path, capsys, monkeypatch, spec, message):
    def no_loading(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(scorers, "load_scorer", no_loading)
    rc = cli.main([str(tmp_path / "run"), "--verifier", spec, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and message in err and len(err.splitlines()) == 1


def test_out_inside_the_run_is_refused(tmp_path, tiny_verifier, capsys):
    run = _run(tmp_path, tiny_verifier("self"))
    assert cli.main([str(run), "--verifier", "self:certainty", "--out", str(run / "scored")]) == 2
    assert "untouched" in capsys.readouterr().err


def test_scores_every_rollout_into_a_copy_and_resumes(tmp_path, tiny_verifier, monkeypatch, capsys):
    run = _run(tmp_path, tiny_verifier("self"))
    before = _digest(run)
    out = tmp_path / "out"
    orm = f"orm:{tiny_verifier('orm')}"
    args = [str(run), "--verifier", "self:certainty", "--verifier", orm, "--out", str(out), "--batch_size", "2",
            "--device", "cpu", "--dtype", "float32"]
    assert cli.main([*args, "--limit", "2"]) == 0
    record = json.loads((out / "eglr_verify.json").read_text())
    assert record["verifiers"]["self:certainty"] == {**record["verifiers"]["self:certainty"], "rollouts": 6,
                                                     "texts_scored": 6, "texts_from_store": 0}
    # a kill after the first batch: what was scored stays in the store
    calls = []
    real_score = Scorer.score

    def dying_score(self, batch):
        calls.append(len(batch))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_score(self, batch)

    monkeypatch.setattr(Scorer, "score", dying_score)
    capsys.readouterr()
    assert cli.main(args) == 130  # Ctrl-C: one line, what was stored and the command that resumes (issue 47)
    err = capsys.readouterr().err
    assert "Traceback" not in err and [x for x in err.splitlines() if "interrupted" in x] == [
        f"eglr-verify: interrupted (SIGINT); stored: 2 verifier scores in {out / 'verifier_scores.sqlite'}. "
        f"Rerun to resume: eglr-verify {' '.join(args)}"]
    monkeypatch.setattr(Scorer, "score", real_score)
    assert cli.main(args) == 0
    record = json.loads((out / "eglr_verify.json").read_text())
    assert record["verifiers"]["self:certainty"]["texts_from_store"] == 6 + 2  # --limit 2's docs and one batch
    assert record["verifiers"]["self:certainty"]["texts_scored"] == 1
    assert _digest(run) == before  # the run's own files are untouched
    (copy,) = (out / "run").rglob("samples_*.jsonl")
    lines = [json.loads(line) for line in copy.read_text().splitlines()]
    for sample in lines:
        for r in sample["rollouts"]:
            scores = r["verifier_scores"]
            assert set(scores) == {"self:certainty", orm}
            assert scores["self:certainty"]["last"] == scores["self:certainty"]["steps"][-1] > 0
            assert 0 < scores[orm]["prod"] < 1
    rows = list(export_rows([out / "run"]))
    assert len(rows) == 9 and all(set(r["verifier_scores"]) == {"self:certainty", orm} for r in rows)


def test_a_second_verifier_keeps_the_first_ones_scores(tmp_path, tiny_verifier):
    run = _run(tmp_path, tiny_verifier("self"), docs=1)
    out = tmp_path / "out"
    common = [str(run), "--out", str(out), "--device", "cpu", "--dtype", "float32"]
    assert cli.main([*common, "--verifier", "self:certainty"]) == 0
    assert cli.main([*common, "--verifier", f"value-head:{tiny_verifier('value-head')}"]) == 0
    (copy,) = (out / "run").rglob("samples_*.jsonl")
    scores = json.loads(copy.read_text().splitlines()[0])["rollouts"][0]["verifier_scores"]
    assert len(scores) == 2


def test_doc_ids_choose_the_documents(tmp_path, tiny_verifier, capsys):
    run = _run(tmp_path, tiny_verifier("self"))
    out = tmp_path / "out"
    common = [str(run), "--out", str(out), "--device", "cpu", "--verifier", "self:certainty"]
    assert cli.main([*common, "--doc_ids", "x,2"]) == 2 and "--doc_ids" in capsys.readouterr().err
    assert cli.main([*common, "--doc_ids", "2,0"]) == 0
    (copy,) = (out / "run").rglob("samples_*.jsonl")
    scored = [json.loads(line)["doc_id"] for line in copy.read_text().splitlines()
              if "verifier_scores" in json.loads(line)["rollouts"][0]]
    assert sorted(scored) == [0, 2]


def test_verify_never_imports_lm_eval():
    """Layering: only eglr_harness/harness imports lm_eval; eglr-verify reads lm-eval's files only."""
    import subprocess
    import sys

    code = ("import sys, eglr_harness.commands.verify, eglr_harness.verify.run, "
            "eglr_harness.analysis.sections.bestofn; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'lm_eval'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_out_at_the_runs_parent_is_refused_before_loading(tmp_path, capsys, monkeypatch):
    """Issue 47: `--out <the run's parent>` copies the run onto itself (OUT/<run>/... is the run): it loaded
    the model, scored, then died with SameFileError. Now one line, before any model loads."""
    def no_loading(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(scorers, "load_scorer", no_loading)
    run = _run(tmp_path, "/models/none")
    before = _digest(run)
    assert cli.main([str(run), "--verifier", "self:certainty", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "never writes over or into what it reads" in err[0], err
    assert f"lies inside the input {str(run)!r}" in err[0]
    assert _digest(run) == before


def test_two_verifiers_writing_one_out_at_once_lose_no_scores(tmp_path, tiny_verifier, monkeypatch):
    """Issue 47: each eglr-verify rewrote the copy from what it had read, so the last writer dropped the other's
    scores. Here the second verifier's run is made to finish while the first one is between its read of the
    copy and its write (the moment a real concurrent run can take); both verifiers' scores must be kept."""
    from eglr_harness.verify import run as verify_run

    run = _run(tmp_path, tiny_verifier("self"), docs=2)
    out = tmp_path / "out"
    common = [str(run), "--out", str(out), "--device", "cpu", "--dtype", "float32"]
    value_head = f"value-head:{tiny_verifier('value-head')}"
    real_close = verify_run.ScoreStore.close
    others = []

    def close_then_let_the_other_writer_finish(self):
        real_close(self)
        if not others:  # the first run's store closes after scoring, before it writes the copy
            others.append(None)
            others[0] = cli.main([*common, "--verifier", value_head])

    monkeypatch.setattr(verify_run.ScoreStore, "close", close_then_let_the_other_writer_finish)
    assert cli.main([*common, "--verifier", "self:certainty"]) == 0 and others == [0]
    (copy,) = (out / "run").rglob("samples_*.jsonl")
    for line in copy.read_text().splitlines():
        for rollout in json.loads(line)["rollouts"]:
            assert set(rollout["verifier_scores"]) == {"self:certainty", value_head}, rollout
    record = json.loads((out / "eglr_verify.json").read_text())
    assert set(record["verifiers"]) == {"self:certainty", value_head}
