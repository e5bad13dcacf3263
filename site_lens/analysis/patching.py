"""Head-level patching: how much of SITE's effect do the top-k heads by alpha carry?

At the last token of zero-shot prompts, a chosen set of heads has its
``hook_z`` *replaced* by a source activation (alpha = 1 on the set, 0
elsewhere), everything else left alone. Sources:

    "mean"       the task embedding t (mean hook_z at the last token of clean
                 N-shot prompts; ``adapter.t``)
    "per_query"  each query's own clean activation: hook_z at the last token
                 of an N-shot prompt ending in that same query

Head sets: the top-k heads by alpha, the bottom-k, and k random heads
(several draws), for k swept over 1, 2, 4, ..., all.

Metrics, per condition: first-token accuracy ``acc``, mean probability of the
answer's first token ``prob``, and the normalised recoveries

    recovery_prob = (prob - prob_zero_shot) / (prob_ref - prob_zero_shot)
    recovery_acc  = (acc  - acc_zero_shot)  / (acc_ref  - acc_zero_shot)

where the reference ("1") is full SITE (``reference="site"``: t injected
with the trained soft alpha) or the source patched into every head
(``reference="all"``); zero-shot is 0. No heads patched gives 0 exactly;
patching the reference's own head set gives 1 exactly.

    df = head_patching_sweep(model, task, adapter)        # tidy DataFrame

``generic_head_patch`` is the one gate -> logits -> metric routine, the metric an
argument; ``patch_scores``, ``patch_accuracy`` and ``site_reference`` are thin
variants that fix the metric (or the gate), ``patch_top_k``, ``patch_bottom_k``
and ``patch_random_k`` the ones that choose the head sets. (CIE, ``analysis.cie``,
runs the other way round: one prompt's prefix against every head's gate as the
rows of one batch.)
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from ..engine.prompt_cache import PromptCache
from ..metrics import answer_probability, first_token_accuracy
from ..stages.embeddings import last_token_z
from ..stats import top_k_mask
from ..tasks import Task, sample_icl_prompts, zero_shot_prompts
from ..tokens import Example, encode, make_examples
from ..types import Model

log = logging.getLogger(__name__)
HeadMask = Bool[Tensor, "layer head_index"]
Gate = Float[Tensor, "layer head_index"] | HeadMask  # SITE's alpha; a mask is alpha 1 on its heads, 0 elsewhere
# last-token logits of every prompt (float32, in the prompts' order) and the answers' first tokens -> score(s)
Metric = Callable[[Float[Tensor, "prompt d_vocab"], Int[Tensor, " prompt"]], float | Tensor]


# ---------------------------------------------------------------- head sets


def top_k_heads(alpha: Float[Tensor, "layer head_index"], k: int) -> HeadMask:
    """Mask of the k heads with the largest alpha (ties broken by index)."""
    return top_k_mask(alpha, k)


def bottom_k_heads(alpha: Float[Tensor, "layer head_index"], k: int) -> HeadMask:
    """Mask of the k heads with the smallest alpha (ties broken by index)."""
    return top_k_mask(alpha, k, largest=False)


def random_k_heads(shape: Sequence[int], k: int, rng: random.Random, exclude: HeadMask | None = None) -> HeadMask:
    """Mask of k heads drawn uniformly without replacement (outside ``exclude`` when enough remain)."""
    n = int(shape[0]) * int(shape[1])
    pool = list(range(n))
    if exclude is not None:
        rest = [i for i in pool if not bool(exclude.flatten()[i])]
        pool = rest if len(rest) >= k else pool
    m = torch.zeros(n, dtype=torch.bool)
    m[sorted(rng.sample(pool, k))] = True
    return m.view(int(shape[0]), int(shape[1]))


def k_sweep(n_heads_total: int) -> list[int]:
    """1, 2, 4, ... up to and including every head."""
    ks, k = [], 1
    while k < n_heads_total:
        ks.append(k)
        k *= 2
    return ks + [n_heads_total]


# ---------------------------------------------------------------- data


@dataclass
class PatchData:
    """Zero-shot prompts (tokens), answer first tokens, and optional per-query clean activations."""

    tokens: list[list[int]]
    targets: Int[Tensor, " prompt"]
    clean_z: Float[Tensor, "prompt layer head_index d_head"] | None = None


def patch_data(
    model: Model,
    task: Task,
    split: str = "test",
    max_items: int = 50,
    per_query: bool = False,
    n_shots: int = 10,
    seed: int = 0,
) -> PatchData:
    """Zero-shot prompts of ``split`` (first ``max_items``); with ``per_query``, also their N-shot clean z."""
    pairs = task.split(split)[:max_items]
    examples = make_examples(model, zero_shot_prompts(pairs))
    tokens = [e.tokens for e in examples]
    targets = torch.tensor([e.target for e in examples])
    clean = None
    if per_query:
        icl = sample_icl_prompts(task.train, 0, n_shots, random.Random(seed + 1), queries=pairs)
        clean = last_token_z(model, encode(model, [p for p, _ in icl]))
    return PatchData(tokens, targets, clean)


# ---------------------------------------------------------------- the generic routine


@torch.inference_mode()
def generic_head_patch(
    model: Model,
    data: PatchData,
    source: Float[Tensor, "layer head_index d_head"] | Float[Tensor, "prompt layer head_index d_head"],
    gates: Sequence[Gate],
    metric: Metric,
    cache: PromptCache | None = None,
) -> Float[Tensor, " gate *score"]:
    """``metric(logits, targets)`` with ``source`` gated into hook_z at the last token, one row per gate.

    A gate is SITE's alpha: a head mask replaces its heads' z by ``source`` (alpha 1 there, 0
    elsewhere), a soft alpha mixes it in. ``source`` is one activation for every prompt or one
    per prompt. The metric gets every prompt's last-token logits (float32, in the prompts'
    order) and the answers' first tokens, and returns a number or a tensor of them. Only the
    last token is patched, so each prompt's prefix is cached once (``cache``:
    ``patch_cache(model, data)``, built here if not given) and every gate runs one token per prompt.
    """
    dev, dt = model.cfg.device, model.cfg.dtype
    cache = cache or patch_cache(model, data)
    src = source.to(device=dev, dtype=dt)
    targets = data.targets.to(dev)
    scores = []
    for gate in gates:
        parts = cache.logits(range(len(cache)), gate.to(device=dev, dtype=dt), src)
        order = torch.tensor([i for idx, _ in parts for i in idx], device=dev)
        grouped = torch.cat([lg for _, lg in parts]).float()  # (prompt, d_vocab), grouped by prefix length
        logits = torch.empty_like(grouped)
        logits[order] = grouped  # in the prompts' order
        scores.append(torch.as_tensor(metric(logits, targets), dtype=torch.float64))
    return torch.stack(scores)


def patch_cache(model: Model, data: PatchData) -> PromptCache:
    """The prompts' cached prefixes, for repeated last-token runs."""
    return PromptCache(model, [Example(list(t), int(y)) for t, y in zip(data.tokens, data.targets)])


