"""The three BIG-Bench Hard tasks that BIG-bench ships as programs, generated here.

BIG-bench defines boolean_expressions, multistep_arithmetic and web_of_lies as Python
tasks rather than JSON files; these generators write items of the same shape as
BBH's (Suzgun et al. 2022), from a seeded ``random.Random``:

    boolean_expressions        "not ( True and False ) or False is"  ->  "True"
    multistep_arithmetic_two   "((-3 + 5) * (7 - -2)) ="             ->  "18"
    web_of_lies                "Question: Ana lies. Bo says Ana tells the truth. ... Does Eve tell the truth?"  ->  "No"

Each returns distinct items (no input twice).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from itertools import pairwise

from . import Item

NAMES = [
    "Alice",
    "Bob",
    "Carla",
    "Dan",
    "Elena",
    "Farid",
    "Gwen",
    "Hiro",
    "Ines",
    "Jamal",
    "Kira",
    "Leon",
    "Mona",
    "Nils",
    "Olga",
    "Pavel",
    "Quinn",
    "Rosa",
    "Sam",
    "Tara",
    "Uma",
    "Victor",
    "Wen",
    "Xavier",
    "Yara",
    "Zane",
]


def _boolean(rng: random.Random) -> Item:
    """An expression over True/False with not/and/or and one pair of parentheses, as BBH's."""

    def literal() -> tuple[str, bool]:
        nots, value = rng.choice((0, 0, 1, 2)), rng.random() < 0.5
        return " ".join(["not"] * nots + [str(value)]), value ^ (nots % 2 == 1)

    def apply(op: str, x: bool, y: bool) -> bool:
        return (x and y) if op == "and" else (x or y)

    op1, op2 = rng.choice(("and", "or")), rng.choice(("and", "or"))
    (a, va), (b, vb), (c, vc) = literal(), literal(), literal()
    if rng.random() < 0.5:
        expr, value = f"( {a} {op1} {b} ) {op2} {c}", apply(op2, apply(op1, va, vb), vc)
    else:
        expr, value = f"{a} {op1} ( {b} {op2} {c} )", apply(op1, va, apply(op2, vb, vc))
    if rng.random() < 0.3:
        expr, value = f"not ( {expr} )", not value
    return {"input": f"{expr} is", "output": str(value), "options": ["True", "False"]}


def _arithmetic(rng: random.Random) -> Item:
    """((a op b) op (c op d)) with one-digit operands in -9..9 and + - *, as BBH's two-step variant."""

    def num() -> int:
        return rng.randint(-9, 9)

    def term() -> tuple[str, int]:
        x, y, op = num(), num(), rng.choice("+-*")
        return f"({x} {op} {y})", {"+": x + y, "-": x - y, "*": x * y}[op]

    (s1, v1), (s2, v2), op = term(), term(), rng.choice("+-*")
    value = {"+": v1 + v2, "-": v1 - v2, "*": v1 * v2}[op]
    return {"input": f"({s1} {op} {s2}) =", "output": str(value)}


def _web_of_lies(rng: random.Random) -> Item:
    """Five people: the first tells the truth or lies, each next one says the previous one does or not."""
    people = rng.sample(NAMES, 5)
    truthful = rng.random() < 0.5
    parts = [f"{people[0]} {'tells the truth' if truthful else 'lies'}."]
    for prev, cur in pairwise(people):
        says_truth = rng.random() < 0.5
        parts.append(f"{cur} says {prev} {'tells the truth' if says_truth else 'lies'}.")
        truthful = says_truth == truthful
    question = f"Question: {' '.join(parts)} Does {people[-1]} tell the truth?"
    return {"input": question, "output": "Yes" if truthful else "No", "options": ["Yes", "No"]}


GENERATORS: dict[str, Callable[[random.Random], Item]] = {
    "boolean_expressions": _boolean,
    "multistep_arithmetic_two": _arithmetic,
    "web_of_lies": _web_of_lies,
}


def generate(name: str, n: int, seed: int) -> list[Item]:
    """``n`` distinct items of the generated task ``name``."""
    rng, make = random.Random(f"{name}:{seed}"), GENERATORS[name]
    seen: dict[str, Item] = {}
    for _ in range(50 * n):
        item = make(rng)
        seen.setdefault(item["input"], item)
        if len(seen) == n:
            break
    return list(seen.values())
