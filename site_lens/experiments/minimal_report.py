"""Tables and figures of ``site-lens sparsify`` folders (no model): smallest k per method, the shared gate.

    write_summaries("runs/sparse")                      # summary.md and its CSVs
    write_minimal_figures("runs/sparse", "figures/minimal")
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import torch

from ..adapter import load_adapter
from ..analysis.minimal import parse_heads, seed_overlap
from ..files import write_text_atomic
from .sweep import minimal_folders, read_minimal


def chosen_sets(scores: pd.DataFrame, smallest: pd.DataFrame, method: str, metric: str = "recovery_em") -> pd.DataFrame:
    """Per (task, seed): the heads of ``method``'s valid-chosen set (the smallest reaching the target)."""
    rows = []
    pick = smallest[(smallest.method == method) & (smallest.metric == metric) & smallest.k.notna()]
    for _, r in pick.iterrows():
        s = scores[
            (scores.task == r.task)
            & (scores.seed == r.seed)
            & (scores.split == "test")
            & (scores.method == method)
            & (scores["mode"] == "binary")
            & (scores.k == r.k)
        ]
        if "weight" in r and pd.notna(r.get("weight")):
            s = s[(s.weight == r.weight) & (s.threshold == r.threshold)]
        if len(s):
            rows.append({"task": r.task, "seed": int(r.seed), "k": int(r.k), "heads": s.iloc[0].heads})
    return pd.DataFrame(rows, columns=["task", "seed", "k", "heads"])


def summarise_minimal(root: str | Path, metric: str = "recovery_em") -> pd.DataFrame:
    """Per task and method: median over seeds of the smallest k reaching the target, test recovery, seed overlap."""
    scores, small = read_minimal(root)
    small = small[small.metric == metric]
    gains = scores[(scores.split == "test") & (scores.method == "site")].groupby("task").site_gain_em.mean()
    rows = []
    for (task, method), g in small.groupby(["task", "method"]):
        ks = g.k.dropna()
        row = {
            "task": task,
            "category": scores[scores.task == task].category.iloc[0],
            "method": method,
            "seeds": len(g),
            "reached": int(ks.size),
            "k_median": float(ks.median()) if ks.size else None,
            "test_recovery": float(g.test_value.dropna().mean()) if g.test_value.notna().any() else None,
            "test_exact_match": float(g.test_exact_match.dropna().mean()) if g.test_exact_match.notna().any() else None,
            "site_gain_em": float(gains.get(task, float("nan"))),
        }
        if method.startswith("sparse"):
            sets = chosen_sets(scores, small, method, metric)
            sets = sets[sets.task == task]
            row["seed_jaccard"] = seed_overlap([parse_heads(h) for h in sets.heads]) if len(sets) > 1 else None
        rows.append(row)
    return pd.DataFrame(rows)


def kept_fraction(sets: pd.DataFrame, shape: tuple[int, int]) -> torch.Tensor:
    """(layer, head): the share of the rows of ``sets`` (``chosen_sets`` of one task) whose set holds each head."""
    counts = torch.zeros(shape)
    for h in sets.heads:
        for layer, head in parse_heads(h):
            counts[layer, head] += 1
    return counts / max(1, len(sets))


def write_minimal_figures(root: str | Path, out: str | Path, method: str = "sparse_l0") -> list[Path]:
    """Recovery against k (all tasks and per task), each task's minimal set as a heatmap, their overlap."""
    from ..analysis.minimal import jaccard
    from ..analysis.plots import alpha_heatmap, overlap_heatmap, save_figure
    from ..analysis.plots.minimal import SET_METHODS, k_curves

    scores, small = read_minimal(root)
    out = Path(out)
    written: list[Path] = []
    for metric in ("recovery_em", "recovery_prob"):
        fig = k_curves(scores, metric, title=f"{scores.task.nunique()} tasks: recovery against heads kept (test)")
        written += save_figure(fig, out / f"minimal_k_{metric}")
    shape = tuple(load_adapter(minimal_folders(root)[0] / "adapter").theta.shape)
    sets = chosen_sets(scores, small, method)
    majority: dict[str, set] = {}
    categories = scores.groupby("task").category.first().to_dict()
    for task in sorted(scores.task.unique()):
        written += save_figure(
            k_curves(scores[scores.task == task], title=f"{task}: recovery against heads kept"),
            out / f"minimal_k_{task}",
        )
        mine = sets[sets.task == task]
        if len(mine):
            frac = kept_fraction(mine, shape)  # type: ignore[arg-type]
            title = f"{task}: heads kept by {SET_METHODS.get(method, (method,))[0]}"
            n = len(mine)
            fig = alpha_heatmap(frac, title=title, colorbar_title=f"share of the {n} seeds keeping the head")
            shares = [f"{i}/{n}" for i in range(1, n)]
            fig.update_traces(colorbar=dict(tickvals=[i / n for i in range(n + 1)], ticktext=["0", *shares, "1"]))
            written += save_figure(fig, out / f"minimal_heads_{task}")
            majority[task] = {tuple(x) for x in (frac > 0.5).nonzero().tolist()}
    if len(majority) > 1:
        names = list(majority)
        matrix = pd.DataFrame(
            [[jaccard(majority[a], majority[b]) for b in names] for a in names], index=names, columns=names
        )
        fig = overlap_heatmap(
            matrix, title="Minimal sets across tasks (heads most seeds keep)", diverging=False,
            categories=categories, colorbar_title="Jaccard",
        )  # fmt: skip
        written += save_figure(fig, out / "minimal_overlap")
    shared = Path(root) / "shared" / "theta.safetensors"
    if shared.is_file():
        from safetensors.torch import load_file

        alpha = torch.sigmoid(load_file(str(shared))["theta"])
        written += save_figure(
            alpha_heatmap(alpha, title="one alpha shared by every task"), out / "minimal_shared_alpha"
        )
    return written


