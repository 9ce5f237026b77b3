"""Each verifier's documented input, built on its tokenizer: the steps of a solution, the text around
them, and the token positions where a step's score is read (pure: no model).

Sources (the models' cards and the code that practitioners use, not guesses):

- ``qwen-prm`` (Qwen2.5-Math-PRM-7B's card): steps split on blank lines ("\\n\\n"); chat messages
  system "Please reason step by step, and put your final answer within \\boxed{}.", user = the
  question, assistant = the steps joined by ``<extra_0>`` with one ``<extra_0>`` after the last;
  ``apply_chat_template(..., tokenize=False)`` then ``tokenizer.encode``; scores are read at every
  ``<extra_0>`` token.
- ``shepherd`` (math-shepherd-mistral-7b-prm's card; HF search-and-learn splits generations on blank
  lines): ``f"{question} Step 1: ... ки\\nStep 2: ... ки"``, encoded whole, scores read at every
  ``ки`` token (the card's ``step_tag_id = tokenizer.encode("ки")[-1]``), over the ``+``/``-`` tokens
  (``tokenizer.encode("+ -")`` without special tokens).
- ``value-head`` (Skywork-o1-Open-PRM's ``prepare_input``): ids of ``bos + question + "\\n"``, then
  per line of the solution (step token "\\n") its ids followed by the id of "\\n", a score read at
  each appended "\\n"; empty lines are skipped.
- ``orm``: chat messages (optional system, user = question, assistant = solution) when the tokenizer
  has a chat template, else ``question + "\\n" + solution``; one score read at the last token.
- ``self:p_true`` (Kadavath et al. 2022, "Language Models (Mostly) Know What They Know"): the run's
  model is asked in its chat template whether the proposed solution is true; the score is the
  probability of the first token of "True" at the first position of its answer.
- ``self:certainty`` (Kang et al. 2025, "Scalable Best-of-N Selection for LLMs via Self-Certainty"):
  the run's own prompt and the rollout, teacher-forced; the positions are those whose next-token
  distribution produced each rollout token.

A tag string that occurs inside a solution is removed first, so that tags sit only where a step ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "QWEN_PRM_SYSTEM",
    "QWEN_STEP_TAG",
    "SHEPHERD_STEP_TAG",
    "VALUE_HEAD_STEP",
    "P_TRUE_QUESTION",
    "Encoded",
    "split_steps",
    "qwen_prm_messages",
    "shepherd_text",
    "encode_qwen_prm",
    "encode_shepherd",
    "shepherd_candidates",
    "encode_value_head",
    "encode_orm",
    "p_true_messages",
    "encode_p_true",
    "encode_certainty",
]

QWEN_PRM_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
QWEN_STEP_TAG = "<extra_0>"
SHEPHERD_STEP_TAG = "ки"
VALUE_HEAD_STEP = "\n"
P_TRUE_QUESTION = ("Question: {question}\nProposed answer: {solution}\n"
                   "Is the proposed answer true or false? Answer with one word: True or False.")


@dataclass(frozen=True)
class Encoded:
    """One verifier input: token ids and the positions (indices into ``input_ids``) where the scores
    are read, one per step (one in all for an ``orm`` or ``self:p_true``)."""

    input_ids: tuple[int, ...]
    positions: tuple[int, ...]


def split_steps(solution: str, separator: str = "\n\n") -> list[str]:
    """The steps of a solution: pieces between ``separator``, stripped, empty ones dropped; a
    solution with no text is one empty step (it still gets one score)."""
    steps = [s.strip() for s in solution.split(separator)]
    return [s for s in steps if s] or [""]


def _tag_positions(ids: Sequence[int], tag_id: int, steps: int, what: str) -> tuple[int, ...]:
    positions = tuple(i for i, t in enumerate(ids) if t == tag_id)
    if len(positions) != steps:
        raise ValueError(f"{what}: {len(positions)} step tags in the encoded input for {steps} steps; the "
                         "tokenizer does not keep the tag as one token (is it the verifier's own tokenizer?).")
    return positions


def _single_token(tokenizer, text: str, what: str) -> int:
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(f"{what}: {text!r} is {len(ids)} tokens in this tokenizer, expected one; is it the "
                         "verifier's own tokenizer?")
    return ids[0]


def qwen_prm_messages(question: str, solution: str, system: str = QWEN_PRM_SYSTEM) -> list[dict]:
    """The card's messages: steps joined by ``<extra_0>``, one after the last."""
    steps = split_steps(solution.replace(QWEN_STEP_TAG, ""))
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": question},
        {"role": "assistant", "content": QWEN_STEP_TAG.join(steps) + QWEN_STEP_TAG},
    ]


