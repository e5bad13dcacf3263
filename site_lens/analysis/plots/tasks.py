"""Figures across tasks: overlap and transfer matrices grouped by category, and the benchmark's methods x models."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .theme import (
    COLORWAY,
    DIVERGING,
    FONT,
    FONT_SMALL,
    FULL,
    MASKED,
    SEQUENTIAL,
    WIDTHS,
    _category_key,
    _colorbar,
    _rgba,
    _style,
    _text_px,
    diverging_range,
    legend_below,
    note,
    sequential_range,
)


def grouped_order(matrix: pd.DataFrame, categories: Mapping[str, str] | None = None) -> list[str]:
    """Tasks by category (abstractive, extractive, others, 'other' last), clustered within each category."""
    from ..overlap import cluster_order

    names = list(matrix.index)
    if not categories:
        return cluster_order(matrix)
    order = []
    for c in sorted({categories.get(n, "other") for n in names}, key=_category_key):
        members = [n for n in names if categories.get(n, "other") == c]
        order += cluster_order(matrix.loc[members, members])
    return order


def _group(order: list[str], categories: Mapping[str, str] | None) -> list[str]:
    """``order`` with tasks grouped by category, keeping their relative order within a category."""
    if not categories:
        return order
    return sorted(order, key=lambda n: _category_key(categories.get(n, "other")))


def _mark_categories(fig: go.Figure, order: list[str], categories: Mapping[str, str] | None) -> None:
    """Lines between category blocks and each category's name above its block."""
    if not categories:
        return
    cats = [categories.get(n, "other") for n in order]
    starts = [i for i in range(len(cats)) if i == 0 or cats[i] != cats[i - 1]] + [len(cats)]
    for s, e in itertools.pairwise(starts):
        fig.add_annotation(
            text=f"<b>{cats[s]}</b>", x=(s + e - 1) / 2, xref="x", y=1.0, yref="paper", yanchor="bottom",
            showarrow=False, font={"size": FONT},
        )  # fmt: skip
        if s > 0:
            line = {"color": "black", "width": 2}
            fig.add_shape(type="line", x0=s - 0.5, x1=s - 0.5, y0=-0.5, y1=len(cats) - 0.5, line=line)
            fig.add_shape(type="line", y0=s - 0.5, y1=s - 0.5, x0=-0.5, x1=len(cats) - 0.5, line=line)


def _task_heatmap(z, order, text, hover, scale: dict, colorbar: dict, title: str, categories) -> go.Figure:
    """One column wide if every cell's value fits there at ``FONT_SMALL``, else full width (values shown if they fit)."""
    n = len(order)
    labels = max(_text_px(t) for t in order) + 12  # the row labels' width, and about the column labels' height
    widest = max((_text_px(c) for row in text for c in row), default=0.0) + 8
    for size, width in WIDTHS.items():  # column, then full
        cell_w = (width - labels - 140) / n  # less the colour bar with its title, and an axis title
        if widest <= cell_w:
            break
    cell_h = min(cell_w, 44)
    fits = widest <= cell_w and cell_h >= FONT_SMALL + 6
    fig = go.Figure(
        go.Heatmap(
            z=z, x=order, y=order, text=text, texttemplate="%{text}" if fits else None,
            textfont={"size": FONT_SMALL}, customdata=hover, hovertemplate="%{customdata}<extra></extra>",
            colorbar=colorbar, xgap=1, ygap=1, **scale,
        )
    )  # fmt: skip
    height = round(cell_h * n + labels * 0.75 + 75)  # the column labels are at -40 degrees
    _style(fig, title, size, height=height, plot_bgcolor=MASKED, margin=dict(t=65, l=10, r=10, b=10))
    fig.update_xaxes(showgrid=False, showline=False, ticks="", tickangle=-40)
    fig.update_yaxes(showgrid=False, showline=False, ticks="", autorange="reversed")
    _mark_categories(fig, order, categories)
    return fig


