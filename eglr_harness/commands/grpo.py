"""``eglr-grpo``: a few GRPO steps per group spec from the same weights and prompts.

Each ``--group NAME:L=...,T=...`` trains a fresh copy of the model (``--model_args``, as eglr-hf
takes them) for ``--steps`` optimizer steps on the first ``--limit`` problems of an eglr task, with
that pool as GRPO's group (:class:`eglr_harness.rl.rollouts.EglrRollout`) and the tasks' grader as the reward
(:func:`eglr_harness.rl.rollouts.math_reward`). Written to ``--output_dir``:

- ``<NAME>/steps.jsonl``: per optimizer step, TRL's log line (loss, grad norm, reward mean and std,
  the per-cell reward ``eglr/reward/<cell>``, completion lengths, step time);
- ``<NAME>/rollouts.jsonl``: per completion, its ``step`` (the trainer's global step when it was
  generated: 0 feeds optimizer step 1), problem, cell, reward, extracted answer, tokens, gated
  tokens, why it ended and its text;
- ``summary.md``: reward per step and per cell of every group, and the run's settings and versions;
  written also when a group stops with an error (the groups that finished, and which one stopped).

Every argument and group (its pool, tau_h, generation options, ``L`` against the model's layers,
``compile`` against its device, a name per group that can be a folder) and ``--output_dir`` are
checked before the first group trains; a mistake is one line (exit status 2).

    eglr-grpo --model_args model_config=smollm2-135m-instruct --task gsm8k_eglr \\
        --limit 4 --group "lxt:L=0|2|4,T=0|0.7" --group "t_only:L=0,T=0-1.0:0.2" --steps 4 --output_dir out/grpo
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import math
import platform
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from eglr_harness.core.errors import UserError
from eglr_harness.core.interrupt import run_interruptible
from eglr_harness.core.outputs import atomic_write_text, check_writable

if TYPE_CHECKING:
    from eglr_harness.rl.rollouts import EglrRollout

# eglr_harness.rl (torch, TRL: tens of seconds on a busy machine) is imported once the flags that need neither
# are checked (_check_flags): a misspelt --group is refused at once
logger = logging.getLogger("eglr_harness.commands.grpo")


_GROUP_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


_EGLR_KEYS = ("L", "T", "alpha", "k_max", "tau_kl", "tau_h", "top_k", "top_p", "seed")


def parse_group(text: str) -> tuple[str, dict]:
    """``"lxt:L=0|2|4,T=0|0.7"`` -> ``("lxt", {"L": "0|2|4", "T": "0|0.7"})``; ValueError naming the option."""
    name, sep, spec = text.partition(":")
    pairs = [p.split("=", 1) for p in spec.split(",") if p.strip()] if sep else []
    if not name.strip() or not pairs or any(len(p) != 2 or p[0].strip() not in _EGLR_KEYS for p in pairs):
        raise ValueError(f"`--group`={text!r} is not allowed; allowed: NAME:KEY=VALUE,... with keys "
                         f"{', '.join(_EGLR_KEYS)} (e.g. 'lxt:L=0|2|4,T=0|0.7').")
    if not _GROUP_NAME.fullmatch(name.strip()) or name.strip() in (".", ".."):
        raise ValueError(f"`--group`={text!r}: the name {name.strip()!r} is not allowed; allowed: letters, digits, "
                         "_ . - (it names the folder <output_dir>/<name>/).")
    return name.strip(), {k.strip(): v.strip() for k, v in pairs}


def _main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="eglr-grpo", description=__doc__.split("\n")[0])
    parser.add_argument("--model_args", required=True, help="as eglr-hf takes them: model_config=... or pretrained=...")
    parser.add_argument("--task", required=True,
                        help="an eglr task: its prompts, gold answers, stop strings, tau_h key")
    parser.add_argument("--limit", type=int, default=4, help="problems (the task's first)")
    parser.add_argument("--doc_ids", default=None, help="problems by index instead (e.g. 1,3,4,22)")
    parser.add_argument("--group", action="append", required=True, help="NAME:L=...,T=...[,tau_h=...] (repeatable)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--prompts_per_step", type=int, default=2)
    parser.add_argument("--max_completion_length", type=int, default=128)
    parser.add_argument("--learning_rate", type=float, default=1e-6)
    parser.add_argument("--batch_size", type=int, default=16, help="rows the engine decodes together")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output_dir", required=True)
    args = parser.parse_args(argv)
    try:  # what is known without torch, at once
        _check_flags(args)
    except ValueError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from eglr_harness.harness.task_source import task_problems  # noqa: PLC0415
    from eglr_harness.rl import grpo as rl  # noqa: PLC0415 -- torch, TRL

    try:  # every group and argument, before any training
        model_args, rollouts, problems = _checked(args, task_problems)
        first_policy = rl._policy(model_args)
        for name, rollout in rollouts.items():
            try:
                rollout.check_model(first_policy[0])
            except ValueError as err:
                raise ValueError(f"`--group` {name}: {err}") from None
    except (UserError, ValueError) as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    groups: list[dict] = []
    unfinished = None
    try:
        for i, (name, rollout) in enumerate(rollouts.items()):
            unfinished = name
            groups.append(rl.run_group(name, rollout, args, problems,
                                       first_policy if i == 0 else rl._policy(model_args)))
        unfinished = None
    finally:  # a partial run keeps the summary of the groups that finished
        try:
            _write_summary(args, argv, groups, problems, unfinished)
        except UserError as err:
            if unfinished is None:
                raise
            # the group's own error is the one to see: a summary that cannot be written never hides it
            logger.error("%s (group %s stopped with the error below)", err, unfinished)


def _check_flags(args) -> None:
    """The flags and the group specs' form (``parse_group``, one name per group): what needs no import of torch or
    TRL, each mistake a ``ValueError`` naming it."""
    for flag, value in (("--steps", args.steps), ("--prompts_per_step", args.prompts_per_step),
                        ("--max_completion_length", args.max_completion_length), ("--batch_size", args.batch_size),
                        ("--limit", args.limit)):
        if value < 1:
            raise ValueError(f"`{flag}`={value} is not allowed; allowed: an int >= 1.")
    if not math.isfinite(args.learning_rate) or args.learning_rate <= 0:
        raise ValueError(f"`--learning_rate`={args.learning_rate} is not allowed; allowed: a float > 0.")
    names: set[str] = set()
    for text in args.group:
        name, _ = parse_group(text)
        if name in names:
            raise ValueError(f"`--group`={text!r}: the name {name!r} is taken by an earlier group; allowed: one name "
                             "per group (each writes <output_dir>/<name>/).")
        names.add(name)


def _checked(args, task_problems) -> tuple[dict, dict[str, EglrRollout], list[dict]]:
    """The run's arguments (the flags checked already: ``_check_flags``), every group's rollouts and the problems,
    each mistake a ``ValueError`` naming it."""
    from eglr_harness.harness.preflight import parse_args_string  # noqa: PLC0415
    from eglr_harness.rl.rollouts import EglrRollout  # noqa: PLC0415

    model_args = parse_args_string(args.model_args)
    rollouts: dict[str, EglrRollout] = {}
    for text in args.group:
        name, eglr = parse_group(text)
        try:
            rollouts[name] = EglrRollout(model_config=model_args.get("model_config"), task=args.task,
                                         batch_size=args.batch_size, **eglr)
        except ValueError as err:
            raise ValueError(f"`--group`={text!r}: {err}") from None
        if len(rollouts[name].cells) < 2:  # TRL refuses it, but only once the policy has loaded (minutes)
            raise ValueError(f"`--group`={text!r}: the pool has {len(rollouts[name].cells)} cell (one completion per "
                             "problem); allowed: a pool of at least 2 cells (GRPO's advantage compares the completions "
                             "of a group: TRL's num_generations >= 2).")
    # the model args as eglr-hf checks them, and every group's L against the layers its config declares:
    # before the policy loads (`--group a:L=99` loaded the policy first)
    from eglr_harness.harness.preflight import check_run_args  # noqa: PLC0415

    layers = check_run_args(model_args).declared_layers
    if layers is not None:
        for text, (name, rollout) in zip(args.group, rollouts.items()):
            try:
                rollout.settings.check_layers(layers)
                rollout.settings.check_cells(rollout.cells, layers)
            except ValueError as err:
                raise ValueError(f"`--group`={text!r}: {err}") from None
    check_writable(args.output_dir, "--output_dir")
    return model_args, rollouts, _problems(args, task_problems)


def _write_summary(args, argv, groups: list[dict], problems: list[dict], unfinished: str | None) -> None:
    from eglr_harness.rl.grpo import summary_markdown  # noqa: PLC0415

    versions = {p: importlib.metadata.version(p) for p in ("torch", "transformers", "trl", "lm_eval")}
    settings = {"model_args": args.model_args, "task": args.task,
                "problems": f"{len(problems)} (doc_id {', '.join(str(p['doc_id']) for p in problems)})",
                "steps": args.steps,
                "prompts per step": args.prompts_per_step, "max new tokens": args.max_completion_length,
                "learning rate": args.learning_rate, "seed": args.seed, "beta": 0.0, "versions": versions,
                "machine": f"{platform.machine()}, {'CUDA' if _cuda() else 'CPU'}",
                "wall time (s)": {g["name"]: g["wall_s"] for g in groups}}
    if unfinished is not None:
        settings["unfinished"] = (f"group {unfinished} stopped with an error (see the log); the groups after it "
                                  "did not run")
    command = "eglr-grpo " + " ".join(_quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    Path(args.output_dir).mkdir(parents=True, exist_ok=True)  # check_writable leaves no folder it made
    atomic_write_text(Path(args.output_dir) / "summary.md", summary_markdown(groups, command, settings))
    logger.info("wrote %s", Path(args.output_dir) / "summary.md")


def _problems(args, task_problems) -> list[dict]:
    if args.doc_ids is None:
        return task_problems(args.task, limit=args.limit)
    try:
        wanted = [int(i) for i in args.doc_ids.split(",")]
    except ValueError:
        raise ValueError(f"`--doc_ids`={args.doc_ids!r} is not allowed; allowed: problem indices, e.g. "
                         "1,3,4,22.") from None
    problems = task_problems(args.task, limit=max(wanted) + 1)
    if max(wanted) >= len(problems) or min(wanted) < 0:
        raise ValueError(f"`--doc_ids`={args.doc_ids!r}: task {args.task!r} has problems 0..{len(problems) - 1}.")
    return [problems[i] for i in wanted]


def _cuda() -> bool:
    import torch  # noqa: PLC0415

    return torch.cuda.is_available()


def _quote(arg: str) -> str:
    return f'"{arg}"' if any(c in arg for c in " |;") else arg



def main(argv=None) -> int:
    """Console entry point of ``eglr-grpo`` (:func:`_main`); Ctrl-C or SIGTERM end it with one line saying what was
    stored and the command that resumes (core/interrupt.py)."""
    return run_interruptible("eglr-grpo", lambda: _main(argv), argv)

if __name__ == "__main__":
    main()
