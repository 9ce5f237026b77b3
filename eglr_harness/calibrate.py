"""tau_h calibration (eglr-method.md §3): the 95th percentile of per-token entropies of a greedy
(L=0) run on a task's prompts, capped at 2.5 nats; cached on disk; and the ``eglr-calibrate``
command that writes the value into a model_configs preset.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
from pathlib import Path

import torch

from eglr_harness.config import TAU_H_CAP

logger = logging.getLogger(__name__)
CALIBRATION_QUANTILE = 0.95
DEFAULT_CALIB_LIMIT = 64


def calibrated_threshold(entropies: torch.Tensor, quantile: float = CALIBRATION_QUANTILE, cap: float = TAU_H_CAP) -> float:
    """min(quantile of per-token entropies, cap).  entropies: (n_tokens,) nats."""
    if entropies.numel() == 0:
        raise ValueError("tau_h calibration saw no generated tokens; raise max_gen_toks or calib_limit.")
    return min(float(torch.quantile(entropies.float(), quantile)), cap)


def cache_dir() -> Path:
    return Path(os.environ.get("EGLR_CACHE_DIR", Path.home() / ".cache" / "eglr_harness"))


def calibration_key(model_fingerprint: dict, contexts: list[str], gen_kwargs: dict) -> str:
    payload = json.dumps([model_fingerprint, contexts, gen_kwargs], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()


class TauHCache:
    """``key -> {"tau_h", "task", "model", "prompts", "tokens"}`` in one JSON file."""

    def __init__(self, path: Path | None = None):
        self.path = path or cache_dir() / "tau_h.json"

    def _read(self) -> dict:
        return json.loads(self.path.read_text()) if self.path.is_file() else {}

    def get(self, key: str) -> dict | None:
        return self._read().get(key)

    def put(self, key: str, record: dict) -> None:
        data = self._read()
        data[key] = record
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(self.path)


def main(argv: list[str] | None = None) -> None:
    """``eglr-calibrate``: calibrate tau_h for a model on tasks and write it into its preset."""
    parser = argparse.ArgumentParser(prog="eglr-calibrate", description=main.__doc__)
    parser.add_argument("--model_config", required=True, help="preset name in model_configs/ or a YAML path")
    parser.add_argument("--tasks", required=True, help="comma-separated lm-eval task names (e.g. gsm8k_eglr,math500_eglr)")
    parser.add_argument("--model_args", default="", help="extra eglr-hf model args, key=value,key2=value2")
    parser.add_argument("--calib_limit", type=int, default=DEFAULT_CALIB_LIMIT, help="prompts per task (default 64)")
    parser.add_argument("--gen_kwargs", default=None, help="e.g. max_gen_toks=256")
    parser.add_argument("--batch_size", default="8")
    parser.add_argument("--apply_chat_template", action="store_true")
    parser.add_argument("--no_write", action="store_true", help="print the thresholds without editing the preset")
    args = parser.parse_args(argv)

    import lm_eval

    from eglr_harness.lm_model import EglrHFLM
    from eglr_harness.presets import benchmark_of, write_tau_h

    logging.basicConfig(level=logging.INFO)
    extra = lm_eval.utils.simple_parse_args_string(args.model_args)
    lm = EglrHFLM(model_config=args.model_config, L=0, T=0.0, tau_h="auto", calib_limit=args.calib_limit,
                  batch_size=args.batch_size, **extra)
    lm.calibrate_always = True
    for task in args.tasks.split(","):
        lm_eval.simple_evaluate(model=lm, tasks=[task], limit=args.calib_limit, gen_kwargs=args.gen_kwargs,
                                apply_chat_template=args.apply_chat_template)
        value = lm.tau_h_by_task[task]
        print(f"{task}: tau_h = {value:.4f} nats")
        if not args.no_write:
            path = write_tau_h(args.model_config, benchmark_of(task), value)
            print(f"written to {path} (tau_h.{benchmark_of(task)})")
