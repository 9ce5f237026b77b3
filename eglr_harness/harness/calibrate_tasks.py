"""tau_h calibration through lm-eval, for ``eglr-calibrate``: eglr-hf at L=0 over each task, its token
entropies' quantile per task (the rule: :mod:`eglr_harness.run.calibration`)."""

from __future__ import annotations

from collections.abc import Iterator

import lm_eval

from eglr_harness.harness.model import EglrHFLM


def calibrate_tasks(model_config: str, model_args: str, tasks: list[str], *, calib_limit: int | float,
                    batch_size, gen_kwargs: str | None,
                    apply_chat_template: bool) -> Iterator[tuple[str, float, int | None]]:
    """Yield ``(task, tau_h, token entropies it came from or None)`` per task, decoding each task's first
    ``calib_limit`` problems once (``model_args``: more eglr-hf model args, as ``--model_args`` gives them)."""
    extra = lm_eval.utils.simple_parse_args_string(model_args)
    lm = EglrHFLM(model_config=model_config, L=0, T=0.0, tau_h="auto", calib_limit=calib_limit,
                  batch_size=batch_size, **extra)
    lm.runner.calibrate_always = True
    for task in tasks:
        lm_eval.simple_evaluate(model=lm, tasks=[task], limit=calib_limit, gen_kwargs=gen_kwargs,
                                apply_chat_template=apply_chat_template)
        tokens = (lm.accounts.calibration_source.get(task) or {}).get("entropy_tokens")
        yield task, lm.tau_h_by_task[task], tokens