def overlap_heatmap(
    matrix: pd.DataFrame,
    order: Sequence[str] | None = None,
    title: str = "alpha correlation across tasks",
    diverging: bool = True,
    categories: Mapping[str, str] | None = None,
    colorbar_title: str | None = None,
    chance: float | None = None,
) -> go.Figure:
    """Task x task heatmap of a square DataFrame (first task at the top), its trivial diagonal greyed out.

    Rows and columns follow ``order`` (e.g. ``overlap.cluster_order``), grouped by
    ``categories`` (task -> category) when given, with lines between the groups;
    with categories and no order, ``grouped_order``. Diverging data (correlations)
    get RdBu centred at 0 over +-max |off-diagonal value|; otherwise a sequential
    scale from 0 to the data's maximum. ``chance`` (e.g. ``jaccard_chance``) is
    stated in the colourbar title.
    """
    if order is None:
        order = grouped_order(matrix, categories) if categories else list(matrix.index)
    order = _group(list(order), categories)
    m = matrix.loc[order, order].to_numpy(dtype=float)
    off = ~np.eye(len(order), dtype=bool)
    z = np.where(off, m, np.nan)
    ticks = {}
    if diverging:
        r = diverging_range(z[off])
        scale = {"colorscale": DIVERGING, "zmid": 0, "zmin": -r, "zmax": r}
        cbar = colorbar_title or "correlation"
        notes = [f"colour range ±{r:.2f}"] if r < 1 else []
    else:
        zmax = sequential_range(np.r_[z[off], 0.0])[1]
        scale = {"colorscale": SEQUENTIAL, "zmin": 0.0, "zmax": zmax}
        cbar = colorbar_title or "overlap"
        notes = [f"colour range 0 to {zmax:.2f}"] if zmax < 1 else []
    if chance is not None:
        notes.append(f"chance {chance:.3f}")
        span = scale["zmax"] - scale["zmin"]
        step = next(st for st in (0.01, 0.02, 0.05, 0.1, 0.2, 0.25, 0.5, 1.0, 2.0) if span / st <= 5.01)
        vals = [v for v in np.arange(scale["zmin"], scale["zmax"] + 1e-9, step) if abs(v - chance) > 0.06 * span]
        ticks = {"tickvals": [*vals, chance], "ticktext": [f"{v:g}" for v in np.round(vals, 4)] + ["chance"]}
    if notes:
        cbar += note("; ".join(notes))
    text = [["" if i == j else _cell(m[i, j]) for j in range(len(order))] for i in range(len(order))]
    hover = [[f"{a} vs {b}: {m[i, j]:.3f}" for j, b in enumerate(order)] for i, a in enumerate(order)]
    return _task_heatmap(z, order, text, hover, scale, _colorbar(cbar, **ticks), title, categories)


def _cell(v: float) -> str:
    """A cell's value in two decimals, without the leading zero below 1 (".53", "−.12"): it fits a narrow cell."""
    t = f"{v:.2f}"
    return t.replace("0.", ".", 1).replace("-", "−") if abs(v) < 1 else t.replace("-", "−")


def jaccard_chance(k: int, n: int) -> float:
    """Expected Jaccard overlap of two independent uniformly random k-subsets of n heads (exact).

    The intersection X is hypergeometric (n, k, k), E[X] = k^2 / n, and the union is
    2k - X, so E[J] = sum_x P(X = x) x / (2k - x).
    """
    if not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if k == 0:
        return 1.0
    total = math.comb(n, k)
    return sum(
        math.comb(k, x) * math.comb(n - k, k - x) / total * x / (2 * k - x) for x in range(max(0, 2 * k - n), k + 1)
    )


def relative_transfer(transfer: pd.DataFrame) -> pd.DataFrame:
    """Each column (the task evaluated, with its t) over its own-alpha score (the diagonal); nan where that is 0."""
    own = pd.Series(
        np.diag(transfer.loc[transfer.columns, transfer.columns].to_numpy(dtype=float)), index=transfer.columns
    )
    return transfer.div(own.where(own != 0), axis=1)


def transfer_heatmap(
    transfer: pd.DataFrame,
    order: Sequence[str] | None = None,
    categories: Mapping[str, str] | None = None,
    title: str = "alpha transfer across tasks",
) -> go.Figure:
    """Accuracy on the column task (its t) with the row task's alpha, relative to the column task's own alpha.

    ``transfer`` is ``overlap.transfer_matrix`` output (index: alpha from, columns:
    task evaluated). 1 = as good as the task's own alpha; the diagonal (1 by
    construction) is outlined. Grouped by category like ``overlap_heatmap``.
    """
    order = _group(list(order) if order is not None else list(transfer.columns), categories)
    raw = transfer.loc[order, order].to_numpy(dtype=float)
    rel = relative_transfer(transfer.loc[order, order]).to_numpy(dtype=float)
    zmax = math.ceil(float(np.nanmax(np.r_[rel.flatten(), 1.0])) / 0.1 - 1e-9) * 0.1  # 0 to max(1, data)
    text = [["" if i == j or not np.isfinite(v) else _cell(v) for j, v in enumerate(row)] for i, row in enumerate(rel)]
    hover = [
        [f"alpha of {a}, t of {b}: accuracy {raw[i, j]:.2f}, own alpha {raw[j, j]:.2f}" for j, b in enumerate(order)]
        for i, a in enumerate(order)
    ]
    scale = {"colorscale": SEQUENTIAL, "zmin": 0.0, "zmax": zmax}
    cbar = _colorbar("accuracy relative to own alpha" + note("1 = as good as its own alpha (outlined)"))
    fig = _task_heatmap(rel, order, text, hover, scale, cbar, title, categories)
    for i in range(len(order)):
        fig.add_shape(
            type="rect", x0=i - 0.5, x1=i + 0.5, y0=i - 0.5, y1=i + 0.5, line={"color": "black", "width": 2.5}
        )
    fig.update_layout(xaxis_title="task evaluated (with its own t)", yaxis_title="alpha taken from")
    return fig


