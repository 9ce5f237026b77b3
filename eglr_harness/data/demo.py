"""Offline demo problems: seeded multi-step arithmetic word problems with exact integer answers.

Five difficulty levels, interleaved (problem ``i`` has level ``i % 5 + 1``) so that any prefix
(``--limit``) mixes them:

0. (opt-in only, never in the default set) one easy step: ten more than a number up to 89 ("What is
   10 more than 56?") or a number up to 45 doubled ("What is 23 + 23?"): 132 distinct problems in a
   seeded order, repeating from the 133rd on;
1. a bare sum or difference of two small numbers ("What is 14 + 8?");
2. one step in words, numbers up to 20 (add or take away);
3. two steps, numbers up to 60 (add, then take away);
4. a product plus a sum (items per box × boxes + spare);
5. three steps: product, take away, share equally (exact division).

The answer is never one of the numbers written in the problem (no copying). What SmolLM2-135M-Instruct
solves of each level: ``results/README.md``.
Problem ``i`` depends only on ``(seed, i)``, so a larger ``n`` extends a smaller set instead of
reshuffling it.

``levels`` picks the levels: the ``k``-th problem of level ``1..5`` is the default set's problem
``5k + level - 1`` (the same id and text), the ``k``-th of level 0 depends only on ``(seed, k)``.
A level set interleaves its levels in ascending order as the default set does, and a larger ``n``
extends a smaller set. Levels 1-5 (the default) is the default set itself. Level 0 is for models that
solve few problems of the default levels (SmolLM2-135M-Instruct: ``results/README.md``).
"""

from __future__ import annotations

import random
import re

DEFAULT_N = 50
PROBLEMS_SEED = 1333  # the demo problems' generator seed (not the decoding seed of core.config)
LEVELS = 5  # levels of the default set, 1..LEVELS
ALL_LEVELS = tuple(range(0, LEVELS + 1))  # level 0 is opt-in

_NAMES = ("Mia", "Leo", "Ava", "Noah", "Zoe", "Omar", "Lena", "Ravi", "Sara", "Tom", "Ines", "Kai")
_PRONOUN = {"Mia": "She", "Ava": "She", "Zoe": "She", "Lena": "She", "Sara": "She", "Ines": "She"}
_ITEMS = ("apples", "marbles", "stickers", "pencils", "cookies", "shells", "stamps", "cards")


def _pronoun(name: str) -> str:
    return _PRONOUN.get(name, "He")


# Level 0: every problem it has (ten more than 2..89, 2..45 doubled), shuffled per seed.
_LEVEL0 = tuple([(f"What is 10 more than {x}?", x + 10) for x in range(2, 90)]
                + [(f"What is {x} + {x}?", 2 * x) for x in range(2, 46)])


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


_GENERATORS = (None, _bare, _level1, _level2, _level3, _level4)  # index = level (level 0: _LEVEL0)


def generate_problem(index: int, *, seed: int = PROBLEMS_SEED) -> dict:
    """Problem ``index`` of the demo set for ``seed``, in the internal schema (answer: an integer string)."""
    if index < 0:
        raise ValueError(f"`index`={index} must be >= 0.")
    return _problem(index % LEVELS + 1, f"eglr-demo:{seed}:{index}", f"demo-{seed}-{index:04d}")


def level_problem(level: int, k: int, *, seed: int = PROBLEMS_SEED) -> dict:
    """The ``k``-th problem of ``level`` (0..5) for ``seed``; levels 1..5 are the default set's."""
    if level not in ALL_LEVELS or k < 0:
        raise ValueError(f"`level`={level!r}, `k`={k!r}: allowed: a level in 0..{LEVELS} and k >= 0.")
    if level:
        return generate_problem(k * LEVELS + level - 1, seed=seed)
    order = random.Random(f"eglr-demo:{seed}:level0").sample(range(len(_LEVEL0)), len(_LEVEL0))
    problem, answer = _LEVEL0[order[k % len(_LEVEL0)]]
    return _record(f"demo-{seed}-level0-{k:04d}", problem, answer, 0)


def _problem(level: int, rng_key: str, problem_id: str) -> dict:
    rng = random.Random(rng_key)
    while True:  # redraw until the answer is not one of the numbers in the text (no copying)
        name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
        problem, answer = _GENERATORS[level](rng, name, item)
        if str(answer) not in re.findall(r"\d+", problem):
            break
    return _record(problem_id, problem, answer, level)


def _record(problem_id: str, problem: str, answer: int, level: int) -> dict:
    assert isinstance(answer, int) and answer >= 0 and str(answer) not in re.findall(r"\d+", problem), (problem, answer)
    return {
        "id": problem_id,
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


def parse_levels(levels) -> tuple[int, ...]:
    """Demo levels as a sorted tuple of distinct ints in ``0..LEVELS``.

    Accepts ``None`` (the default levels 1..LEVELS), an int (``2``), a list of ints (``[1, 2]``) or a string of
    ints and inclusive ranges separated by ``,``, ``|``, ``;`` or spaces (``"1,2"``, ``"1-3"``).
    Anything else raises ``ValueError`` naming the value and what is allowed.
    """
    allowed = (
        f"allowed: levels 0..{LEVELS} (default 1-{LEVELS}; 0 is opt-in) as an int (2), a list ([1, 2]) "
        "or a string ('1,2', '1|2', '1-3')"
    )
    if levels is None:
        return tuple(range(1, LEVELS + 1))
    if isinstance(levels, bool):
        raise ValueError(f"`demo_levels`={levels!r} is not a level; {allowed}.")
    if isinstance(levels, int):
        values = [levels]
    elif isinstance(levels, (list, tuple)):
        values = []
        for item in levels:
            if isinstance(item, bool) or not isinstance(item, int):
                raise ValueError(f"`demo_levels`={levels!r}: {item!r} is not a level; {allowed}.")
            values.append(item)
    elif isinstance(levels, str):
        values = []
        for part in (part for part in re.split(r"[,|;\s]+", levels.strip()) if part):
            if m := re.fullmatch(r"(\d+)(?:-(\d+))?", part):
                lo, hi = int(m[1]), int(m[2] or m[1])
                if lo > hi:
                    raise ValueError(f"`demo_levels`={levels!r}: range {part!r} runs backwards; {allowed}.")
                values.extend(range(lo, hi + 1))
            else:
                raise ValueError(f"`demo_levels`={levels!r}: {part!r} is not a level; {allowed}.")
    else:
        raise ValueError(f"`demo_levels`={levels!r} is not a level list; {allowed}.")
    if not values:
        raise ValueError(f"`demo_levels`={levels!r} names no level; {allowed}.")
    for v in values:
        if v not in ALL_LEVELS:
            raise ValueError(f"`demo_levels`={levels!r}: level {v} does not exist; {allowed}.")
    return tuple(sorted(set(values)))


def generate_problems(n: int = DEFAULT_N, *, seed: int = PROBLEMS_SEED, levels=None) -> list[dict]:
    """The first ``n`` demo problems for ``seed`` of ``levels`` (default: 1..5, the default set).

    The ``j``-th problem of a level set ``S`` (sorted) is problem ``j // |S|`` of level
    ``S[j % |S|]`` (:func:`level_problem`): the set interleaves its levels as the default set does.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"`demo_n`={n!r} must be a positive int (e.g. {DEFAULT_N}).")
    chosen = parse_levels(levels)
    return [level_problem(chosen[j % len(chosen)], j // len(chosen), seed=seed) for j in range(n)]