def accuracy_and_probability(logits: Float[Tensor, "prompt d_vocab"], targets: Int[Tensor, " prompt"]) -> Tensor:
    """(first-token accuracy, mean probability of the answer's first token): both from one patched run."""
    acc, prob = first_token_accuracy(logits, targets), answer_probability(logits, targets)
    return torch.tensor([acc, prob], dtype=torch.float64)


def patch_scores(
    model: Model, data: PatchData, source: Tensor, gates: Sequence[Gate], cache: PromptCache | None = None
) -> tuple[Float[Tensor, " gate"], Float[Tensor, " gate"]]:
    """(accuracy, mean answer probability) per gate: ``generic_head_patch`` with ``accuracy_and_probability``."""
    scores = generic_head_patch(model, data, source, gates, accuracy_and_probability, cache)
    return scores[:, 0], scores[:, 1]


def patch_accuracy(
    model: Model, data: PatchData, source: Tensor, gates: Sequence[Gate], cache: PromptCache | None = None
) -> Float[Tensor, " gate"]:
    """First-token accuracy per gate: ``generic_head_patch`` with ``metrics.first_token_accuracy``."""
    return generic_head_patch(model, data, source, gates, first_token_accuracy, cache)


def site_reference(
    model: Model,
    data: PatchData,
    t: Float[Tensor, "layer head_index d_head"],
    alpha: Float[Tensor, "layer head_index"],
    cache: PromptCache | None = None,
) -> tuple[float, float]:
    """(accuracy, mean answer probability) with full SITE injected (soft alpha)."""
    acc, prob = patch_scores(model, data, t, [alpha], cache)
    return float(acc[0]), float(prob[0])


def normalised_recovery(value, low: float, high: float):
    """(value - low) / (high - low); nan where high == low."""
    den = high - low
    return (
        (np.asarray(value, dtype=float) - low) / den
        if den != 0
        else np.full_like(np.asarray(value, dtype=float), np.nan)
    )


