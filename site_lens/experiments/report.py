"""Head-specificity report: analyses and figures from ``site-lens run`` folders.

A run folder holds ``results.json`` and ``adapter/``; ``find_runs`` finds them
recursively. ``analyse_runs`` (needs the model) adds to each folder

    patching.csv       patching.head_patching_sweep (top / bottom / random k)
    cie.safetensors    cie.causal_indirect_effect, tensor "cie" (layer, head)

and ``transfer.csv`` at the root (task B's t with task A's alpha).
``write_figures`` plots whatever is there (no model needed) and
``summarise`` returns the headline numbers as DataFrames.
``write_benchmark_figures`` plots ``site-lens bench`` folders (rows.csv,
bench.json): every method's score per task, per model.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from ..adapter import CFG_FILE, WEIGHTS_FILE, Adapter, load_adapter
from ..files import save_tensors

log = logging.getLogger(__name__)
PATCHING_FILE = "patching.csv"
CIE_FILE = "cie.safetensors"
TRANSFER_FILE = "transfer.csv"


@dataclass
class Run:
    """One ``site-lens run`` output folder."""

    path: Path
    name: str  # the task name
    results: dict[str, Any]
    adapter: Adapter

    @property
    def patching(self) -> pd.DataFrame | None:
        p = self.path / PATCHING_FILE
        return pd.read_csv(p) if p.is_file() else None

    @property
    def cie(self) -> torch.Tensor | None:
        from safetensors.torch import load_file

        p = self.path / CIE_FILE
        return load_file(str(p))["cie"] if p.is_file() else None


def find_runs(root: str | Path) -> list[Run]:
    """Every folder under ``root`` (itself included) holding results.json and adapter/, by task name.

    ``root`` may also be one adapter folder (cfg.json + adapter.safetensors, as ``save_adapter``
    writes): the run folder whose adapter/ it is, else the adapter on its own (``adapter_run``).
    """
    root = Path(root)
    if (root / CFG_FILE).is_file() or (root / WEIGHTS_FILE).is_file():
        if root.name == "adapter" and (root.parent / "results.json").is_file():
            return find_runs(root.parent)
        return [adapter_run(root)]
    runs = []
    for res in sorted(root.rglob("results.json")):
        d = res.parent
        if not (d / "adapter").is_dir():
            continue
        results = json.loads(res.read_text())
        runs.append(Run(d, str(results.get("task", d.name)), results, load_adapter(d / "adapter")))
    return runs


def adapter_run(path: str | Path) -> Run:
    """A ``Run`` of a bare adapter folder: the task, its source and the training history from the adapter's meta.

    Its analyses (patching.csv, cie.safetensors) are written into the folder itself.
    """
    from ..tasks import TaskError

    path = Path(path)
    adapter = load_adapter(path)
    meta = adapter.meta
    name = meta.get("task")
    if not isinstance(name, str) or not name:
        raise TaskError(f"{path}: the adapter records no task (cfg.json has no meta.task), so no task to analyse it on")
    results: dict[str, Any] = {"task": name, "task_source": meta.get("task_source"), "model": adapter.model.get("name")}
    if isinstance(meta.get("history"), dict):
        results["history"] = meta["history"]
    return Run(path, name, results, adapter)


# ---------------------------------------------------------------- analyses (need the model)


def analyse_runs(
    model,
    runs: Sequence[Run],
    data_dir: str | Path | None = None,
    max_items: int = 50,
    cie_prompts: int = 25,
    draws: int = 5,
    redo: bool = False,
    n_shots: int = 10,
) -> None:
    """Write patching.csv and cie.safetensors into each run folder, transfer.csv next to them (skips existing)."""

    from ..analysis.cie import causal_indirect_effect
    from ..analysis.overlap import transfer_matrix
    from ..analysis.patching import head_patching_sweep
    from ..models import model_identity
    from ..progress import Progress
    from ..tasks import load_task

    tasks = {}
    with Progress(2 * len(runs) + (len(runs) > 1), "analyse", unit="analysis") as progress:  # patching, CIE; transfer
        for run in runs:
            src = str(run.results.get("task_source") or "")
            if data_dir:
                task = load_task(run.name, data_dir=data_dir)
            else:
                task = load_task(run.name if not src or src.startswith("builtin:") else src)
            tasks[run.name] = task
            run.adapter.check_model(model_identity(model))
            if redo or not (run.path / PATCHING_FILE).is_file():
                progress.start(f"{run.name}: patching")
                df = head_patching_sweep(model, task, run.adapter, draws=draws, max_items=max_items)
                df.to_csv(run.path / PATCHING_FILE, index=False)
                progress.done(f"{run.name}: patching, {len(df)} head sets")
            else:
                progress.skip()
            if redo or not (run.path / CIE_FILE).is_file():
                progress.start(f"{run.name}: CIE")
                cie = causal_indirect_effect(model, task, run.adapter.t, n_prompts=cie_prompts, n_shots=n_shots)
                save_tensors(run.path / CIE_FILE, {"cie": cie.contiguous()})  # whole or absent: a rerun redoes it
                progress.done(f"{run.name}: CIE over {cie.numel()} heads")
            else:
                progress.skip()
            log.info("analysed %s", run.name)
        if len(runs) > 1:
            progress.start(f"transfer between {len(runs)} runs")
            tm = transfer_matrix(model, tasks, {r.name: r.adapter for r in runs}, max_items=max_items)
            tm.to_csv(transfer_path(runs))
            progress.done(f"transfer between {len(runs)} runs")


def transfer_path(runs: Sequence[Run]) -> Path:
    """Where ``analyse_runs`` writes, and ``site-lens figures`` reads, the runs' transfer table: their common folder."""
    return _common_root([r.path for r in runs]) / TRANSFER_FILE


