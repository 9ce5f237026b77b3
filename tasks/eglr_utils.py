"""Glue between the eglr task YAMLs and eglr_harness (loaded by lm-eval through ``!function``).

Everything of substance lives in the package: data loading in :mod:`eglr_harness.data`, answers
and metrics in :mod:`eglr_harness.scoring`. Importing this module also registers the eglr
filters and aggregations with lm-eval, so the YAMLs' ``function: eglr_...`` names resolve even
when the package's autoload is switched off.
"""

from __future__ import annotations

import eglr_harness.harness.registry  # noqa: F401  (registers filters/aggregations)
from eglr_harness.data import load_dataset_dict
from eglr_harness.scoring.doc_scores import GRID_SUB_POOLS, score_document

# Qwen2.5-Math's chain-of-thought instruction, in the user turn (works with every chat template,
# including those without a system role).
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def load_benchmark(eglr_benchmark: str, eglr_data_dir: str | None = None, eglr_split: str | None = None,
                   eglr_demo_n: int | None = None, eglr_demo_seed: int | None = None,
                   eglr_demo_levels=None, **_ignored):
    """``custom_dataset`` of every eglr task: ``{split: Dataset}`` in the internal schema.

    lm-eval calls it with the task's ``metadata`` (which also holds ``--metadata`` and the model
    args) and ``dataset_kwargs``; keys other than the ``eglr_*`` ones are ignored.
    """
    return load_dataset_dict(
        eglr_benchmark, split=eglr_split, data_dir=eglr_data_dir,
        demo_n=None if eglr_demo_n is None else int(eglr_demo_n),
        demo_seed=None if eglr_demo_seed is None else int(eglr_demo_seed),
        demo_levels=eglr_demo_levels,
    )


def doc_to_text(doc: dict) -> str:
    """Zero-shot prompt: the problem, then the step-by-step / ``\\boxed{}`` instruction."""
    return f"{doc['problem'].strip()}\n{INSTRUCTION}"


def process_results(doc: dict, results: list) -> dict:
    """Per-document metrics (docs/run-format.md) from the filtered answers of all repeats."""
    (answers,) = results  # one request per document; its filtered responses over the repeats
    return score_document(doc["answer"], answers)


def process_results_lxt(doc: dict, results: list) -> dict:
    """:func:`process_results` plus the paper's grid sub-pools (``acc_L_only``, ``maj@10_L_only``, ...).

    The sub-pools (``GRID_SUB_POOLS`` of :mod:`eglr_harness.scoring.doc_scores`) are scored from the
    grid's own rollouts, so the task needs one lm-eval filter and logs each response once.
    """
    (answers,) = results
    return score_document(doc["answer"], answers, sub_pools=GRID_SUB_POOLS)
