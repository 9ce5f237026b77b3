"""benchmarks/gpu_route.py on the CPU: the dry run's arithmetic, run as users run it (the script in a subprocess),
a rehearsal of the carrying on a small fake GGUF in a throwaway repository (prepare, then each call's machine step
in order: the reassembled file has the original's sha256), the refusals, and the problem count from a throughput."""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_route.py"
MiB = 1 << 20


@pytest.fixture(scope="module")
def route():
    spec = importlib.util.spec_from_file_location("gpu_route", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_route"] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("gpu_route", None)


def run(script: Path, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, str(script), *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=env)


def data_dir(tmp_path: Path) -> Path:
    (tmp_path / "data" / "math500").mkdir(parents=True)
    (tmp_path / "data" / "math500" / "test.jsonl").write_text('{"problem": "1+1?", "answer": "2"}\n' * 40)
    return tmp_path / "data"


def check_calls(plan: dict) -> None:
    """What every plan must hold: no call over the limit, the slices cover the GGUF exactly and in order, one slice a
    call, commands and carry lists the device tool takes, the estimates inside the 900 s."""
    limit, tree = plan["limit_bytes"], plan["tree_bytes"]
    slices = [c["slice"] for c in plan["calls"] if c["slice"]]
    assert [s["index"] for s in slices] == list(range(1, len(slices) + 1)) == [
        c["call"] for c in plan["calls"] if c["slice"]]
    assert slices[0]["offset"] == 0
    for before, after in zip(slices, slices[1:]):
        assert after["offset"] == before["offset"] + before["size"]  # contiguous, in order
    assert sum(s["size"] for s in slices) == plan["gguf_bytes"]
    for c in plan["calls"]:
        setup = c["call"] == 1
        carried = (c["slice"]["size"] if c["slice"] else 0) + (plan["wheels_bytes"] + plan["data_bytes"] if setup
                                                               else 0)
        assert tree + carried <= c["bytes"] <= limit - plan["headroom_bytes"], c["call"]
        assert len(c["command"]) <= 2000 and len(c["carry"]) <= 8 and 0 < c["timeout_s"] <= 600
        assert f".gpu_route/calls/{c['call']:02d}" in c["carry"] and c["command"].endswith(
            (f"calls/{c['call']:02d} --out $OUT", f"--budget_s {plan['eval_budget_s']}"))
    assert plan["calls"][-1]["steps"] == ["eval"] and "assemble" in plan["calls"][-2]["steps"]
    # the eval takes what the 900 s leave; a plan that leaves it less than its minimum says it does not fit
    assert plan["fits"] == (plan["eval_budget_s"] >= plan["eval_minimum_s"])
    assert plan["total_s"] <= 900 + 1e-6 or plan["eval_budget_s"] == 0
    assert plan["calls"][-1]["held_s_after"] == pytest.approx(plan["total_s"])


@pytest.mark.parametrize("tree_mib", [3, 16, 38])
def test_the_dry_run_plans_calls_under_the_limit_that_cover_the_gguf(tree_mib, tmp_path):
    done = run(SCRIPT, "--dry_run", "--json", "--tree_mib", str(tree_mib), "--data_dir", str(data_dir(tmp_path)))
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    check_calls(plan)
    assert plan["tree_bytes"] == tree_mib * MiB
    # as many slice calls as the room allows, not more: every slice but the last fills its call
    room = plan["limit_bytes"] - plan["tree_bytes"] - plan["headroom_bytes"]
    sizes = [c["slice"]["size"] for c in plan["calls"] if c["slice"]]
    assert all(room - 16 * 1024 - size == 0 for size in sizes[1:-1])


def test_the_dry_run_prints_the_estimates_and_the_device_calls(tmp_path):
    done = run(SCRIPT, "--dry_run", "--tree_mib", "16", "--transfer_mib_s", "40", "--gap_s", "5",
               "--data_dir", str(data_dir(tmp_path)))
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "transfer 40 MiB/s" in text and "gap between calls 5 s" in text and "carrying (calls 1.." in text
    assert ("goal <= 300 s: fits" in text) != ("goal <= 300 s: DOES NOT FIT" in text)
    calls = json.loads(text[text.index("device calls (JSON):") + len("device calls (JSON):"):])
    assert [c["call"] for c in calls] == list(range(1, len(calls) + 1))
    assert calls[0]["carry"][:2] == [".gpu_route/wheels", ".gpu_route/data"]
    assert all(set(c) >= {"command", "carry", "timeout_s"} for c in calls)


def test_the_dry_run_of_todays_tree_plans_or_says_why_not(route, tmp_path):
    """Measured, not assumed: the tree as git lists it, which either leaves room beside the wheels or is refused in
    one line naming its size."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.split(b"\0")
    tree = sum((ROOT / os.fsdecode(n)).lstat().st_size for n in listed if n and (ROOT / os.fsdecode(n)).is_file())
    data = data_dir(tmp_path)
    wheels_dir = ROOT / ".gpu_route" / "wheels"
    wheels = (sum(p.stat().st_size for p in wheels_dir.rglob("*") if p.is_file()) if any(wheels_dir.glob("*.whl"))
              else int(route.WHEELS_MIB * MiB))
    beside = wheels + (data / "math500" / "test.jsonl").stat().st_size + MiB // 2 + route.META_BYTES
    done = run(SCRIPT, "--dry_run", "--json", "--data_dir", str(data))
    if tree + beside < 64 * MiB:
        assert done.returncode == 0, done.stderr
        check_calls(json.loads(done.stdout))
    else:
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.count("\n") == 1 and f"the tree ({tree / MiB:.1f} MiB)" in done.stderr


def test_a_tree_that_leaves_no_room_is_one_line(tmp_path):
    done = run(SCRIPT, "--dry_run", "--tree_mib", "63.9", "--data_dir", str(data_dir(tmp_path)))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "63.9 MiB" in done.stderr
    assert "Traceback" not in done.stderr


def test_slices_cover_a_file_exactly_in_order(route):
    assert route.slice_spans(10, 3, 4) == [(0, 3), (3, 4), (7, 3)]
    assert route.slice_spans(8, 0, 4) == [(0, 4), (4, 4)]  # no room beside the wheels: the first call has none
    assert route.slice_spans(2, 5, 4) == [(0, 2)]
    with pytest.raises(route.RouteError, match="no room for a slice"):
        route.slice_spans(10, 3, 0)


def test_the_problem_count_follows_the_measured_throughput(route):
    a = route.Assumptions(process_s=30, pack_s=20, mean_new_tokens=600, safety=1.0)
    # 400 s: 1 start-up (30 + 30 s warm-up) + packing 20 + interrupt grace 15 = 95 s fixed, 305 s decoding;
    # a problem is 21 rollouts of 600 tokens = 12,600 tokens: 305 * 10,000 / 12,600 = 242.06
    got = route.problems_for(400, tokens_per_s=10_000, warmup_s=30, a=a)
    assert got["problems"] == 242 and got["fixed_s"] == 95 and got["tokens_per_problem"] == 12_600
    # a calibration first is a second start-up; twice the rate, about twice the problems; never past MATH-500's 500
    assert route.problems_for(400, tokens_per_s=10_000, warmup_s=30, a=a, startups=2)["problems"] == 194
    assert route.problems_for(400, tokens_per_s=20_000, warmup_s=30, a=a)["problems"] == 484
    assert route.problems_for(400, tokens_per_s=1e9, warmup_s=30, a=a)["problems"] == 500
    assert route.problems_for(90, tokens_per_s=1e9, warmup_s=30, a=a)["problems"] == 0
    # the default keeps a fifth of the decoding seconds spare: 0.8 * 242.06 = 193.6
    assert route.problems_for(400, tokens_per_s=10_000, warmup_s=30, a=route.Assumptions(
        process_s=30, pack_s=20, mean_new_tokens=600))["problems"] == 193
    # a budget of new tokens below the assumed mean caps the rollout's length
    assert route.problems_for(400, tokens_per_s=10_000, warmup_s=30, a=a, max_gen_toks=300)["tokens_per_problem"] == (
        21 * 300)


@pytest.fixture()
def fake_repo(tmp_path):
    """A throwaway repository holding the script, a fake wheel and a fake 700,001-byte GGUF; calls of 0.2 MiB."""
    repo = tmp_path / "repo"
    (repo / "benchmarks").mkdir(parents=True)
    shutil.copy(SCRIPT, repo / "benchmarks" / "gpu_route.py")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (repo / ".gpu_route" / "wheels").mkdir(parents=True)
    (repo / ".gpu_route" / "wheels" / "fake-0.1-py3-none-any.whl").write_bytes(b"w" * 20_000)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(os.urandom(700_001))
    return repo, gguf, hashlib.sha256(gguf.read_bytes()).hexdigest(), data_dir(tmp_path)


def prepare(repo, gguf, sha, data) -> dict:
    done = run(repo / "benchmarks" / "gpu_route.py", "prepare", "--json", "--no_download", "--gguf", str(gguf),
               "--gguf_sha256", sha, "--data_dir", str(data), "--call_limit_mib", "0.2", "--headroom_mib", "0",
               cwd=repo)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def machine_step(repo, call: int, *extra: str) -> subprocess.CompletedProcess:
    return run(repo / "benchmarks" / "gpu_route.py", "machine-step", f".gpu_route/calls/{call:02d}", "--no_probe",
               "--no_dense", *extra, cwd=repo)


def test_prepare_then_the_machine_steps_reassemble_the_file(fake_repo):
    repo, gguf, sha, data = fake_repo
    plan = prepare(repo, gguf, sha, data)
    check_calls(plan)
    assert plan["slices"] >= 4
    ignored = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=repo, capture_output=True,
                             text=True, check=True).stdout
    assert ".gpu_route" not in ignored  # prepare put it in .git/info/exclude: it never travels uncarried
    for c in plan["calls"][:-1]:
        carried = sum(p.stat().st_size for path in c["carry"] for p in (repo / path).rglob("*") if p.is_file())
        assert c["bytes"] == plan["tree_bytes"] + carried <= plan["limit_bytes"]
        done = machine_step(repo, c["call"])
        assert done.returncode == 0, done.stderr
    model = repo / ".gpu_route" / "model" / gguf.name
    assert hashlib.sha256(model.read_bytes()).hexdigest() == sha and model.read_bytes() == gguf.read_bytes()


def test_a_machine_that_went_back_or_a_damaged_slice_is_one_line(fake_repo):
    repo, gguf, sha, data = fake_repo
    prepare(repo, gguf, sha, data)
    assert machine_step(repo, 1).returncode == 0
    (repo / ".gpu_route" / "acc" / "slice_01.bin").unlink()  # a fresh machine: what the first call left is gone
    done = machine_step(repo, 2)
    assert done.returncode == 3 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("gpu_route: error: slices [1] are not on this machine")
    slice_3 = repo / ".gpu_route" / "calls" / "03" / "slice.bin"
    slice_3.write_bytes(b"x" + slice_3.read_bytes()[1:])  # a byte changed on the way
    (repo / ".gpu_route" / "acc" / "slice_01.bin").write_bytes(b"")  # present again, for the order check
    (repo / ".gpu_route" / "acc" / "slice_02.bin").write_bytes(b"")
    done = machine_step(repo, 3)
    assert done.returncode == 4 and "slice 3 arrived with sha256" in done.stderr


def test_a_gguf_with_another_sha256_is_refused_before_anything_is_sliced(fake_repo):
    repo, gguf, _, data = fake_repo
    done = run(repo / "benchmarks" / "gpu_route.py", "prepare", "--no_download", "--gguf", str(gguf), "--gguf_sha256",
               "0" * 64, "--data_dir", str(data), "--call_limit_mib", "0.2", cwd=repo)
    assert done.returncode == 2 and "allowed: " + "0" * 64 in done.stderr
    assert not (repo / ".gpu_route" / "calls").exists()


def test_outputs_over_a_files_limit_come_back_in_parts_that_join(route, tmp_path):
    folder = tmp_path / "eval"
    (folder / "run").mkdir(parents=True)
    payload = os.urandom(17 * MiB)  # incompressible: the archive is over the 16 MiB a file of $OUT may be
    (folder / "run" / "samples.bin").write_bytes(payload)
    (tmp_path / "out").mkdir()
    parts = route.pack(folder, tmp_path / "out")
    assert len(parts) == 2 and all(p.stat().st_size <= 16 * MiB for p in parts)
    joined = tmp_path / "joined.tar.gz"
    joined.write_bytes(b"".join(p.read_bytes() for p in sorted(parts)))
    with tarfile.open(joined) as tar:
        assert tar.extractfile("math500_gpu/run/samples.bin").read() == payload
    small = tmp_path / "small"
    small.mkdir()
    (small / "a.txt").write_text("a")
    (tmp_path / "out2").mkdir()
    assert [p.name for p in route.pack(small, tmp_path / "out2")] == ["math500_gpu.tar.gz"]


def test_a_failed_install_in_the_background_is_seen_without_waiting_out_the_wait(route, tmp_path):
    """The setup call's background install and probe: when the install fails (here: no wheels), the marker
    ``state/failed`` appears and the eval's wait for the probe gives up then, not after its 600 s."""
    state = tmp_path / "state"
    state.mkdir()
    (tmp_path / "wheels").mkdir()
    route.start_probe(tmp_path, {"batch": 4}, argparse.Namespace(device="cpu", probe_size="tiny"))
    assert route.wait_for(state / "probe.json", 600, "the probe") is False
    assert (state / "failed").exists() and not (state / "installed").exists()


def test_runs_still_going_at_the_deadline_are_interrupted_then_killed(route, tmp_path, monkeypatch):
    """The eval's runs side by side: one that ends by itself is recorded as it ended; one that outlives the
    deadline gets SIGINT (an eglr run then keeps its finished rollouts), and one that ignores it is killed
    ``INTERRUPT_S`` later (1 s here)."""
    import time

    monkeypatch.setattr(route, "INTERRUPT_S", 1)
    stops = "import time\ntry:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    raise SystemExit(130)"
    jobs = {"quick": ["-c", "print('done')"], "slow": ["-c", stops],
            "deaf": ["-c", "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)"]}
    ends = route.run_side_by_side(jobs, env=dict(os.environ), logs=tmp_path, deadline=time.monotonic() + 3)
    assert ends["quick"]["rc"] == 0 and ends["quick"]["ended"] == "running"
    assert ends["slow"]["rc"] == 130 and ends["slow"]["ended"] == "interrupted"
    assert ends["deaf"]["rc"] == -9 and ends["deaf"]["ended"] == "killed"
    assert (tmp_path / "quick.log").read_text() == "done\n" and ends["slow"]["argv"] == jobs["slow"]


@pytest.mark.slow
def test_the_probe_runs_at_tiny_shapes_on_the_cpu(route):
    """The probe the setup call starts on the GPU, at tiny shapes: the pool L = 1..10 decodes every request to its
    limit (eager on a CPU), and its figures are measured."""
    result = route.probe(None, size="tiny", device="cpu", batch=8, prompts=3, warmup_prompts=1, prompt_lens=(5, 9),
                         new_tokens=(2, 4))
    assert result["mode"] == "cpool" and result["spans"] == [1, 2, 3, 4]  # L = 1..N on the tiny model's 4 layers
    assert result["figures"]["requests"] == 3 * 4
    assert 3 * 4 * 2 <= result["tokens"] <= 3 * 4 * 4 and result["tokens_per_s"] > 0 and result["warmup_s"] > 0