# ---------------------------------------------------------------- benchmark

METHOD_ORDER = ("zero_shot", "icl", "site", "fv", "tv", "i2cl", "mtv", "lora", "ia3")
METHOD_LABELS = {
    "zero_shot": "zero-shot", "icl": "10-shot ICL", "site": "SITE", "fv": "FV", "tv": "TV", "i2cl": "I2CL",
    "mtv": "MTV", "lora": "LoRA", "ia3": "(IA)³",
}  # fmt: skip
METRIC_LABELS = {"exact_match": "prefix match (%)", "first_token_acc": "first-token accuracy (%)",
                 "strict_match": "strict match (%)"}  # fmt: skip


def _benchmark_panel(fig, rows: pd.DataFrame, methods, models, metric: str, row: int, show_legend: bool) -> None:
    rng = np.random.default_rng(0)  # jitter only; the same figure every time
    width = 0.8 / len(models)
    slot_px = (FULL - 80) / (len(methods) + 0.2)  # px per method at full width
    for j, model in enumerate(models):
        color = COLORWAY[j % len(COLORWAY)]
        d = rows[rows["model"] == model].groupby(["method", "task"], as_index=False)[metric].mean()  # over seeds
        xs, ys, tasks, mx, my = [], [], [], [], []
        for i, m in enumerate(methods):
            v = d[d["method"] == m]
            if not len(v):
                continue
            centre = i + (j - (len(models) - 1) / 2) * width
            xs += list(centre + rng.uniform(-0.28, 0.28, len(v)) * width)
            ys += list(100 * v[metric])
            tasks += list(v["task"])
            mx.append(centre)
            my.append(100 * v[metric].mean())
        fig.add_trace(
            go.Scatter(
                x=xs, y=ys, mode="markers", text=tasks, name=f"{model}: one task", legendgroup=model,
                marker={"size": 5, "color": _rgba(color, 0.5)}, showlegend=show_legend,
                hovertemplate="%{text}: %{y:.0f}%<extra>" + model + "</extra>",
            ),
            row=row, col=1,
        )  # fmt: skip
        fig.add_trace(
            go.Scatter(
                x=mx, y=my, mode="markers", name=f"{model}: mean", legendgroup=model, showlegend=show_legend,
                marker={"symbol": "line-ew", "size": 0.8 * width * slot_px, "line": {"width": 3, "color": color}},
                hovertemplate="mean %{y:.1f}%<extra>" + model + "</extra>",
            ),
            row=row, col=1,
        )  # fmt: skip


def benchmark_figure(
    rows: pd.DataFrame, metric: str = "exact_match", by_category: bool = False, title: str | None = None
) -> go.Figure:
    """Per-method score over the benchmark's tasks: every task a point (jittered), the mean a bar; one colour per model.

    ``rows`` are ``bench`` rows.csv rows with a ``model`` column (``report.read_benchmark``);
    seeds are averaged per task. With ``by_category``, one panel per task category.
    """
    methods = [m for m in METHOD_ORDER if m in set(rows["method"])] + sorted(set(rows["method"]) - set(METHOD_ORDER))
    models = list(dict.fromkeys(rows["model"]))
    cats = sorted(set(rows["category"]), key=_category_key) if by_category else [None]
    n_tasks = {c: rows.loc[rows["category"] == c, "task"].nunique() for c in cats if c}
    titles = [f"{c} ({n_tasks[c]} task{'s' * (n_tasks[c] != 1)})" for c in cats] if by_category else None
    fig = make_subplots(rows=len(cats), cols=1, shared_xaxes=True, subplot_titles=titles, vertical_spacing=0.1)
    for r, c in enumerate(cats, start=1):
        _benchmark_panel(fig, rows if c is None else rows[rows["category"] == c], methods, models, metric, r, r == 1)
        fig.update_yaxes(title_text=METRIC_LABELS.get(metric, metric.replace("_", " ")), range=[-3, 103], row=r)
    if "site" in methods:  # the method this package is about, on a light band (after the traces: none on empty panels)
        i = methods.index("site")
        fig.add_vrect(x0=i - 0.5, x1=i + 0.5, fillcolor="#efefef", line_width=0, layer="below", row="all", col=1)
    what = METRIC_LABELS.get(metric, metric.replace("_", " ")).split(" (")[0]
    title = title or f"{what} on {rows['task'].nunique()} tasks" + (", by task category" if by_category else "")
    _style(fig, title, "full", height=370 if len(cats) == 1 else 600, margin=dict(t=70 if by_category else 45))
    fig.update_annotations(font_size=FONT)
    fig.update_xaxes(
        tickvals=list(range(len(methods))), ticktext=[METHOD_LABELS.get(m, m) for m in methods], showgrid=False,
        range=[-0.6, len(methods) - 0.4],
    )  # fmt: skip
    return legend_below(fig, axis_px=30)