def markdown_table(df: pd.DataFrame, digits: int = 3) -> str:
    """A DataFrame as a Markdown table (floats to ``digits`` places, missing values blank)."""

    def cell(v) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return ""
        return f"{v:.{digits}f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def average_minimal(table: pd.DataFrame, min_gain: float = 0.1) -> pd.DataFrame:
    """Per method, over tasks (``summarise_minimal``'s rows): where SITE gains >= ``min_gain`` and apart where it does not.

    ``k_median`` counts a task whose method never reached the target as infinitely many heads
    (so the median says "not reached" when most did not); ``test_recovery`` averages the tasks
    that reached it.
    """
    rows = []
    for group, sub in (
        (f"gain >= {min_gain:.1f}", table[table.site_gain_em >= min_gain]),
        (f"gain < {min_gain:.1f}", table[table.site_gain_em < min_gain]),
    ):
        for method, g in sub.groupby("method", sort=False):
            ks = g.k_median.fillna(float("inf"))
            med = float(ks.median()) if len(ks) else float("nan")
            rows.append(
                {
                    "tasks": group,
                    "method": method,
                    "n_tasks": len(g),
                    "reached": int(g.k_median.notna().sum()),
                    "k_median": med,
                    "test_recovery": float(g.test_recovery.mean()) if g.test_recovery.notna().any() else float("nan"),
                    "seed_jaccard": float(g.seed_jaccard.mean())
                    if "seed_jaccard" in g and g.seed_jaccard.notna().any()
                    else float("nan"),
                }
            )
    return pd.DataFrame(rows)


def summarise_shared(root: str | Path, method: str = "sparse_l0") -> tuple[pd.DataFrame, dict]:
    """Per task: its own SITE against the shared gate (soft and as a mask); and which heads the tasks share.

    The dict gives the shared gate's open heads (alpha > 0.5) and, over the tasks' valid-chosen
    ``method`` sets of the shared seed, the heads every task keeps and those at least half keep.
    """
    root = Path(root)
    scores = pd.read_csv(root / "shared" / "scores.csv")
    info = json.loads((root / "shared" / "shared.json").read_text())
    rows = []
    for task, g in scores.groupby("task", sort=False):

        def get(m: str, mode: str, g: pd.DataFrame = g) -> pd.Series:
            return g[(g.method == m) & (g["mode"] == mode)].iloc[0]

        site, soft, mask = get("site", "soft"), get("shared", "soft"), get("shared", "binary")
        rows.append(
            {
                "task": task,
                "zero_shot_em": float(get("zero_shot", "binary").exact_match),
                "site_em": float(site.exact_match),
                "shared_em": float(soft.exact_match),
                "shared_mask_em": float(mask.exact_match),
                "shared_mask_k": int(mask.k),
                "n": int(site.n),
            }
        )
    table = pd.DataFrame(rows)
    all_scores, small = read_minimal(root)
    sets = chosen_sets(all_scores, small, method)
    sets = sets[sets.seed == info["seed"]]
    heads = [parse_heads(h) for h in sets.heads]
    counts: dict = {}
    for hs in heads:
        for h in hs:
            counts[h] = counts.get(h, 0) + 1
    shared_heads = {
        "shared_gate_open": info["n_open"],
        "tasks_with_a_chosen_set": len(heads),
        "kept_by_every_task": sorted(h for h, c in counts.items() if c == len(heads)) if heads else [],
        "kept_by_half_the_tasks": sorted(h for h, c in counts.items() if 2 * c >= len(heads)) if heads else [],
    }
    return table, shared_heads


def write_summaries(root: str | Path) -> str:
    """summary.md (per task and over tasks, on exact match and on answer probability; the shared gate) and CSVs."""
    root = Path(root)
    md = ""
    for metric, suffix in (("recovery_em", ""), ("recovery_prob", "_prob")):
        table = summarise_minimal(root, metric)
        average = average_minimal(table)
        write_text_atomic(root / f"summary{suffix}.csv", table.to_csv(index=False))
        write_text_atomic(root / f"summary_average{suffix}.csv", average.to_csv(index=False))
        what = "prefix match" if metric == "recovery_em" else "answer probability"
        md += f"## Recovery of {what}: over tasks\n\n" + markdown_table(average)
        md += f"\n## Recovery of {what}: per task\n\n" + markdown_table(table) + "\n"
    if (root / "shared" / "scores.csv").is_file():
        shared, heads = summarise_shared(root)
        write_text_atomic(root / "shared" / "summary.csv", shared.to_csv(index=False))
        md += "## One alpha for every task\n\n" + markdown_table(shared) + "\n"
        md += "".join(f"- {k}: {v}\n" for k, v in heads.items())
    write_text_atomic(root / "summary.md", md)
    return md
