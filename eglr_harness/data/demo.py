"""Offline demo problems: seeded multi-step arithmetic word problems with exact integer answers.

Five difficulty levels, interleaved (problem ``i`` has level ``i % 5 + 1``) so that any prefix
(``--limit``) mixes them:

1. a bare sum or difference of two small numbers ("What is 14 + 8?");
2. one step in words, numbers up to 20 (add or take away);
3. two steps, numbers up to 60 (add, then take away);
4. a product plus a sum (items per box × boxes + spare);
5. three steps: product, take away, share equally (exact division).

The answer is never one of the numbers written in the problem (no copying). SmolLM2-135M-Instruct
solves most level-1 problems, some of level 2 and next to none above (measured in
``results/``), so the demo separates decoding settings on a CPU in minutes. Problem ``i`` depends only on
``(seed, i)``, so a larger ``n`` extends a smaller set instead of reshuffling it.
"""

from __future__ import annotations

import random
import re

DEFAULT_N = 50
DEFAULT_SEED = 1333
LEVELS = 5

_NAMES = ("Mia", "Leo", "Ava", "Noah", "Zoe", "Omar", "Lena", "Ravi", "Sara", "Tom", "Ines", "Kai")
_PRONOUN = {"Mia": "She", "Ava": "She", "Zoe": "She", "Lena": "She", "Sara": "She", "Ines": "She"}
_ITEMS = ("apples", "marbles", "stickers", "pencils", "cookies", "shells", "stamps", "cards")


def _pronoun(name: str) -> str:
    return _PRONOUN.get(name, "He")


def _bare(rng: random.Random, name: str, item: str) -> tuple[str, int]:
    a, b = rng.randint(11, 30), rng.randint(2, 9)
    if rng.random() < 0.5:
        return f"What is {a} + {b}?", a + b
    return f"What is {a} - {b}?", a - b


def _level1(rng: random.Random, name: str, item: str) -> tuple[str, int]:
    a, b = rng.randint(3, 20), rng.randint(2, 9)
    if rng.random() < 0.5:
        return f"{name} has {a} {item}. {_pronoun(name)} gets {b} more. How many {item} does {name} have now?", a + b
    a = max(a, b + 2)
    return f"{name} has {a} {item} and gives {b} of them to a friend. How many {item} does {name} have left?", a - b


def _level2(rng: random.Random, name: str, item: str) -> tuple[str, int]:
    a, b = rng.randint(10, 60), rng.randint(5, 30)
    c = rng.randint(3, a + b - 1)
    text = (
        f"{name} has {a} {item}. {_pronoun(name)} buys {b} more and then gives away {c}. "
        f"How many {item} does {name} have now?"
    )
    return text, a + b - c


def _level3(rng: random.Random, name: str, item: str) -> tuple[str, int]:
    per_box, boxes, spare = rng.randint(3, 12), rng.randint(2, 9), rng.randint(1, 15)
    text = (
        f"Each box holds {per_box} {item}. {name} buys {boxes} boxes and already had {spare} {item}. "
        f"How many {item} does {name} have in total?"
    )
    return text, per_box * boxes + spare


def _level4(rng: random.Random, name: str, item: str) -> tuple[str, int]:
    bags, per_bag = rng.randint(2, 6), rng.randint(3, 9)
    packs, per_pack = rng.randint(2, 8), rng.randint(6, 15)
    gift = packs * per_pack - bags * per_bag
    while gift <= 0:
        packs += 1
        gift = packs * per_pack - bags * per_bag
    text = (
        f"{name} buys {packs} packs of {item} with {per_pack} {item} in each pack. "
        f"{_pronoun(name)} gives {gift} {item} to a neighbour and splits the rest equally into "
        f"{bags} bags. How many {item} are in each bag?"
    )
    return text, per_bag


_GENERATORS = (_bare, _level1, _level2, _level3, _level4)


def generate_problem(index: int, *, seed: int = DEFAULT_SEED) -> dict:
    """Problem ``index`` of the demo set for ``seed``, in the internal schema (answer: an integer string)."""
    if index < 0:
        raise ValueError(f"`index`={index} must be >= 0.")
    rng = random.Random(f"eglr-demo:{seed}:{index}")
    level = index % LEVELS + 1
    while True:  # redraw until the answer is not one of the numbers in the text (no copying)
        name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
        problem, answer = _GENERATORS[level - 1](rng, name, item)
        if str(answer) not in re.findall(r"\d+", problem):
            break
    assert isinstance(answer, int) and answer >= 0, (problem, answer)
    return {
        "id": f"demo-{seed}-{index:04d}",
        "problem": problem,
        "answer": str(answer),
        "answer_format": "number",
        "metadata": {
            "source": "demo",
            "solution": None,
            "subject": "arithmetic",
            "level": str(level),
            "original_answer": str(answer),
        },
    }


def generate_problems(n: int = DEFAULT_N, *, seed: int = DEFAULT_SEED) -> list[dict]:
    """The first ``n`` demo problems for ``seed`` (see module docstring)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"`demo_n`={n!r} must be a positive int (e.g. {DEFAULT_N}).")
    return [generate_problem(i, seed=seed) for i in range(n)]
