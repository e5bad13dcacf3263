"""The minimal-head-set study of one (task, seed), as ``site-lens sparsify`` runs it, and its folder.

    result = minimal_sets(model, task, seed=0)          # dense SITE, CIE, sparse paths, every set scored
    write_minimal(result, "runs/sparse/antonym/seed0")
    # minimal_report.summarise_minimal("runs/sparse"): per task and method, the smallest k reaching 0.9

Per (task, seed): dense SITE (the reference, recovery 1) and its t; FV's CIE
of every head against that t; attribution patching's estimate of every head's
effect of t (``analysis.attribution``, zero-shot train prompts, as many as
CIE's); a warm-started sparse path per penalty; then every head set
(zero-shot, dense SITE, each sparse gate soft and as binary masks, the top-k
by dense alpha, by CIE and by attribution, random k-sets) scored on valid
and test the same way (``minimal.score_head_sets``). Rankings are scored on a
k grid and at every k an L0 mask reached, so comparisons are at matched k.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from ..adapter import Adapter, load_adapter, save_adapter
from ..analysis.attribution import attribution_scores, zero_shot_examples
from ..analysis.cie import causal_indirect_effect
from ..analysis.minimal import (
    add_recovery,
    random_sets,
    ranking_sets,
    reference_sets,
    score_head_sets,
    smallest_k,
    sparse_sets,
)
from ..config import K_GRID, SPARSE_WEIGHTS, ConfigError, SiteConfig
from ..files import save_tensors, write_json_atomic, write_text_atomic
from ..methods.site import fit_site
from ..models.identity import model_identity
from ..progress import Progress
from ..stages.sparse import SparseFit, sparse_path
from ..tasks import Task, category
from ..types import Model

log = logging.getLogger(__name__)

ATTRIBUTION_PROMPTS = 25  # CIE's default n_prompts

DONE_FILE = "minimal.json"  # written last: a folder without it is incomplete


@dataclass
class MinimalResult:
    task: str
    seed: int
    dense: Adapter
    cie: torch.Tensor | None
    fits: list[SparseFit]
    scores: pd.DataFrame  # one row per (split, head set)
    smallest: pd.DataFrame  # one row per method
    info: dict = field(default_factory=dict)
    attribution: torch.Tensor | None = None  # (layer, head), attribution patching's estimated effects


def minimal_sets(
    model: Model,
    task: Task,
    seed: int = 0,
    *,
    weights: Mapping[str, Sequence[float]] = SPARSE_WEIGHTS,
    path_steps: int = 100,
    ks: Sequence[int] = K_GRID,
    draws: int = 2,
    thresholds: Sequence[float] = (0.5,),
    rankings: bool = True,
    max_valid: int | None = 100,
    max_test: int | None = 100,
    target: float = 0.9,
    cfg: SiteConfig | None = None,
) -> MinimalResult:
    """Dense SITE, CIE, the sparse paths and every head set scored on valid and test (see the module doc).

    Example:
        A tiny random model with a byte-level tokenizer stands in for a real one: its answers are
        noise, but the calls and what they return are those of a real run.

        >>> import site_lens as sl
        >>> model = sl.tiny_model("bytes")  # a byte-level tokenizer, built offline; or sl.load_model("smollm2-135m")
        >>> cfg = sl.SiteConfig(embedding=sl.EmbeddingConfig(n_prompts=2, n_shots=2),   # a few seconds' budget
        ...                     selection=sl.SelectionConfig(steps=2, eval_every=2, max_valid=2),
        ...                     eval=sl.EvalConfig(max_new_tokens=3, max_test=2))
        >>> result = minimal_sets(model, sl.load_task("uppercase"), weights={"l0": (0.03,)}, path_steps=4,
        ...                       ks=(1, 2), draws=1, max_valid=4, max_test=4, cfg=cfg)
        >>> sorted(set(result.scores["split"])), len(result.fits)
        (['test', 'valid'], 1)
        >>> {"zero_shot", "site", "dense_alpha", "cie", "random", "sparse_l0"} <= set(result.scores["method"])
        True
    """
    cfg = dataclasses.replace(cfg or SiteConfig(), seed=seed)  # a copy: the caller's config is left alone
    if cfg.sparsity is not None:
        raise ConfigError("minimal_sets starts from dense SITE and sweeps its own penalties: cfg.sparsity must be None")
    seconds: dict[str, float] = {}
    with Progress(1 + 2 * rankings + len(weights) + 2, f"{task.name} seed {seed}", unit="stage") as stages:
        stages.start(f"{task.name} seed {seed}: dense SITE")
        t0 = time.perf_counter()
        dense = fit_site(model, task, cfg).adapter
        seconds["dense"] = time.perf_counter() - t0
        stages.done(f"{task.name} seed {seed}: dense SITE")
        cie = attribution = None
        if rankings:
            t0 = time.perf_counter()
            cie = causal_indirect_effect(model, task, dense.t, n_shots=cfg.embedding.n_shots, seed=seed)
            seconds["cie"] = time.perf_counter() - t0
            stages.done(f"{task.name} seed {seed}: CIE")
            t0 = time.perf_counter()  # as many prompts as CIE's, zero-shot from train: SITE's own setting
            attribution = _attribution(model, task, dense.t)
            seconds["attribution"] = time.perf_counter() - t0
            stages.done(f"{task.name} seed {seed}: attribution")
        fits: list[SparseFit] = []
        for penalty, ws in weights.items():
            t0 = time.perf_counter()
            fits += sparse_path(model, task, list(ws), dense, penalty, path_steps, cfg)
            seconds[f"path_{penalty}"] = time.perf_counter() - t0
            stages.done(f"{task.name} seed {seed}: {penalty} path, {len(ws)} weights")
        alpha = dense.alpha
        sets = reference_sets(alpha) + sparse_sets(fits, thresholds)
        if rankings:
            assert cie is not None
            total = alpha.numel()
            sparse_ks = {int(f.mask(th).sum()) for f in fits for th in thresholds if f.sparsity.penalty == "l0"}
            matched = sorted(sparse_ks | set(ks) | {total})  # the grid and every k an L0 mask reached
            matched = [k for k in matched if 0 < k <= total]
            sets += ranking_sets(alpha, matched, "dense_alpha") + ranking_sets(cie, matched, "cie")
            sets += ranking_sets(attribution, matched, "attribution")
            sets += random_sets(alpha.shape, matched, draws, seed)
        t0 = time.perf_counter()
        frames = []
        for split, limit in (("valid", max_valid), ("test", max_test)):
            frames.append(score_head_sets(model, task, dense.t, sets, split, limit))
            stages.done(f"{task.name} seed {seed}: {len(sets)} head sets scored on {split}")
        seconds["scoring"] = time.perf_counter() - t0
    log.info("%s seed %d: %d head sets scored on valid and test; seconds %s", task.name, seed, len(sets), seconds)
    scores = pd.concat(frames, ignore_index=True)
    scores.insert(1, "seed", seed)
    scores.insert(2, "category", category(task))
    scores, smallest = _recovery_and_smallest(scores, task.name, seed, target)
    info = {
        "task": task.name,
        "seed": seed,
        "category": category(task),
        "weights": {k: list(v) for k, v in weights.items()},
        "path_steps": path_steps,
        "ks": list(ks),
        "draws": draws,
        "rankings": rankings,
        "thresholds": list(thresholds),
        "max_valid": max_valid,
        "max_test": max_test,
        "target": target,
        "config": cfg.to_dict(),
        "seconds": seconds,
        "sparse": [f.summary() for f in fits],
    }
    return MinimalResult(task.name, seed, dense, cie, fits, scores, smallest, info, attribution)


RECOVERY_COLUMNS = ("recovery_em", "recovery_prob", "site_gain_em")


def _attribution(model: Model, task: Task, t: torch.Tensor) -> torch.Tensor:
    """Attribution patching's estimated effect of t per head, on ATTRIBUTION_PROMPTS zero-shot train prompts."""
    return attribution_scores(model, zero_shot_examples(model, task, "train", ATTRIBUTION_PROMPTS), t)