def _common_root(paths: Sequence[Path]) -> Path:
    parts = [p.resolve().parent.parts for p in paths]
    common = []
    for level in zip(*parts):
        if len(set(level)) != 1:
            break
        common.append(level[0])
    return Path(*common) if common else Path(".")


# ---------------------------------------------------------------- summaries and figures


def summarise(
    runs: Sequence[Run], categories: dict[str, str] | None = None, ks: Sequence[int] | None = None
) -> dict[str, pd.DataFrame]:
    """Headline tables: per-task alpha shares, accuracies, alpha-CIE correlation; patching recovery at ``ks``
    (default: every k the sweeps measured, up to all heads); overlap.

    ``categories`` (task -> category) default to each run's recorded category, else ``tasks.category``.
    """
    from ..tasks import category

    categories = {**{r.name: r.results.get("category") or category(r.name) for r in runs}, **(categories or {})}
    from ..analysis.cie import alpha_cie_correlation
    from ..analysis.overlap import alpha_shares, category_summary, jaccard_matrix, pearson_matrix, spearman_matrix

    rows = []
    for r in runs:
        row = {"task": r.name, "category": categories[r.name], **alpha_shares(r.adapter.alpha)}
        for m in ("zero_shot", "icl", "site"):
            if m in r.results:
                row[f"{m}_first_token_acc"] = r.results[m]["first_token_acc"]
        cie = r.cie
        if cie is not None:
            c = alpha_cie_correlation(r.adapter.alpha, cie)
            row["alpha_cie_pearson"], row["alpha_cie_spearman"] = c["pearson"], c["spearman"]
        rows.append(row)
    out = {"tasks": pd.DataFrame(rows)}
    frames = [r.patching for r in runs if r.patching is not None]
    if frames:
        df = pd.concat(frames, ignore_index=True)
        d = df[df.condition.isin(["top", "bottom", "random"])]
        d = d if ks is None else d[d.k.isin(list(ks))]
        out["patching"] = (
            d.groupby(["condition", "k"])[["recovery_prob", "recovery_acc", "acc", "prob"]].mean().reset_index()
        )
    alphas = {r.name: r.adapter.alpha for r in runs}
    known = {n: c for n, c in categories.items() if c != "other"}  # an uncategorised task is in no category
    if len(alphas) > 1:
        out["overlap"] = pd.DataFrame(
            [
                {"measure": name, **category_summary(m, known)}
                for name, m in (
                    ("pearson", pearson_matrix(alphas)),
                    ("spearman", spearman_matrix(alphas)),
                    ("jaccard_top20", jaccard_matrix(alphas, 20)),
                )
            ]
        )
    return out


def _categories(runs: Sequence[Run]) -> dict[str, str]:
    from ..tasks import category

    return {r.name: r.results.get("category") or category(r.name) for r in runs}


