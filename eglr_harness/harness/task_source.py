"""An eglr task read as lm-eval reads it, for code that decodes outside an lm-eval run (``eglr_harness.rl.rollouts``).

:func:`task_generation_kwargs` gives the task's ``generation_kwargs`` (``until``, ``max_gen_toks``
and the pool keys ``eglr_L``/``eglr_T``/``eglr_budget_*``) from its YAML, includes merged, without
loading its data; :func:`task_problems` gives its documents with lm-eval's zero-shot prompt
(``doc_to_text``) as a chat turn, the form ``eglr-hf --apply_chat_template`` renders.
"""

from __future__ import annotations

from eglr_harness.core.resources import task_names


def _task_yaml(name: str):
    known = task_names()
    if name not in known:
        eglr = sorted(n for n in known if "_eglr" in n)
        raise ValueError(f"`task`={name!r} is not an eglr task; known: {', '.join(eglr)}.")
    return known[name]


def lm_eval_task_names() -> set[str]:
    """Every task and group name lm-eval's own index knows (ours included), without loading any data."""
    from lm_eval.tasks import TaskManager  # noqa: PLC0415

    return set(TaskManager().all_tasks)


def task_generation_kwargs(name: str) -> dict:
    """The task's ``generation_kwargs`` (its YAML with its includes, as lm-eval merges them)."""
    from lm_eval.tasks._yaml_loader import load_yaml  # noqa: PLC0415 -- lm-eval's own include rule

    config = load_yaml(_task_yaml(name), resolve_func=False)
    return dict(config.get("generation_kwargs") or {})


def task_problems(name: str, limit: int | None = None) -> list[dict]:
    """The first ``limit`` documents of the task's evaluation split, in lm-eval's order, each as
    ``{"prompt": <chat turns>, "answer", "answer_format", "doc_id"}``: the turns lm-eval's own
    ``fewshot_context`` hands to the chat template under ``--apply_chat_template`` (system
    instruction, few-shot turns and the problem, as the task defines them), and the gold answer in
    the form the eglr tasks grade it."""
    from lm_eval.tasks import TaskManager  # noqa: PLC0415

    _task_yaml(name)
    task = TaskManager().load_task_or_group(name)[name]
    docs = list(task.eval_docs)
    rows = []
    for i, doc in enumerate(docs[:limit] if limit is not None else docs):
        turns = []

        def keep(chat_history, add_generation_prompt=True):
            if not add_generation_prompt:
                raise ValueError(f"`task`={name!r} continues the assistant turn (gen_prefix); its prompts are not "
                                 "whole chat turns.")
            turns.extend(dict(message) for message in chat_history)
            return ""

        task.fewshot_context(doc, task.config.num_fewshot or 0, apply_chat_template=True, chat_template=keep)
        rows.append({"prompt": turns, "answer": doc["answer"], "answer_format": doc.get("answer_format") or "math",
                     "doc_id": i})
    return rows