# ---------------------------------------------------------------- named variants


def _rows(condition: str, ks: Sequence[int], masks, acc, prob, draw: int = 0) -> list[dict]:
    return [
        {"condition": condition, "k": int(k), "draw": draw, "acc": float(a), "prob": float(p), "n_heads": int(m.sum())}
        for k, m, a, p in zip(ks, masks, acc, prob)
    ]


def patch_top_k(model, data: PatchData, source, alpha, ks: Sequence[int], cache=None) -> pd.DataFrame:
    """Patch the source into the top-k heads by alpha, for each k."""
    masks = [top_k_heads(alpha, k) for k in ks]
    return pd.DataFrame(_rows("top", ks, masks, *patch_scores(model, data, source, masks, cache)))


def patch_bottom_k(model, data: PatchData, source, alpha, ks: Sequence[int], cache=None) -> pd.DataFrame:
    """Patch the source into the bottom-k heads by alpha, for each k."""
    masks = [bottom_k_heads(alpha, k) for k in ks]
    return pd.DataFrame(_rows("bottom", ks, masks, *patch_scores(model, data, source, masks, cache)))


def patch_random_k(
    model, data: PatchData, source, alpha, ks: Sequence[int], draws: int = 5, seed: int = 0, cache=None
) -> pd.DataFrame:
    """Patch the source into k uniformly random heads, ``draws`` draws per k."""
    rng = random.Random(seed)
    rows = []
    for d in range(draws):
        masks = [random_k_heads(alpha.shape, k, rng) for k in ks]
        rows += _rows("random", ks, masks, *patch_scores(model, data, source, masks, cache), draw=d)
    return pd.DataFrame(rows)


def head_patching_sweep(
    model: Model,
    task: Task,
    adapter,
    ks: Sequence[int] | None = None,
    source: str = "mean",
    draws: int = 5,
    reference: str = "site",
    split: str = "test",
    max_items: int = 50,
    seed: int = 0,
    n_shots: int = 10,
) -> pd.DataFrame:
    """Top-k vs bottom-k vs random-k patching on one task; one row per (condition, k, draw).

    Rows with condition "zero_shot" (k=0) and "site" (the soft-alpha run) are
    included; ``recovery_prob`` / ``recovery_acc`` are normalised between them
    (or, with ``reference="all"``, between zero-shot and every head patched).
    """
    if source not in ("mean", "per_query") or reference not in ("site", "all"):
        raise ValueError("source must be 'mean' or 'per_query'; reference 'site' or 'all'")
    alpha, t = adapter.alpha, adapter.t
    data = patch_data(model, task, split, max_items, per_query=source == "per_query", n_shots=n_shots, seed=seed)
    src = t if source == "mean" else data.clean_z
    total = alpha.numel()
    ks = list(ks or k_sweep(total))
    cache = patch_cache(model, data)
    none = torch.zeros_like(alpha, dtype=torch.bool)
    acc0, prob0 = patch_scores(model, data, src, [none, ~none], cache)
    site_acc, site_prob = site_reference(model, data, t, alpha, cache)
    base = pd.DataFrame(
        [
            {"condition": "zero_shot", "k": 0, "draw": 0, "acc": float(acc0[0]), "prob": float(prob0[0]), "n_heads": 0},
            {
                "condition": "all",
                "k": total,
                "draw": 0,
                "acc": float(acc0[1]),
                "prob": float(prob0[1]),
                "n_heads": total,
            },
            {"condition": "site", "k": total, "draw": 0, "acc": site_acc, "prob": site_prob, "n_heads": total},
        ]
    )
    df = pd.concat(
        [
            base,
            patch_top_k(model, data, src, alpha, ks, cache),
            patch_bottom_k(model, data, src, alpha, ks, cache),
            patch_random_k(model, data, src, alpha, ks, draws, seed, cache),
        ],
        ignore_index=True,
    )
    ref = base.set_index("condition").loc["site" if reference == "site" else "all"]
    df["recovery_prob"] = normalised_recovery(df["prob"], float(prob0[0]), float(ref["prob"]))
    df["recovery_acc"] = normalised_recovery(df["acc"], float(acc0[0]), float(ref["acc"]))
    df.insert(0, "task", task.name)
    df["source"], df["reference"] = source, reference
    log.info("patching sweep on %s: %d conditions", task.name, len(df))
    return df
