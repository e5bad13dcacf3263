"""Cross-task head overlap: do different tasks select the same heads?

Given several tasks' alphas (name -> (layer, head) tensor):

    pearson_matrix(alphas), spearman_matrix(alphas)   alpha correlation over heads
    jaccard_matrix(alphas, k)                          overlap of the top-k head sets
    cluster_order(matrix)                              average-linkage leaf order (numpy)
    category_summary(matrix, categories)               mean within vs across categories
    category_permutation_test(matrix, categories)      ... and whether the gap beats shuffled categories
                                                       (blocks=families: whole families shuffled)
    seed_stability(alphas_of_one_task_by_seed, k)      rank correlation and top-k overlap across seeds
    expected_jaccard(n, k)                             the overlap two random k-sets have by chance
    transfer_matrix(model, tasks, adapters)            task B's t with task A's alpha

All matrices are pandas DataFrames indexed and columned by task name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from jaxtyping import Float
from torch import Tensor

from ..adapter import Adapter
from ..stats import pearson, spearman, top_k_mask
from ..tasks import Task
from ..types import Model
from .patching import patch_accuracy, patch_cache, patch_data

Alphas = Mapping[str, Float[Tensor, "layer head_index"]]


def top_k_set(alpha: Float[Tensor, "layer head_index"], k: int) -> set[tuple[int, int]]:
    """The k (layer, head) pairs with the largest alpha (ties broken by index)."""
    return {(layer, head) for layer, head in top_k_mask(alpha, k).nonzero().tolist()}


def jaccard(a: set, b: set) -> float:
    """|a & b| / |a | b| (1 for two empty sets)."""
    return len(a & b) / len(a | b) if a | b else 1.0


# ---------------------------------------------------------------- matrices


def _matrix(alphas: Alphas, fn) -> pd.DataFrame:
    names = list(alphas)
    m = np.array([[fn(alphas[a], alphas[b]) for b in names] for a in names], dtype=float)
    return pd.DataFrame(m, index=names, columns=names)


def pearson_matrix(alphas: Alphas) -> pd.DataFrame:
    """Pearson correlation of alpha over heads, for every pair of tasks."""
    return _matrix(alphas, pearson)


def spearman_matrix(alphas: Alphas) -> pd.DataFrame:
    """Spearman correlation of alpha over heads, for every pair of tasks."""
    return _matrix(alphas, spearman)


def jaccard_matrix(alphas: Alphas, k: int = 20) -> pd.DataFrame:
    """Jaccard overlap of the top-k heads by alpha, for every pair of tasks."""
    return _matrix(alphas, lambda a, b: jaccard(top_k_set(a, k), top_k_set(b, k)))


def cluster_order(similarity: pd.DataFrame) -> list[str]:
    """Leaf order of average-linkage agglomerative clustering on 1 - similarity (pure numpy)."""
    names = list(similarity.index)
    if len(names) <= 2:
        return names
    dist = 1.0 - np.nan_to_num(similarity.to_numpy(dtype=float), nan=0.0)
    clusters: list[list[int]] = [[i] for i in range(len(names))]
    while len(clusters) > 1:
        best = (np.inf, 0, 1)
        for i in range(len(clusters)):
            for j in range(i + 1, len(clusters)):
                d = dist[np.ix_(clusters[i], clusters[j])].mean()
                if d < best[0]:
                    best = (d, i, j)
        _, i, j = best
        merged = clusters[i] + clusters[j]
        clusters = [c for n, c in enumerate(clusters) if n not in (i, j)] + [merged]
    return [names[i] for i in clusters[0]]


def category_summary(matrix: pd.DataFrame, categories: Mapping[str, str]) -> dict[str, float | int]:
    """Mean off-diagonal value for pairs in the same category vs in different ones."""
    names = [n for n in matrix.index if n in categories]
    within, across = [], []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            (within if categories[a] == categories[b] else across).append(float(matrix.loc[a, b]))
    return {
        "within": float(np.mean(within)) if within else float("nan"),
        "across": float(np.mean(across)) if across else float("nan"),
        "n_within": len(within),
        "n_across": len(across),
    }


def alpha_shares(alpha: Float[Tensor, "layer head_index"], low: float = 0.1, high: float = 0.9) -> dict[str, float]:
    """Share of heads with alpha < low and > high (how binary the selection is)."""
    a = alpha.detach().float().flatten()
    return {f"share_lt_{low}": float((a < low).float().mean()), f"share_gt_{high}": float((a > high).float().mean())}


# ---------------------------------------------------------------- transfer


def transfer_matrix(
    model: Model,
    tasks: Mapping[str, Task],
    adapters: Mapping[str, Adapter],
    split: str = "test",
    max_items: int = 50,
    names: Sequence[str] | None = None,
) -> pd.DataFrame:
    """First-token accuracy on task B (columns) with B's embedding t and task A's alpha (rows)."""
    names = list(names or [n for n in adapters if n in tasks])
    out = pd.DataFrame(np.nan, index=pd.Index(names, name="alpha_from"), columns=pd.Index(names, name="task"))
    for b in names:
        data = patch_data(model, tasks[b], split, max_items)
        acc = patch_accuracy(model, data, adapters[b].t, [adapters[a].alpha for a in names], patch_cache(model, data))
        out[b] = acc.tolist()
    return out


def category_permutation_test(
    matrix: pd.DataFrame,
    categories: Mapping[str, str],
    n_perm: int = 10_000,
    seed: int = 0,
    strata: Mapping[str, str] | None = None,
    blocks: Mapping[str, str] | None = None,
) -> dict[str, float | int | str]:
    """``category_summary`` and a one-sided permutation test of within minus across.

    ``p_value`` is the share of labellings, the observed one counted with the ``n_perm`` shuffles,
    whose within minus across is at least the observed one (one-sided, ``sided`` "greater": are
    heads shared more within a group?); it cannot fall below ``p_floor`` = 1 / (n_perm + 1).
    ``blocks`` (task -> family) shuffles the labels over whole families: a family's tasks keep one
    label together, as they do in the data, so pairs inside a family, always "within", cannot make
    a group look shared. Beside the gap the result then gives ``gap_excl`` (pairs inside a family
    left out of within and across) and ``p_excl`` from the same shuffles. ``strata`` (task ->
    coarser group) shuffles only within each coarser group: a test of finer groups (task
    families) beyond what the coarser ones (categories) already share.
    """
    observed, null, excl = _permutation(matrix, categories, n_perm, seed, strata, blocks)
    out: dict[str, float | int | str] = {**category_summary(matrix, categories), "gap": observed}
    out.update(_p(observed, null, n_perm))
    if blocks is not None:
        ex_obs, ex_null, n_pairs = excl
        out.update({"gap_excl": ex_obs, "pairs_excl": n_pairs, "p_excl": _p(ex_obs, ex_null, n_perm)["p_value"]})
    return out


def _p(observed: float, null: np.ndarray, n_perm: int) -> dict[str, float | int | str]:
    """One-sided permutation p (the observed labelling counted), its floor and the null's mean."""
    if np.isnan(observed) or not len(null):  # no pair within a group, or none across: nothing to test
        return {"p_value": float("nan"), "null_mean": float("nan"), "p_floor": 1 / (n_perm + 1),
                "n_perm": n_perm, "sided": "greater"}  # fmt: skip
    p = (1 + int((null >= observed - 1e-12).sum())) / (n_perm + 1)
    return {"p_value": p, "null_mean": float(null.mean()), "p_floor": 1 / (n_perm + 1), "n_perm": n_perm,
            "sided": "greater"}  # fmt: skip


