"""Running the GPU checks: ``main`` runs the chosen checks on the chosen families, each family within its
budget (``run_family``), and writes the report with its one-line-per-family summary (``summarise``)."""

from __future__ import annotations

import importlib.util
import json
import logging
import platform
import time
from pathlib import Path

import torch

from .budget import Budget, BudgetExhausted
from .cli import parse_args
from .common import CAPTURED_SUMMARY, PAPER, _free
from .exactness import check_exactness
from .models import FAMILIES, family_config, sharpen_factor
from .placement import check_placement
from .pool import check_pool
from .speed import check_speed_and_memory

logger = logging.getLogger(__name__)


def environment(device: str) -> dict:
    import transformers

    env = {"device": device, "python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__, "platform": platform.platform()}
    for package in ("accelerate", "flash_attn"):
        spec = importlib.util.find_spec(package)
        env[package] = getattr(__import__(package), "__version__", "?") if spec is not None else None
    if device.startswith("cuda"):
        env["device_name"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    else:
        env["device_name"] = platform.processor() or platform.machine()
        env["cpu_threads"] = torch.get_num_threads()
    return env


def main(argv: list[str] | None = None) -> dict:
    """Run the chosen checks on the chosen families; returns (and with --out writes) the results.

    The JSON is rewritten after every part and every speed mode: a run cut short keeps what it finished."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    device, checks = args.device, set(args.checks)
    report: dict = {"settings": {k: v for k, v in vars(args).items()}, "paper_settings": PAPER,
                    "environment": environment(device), "families": {}}
    started = time.perf_counter()

    def save() -> None:
        report["wall_s"] = time.perf_counter() - started
        report["summary"] = summarise(report)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(report, indent=1, default=str) + "\n")

    for name in args.families:
        family = FAMILIES[name]
        config = family_config(name, args.size)
        entry: dict = {"source": family.source, "config_cls": family.config_cls, "random_init": family.random_init,
                       "output_embedding_scale": sharpen_factor(config, args.logit_std),
                       "config": {k: v for k, v in config.to_diff_dict().items() if not k.startswith("_")}}
        report["families"][name] = entry
        run_family(name, entry, args, device, checks, save)
        logger.info("%s done (%.0f s so far)", name, time.perf_counter() - started)
        save()
    print(json.dumps(report["summary"], indent=1, default=str))
    return report


def run_family(name: str, entry: dict, args, device: str, checks: set[str], save) -> None:
    """The checks of one family within its budget, in ``entry``: exactness, placement, speed (+ memory), pool.

    A part the budget does not reach is ``{"skipped": ...}``; the one the alarm interrupts keeps what
    it finished and says ``"interrupted"``."""
    budget = Budget(args.budget_s)
    entry["budget"] = {"budget_s": args.budget_s}
    parts = [part for part in ("exactness", "placement", "speed", "pool") if part in checks or
             (part == "speed" and "memory" in checks)]
    checks_of = {"exactness": check_exactness, "placement": check_placement}
    running = None
    try:
        with budget.alarm():
            for part in parts:
                if not budget.allows():
                    entry[part] = {"skipped": budget.skip_reason()}
                    continue
                running = part
                if part in ("speed", "pool"):  # filled mode by mode, saved after each
                    result = entry[part] = {}
                    out = (guarded(check_speed_and_memory, name, args, device, checks, result, budget, save)
                           if part == "speed" else guarded(check_pool, name, args, device, result, budget, save))
                    if out is not result:  # an error: keep the modes that finished beside it
                        result.update(out)
                else:
                    entry[part] = guarded(checks_of[part], name, args, device)
                running = None
                save()
    except BudgetExhausted as spent:
        logger.warning("%s: %s; %s interrupted, the rest skipped", name, spent, running)
        if running is not None:
            previous = entry.get(running) if isinstance(entry.get(running), dict) else {}
            during = previous.pop("running", running)
            entry[running] = {**previous, "interrupted": f"{spent} (during {during})"}
        for part in parts[parts.index(running) + 1 if running in parts else len(parts):]:
            entry.setdefault(part, {"skipped": budget.skip_reason()})
        try:  # an interrupted CUDA-graph capture may leave the device unusable: the report comes first
            _free(device)
        except Exception:  # noqa: BLE001
            logger.exception("%s: freeing the device after the interruption failed", name)
    entry["budget"].update({"spent_s": budget.elapsed(), "exhausted": budget.exhausted})


def guarded(check, name: str, args, device: str, *rest) -> dict:
    """Run one check; an exception becomes {"ok": False, "error": ...} so the other checks still run."""
    try:
        return check(name, args, device, *rest)
    except Exception as error:  # noqa: BLE001 - reported in the JSON, with the traceback in the log
        logger.exception("%s: %s failed", name, check.__name__)
        _free(device)
        return {"ok": False, "error": f"{type(error).__name__}: {error}"}


def summarise(report: dict) -> dict:
    """One line per family and check: the verdicts, the headline speed figures, the goals, what was skipped."""
    out = {}
    for name, entry in report["families"].items():
        line = {}
        exact = entry.get("exactness")
        if exact is not None:
            line["exact"] = exact.get("ok", exact.get("skipped") or exact.get("interrupted"))
            cont = exact.get("continuous_fp32")
            if cont:
                line["exact[continuous]"] = cont["L0_equals_generate"] and all(
                    c["tokens_equal"] for c in cont["vs_naive"].values())
        if "placement" in entry:
            line["placement"] = entry["placement"].get("ok", entry["placement"].get("skipped"))
        speed = entry.get("speed", {})
        for batch, figures in speed.get("batches", {}).items():
            line[f"b{batch}"] = {k: round(figures[k], 3) for k in (
                "wall_ratio_L0_vs_generate", "wall_ratio_L_vs_L0", "wall_ratio_generate_static_vs_generate",
                "wall_ratio_L0_vs_generate_static[continuous]", "wall_ratio_L_vs_L0[continuous]",
                "wall_ratio_L0_vs_generate_static[continuous,compiled]", "wall_ratio_L_vs_L0[continuous,compiled]",
                "per_row_bound", "batched_bound", "rho") if figures.get(k) is not None}
            goals = {goal: v["met"] for goal, v in figures.get("goals", {}).items() if v["met"] is not None}
            if goals:
                line[f"b{batch}"]["goals_met"] = goals
            skipped = sorted(mode for mode, run in figures["runs"].items() if "skipped" in run)
            if skipped:
                line[f"b{batch}"]["skipped"] = skipped
            captured = {mode: {k: run.get(k) for k in CAPTURED_SUMMARY} for mode, run in figures["runs"].items()
                        if "dynamo_graphs_warmup" in run}
            if captured:
                line[f"b{batch}"]["captured"] = captured
        pool = entry.get("pool")
        if pool is not None:
            line["pool"] = {mode: run.get("tokens_per_s", run.get("skipped")) for mode, run in pool.get("modes",
                                                                                                        {}).items()}
            for key in ("skipped", "interrupted", "error"):
                if key in pool:
                    line["pool"][key] = pool[key]
        for key in ("error", "interrupted", "skipped"):
            if key in speed:
                line[f"speed_{key}"] = speed[key]
        if "memory" in speed:
            line["memory_peak_ratio"] = speed["memory"].get("peak_ratio", speed["memory"].get("skipped"))
        if entry.get("budget", {}).get("exhausted"):
            line["budget"] = f"spent ({entry['budget']['spent_s']:.0f} s of {entry['budget']['budget_s']:g})"
        out[name] = line
    return out
