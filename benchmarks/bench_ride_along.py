"""Where a continuous run's refinement costs its time: L=10 against L=0 on the same requests, step by step.

The continuous engine lets refining rows ride along: a step runs layers 0..join-1 on its A advancing rows and
join..N-1 on A + R rows, the R refining rows entering at join = N - max L (``fixed_step.decode_step``). This
script decodes the same requests at L=0 and at L=10 (greedy, ``--tau_h``, alpha 0.2, k_max 3, tau_kl 5e-4) through
one ``ContinuousEngine`` per mode, the runs interleaved (L0, L10_before, L10, L0, ...), and takes each run apart.
Modes (``--modes``): ``L0``; ``L10``, the engine as it is; ``L10_before``, the same engine with its step as it ran
before steps read less for their refining rows (``step_before_the_change``), so that before and after are timed
in one process.

- **steps**: decoding steps, steps per emitted token, advancing rows A and refining rows R per step (mean, and the
  share of steps with R > 0), row-steps of each kind, and the tail (steps with fewer rows than ``--batch_size``);
- **time**: the run's wall time split into prefill (the engine's ``prefill_report``), the steps and the host loop
  around them (scheduler, uploads, the read's bookkeeping); each step split into the decoder layers below ``join``
  (A rows) and from ``join`` on (A + R rows), the final norm and unembedding, ``settle`` (gate, exit rule,
  processors, token, slot writes) and the rest (embedding, masks, rotary angles);
- **per row**: seconds per row-layer below and above ``join``, and unembedding + settle seconds per row, fitted
  over the run's steps (least squares on the row count: a step's fixed part and its per-row part);
- **ratios**: each L10 mode over L0 of the wall, the process's CPU time and each part, within one repeat (the
  machine is shared: ratios of interleaved runs, not absolute times, are the figures; the CPU time, one thread,
  moves less with the machine's load than the wall); the FLOP bounds (``1 + rho*k*L/N``, and with the
  unembedding counted: ``1 + rho*k*(L*layer + head)/(N*layer + head)``).

Eager steps only (``compile=auto`` on a CPU): the step's row counts are exact, no bucket pads them. ``settle`` and
the unembedding are timed by wrapping them, the decoder layers by forward hooks (``Probe``): a few microseconds a
call, the same in every mode.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/bench_ride_along.py --prompts 32 --batch_size 32 \\
        --max_new_tokens 96 --repeats 2 --out benchmarks/results/smollm2_cpu_ride_along.json
    python benchmarks/bench_ride_along.py --tiny --out /tmp/ride.json   # seconds: a tiny random model (CI)

Prompts: GSM8K test questions from ``--first`` on (default 400, past the ones calibrations read), with SmolLM2's
chat template and bench_decoding.py's instruction. ``--tiny``: a tiny random Llama (10 layers) with SmolLM2's
tokenizer, ``TINY``'s settings for the flags left at their defaults (its entropies are near log V: every token is
gated).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STOP = ("<|im_end|>",)
SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."  # bench_decoding.py's
TINY = {"prompts": 3, "batch_size": 2, "max_new_tokens": 5, "repeats": 1}
MODES = {"L0": 0, "L10": 10, "L10_before": 10}  # mode -> L; L10_before runs under ``step_before_the_change``


@contextmanager
def step_before_the_change():
    """The decoding step as it ran before steps read less for their refining rows (2026-12-02): a step of refining
    rows only still ran one advancing row, the trash slot, through every layer (its key's A was at least 1), and
    every step attended over every slot's K/V (no gather: ``GATHER_SHARE`` 0). Set for the runs of ``L10_before``
    only, so that the engine before and after are timed in one process, interleaved."""
    from eglr_harness.decoding.continuous import fixed_step
    from eglr_harness.decoding.continuous.step_key import StepSizes

    key, share = StepSizes.key, fixed_step.GATHER_SHARE
    StepSizes.key = lambda self, advancing, refining, needed: key(self, max(advancing, 1), refining, needed)
    fixed_step.GATHER_SHARE = 0.0
    try:
        yield
    finally:
        StepSizes.key, fixed_step.GATHER_SHARE = key, share


def chat_prompts(tokenizer, first: int, n: int) -> list[tuple[int, ...]]:
    """The GSM8K test questions first..first+n-1 of $EGLR_DATA_DIR as SmolLM2 chat prompts, token ids."""
    data = Path(os.environ.get("EGLR_DATA_DIR", ROOT.parent / "shared" / "data")) / "gsm8k" / "test.jsonl"
    lines = data.read_text().splitlines()
    if first + n > len(lines):
        raise SystemExit(f"bench_ride_along.py: --first {first} + --prompts {n} > the {len(lines)} questions of {data}")
    prompts = []
    for line in lines[first:first + n]:
        text = tokenizer.apply_chat_template([{"role": "user", "content": json.loads(line)["question"] + SUFFIX}],
                                             tokenize=False, add_generation_prompt=True)
        prompts.append(tuple(tokenizer(text, add_special_tokens=False)["input_ids"]))
    return prompts


def requests_for(prompts, L: int, tau_h: float, max_new_tokens: int) -> list:
    from eglr_harness.core.config import EglrConfig
    from eglr_harness.decoding.contract import Request

    cell = EglrConfig(L=L, alpha=0.2, k_max=3, tau_kl=5e-4, tau_h=tau_h) if L else EglrConfig(L=0)
    return [Request(prompt, cell, max_new_tokens, stop_strings=STOP) for prompt in prompts]


class Probe:
    """Times one engine's decoding steps by parts: wraps its step function, ``settle`` (``fixed_step``'s, as the
    step calls it) and the stack's unembedding (``logits``), times each decoder layer by forward hooks (the step's
    ``layers`` function is left as it is: the step decides from it how it runs), and keeps one record per step.
    ``records`` is emptied by ``take``."""

    def __init__(self, engine):
        from eglr_harness.decoding.continuous import fixed_step

        self.engine, self.fixed_step = engine, fixed_step
        self.records: list[dict] = []
        self.current: dict | None = None
        self._layer_started = 0.0
        self._step = engine.step_fn
        self._settle, self._logits = fixed_step.settle, engine.stack.logits
        engine.step_fn = self.step
        object.__setattr__(engine.stack, "logits", self.logits)  # a frozen dataclass: its instance only
        for index, layer in enumerate(engine.stack.parts.layers):
            layer.register_forward_pre_hook(self._layer_starts)
            layer.register_forward_hook(lambda *_, index=index: self._layer_ends(index))

    def _layer_starts(self, *_):
        self._layer_started = time.perf_counter()

    def _layer_ends(self, index: int):
        if self.current is not None:
            part = "below_s" if index < self.current["join"] else "above_s"
            self.current[part] += time.perf_counter() - self._layer_started

    def step(self, stack, key, state, cache, advancing, refining):
        trash = state.position.shape[0] - 1  # padding rows name it (a step of refining rows only runs one)
        self.current = record = {"A": int((advancing != trash).sum()), "R": int((refining != trash).sum()),
                                 "A_run": int(advancing.shape[0]), "R_run": int(refining.shape[0]), "width": key.width,
                                 "join": key.invariants.join_layer, "below_s": 0.0, "above_s": 0.0,
                                 "logits_s": 0.0, "settle_s": 0.0}
        self.fixed_step.settle = self.settle
        started, cpu = time.perf_counter(), time.process_time()
        try:
            read = self._step(stack, key, state, cache, advancing, refining)
        finally:
            self.fixed_step.settle = self._settle
            self.current = None
        record["step_s"], record["step_cpu_s"] = time.perf_counter() - started, time.process_time() - cpu
        self.records.append(record)
        return read

    def settle(self, *args):
        started = time.perf_counter()
        out = self._settle(*args)
        self.current["settle_s"] += time.perf_counter() - started
        return out

    def logits(self, last_hidden):
        started = time.perf_counter()
        out = self._logits(last_hidden)
        if self.current is not None:
            self.current["logits_s"] += time.perf_counter() - started
        return out

    def take(self) -> list[dict]:
        records, self.records = self.records, []
        return records


def fit(xs: list[float], ys: list[float]) -> dict:
    """Least squares y = fixed + per_row * x (a step's fixed part and its part per row); None without two xs."""
    n = len(xs)
    if n < 2 or len(set(xs)) < 2:
        return {"fixed_s": None, "per_row_s": None}
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return {"fixed_s": my - slope * mx, "per_row_s": slope}


def summarise(records: list[dict], wall: float, cpu: float, prefill_s: float, outcomes, batch: int,
              num_layers: int) -> dict:
    """One run's figures (the module docstring's list)."""
    steps = len(records)
    tokens = sum(len(o.tokens) for o in outcomes)
    gated = sum(o.gated for o in outcomes)
    iterations = sum(k * m for o in outcomes for k, m in o.iterations.items())
    total = {part: sum(r[part] for r in records) for part in ("step_s", "below_s", "above_s", "logits_s", "settle_s")}
    join = records[0]["join"] if records else num_layers
    rows = [r["A"] + r["R"] for r in records]
    summary = {
        "wall_s": wall, "cpu_s": cpu, "prefill_s": prefill_s, "steps_s": total["step_s"],
        "steps_cpu_s": sum(r["step_cpu_s"] for r in records),
        "host_loop_s": wall - prefill_s - total["step_s"],
        "layers_below_join_s": total["below_s"], "layers_from_join_s": total["above_s"],
        "unembedding_s": total["logits_s"], "settle_s": total["settle_s"],
        "step_rest_s": total["step_s"] - total["below_s"] - total["above_s"] - total["logits_s"] - total["settle_s"],
        "tokens": tokens, "gated_tokens": gated, "iterations": iterations,
        "rho": gated / tokens if tokens else 0.0, "mean_iterations": iterations / gated if gated else 0.0,
        "steps": steps, "steps_per_token": steps / tokens if tokens else None,
        "advancing_row_steps": sum(r["A"] for r in records), "refining_row_steps": sum(r["R"] for r in records),
        "mean_A": sum(r["A"] for r in records) / max(steps, 1), "mean_R": sum(r["R"] for r in records) / max(steps, 1),
        "share_of_steps_with_R": sum(1 for r in records if r["R"]) / max(steps, 1),
        "max_R": max((r["R"] for r in records), default=0),
        "steps_without_advancing_rows": sum(1 for r in records if not r["A"]),
        "padding_row_steps": sum(r["A_run"] + r["R_run"] - r["A"] - r["R"] for r in records),
        "tail_steps": sum(1 for n in rows if n < batch),
        "tail_steps_s": sum(r["step_s"] for r, n in zip(records, rows) if n < batch),
        "join_layer": join,
    }
    # per row: each layer group's seconds against its row count, per layer; unembedding + settle against A + R
    run = [r["A_run"] + r["R_run"] for r in records]  # the rows the step computed, padding included
    below = fit([r["A_run"] for r in records], [r["below_s"] / max(join, 1) for r in records])
    above = fit(run, [r["above_s"] / max(num_layers - join, 1) for r in records])
    head = fit(run, [r["logits_s"] + r["settle_s"] for r in records])
    step = fit(run, [r["step_s"] for r in records])
    summary["fit"] = {"layer_below_join": below, "layer_from_join": above, "unembedding_and_settle": head,
                      "step": step}
    return summary


RATIO_KEYS = ("wall_s", "cpu_s", "prefill_s", "steps_s", "steps_cpu_s", "host_loop_s", "layers_below_join_s",
              "layers_from_join_s", "unembedding_s", "settle_s", "step_rest_s", "steps", "tail_steps", "tail_steps_s")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--first", type=int, default=400, help="the first GSM8K test question decoded")
    parser.add_argument("--batch_size", type=int, default=32, help="the engine's max_batch")
    parser.add_argument("--max_new_tokens", type=int, default=96)
    parser.add_argument("--tau_h", type=float, default=2.5, help="the L=10 cell's entropy gate (nats)")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved runs per mode (the best counts)")
    parser.add_argument("--refine_headroom", type=float, default=0.5, help="the engine's (its default: 0.5)")
    parser.add_argument("--modes", default="L0,L10_before,L10", help=f"comma-separated, of {', '.join(MODES)}; "
                        "L0 is needed (the ratios are to it)")
    parser.add_argument("--tiny", action="store_true", help="a tiny random model and TINY's settings: seconds (CI)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.tiny:
        from bench_prefill import tiny_defaults  # this folder's

        tiny_defaults(args, parser, TINY)
    for name in ("prompts", "batch_size", "max_new_tokens", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)} is not allowed; allowed: an int >= 1")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not set(modes) <= set(MODES) or "L0" not in modes or len(modes) < 2:
        parser.error(f"--modes {args.modes!r} is not allowed; allowed: L0 and one or more of {', '.join(MODES)}")

    import torch

    from eglr_harness.decoding.continuous.engine import ContinuousEngine

    from bench_prefill import bench_model  # this folder's: tiny, or SmolLM2-135M-Instruct in fp32

    model, tokenizer = bench_model(args.tiny)
    prompts = chat_prompts(tokenizer, args.first, args.prompts)
    num_layers = model.config.num_hidden_layers
    requests = {mode: requests_for(prompts, MODES[mode], args.tau_h, args.max_new_tokens) for mode in modes}
    engines, probes = {}, {}
    for mode in modes:
        engines[mode] = ContinuousEngine(model, max_batch=args.batch_size, eos_token_ids=[tokenizer.eos_token_id],
                                         tokenizer=tokenizer, refine_headroom=args.refine_headroom)
        probes[mode] = Probe(engines[mode])
        engines[mode].run(requests[mode][:1])  # warm-up, untimed: one row (allocator, first calls)
        probes[mode].take()
    runs: dict[str, list[dict]] = defaultdict(list)
    tokens: dict[str, list] = defaultdict(list)  # per mode, each repeat's tokens
    for repeat in range(args.repeats):
        for mode, engine in engines.items():
            before = engine.prefill_report()["seconds"]
            started, cpu = time.perf_counter(), time.process_time()
            with step_before_the_change() if mode == "L10_before" else nullcontext():
                outcomes = engine.run(requests[mode])
            wall, cpu = time.perf_counter() - started, time.process_time() - cpu
            prefill_s = engine.prefill_report()["seconds"] - before
            run = summarise(probes[mode].take(), wall, cpu, prefill_s, outcomes, args.batch_size, num_layers)
            runs[mode].append(run)
            tokens[mode].append([o.tokens for o in outcomes])
            print(f"repeat {repeat} {mode}: wall {wall:.1f} s (prefill {prefill_s:.1f}, steps {run['steps_s']:.1f}), "
                  f"{run['steps']} steps, mean A {run['mean_A']:.1f} R {run['mean_R']:.1f}", flush=True)
    # per repeat, each L10 mode over its interleaved L0 neighbour, part by part; the best repeat: the fastest in all
    best = min(range(args.repeats), key=lambda i: sum(runs[mode][i]["wall_s"] for mode in modes))
    head_share = _head_share(model)
    summary: dict = {"unembedding_per_layer": head_share}
    for mode in modes[1:] if modes[0] == "L0" else [m for m in modes if m != "L0"]:
        ratios = [{key: (r[key] / r0[key] if r0[key] else None) for key in RATIO_KEYS}
                  for r0, r in zip(runs["L0"], runs[mode])]
        run, k = runs[mode][best], runs[mode][best]["mean_iterations"]
        summary[mode] = {
            "wall_ratio_vs_L0": ratios[best]["wall_s"], "wall_ratios_by_repeat": [r["wall_s"] for r in ratios],
            "cpu_ratio_vs_L0": ratios[best]["cpu_s"], "cpu_ratios_by_repeat": [r["cpu_s"] for r in ratios],
            "steps_cpu_ratios_by_repeat": [r["steps_cpu_s"] for r in ratios],
            "decode_wall_ratio_vs_L0": (run["wall_s"] - run["prefill_s"]) /
            (runs["L0"][best]["wall_s"] - runs["L0"][best]["prefill_s"]),
            "ratios_vs_L0": ratios[best],
            "per_row_bound": 1 + run["rho"] * k * MODES[mode] / num_layers,
            "per_row_bound_with_unembedding": 1 + run["rho"] * k * (MODES[mode] + head_share) /
            (num_layers + head_share),
        }
    summary["same_tokens_across_repeats"] = {mode: all(t == ts[0] for t in ts) for mode, ts in tokens.items()}
    if "L10" in tokens and "L10_before" in tokens:
        summary["same_tokens_L10_before_and_after"] = tokens["L10"][0] == tokens["L10_before"][0]
    print(json.dumps(summary, indent=1))
    if args.out:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else None
        command = ("OMP_NUM_THREADS=" + os.environ.get("OMP_NUM_THREADS", "")
                   + " python benchmarks/bench_ride_along.py " + " ".join(argv if argv is not None else sys.argv[1:]))
        machine = {"cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "loadavg_at_end": load,
                   "python": platform.python_version(), "torch": torch.__version__, "commit": commit}
        model_name = "tiny random Llama, 10 layers" if args.tiny else "SmolLM2-135M-Instruct fp32"
        settings = {**vars(args), "model": model_name}
        Path(args.out).write_text(json.dumps({"command": command, "settings": settings, "machine": machine,
                                              "summary": summary, "best_repeat": best, "runs": runs}, indent=1) + "\n")


def _head_share(model) -> float:
    """The unembedding's multiply-adds per row over one decoder layer's (its weights' sizes: dense layers)."""
    layer = sum(p.numel() for p in model.model.layers[0].parameters() if p.dim() == 2)
    return model.get_output_embeddings().weight.numel() / layer


if __name__ == "__main__":
    main()