def format_p(p: float, n_perm: int) -> str:
    """A permutation p for a table: '<= 1/10,001' at its floor (no shuffle reached the observed gap)."""
    if np.isnan(p):
        return "-"
    if p <= 1 / (n_perm + 1) + 1e-15:
        return f"<= 1/{n_perm + 1:,}"
    return f"{p:.4f}"


def permutation_null(
    matrix: pd.DataFrame,
    categories: Mapping[str, str],
    n_perm: int = 10_000,
    seed: int = 0,
    strata: Mapping[str, str] | None = None,
    blocks: Mapping[str, str] | None = None,
) -> tuple[float, np.ndarray]:
    """The observed within-minus-across gap and its ``n_perm`` gaps with the labels shuffled: over tasks,
    over whole ``blocks`` (families) when given, within each of ``strata``'s groups when given (a task
    missing from ``strata`` or ``blocks`` is a group alone). The shuffles ``category_permutation_test`` uses.

    The gap is NaN (and the null empty) when no pair lies within a category or none across.
    """
    observed, null, _ = _permutation(matrix, categories, n_perm, seed, strata, blocks)
    return observed, null


def _permutation(matrix, categories, n_perm, seed, strata, blocks):
    """(observed gap, null gaps, (gap without same-block pairs, its null, pairs it keeps))."""
    names = [n for n in matrix.index if n in categories]
    m = matrix.loc[names, names].to_numpy(dtype=float)
    labels = np.array([categories[n] for n in names])
    upper = np.triu_indices(len(names), 1)
    values = m[upper]
    unit_of = [blocks.get(n, f"\0{n}") for n in names] if blocks is not None else names
    units = list(dict.fromkeys(unit_of))  # the things shuffled: families, or tasks
    index = np.array([units.index(u) for u in unit_of])
    unit_label = {}
    for n, u, lab in zip(names, unit_of, labels):
        if unit_label.setdefault(u, lab) != lab:
            raise ValueError(f"family '{u}' spans two groups ('{unit_label[u]}' and '{lab}', at '{n}'): "
                             "blocks must lie inside one group")  # fmt: skip
    unit_labels = np.array([unit_label[u] for u in units])
    inside = (index[:, None] == index[None, :])[upper]  # pairs within one block (always within a group)

    def gaps(lab: np.ndarray) -> tuple[float, float]:
        same = (lab[:, None] == lab[None, :])[upper]
        full = values[same].mean() - values[~same].mean() if same.any() and (~same).any() else np.nan
        keep_w, keep_a = same & ~inside, ~same & ~inside
        ex = values[keep_w].mean() - values[keep_a].mean() if keep_w.any() and keep_a.any() else np.nan
        return float(full), float(ex)

    observed, ex_observed = gaps(labels)
    if np.isnan(observed):
        return observed, np.empty(0), (ex_observed, np.empty(0), int((~inside).sum()))
    rng = np.random.default_rng(seed)
    keys = []
    for i, u in enumerate(units):  # a block's stratum: the one all its tasks share
        found = {(strata or {}).get(names[j], f"\0{u}") for j in np.flatnonzero(index == i)} if strata is not None else {""}
        if len(found) > 1:
            raise ValueError(f"block '{u}' spans strata {sorted(found)}: blocks must lie inside one stratum")
        keys.append(found.pop())
    groups = [np.flatnonzero(np.array(keys, dtype=object) == key) for key in dict.fromkeys(keys)]
    null = np.empty(n_perm)
    ex_null = np.empty(n_perm)
    for i in range(n_perm):
        lab = unit_labels.copy()
        for ix in groups:
            lab[ix] = rng.permutation(unit_labels[ix])
        null[i], ex_null[i] = gaps(lab[index])
    return observed, null, (ex_observed, ex_null, int((~inside).sum()))


def expected_jaccard(n: int, k: int) -> float:
    """Expected Jaccard overlap of two independent uniformly random k-sets out of n (the chance level)."""
    from math import comb

    if not 0 < k <= n:
        raise ValueError(f"need 0 < k <= n, got k={k}, n={n}")
    total = comb(n, k)
    return sum(comb(k, i) * comb(n - k, k - i) / total * i / (2 * k - i) for i in range(max(0, 2 * k - n), k + 1))


def seed_stability(alphas: Sequence[Float[Tensor, "layer head_index"]], k: int) -> dict[str, float | int]:
    """One task's alphas from several seeds: mean pairwise Spearman, mean pairwise top-k Jaccard, its chance level."""
    if len(alphas) < 2:
        raise ValueError("seed stability needs alphas from two or more seeds")
    pairs = [(a, b) for i, a in enumerate(alphas) for b in alphas[i + 1 :]]
    return {
        "n_seeds": len(alphas),
        "spearman": float(np.mean([spearman(a, b) for a, b in pairs])),
        "jaccard": float(np.mean([jaccard(top_k_set(a, k), top_k_set(b, k)) for a, b in pairs])),
        "jaccard_chance": expected_jaccard(alphas[0].numel(), k),
    }
