"""Two atlases side by side: do the tasks that share heads in one share them in the other?

    compare_atlases(smollm2_atlas, gemma_atlas)   # two models: a Mantel test over their shared tasks
    compare_atlases(atlas, atlas, seeds=(1, 2))   # two seeds of one model

Each atlas gives a task-by-task matrix of top-k Jaccard (its default k, a tenth of its heads;
averaged over its seeds unless one is named). The statistic is the Spearman correlation of the
two matrices' entries over the pairs of shared tasks; its null shuffles the task labels of one
matrix (rows and columns together), which keeps each matrix's own structure and breaks only
their correspondence: a Mantel test. Pairs of one task family (animal_v_object_3 and _5) share
heads strongly in any model, so the shuffles move whole families (onto families of the same
size), and the correlation is also given with those pairs left out.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .build import family
from .store import Atlas, AtlasError

MIN_TASKS = 4


def task_matrix(atlas: Atlas, tasks: list[str], seed: int | None = None, k: int | None = None) -> pd.DataFrame:
    """Top-k Jaccard between ``tasks``, at ``seed`` or averaged over the seeds that map both tasks of a pair."""
    seeds = [seed] if seed is not None else atlas.seeds
    mats = np.stack([atlas.overlap(s, k).reindex(index=tasks, columns=tasks).to_numpy(dtype=float) for s in seeds])
    with np.errstate(invalid="ignore"):
        mean = np.nanmean(mats, axis=0) if np.isfinite(mats).any(axis=0).all() else np.full(mats.shape[1:], np.nan)
    return pd.DataFrame(mean, index=tasks, columns=tasks)


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 3 or not (np.isfinite(a).all() and np.isfinite(b).all()):
        return float("nan")
    ra, rb = pd.Series(a).rank().to_numpy(), pd.Series(b).rank().to_numpy()  # average ranks for ties
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def family_permutation(tasks: list[str], rng: np.random.Generator) -> np.ndarray:
    """A shuffle of the task indices that moves whole families onto families of the same size, members in order."""
    units: dict[str, list[int]] = {}
    for i, t in enumerate(tasks):
        units.setdefault(family(t), []).append(i)
    by_size: dict[int, list[list[int]]] = {}
    for members in units.values():
        by_size.setdefault(len(members), []).append(members)
    perm = np.arange(len(tasks))
    for group in by_size.values():
        order = rng.permutation(len(group))
        for src, dst in zip(group, (group[j] for j in order)):
            perm[src] = dst
    return perm


def compare_atlases(
    a: Atlas,
    b: Atlas,
    seeds: tuple[int | None, int | None] = (None, None),
    k: tuple[int | None, int | None] = (None, None),
    n_perm: int = 10_000,
    seed: int = 0,
) -> dict[str, float | int | str]:
    """Mantel test of two atlases' task-by-task head overlap over their shared tasks (one-sided: agree more than chance).

    The null shuffles whole task families onto families of the same size (a family's two list
    lengths stay together, as they do in the data), so near-duplicate tasks cannot narrow it.
    p is NaN where the statistic is (constant or missing overlaps); a NaN shuffle counts against.

    Example:
        A tiny random model with a byte-level tokenizer stands in for a real one: its answers are
        noise, but the calls and what they return are those of a real run.

        >>> import site_lens as sl
        >>> model = sl.tiny_model("bytes")  # a byte-level tokenizer, built offline; or sl.load_model("smollm2-135m")
        >>> cfg = sl.SiteConfig(embedding=sl.EmbeddingConfig(n_prompts=2, n_shots=2),   # a few seconds' budget
        ...                     selection=sl.SelectionConfig(steps=2, eval_every=2, max_valid=2),
        ...                     eval=sl.EvalConfig(max_new_tokens=3, max_test=2))
        >>> import tempfile
        >>> from pathlib import Path
        >>> TASKS = ["uppercase", "opposites", "past-tense", "to-french"]
        >>> from site_lens.experiments.bench import run_bench
        >>> bench = Path(tempfile.mkdtemp())              # what `site-lens bench` writes
        >>> rows = run_bench(model, TASKS, ["site"], [0], bench, cfg=cfg)
        >>> atlas = sl.assemble_atlas(model, [bench])
        >>> result = compare_atlases(atlas, atlas, k=(3, 3), n_perm=100)
        >>> result["tasks"], result["pairs"], result["a"], result["b"]   # e.g. two models' atlases, in practice
        (4, 6, 'tiny-2x4', 'tiny-2x4')
        >>> 0 < result["p_value"] <= 1
        True
    """
    tasks = sorted(set(a.tasks) & set(b.tasks))
    if len(tasks) < MIN_TASKS:
        raise AtlasError(f"the two atlases share {len(tasks)} tasks; a comparison needs at least {MIN_TASKS}")
    ma = task_matrix(a, tasks, seeds[0], k[0]).to_numpy(dtype=float)
    mb = task_matrix(b, tasks, seeds[1], k[1]).to_numpy(dtype=float)
    upper = np.triu_indices(len(tasks), 1)
    fam = np.array([family(t) for t in tasks])
    apart = (fam[:, None] != fam[None, :])[upper]  # pairs of two families (a family shuffle keeps this set)
    va = ma[upper]
    rng = np.random.default_rng(seed)
    observed = (_spearman(va, mb[upper]), _spearman(va[apart], mb[upper][apart]))
    null = np.empty((n_perm, 2))
    for i in range(n_perm):
        p = family_permutation(tasks, rng)
        vb = mb[np.ix_(p, p)][upper]
        null[i] = _spearman(va, vb), _spearman(va[apart], vb[apart])
    pv = []
    for j in range(2):
        if np.isnan(observed[j]):
            pv.append(float("nan"))
        else:
            reach = np.isnan(null[:, j]) | (null[:, j] >= observed[j] - 1e-12)
            pv.append((1 + int(reach.sum())) / (n_perm + 1))
    return {
        "tasks": len(tasks),
        "pairs": len(va),
        "spearman": observed[0],
        "p_value": pv[0],
        "null_mean": float(np.nanmean(null[:, 0])) if np.isfinite(null[:, 0]).any() else float("nan"),
        "pairs_excl": int(apart.sum()),
        "spearman_excl": observed[1],
        "p_excl": pv[1],
        "p_floor": 1 / (n_perm + 1),
        "n_perm": n_perm,
        "sided": "greater",
        "a": str(a.model.get("name")),
        "b": str(b.model.get("name")),
    }