def write_figures(
    runs: Sequence[Run], out: str | Path, transfer: pd.DataFrame | None = None, jaccard_k: int = 20
) -> list[Path]:
    """Every figure the runs support, as HTML (+ PNG when static export works); returns the files written.

    Per run: alpha_TASK, training_TASK, patching_TASK, alpha_cie_TASK. Across runs:
    alpha_histogram (one panel per task), patching_all (mean and spread over tasks),
    overlap_pearson, overlap_spearman, overlap_jaccard and transfer (tasks grouped by
    category, one order for all four).
    """
    from ..analysis.overlap import jaccard_matrix, pearson_matrix, spearman_matrix
    from ..analysis.plots import (
        alpha_cie_scatter,
        alpha_heatmap,
        alpha_histogram,
        grouped_order,
        jaccard_chance,
        overlap_heatmap,
        patching_curves,
        save_figure,
        training_curve,
        transfer_heatmap,
    )

    out = Path(out)
    written: list[Path] = []
    for r in runs:
        model = r.results.get("model", "")
        written += save_figure(
            alpha_heatmap(r.adapter.alpha, title=f"{r.name}: SITE alpha" + (f" ({model})" if model else "")),
            out / f"alpha_{r.name}",
        )
        if r.results.get("history"):
            written += save_figure(
                training_curve(r.results["history"], title=f"{r.name}: training alpha"), out / f"training_{r.name}"
            )
        if r.patching is not None:
            written += save_figure(
                patching_curves(_with_task(r.patching, r.name), title=f"{r.name}: patching t into k heads"),
                out / f"patching_{r.name}",
            )
        if r.cie is not None:
            written += save_figure(
                alpha_cie_scatter(r.adapter.alpha, r.cie, title=f"{r.name}: alpha vs FV's CIE"),
                out / f"alpha_cie_{r.name}",
            )
    if not runs:
        return written
    categories = _categories(runs)
    alphas = {r.name: r.adapter.alpha for r in runs}
    order = sorted(alphas, key=lambda n: (categories[n] != "abstractive", categories[n], n))
    written += save_figure(
        alpha_histogram({n: alphas[n] for n in order}, title="alpha over heads, per task", categories=categories),
        out / "alpha_histogram",
    )
    frames = [_with_task(r.patching, r.name) for r in runs if r.patching is not None]
    if len(frames) > 1:
        fig = patching_curves(
            pd.concat(frames, ignore_index=True), title=f"patching t into k heads, {len(frames)} tasks"
        )
        written += save_figure(fig, out / "patching_all")
    if len(alphas) > 1:
        pm = pearson_matrix(alphas)
        order = grouped_order(pm, categories)
        for name, m, label in (
            ("pearson", pm, "Pearson r of alpha over heads"),
            ("spearman", spearman_matrix(alphas), "Spearman ρ of alpha over heads"),
        ):
            fig = overlap_heatmap(m, order, f"alpha {name.capitalize()} correlation", True, categories, label)
            written += save_figure(fig, out / f"overlap_{name}")
        n_heads = int(next(iter(alphas.values())).numel())
        k = min(jaccard_k, n_heads)
        fig = overlap_heatmap(
            jaccard_matrix(alphas, k), order, f"overlap of the top-{k} heads", False, categories,
            f"Jaccard overlap of top-{k} heads", chance=jaccard_chance(k, n_heads),
        )  # fmt: skip
        written += save_figure(fig, out / "overlap_jaccard")
    if transfer is not None:
        names = [n for n in order if n in transfer.index and n in transfer.columns]
        names += [n for n in transfer.columns if n not in names and n in transfer.index]
        fig = transfer_heatmap(transfer, names, categories, title="one task's alpha with another's t")
        written += save_figure(fig, out / "transfer")
    return written


def _with_task(df: pd.DataFrame, name: str) -> pd.DataFrame:
    return df if "task" in df else df.assign(task=name)


# ---------------------------------------------------------------- benchmark figures

BENCH_ROWS = "rows.csv"  # written by bench.py
BENCH_META = "bench.json"  # bench.SPEC_FILE


def read_benchmark(bench_dirs: Sequence[str | Path]) -> pd.DataFrame:
    """Every folder's rows.csv with a ``model`` column (bench.json's "model", else the folder name)."""
    frames = []
    for d in map(Path, bench_dirs):
        meta = d / BENCH_META
        model = json.loads(meta.read_text()).get("model") if meta.is_file() else None
        frames.append(pd.read_csv(d / BENCH_ROWS).assign(model=model or d.name))
    return pd.concat(frames, ignore_index=True)


def write_benchmark_figures(
    bench_dirs: Sequence[str | Path], out: str | Path, metric: str = "exact_match"
) -> list[Path]:
    """benchmark_METRIC (all tasks) and benchmark_METRIC_by_category from ``bench`` folders; returns the files."""
    from ..analysis.plots import benchmark_figure, save_figure

    rows = read_benchmark(bench_dirs)
    out = Path(out)
    written = save_figure(benchmark_figure(rows, metric), out / f"benchmark_{metric}")
    written += save_figure(benchmark_figure(rows, metric, by_category=True), out / f"benchmark_{metric}_by_category")
    return written