def _save_tensors(folder: Path, name: str, tensors: dict) -> None:
    """``tensors`` as the safetensors file ``folder / name``, written whole or not at all, with open()'s mode."""
    save_tensors(folder / name, tensors)


def _recovery_and_smallest(
    scores: pd.DataFrame, task: str, seed: int, target: float
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Recovery of every scored set (recomputed), and per method the smallest set reaching ``target`` on valid."""
    scores = add_recovery(scores.drop(columns=[c for c in RECOVERY_COLUMNS if c in scores.columns]))
    valid, test = scores[scores.split == "valid"], scores[scores.split == "test"]
    smallest = pd.concat(
        [smallest_k(valid, test, target, m) for m in ("recovery_em", "recovery_prob")], ignore_index=True
    )
    smallest.insert(0, "task", task)
    smallest.insert(1, "seed", seed)
    return scores, smallest


def add_attribution(model: Model, task: Task, folder: str | Path) -> float | None:
    """Attribution's ranking added to a finished folder made without it; its seconds, or None if nothing to add.

    The folder's dense t gives the estimate (as ``minimal_sets`` makes it); its top-k sets at the
    k the folder's other rankings were scored at are scored the same way (valid and test, the
    folder's item limits), and recovery, smallest k and ``minimal.json`` are rewritten. Nothing
    is added to a folder made without rankings or that has the attribution already.
    """
    folder = Path(folder)
    info = json.loads((folder / DONE_FILE).read_text())
    scores = pd.read_csv(folder / "scores.csv")
    if not (scores.method == "dense_alpha").any() or (scores.method == "attribution").any():
        return None
    dense = load_adapter(folder / "adapter")
    dense.check_model(model_identity(model))  # the folder's model, not another
    t0 = time.perf_counter()
    attribution = _attribution(model, task, dense.t)
    seconds = time.perf_counter() - t0
    ks = sorted(int(k) for k in scores.k[scores.method == "dense_alpha"].unique())
    sets = ranking_sets(attribution, ks, "attribution")
    new = pd.concat(
        [score_head_sets(model, task, dense.t, sets, split, info[f"max_{split}"]) for split in ("valid", "test")],
        ignore_index=True,
    )
    new.insert(1, "seed", info["seed"])
    new.insert(2, "category", info["category"])
    both = pd.concat([scores, new], ignore_index=True)
    both, smallest = _recovery_and_smallest(both, task.name, info["seed"], info["target"])
    _save_tensors(folder, "attribution.safetensors", {"attribution": attribution.float().contiguous()})
    write_text_atomic(folder / "smallest_k.csv", smallest.to_csv(index=False))
    write_text_atomic(folder / "scores.csv", both.to_csv(index=False))  # the mark that it is added
    info["seconds"]["attribution"] = seconds
    write_json_atomic(folder / DONE_FILE, info)
    return seconds


def write_minimal(result: MinimalResult, folder: str | Path) -> Path:
    """The folder: adapter/ (dense SITE), cie, attribution and sparse thetas (safetensors), scores.csv, smallest_k.csv,
    minimal.json."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / DONE_FILE).unlink(missing_ok=True)  # unfinished until the end, also when redone
    for name in ("cie.safetensors", "attribution.safetensors"):
        (folder / name).unlink(missing_ok=True)
    save_adapter(result.dense, folder / "adapter")
    if result.cie is not None:
        _save_tensors(folder, "cie.safetensors", {"cie": result.cie.float().contiguous()})
    if result.attribution is not None:
        _save_tensors(folder, "attribution.safetensors", {"attribution": result.attribution.float().contiguous()})
    # one theta per sparse point, named PENALTY_INDEX in the order of minimal.json's "sparse" list
    _save_tensors(
        folder,
        "sparse.safetensors",
        {f"{f.sparsity.penalty}_{i}": f.adapter.theta.float().contiguous() for i, f in enumerate(result.fits)},
    )
    write_text_atomic(folder / "scores.csv", result.scores.to_csv(index=False))
    write_text_atomic(folder / "smallest_k.csv", result.smallest.to_csv(index=False))
    write_json_atomic(folder / DONE_FILE, result.info)
    return folder


SETTINGS = (
    "weights",
    "path_steps",
    "ks",
    "draws",
    "rankings",
    "thresholds",
    "max_valid",
    "max_test",
    "target",
    "config",
)


def settings_differ(folder: str | Path, requested: dict) -> list[str]:
    """The settings (``SETTINGS`` keys of ``requested``) a finished folder was made with differently."""
    info = json.loads((Path(folder) / DONE_FILE).read_text())
    if isinstance(info.get("config"), dict):  # a field added since takes its default, as it did then
        info["config"] = SiteConfig.from_dict(info["config"]).to_dict()
    return [k for k in SETTINGS if k in requested and k in info and info[k] != requested[k]]


def is_done(folder: str | Path) -> bool:
    """Whether ``write_minimal`` finished this folder."""
    return (Path(folder) / DONE_FILE).is_file()


def minimal_folders(root: str | Path) -> list[Path]:
    """Every finished (task, seed) folder under ``root``, sorted."""
    return sorted(p.parent for p in Path(root).glob(f"**/{DONE_FILE}"))


def read_minimal(root: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(scores, smallest_k) of every finished folder under ``root``, concatenated."""
    folders = minimal_folders(root)
    if not folders:
        raise FileNotFoundError(f"{root}: no finished minimal-set folders (no {DONE_FILE} below it)")
    scores = pd.concat([pd.read_csv(f / "scores.csv") for f in folders], ignore_index=True)
    small = pd.concat([pd.read_csv(f / "smallest_k.csv") for f in folders], ignore_index=True)
    return scores, small


def run_shared(
    model: Model, root: str | Path, tasks: Sequence[Task], seed: int = 0, cfg: SiteConfig | None = None
) -> pd.DataFrame:
    """One alpha over ``tasks`` (each task's t from its finished ``root/TASK/seed{seed}`` folder), scored per task.

    Writes ``root/shared/``: theta.safetensors, scores.csv (per task on test: zero-shot, the task's own
    SITE, the shared gate soft and as a mask at 0.5) and shared.json; returns the scores.
    """
    from ..analysis.minimal import HeadSet, mask_alpha
    from ..stages.shared import fit_shared

    cfg = cfg or SiteConfig(seed=seed)
    root = Path(root)
    dense = {}
    for task in tasks:
        folder = root / task.name / f"seed{seed}"
        if not is_done(folder):
            raise FileNotFoundError(f"{folder}: run the task's minimal-set study (seed {seed}) before the shared gate")
        dense[task.name] = load_adapter(folder / "adapter")
    fit = fit_shared(model, {n: a.t for n, a in dense.items()}, {t.name: t for t in tasks}, cfg.selection, seed, cfg.engine)
    frames = []
    for task in tasks:
        a = dense[task.name]
        sets = reference_sets(a.alpha) + [
            HeadSet("shared", fit.alpha, int((fit.alpha > 0).sum()), mode="soft"),
            HeadSet("shared", mask_alpha(fit.alpha > 0.5), int((fit.alpha > 0.5).sum())),
        ]
        frames.append(score_head_sets(model, task, a.t, sets, "test", cfg.eval.max_test))
    scores = pd.concat(frames, ignore_index=True)
    scores.insert(1, "seed", seed)
    scores = add_recovery(scores)
    out = root / "shared"
    out.mkdir(parents=True, exist_ok=True)
    _save_tensors(out, "theta.safetensors", {"theta": fit.theta.contiguous()})
    write_text_atomic(out / "scores.csv", scores.to_csv(index=False))
    info = {
        "tasks": fit.tasks,
        "seed": seed,
        "selection": cfg.selection.to_dict(),
        "seconds": fit.seconds,
        "history": fit.history.to_dict(),
        "n_open": int((fit.alpha > 0.5).sum()),
    }
    write_json_atomic(out / "shared.json", info)
    return scores
