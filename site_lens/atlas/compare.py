"""Two atlases side by side: do the tasks that share heads in one share them in the other?

    compare_atlases(smollm2_atlas, gemma_atlas)   # two models: a Mantel test over their shared tasks
    compare_atlases(atlas, atlas, seeds=(1, 2))   # two seeds of one model

Each atlas gives a task-by-task matrix of top-k Jaccard (its default k, a tenth of its heads;
averaged over its seeds unless one is named). The statistic is the Spearman correlation of the
two matrices' entries over the pairs of shared tasks; its null shuffles the task labels of one
matrix (rows and columns together), which keeps each matrix's own structure and breaks only
their correspondence: a Mantel test. Pairs of one task family (animal_v_object_3 and _5) share
heads strongly in any model, so the correlation is also given with those pairs left out.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .build import family
from .store import Atlas, AtlasError

MIN_TASKS = 4


def task_matrix(atlas: Atlas, tasks: list[str], seed: int | None = None, k: int | None = None) -> pd.DataFrame:
    """Top-k Jaccard between ``tasks``, at ``seed`` or averaged over the atlas's seeds."""
    seeds = [seed] if seed is not None else atlas.seeds
    mats = [atlas.overlap(s, k).reindex(index=tasks, columns=tasks) for s in seeds]
    return sum(mats) / len(mats)


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = pd.Series(a).rank().to_numpy(), pd.Series(b).rank().to_numpy()  # average ranks for ties
    return float(np.corrcoef(ra, rb)[0, 1])


def compare_atlases(
    a: Atlas,
    b: Atlas,
    seeds: tuple[int | None, int | None] = (None, None),
    k: tuple[int | None, int | None] = (None, None),
    n_perm: int = 10_000,
    seed: int = 0,
) -> dict[str, float | int | str]:
    """Mantel test of two atlases' task-by-task head overlap over their shared tasks (one-sided: agree more than chance)."""
    tasks = sorted(set(a.tasks) & set(b.tasks))
    if len(tasks) < MIN_TASKS:
        raise AtlasError(f"the two atlases share {len(tasks)} tasks; a comparison needs at least {MIN_TASKS}")
    ma = task_matrix(a, tasks, seeds[0], k[0]).to_numpy(dtype=float)
    mb = task_matrix(b, tasks, seeds[1], k[1]).to_numpy(dtype=float)
    upper = np.triu_indices(len(tasks), 1)
    fam = np.array([family(t) for t in tasks])
    apart = (fam[:, None] != fam[None, :])[upper]  # pairs of two families
    va = ma[upper]
    rng = np.random.default_rng(seed)
    observed = (_spearman(va, mb[upper]), _spearman(va[apart], mb[upper][apart]))
    null = np.empty((n_perm, 2))
    for i in range(n_perm):
        p = rng.permutation(len(tasks))
        vb = mb[np.ix_(p, p)][upper]
        null[i] = _spearman(va, vb), _spearman(va[apart], vb[apart])
    pv = [(1 + int((null[:, j] >= observed[j] - 1e-12).sum())) / (n_perm + 1) for j in range(2)]
    return {
        "tasks": len(tasks),
        "pairs": len(va),
        "spearman": observed[0],
        "p_value": pv[0],
        "null_mean": float(null[:, 0].mean()),
        "pairs_excl": int(apart.sum()),
        "spearman_excl": observed[1],
        "p_excl": pv[1],
        "p_floor": 1 / (n_perm + 1),
        "n_perm": n_perm,
        "sided": "greater",
        "a": str(a.model.get("name")),
        "b": str(b.model.get("name")),
    }
