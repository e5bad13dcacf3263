"""Scoring: first-token accuracy and answer probability, the paper's (prefix) exact match, and strict match.

``normalize`` follows the paper's evaluation: the first line of the generation,
cut at "(", stripped, lower-cased unless the task is about case. A line that
starts with a parenthesised group keeps it ("(A) because (x)" -> "(a) because"),
so lettered multiple-choice answers such as "(A)" score as themselves. Exact match
is a *prefix* match (normalised prediction starts with the normalised target),
as the paper scores it; it is lenient ("ant, small, sofa" counts for "ant").
Strict match requires equality.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor


def _lead(line: str) -> int:
    """Length of a leading parenthesised group such as '(A)' (0 if none or not yet closed)."""
    return line.find(")") + 1 if line.startswith("(") else 0


def normalize(text: str, case_sensitive: bool = False) -> str:
    """First line, cut at '(' (after a leading group like '(A)'), stripped, lower-cased unless ``case_sensitive``.

    Example:
        >>> normalize("  Paris (France)")
        'paris'
    """
    line = text.strip().split("\n")[0]
    n = _lead(line)
    if line.startswith("(") and n == 0:  # an unclosed '(' opens the line: nothing to cut at
        return line.strip() if case_sensitive else line.strip().lower()
    line = (line[:n] + line[n:].split("(")[0]).strip()
    return line if case_sensitive else line.lower()


def exact_match(pred: str, target: str, case_sensitive: bool = False) -> bool:
    """The paper's metric: the normalised prediction starts with the normalised target.

    Example:
        >>> exact_match(" Paris, France", "paris")
        True
    """
    p, t = normalize(pred, case_sensitive), normalize(target, case_sensitive)
    return bool(t) and p.startswith(t)


def settled_match(partial: str, target: str, case_sensitive: bool = False) -> bool | None:
    """``exact_match`` of every continuation of ``partial``, when it is already settled; else None.

    True once the text past its leading whitespace starts with the normalised target; False once
    it can no longer (it left the target's prefixes, or its first line or "(" ended it); None
    while it is still a prefix of the target, or ends in an incomplete character.
    """
    if "\ufffd" in partial:
        return None
    t = normalize(target, case_sensitive)
    if not t:
        return False
    c = partial.lstrip()
    c = c if case_sensitive else c.lower()
    if "\n" in c or "(" in c[max(_lead(c), 1) :]:  # the first line, cut at a later "(", is fixed
        return exact_match(partial, target, case_sensitive)
    if c.startswith(t):
        return True
    return None if t.startswith(c) else False


def strict_match(pred: str, target: str, case_sensitive: bool = False) -> bool:
    """The normalised prediction equals the normalised target.

    Example:
        >>> strict_match(" Paris, France", "paris"), strict_match(" PARIS (the capital)", "paris")
        (False, True)
    """
    return normalize(pred, case_sensitive) == normalize(target, case_sensitive)


def first_token_accuracy(
    logits: Float[Tensor, "batch d_vocab"], targets: Int[Tensor, " batch"] | Sequence[int]
) -> float:
    """Share of rows whose argmax is the answer's first token (the count over the rows, exactly; nan for none)."""
    targets = torch.as_tensor(targets, device=logits.device)
    return int((logits.argmax(-1) == targets).sum()) / len(targets) if len(targets) else float("nan")


def answer_probability(logits: Float[Tensor, "batch d_vocab"], targets: Int[Tensor, " batch"] | Sequence[int]) -> float:
    """Mean probability (softmax of each row's logits) of the answer's first token; nan for no rows."""
    targets = torch.as_tensor(targets, device=logits.device)
    rows = torch.arange(len(targets), device=logits.device)
    return float(logits.float().softmax(-1)[rows, targets].double().mean())


def score(
    preds: Sequence[str],
    targets: Sequence[str],
    case_sensitive: bool = False,
    accepted: Sequence[Sequence[str]] | None = None,
) -> dict[str, float]:
    """Mean exact and strict match over a set of generations.

    ``accepted`` (one list per item) gives every answer that counts as correct (object_counting
    accepts "three" and "3"); a prediction matching any of them scores.
    """
    n = max(1, len(preds))
    answers = [list(a) for a in accepted] if accepted is not None else [[t] for t in targets]
    return {
        "exact_match": sum(any(exact_match(p, t, case_sensitive) for t in a) for p, a in zip(preds, answers)) / n,
        "strict_match": sum(any(strict_match(p, t, case_sensitive) for t in a) for p, a in zip(preds, answers)) / n,
    }