def encode_qwen_prm(tokenizer, question: str, solution: str, system: str = QWEN_PRM_SYSTEM) -> Encoded:
    messages = qwen_prm_messages(question, solution, system)
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    ids = tokenizer.encode(text)
    tag = _single_token(tokenizer, QWEN_STEP_TAG, "qwen-prm")
    steps = messages[-1]["content"].count(QWEN_STEP_TAG)
    return Encoded(tuple(ids), _tag_positions(ids, tag, steps, "qwen-prm"))


def shepherd_text(question: str, solution: str) -> str:
    """``"{question} Step 1: ... ки\\nStep 2: ... ки"`` (the card's input)."""
    steps = split_steps(solution.replace(SHEPHERD_STEP_TAG, ""))
    return f"{question} " + "\n".join(f"Step {i}: {s} {SHEPHERD_STEP_TAG}" for i, s in enumerate(steps, 1))


def shepherd_candidates(tokenizer) -> tuple[int, int]:
    """The ids of the ``+`` and ``-`` tokens, as the card takes them (``encode("+ -")`` without BOS)."""
    ids = tokenizer.encode("+ -", add_special_tokens=False)
    if len(ids) != 2:
        raise ValueError(f"shepherd: '+ -' is {len(ids)} tokens in this tokenizer, expected two (+ and -).")
    return ids[0], ids[1]


def encode_shepherd(tokenizer, question: str, solution: str) -> Encoded:
    text = shepherd_text(question, solution)
    ids = tokenizer.encode(text)
    tag = _single_token(tokenizer, SHEPHERD_STEP_TAG, "shepherd")  # the card's encode("ки")[-1], BOS aside
    return Encoded(tuple(ids), _tag_positions(ids, tag, text.count(SHEPHERD_STEP_TAG), "shepherd"))


def encode_value_head(tokenizer, question: str, solution: str) -> Encoded:
    """Skywork's ``prepare_input`` with step token "\\n" (segments encoded one by one)."""
    step_id = tokenizer.encode(VALUE_HEAD_STEP, add_special_tokens=False)[-1]
    ids = list(tokenizer.encode((tokenizer.bos_token or "") + question + "\n", add_special_tokens=False))
    positions = []
    for step in solution.split(VALUE_HEAD_STEP):
        if not step:
            continue
        ids += tokenizer.encode(step, add_special_tokens=False) + [step_id]
        positions.append(len(ids) - 1)
    if not positions:  # no text: one score at the end of the question
        positions.append(len(ids) - 1)
    return Encoded(tuple(ids), tuple(positions))


def encode_orm(tokenizer, question: str, solution: str, system: str | None = None) -> Encoded:
    if getattr(tokenizer, "chat_template", None):
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": question}, {"role": "assistant", "content": solution}]
        ids = tokenizer.encode(tokenizer.apply_chat_template(messages, tokenize=False), add_special_tokens=False)
    else:
        ids = tokenizer.encode(f"{question}\n{solution}")
    return Encoded(tuple(ids), (len(ids) - 1,))


def p_true_messages(question: str, solution: str) -> list[dict]:
    return [{"role": "user", "content": P_TRUE_QUESTION.format(question=question, solution=solution.strip())}]


def encode_p_true(tokenizer, question: str, solution: str) -> Encoded:
    """The run's model asked about the solution; the score is read where its answer starts."""
    messages = p_true_messages(question, solution)
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer.encode(text, add_special_tokens=False)
    else:
        ids = tokenizer.encode(messages[0]["content"] + "\nAnswer:")
    return Encoded(tuple(ids), (len(ids) - 1,))


def encode_certainty(tokenizer, prompt: str, completion: str) -> Encoded:
    """The run's prompt and the rollout (encoded apart, as generation saw them); one position per
    rollout token: the one whose logits predicted it. A rollout without tokens has no position."""
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    completion_ids = tokenizer.encode(completion, add_special_tokens=False)
    start = len(prompt_ids) - 1
    return Encoded(tuple(prompt_ids + completion_ids), tuple(range(start, start + len(completion_ids))))
