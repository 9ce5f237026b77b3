"""Mutation run: do the engine and adapter tests fail when the decoding package is subtly wrong?

Each mutant is one small, plausible edit to ``eglr_harness/decoding`` (the first four are the
edits of issue 15). For each, a temporary copy of the tree gets the edit and
``pytest -x tests/engine tests/lm`` runs there; a failing suite kills the mutant. A mutant whose
anchor text is no longer found exactly once (the code moved on) is reported as stale, not run.
Not part of CI: with one thread it takes about 7 minutes (2-core machine, 28 mutants).

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 python benchmarks/mutation_run.py --out benchmarks/results/mutation.json
    python benchmarks/mutation_run.py --only kl_swapped,refine_one_short   # a few mutants
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DECODING = "eglr_harness/decoding"
TESTS = ("tests/engine", "tests/lm")
# Not copied: version control, run outputs, caches.
IGNORED = shutil.ignore_patterns(".git", "results", "out", "__pycache__", ".pytest_cache", "*.egg-info", ".venv")


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # relative to eglr_harness/decoding
    old: str  # must occur exactly once in the file
    new: str
    why: str


MUTANTS = (
    # the four edits of issue 15
    Mutant("refine_one_short", "refiner.py", "for k in range(1, cfg.k_max + 1):", "for k in range(1, cfg.k_max):",
           "refinement stops one iteration early"),
    Mutant("kl_swapped", "refiner.py", "kl_divergence(logp, logp_prev)", "kl_divergence(logp_prev, logp)",
           "KL early exit computed as KL(p_{k-1} || p_k)"),
    Mutant("sampled_never_refined", "generate.py", "tau_kl=tau_kl, tau_h=tau_h,",
           "tau_kl=tau_kl, tau_h=math.inf if do_sample else tau_h,", "sampled rollouts (T > 0) never refined"),
    Mutant("sampler_uniform", "sampling.py", "torch.multinomial(p, 1, generator=g)",
           "torch.multinomial(torch.ones_like(p), 1, generator=g)", "seeded sampler ignores the scores"),
    # the maths
    Mutant("entropy_sign", "math.py", "return -(logp.exp() * logp).sum(dim=-1)",
           "return (logp.exp() * logp).sum(dim=-1)", "entropy with the wrong sign"),
    Mutant("gate_ignores_finished", "math.py", "return active & (entropies > tau_h)", "return entropies > tau_h",
           "finished rows gated and counted"),
    Mutant("norm_match_own_norm", "math.py", "scale = anchor.float().norm(dim=-1, keepdim=True) /",
           "scale = hidden.float().norm(dim=-1, keepdim=True) /", "norm-match keeps h's norm instead of the anchor's"),
    Mutant("fuse_swapped", "math.py", "return (1.0 - alpha) * anchor + alpha * refined",
           "return alpha * anchor + (1.0 - alpha) * refined", "fusion weights swapped"),
    Mutant("kl_unweighted", "math.py", "return (logp_new.exp() * (logp_new - logp_old)).sum(dim=-1)",
           "return (logp_new - logp_old).abs().mean(dim=-1)", "KL replaced by a mean absolute log-ratio"),
    Mutant("softcap_off", "math.py", "    if not cap:\n        return logits", "    if True:\n        return logits",
           "Gemma-2 final-logit soft-cap skipped"),
    # the refinement loop
    Mutant("kl_against_p0", "refiner.py", "                logp_prev = logp\n", "",
           "every iteration compared with p_0 instead of p_{k-1}"),
    Mutant("restart_from_h0", "refiner.py", "fused = fuse(anchor, norm_match(hidden, anchor), cfg.alpha)",
           "fused = fuse(anchor, norm_match(capture.last_hidden[rows].to(anchor.device), anchor), cfg.alpha)",
           "each iteration restarts from h^(N) of the normal pass"),
    Mutant("exited_rows_keep_going", "refiner.py", "chosen[running] = raw[running].to(chosen.dtype)",
           "chosen = raw.to(chosen.dtype)", "rows past their KL exit still take later iterations' logits"),
    Mutant("iterations_off_by_one", "refiner.py", "iterations[running] = k\n", "iterations[running] = k - 1\n",
           "accounting records k* - 1"),
    Mutant("anchor_wrong_layer", "refiner.py", "if index == self._top[0]:", "if index == self._top[-1]:",
           "anchor taken at layer N-1 instead of N-L"),
    Mutant("replay_keeps_stale_kv", "refiner.py", "torch.cat([keys[..., :-1, :], key_states], dim=-2)",
           "torch.cat([keys, key_states], dim=-2)", "refined query also attends to the unrefined current key"),
    Mutant("replay_ignores_refined_kv", "refiner.py",
           "return torch.cat([keys[..., :-1, :], key_states], dim=-2), torch.cat([values[..., :-1, :], value_states], dim=-2)",
           "return keys, values", "refined query attends to the normal pass's current key/value only"),
    Mutant("rotary_of_first_position", "refiner.py", "return tuple(t[:, -1:] for t in value)",
           "return tuple(t[:, :1] for t in value)", "after the prompt pass, refinement takes position 0's rotary angles"),
    Mutant("norm_match_args_swapped", "refiner.py", "norm_match(hidden, anchor)", "norm_match(anchor, hidden)",
           "the anchor rescaled to h's norm instead of h to the anchor's"),
    Mutant("gate_on_uncapped_logits", "refiner.py", "final = softcap(raw.float(), self.parts.logit_softcap)",
           "final = raw.float()", "entropy gate ignores the soft-cap"),
    Mutant("kl_on_uncapped_logits", "refiner.py",
           "logp = torch.log_softmax(softcap(raw.float(), self.parts.logit_softcap), dim=-1)",
           "logp = torch.log_softmax(raw.float(), dim=-1)", "KL exit ignores the soft-cap"),
    Mutant("gate_threshold_zero", "refiner.py", "entropy_gate(entropies, self.config.tau_h, active)",
           "entropy_gate(entropies, 0.0, active)", "tau_h ignored: every token refined"),
    # sampling, generation, accounting
    Mutant("sampler_double_temperature", "sampling.py", "probs = torch.softmax(scores.float(), dim=-1)",
           "probs = torch.softmax(scores.float() / 2, dim=-1)", "the draw flattens the warped scores again"),
    Mutant("sampler_fresh_generators", "sampling.py", "if self._generators is None:", "if True:",
           "generators re-seeded every step"),
    Mutant("seed_ignores_prompt", "sampling.py", "{','.join(map(str, prompt_tokens))}", "",
           "every row of a cell draws with the same seed"),
    Mutant("seed_ignores_salt", "generate.py", "row_seed(seed, seed_salt, p)", "row_seed(seed, '', p)",
           "cells and cycles share their draws"),
    Mutant("finished_rows_counted", "generate.py", "finished_rows=lambda: stopping_criteria.finished",
           "finished_rows=lambda: None", "finished rows keep being gated and counted"),
    Mutant("flops_count_tokens", "accounting.py", "self.refine_layer_evals += L * sum(gated_iterations)",
           "self.refine_layer_evals += L * len(gated_iterations)", "FLOP ratio ignores the iteration count"),
)


def copy_tree(dest: Path) -> Path:
    """A copy of the repository at dest/repo; dest/shared points at the benchmark data the tests read."""
    repo = dest / "repo"
    shutil.copytree(ROOT, repo, ignore=IGNORED, symlinks=True)
    shared = ROOT.parent / "shared"
    if shared.is_dir():
        (dest / "shared").symlink_to(shared)
    return repo


def run_tests(repo: Path, timeout_s: int) -> tuple[str, float, str]:
    """Run the suite in ``repo``: ("passed" | "failed" | "timeout", seconds, the failing test or the last line)."""
    # the copy's eglr_harness shadows any installed one
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *TESTS]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return "timeout", time.perf_counter() - started, ""
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    failed = [line.split(" - ")[0] for line in lines if line.startswith(("FAILED", "ERROR"))]
    summary = (failed or lines or [""])[0 if failed else -1]
    return ("passed" if done.returncode == 0 else "failed"), time.perf_counter() - started, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated mutant names (default: all)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per suite run; a timeout counts as killed")
    parser.add_argument("--out", type=Path, help="write the per-mutant results as JSON here")
    args = parser.parse_args(argv)
    known = {m.name: m for m in MUTANTS}
    names = [n for n in args.only.split(",") if n]
    if unknown := sorted(set(names) - set(known)):
        raise ValueError(f"`--only` names unknown mutants {unknown}; known: {sorted(known)}.")
    mutants = [known[n] for n in names] if names else list(MUTANTS)

    with tempfile.TemporaryDirectory(prefix="eglr_mutation_") as tmp:
        repo = copy_tree(Path(tmp))
        status, seconds, tail = run_tests(repo, args.timeout)
        print(f"baseline (no mutation): {status} in {seconds:.0f}s  {tail}", flush=True)
        if status != "passed":
            print("the unmutated suite must pass first", file=sys.stderr)
            return 2
        results = []
        for mutant in mutants:
            path = repo / DECODING / mutant.path
            original = path.read_text()
            if original.count(mutant.old) != 1:
                results.append({"name": mutant.name, "status": "stale", "why": mutant.why})
                print(f"{mutant.name:28s} stale (anchor text found {original.count(mutant.old)} times)", flush=True)
                continue
            path.write_text(original.replace(mutant.old, mutant.new))
            try:
                status, seconds, tail = run_tests(repo, args.timeout)
            finally:
                path.write_text(original)
            verdict = "survived" if status == "passed" else "killed"
            results.append({"name": mutant.name, "status": verdict, "suite": status, "seconds": round(seconds, 1),
                            "why": mutant.why, "tail": tail})
            print(f"{mutant.name:28s} {verdict:8s} {seconds:6.0f}s  {tail}", flush=True)

    ran = [r for r in results if r["status"] != "stale"]
    killed = sum(r["status"] == "killed" for r in ran)
    print(f"killed {killed}/{len(ran)} ({killed / max(len(ran), 1):.0%}); stale {len(results) - len(ran)}")
    if survivors := [r["name"] for r in ran if r["status"] == "survived"]:
        print("survived: " + ", ".join(survivors))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"tests": list(TESTS), "killed": killed, "total": len(ran),
                                        "mutants": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
