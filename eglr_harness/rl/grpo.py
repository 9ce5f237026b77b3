"""One GRPO group: TRL's trainer on a fresh policy with an EGLR pool as its group, its step and rollout logs,
and the run's summary (``eglr-grpo``, :mod:`eglr_harness.commands.grpo`, drives it)."""

from __future__ import annotations

import logging
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from eglr_harness.core.cell import Cell
from eglr_harness.core.jsonl import dumps
from eglr_harness.core.outputs import atomic_write_text
from eglr_harness.rl.rollouts import EglrRollout, grpo_config, grpo_trainer, math_reward, trainable
from eglr_harness.scoring.extraction import extract_answer

logger = logging.getLogger("eglr_harness.rl.grpo")


def _policy(model_args: dict):
    """The model and tokenizer eglr-hf would evaluate (its preset and HFLM's loading), trainable."""
    from eglr_harness.harness.model import EglrHFLM  # noqa: PLC0415

    lm = EglrHFLM(**model_args, L=0)
    return trainable(lm.model), lm.tokenizer


def _recording_reward(rows: list):
    def math_reward_recorded(completions, answer, **kwargs):
        rewards = math_reward(completions, answer, **kwargs)
        step = kwargs["trainer_state"].global_step
        for i, reward in enumerate(rewards):
            fmt = kwargs.get("answer_format", ["math"] * len(rewards))[i]
            rows.append({"step": step, "doc_id": kwargs["doc_id"][i], "L": kwargs["L"][i], "T": kwargs["T"][i],
                         "reward": reward, "answer": extract_answer(kwargs["eglr_text"][i], fmt), "gold": answer[i],
                         "tokens": len(kwargs["completion_ids"][i]), "gated": kwargs["gated"][i],
                         "finish": kwargs["finish"][i], "text": kwargs["eglr_text"][i]})
        return rewards

    math_reward_recorded.__name__ = "math_reward"
    return math_reward_recorded


def run_group(name: str, rollout: EglrRollout, args, problems: list[dict], policy) -> dict:
    """Train ``policy`` (model, tokenizer: a fresh copy) with ``rollout``'s pool as the group; write its records."""
    import torch  # noqa: PLC0415
    from datasets import Dataset  # noqa: PLC0415

    model, tokenizer = policy
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="grpo_") as scratch:  # the Trainer's output_dir: nothing saved
        config = grpo_config(
            output_dir=scratch, per_device_train_batch_size=len(rollout.cells) * args.prompts_per_step,
            num_generations=len(rollout.cells), max_completion_length=args.max_completion_length,
            max_steps=args.steps, learning_rate=args.learning_rate, beta=0.0, logging_steps=1, report_to=[],
            save_strategy="no", seed=args.seed, use_cpu=not torch.cuda.is_available(),
            bf16=torch.cuda.is_available() and torch.cuda.is_bf16_supported())
        trainer = grpo_trainer(rollout, args=config, model=model, processing_class=tokenizer,
                               reward_funcs=[_recording_reward(rows)], train_dataset=Dataset.from_list(problems))
        started = time.time()
        trainer.train()
    steps = [h for h in trainer.state.log_history if "loss" in h]
    out = Path(args.output_dir) / name
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "steps.jsonl", "".join(dumps(s) + "\n" for s in steps))
    atomic_write_text(out / "rollouts.jsonl", "".join(dumps(r) + "\n" for r in rows))
    return {"name": name, "cells": [c.label for c in rollout.cells], "tau_h": rollout.tau_h,
            "steps": steps, "rows": rows, "wall_s": round(time.time() - started, 1)}


def summary_markdown(groups: list[dict], command: str, settings: dict) -> str:
    lines = ["# GRPO with EGLR pools: " + ", ".join(g["name"] for g in groups), "", "```bash", command, "```", ""]
    lines += [f"- {k}: {v}" for k, v in settings.items()]
    lines += ["", "## Reward per step (mean over the step's completions)", "",
              "| step | " + " | ".join(g["name"] for g in groups) + " |", "|---|" + "---|" * len(groups)]
    for i in range(max((len(g["steps"]) for g in groups), default=0)):
        cells = [f"{g['steps'][i]['reward']:.3f}" if i < len(g["steps"]) else "" for g in groups]
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    for g in groups:
        lines += ["", f"## {g['name']}: L×T = {', '.join(g['cells'])} (tau_h {g['tau_h']}, {g['wall_s']} s)", "",
                  "| cell | rollouts | mean reward | mean tokens | mean gated tokens | ended by EOS |",
                  "|---|---|---|---|---|---|"]
        by_cell = defaultdict(list)
        for row in g["rows"]:
            by_cell[Cell.of(row["L"], row["T"])].append(row)
        for cell in sorted(by_cell):
            rs = by_cell[cell]
            lines.append(f"| {cell.label} | {len(rs)} | {sum(r['reward'] for r in rs) / len(rs):.3f} | "
                         f"{sum(r['tokens'] for r in rs) / len(rs):.1f} | "
                         f"{sum(r['gated'] for r in rs) / len(rs):.1f} | "
                         f"{sum(r['finish'] == 'eos' for r in rs)}/{len(rs)} |")
        lines += ["", "| step | loss | grad norm | reward | reward std | groups with zero std |",
                  "|---|---|---|---|---|---|"]
        for s in g["steps"]:
            lines.append(f"| {s['step']} | {s['loss']:.4g} | {s['grad_norm']:.4g} | {s['reward']:.3f} | "
                         f"{s['reward_std']:.3f} | {s['frac_reward_zero_std']:.2f} |")
    return "\n".join(lines) + "\n"
