"""Plot functions: each takes tensors or DataFrames and returns a plotly ``go.Figure`` in the house theme.

Every figure uses the ``site_lens`` template (``THEME``, registered on import): white
background, a light grid, fonts readable at a paper's column width. Heads are
labelled ``L{layer}H{head}``, and every matrix puts its first row (layer 0, the
first task) at the top. Quantities in 0..1 get a sequential scale, fitted to the
data when they span little of 0..1 (the colourbar says so); only signed
quantities (correlations) get ``RdBu`` centred at 0, over +-max |value|.
``save_figure`` writes interactive HTML always, and PNG when a static exporter
(kaleido + a Chromium) is available.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
import torch
from jaxtyping import Float
from plotly.subplots import make_subplots
from torch import Tensor

log = logging.getLogger(__name__)

THEME = "site_lens"
WIDTH = 600  # px at scale 1; PNGs are written at scale 2
GRID = "#e6e6e6"
MASKED = "#d9d9d9"  # cells with no value (a matrix's trivial diagonal)
COLORWAY = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"]  # Okabe-Ito
SEQUENTIAL = "Viridis"
DIVERGING = "RdBu"


def _register_theme() -> None:
    axis = dict(
        showgrid=True, gridcolor=GRID, zeroline=False, showline=True, linecolor="#444", ticks="outside",
        tickcolor="#444", ticklen=4, automargin=True, title=dict(standoff=8, font=dict(size=15)),
        tickfont=dict(size=13),
    )  # fmt: skip
    t = go.layout.Template()
    t.layout = go.Layout(
        font=dict(family="Liberation Sans, Arial, Helvetica, sans-serif", size=15, color="#222"),
        title=dict(font=dict(size=17), x=0.5, xanchor="center", y=0.97, yanchor="top"),
        paper_bgcolor="white",
        plot_bgcolor="white",
        colorway=COLORWAY,
        xaxis=axis,
        yaxis=axis,
        legend=dict(font=dict(size=13), bgcolor="rgba(255,255,255,0.85)", tracegroupgap=2),
        margin=dict(l=60, r=20, t=50, b=55),
        hoverlabel=dict(font=dict(size=13)),
    )
    pio.templates[THEME] = t


_register_theme()


def _style(fig: go.Figure, title: str, width: int = WIDTH, height: int = 420, **layout) -> go.Figure:
    fig.update_layout(template=THEME, title_text=title, width=width, height=height, **layout)
    return fig


def head_label(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


# ---------------------------------------------------------------- colour ranges


def sequential_range(values, lo: float = 0.0, hi: float = 1.0, fit_below: float = 0.6) -> tuple[float, float, bool]:
    """(zmin, zmax, fitted) for a quantity in [lo, hi].

    [lo, hi] itself, or the data's range (rounded out to 0.05 steps) when the data span less than ``fit_below`` of it.
    """
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0 or v.max() - v.min() >= fit_below * (hi - lo):
        return lo, hi, False
    step = 0.05 * (hi - lo)
    zmin, zmax = math.floor(v.min() / step) * step, math.ceil(v.max() / step) * step
    return max(lo, zmin), min(hi, max(zmax, zmin + step)), True


def diverging_range(values) -> float:
    """Half-width of a symmetric range around 0 fitted to max |value| (0.05 steps)."""
    v = np.abs(np.asarray(values, dtype=float))
    v = v[np.isfinite(v)]
    m = float(v.max()) if v.size else 1.0
    return max(0.05, math.ceil(m / 0.05 - 1e-9) * 0.05)


def _colorbar(title: str, **kw) -> dict:
    """A colourbar in the house style, its title in words along its right side."""
    return dict(
        title=dict(text=title, side="right", font=dict(size=14)), thickness=14, outlinewidth=0, ticks="outside",
        tickfont=dict(size=13), **kw,
    )  # fmt: skip


def _range_note(zmin: float, zmax: float) -> str:
    return f"<br><sup>colour range fitted to the data: {zmin:.2f} to {zmax:.2f}</sup>"


# ---------------------------------------------------------------- layer x head


def alpha_heatmap(alpha: Float[Tensor, "layer head_index"], title: str = "SITE alpha") -> go.Figure:
    """Layer x head heatmap of alpha (layer 0 at the top); hover shows L{l}H{h} and the value."""
    a = torch.as_tensor(alpha).detach().float().cpu()
    n_layers, n_heads = a.shape
    zmin, zmax, fitted = sequential_range(a.numpy())
    text = [[head_label(layer, h) for h in range(n_heads)] for layer in range(n_layers)]
    fig = go.Figure(
        go.Heatmap(
            z=a.numpy(), x=list(range(n_heads)), y=list(range(n_layers)), zmin=zmin, zmax=zmax,
            colorscale=SEQUENTIAL, text=text, hovertemplate="%{text}: alpha = %{z:.3f}<extra></extra>",
            colorbar=_colorbar("alpha (head weight)" + (_range_note(zmin, zmax) if fitted else "")),
            xgap=1, ygap=1,
        )
    )  # fmt: skip
    _style(fig, title, width=max(380, 34 * n_heads + 200), height=max(360, 17 * n_layers + 120))
    fig.update_xaxes(title_text="head", dtick=1, showgrid=False, showline=False, ticks="")
    fig.update_yaxes(title_text="layer", dtick=1 if n_layers <= 12 else 2, showgrid=False, showline=False, ticks="")
    fig.update_yaxes(autorange="reversed")  # layer 0 at the top, as TransformerLens's imshow
    return fig


def alpha_cie_scatter(
    alpha: Float[Tensor, "layer head_index"],
    cie: Float[Tensor, "layer head_index"],
    title: str = "SITE alpha vs FV CIE",
) -> go.Figure:
    """One point per head (hover L{l}H{h}), coloured by layer; the Pearson and Spearman correlations noted."""
    from .stats import pearson, spearman

    a, c = torch.as_tensor(alpha).detach().float().cpu(), torch.as_tensor(cie).detach().float().cpu()
    n_layers, n_heads = a.shape
    layers = [layer for layer in range(n_layers) for _ in range(n_heads)]
    labels = [head_label(layer, h) for layer in range(n_layers) for h in range(n_heads)]
    cbar = _colorbar("layer", len=0.9)
    big = float(c.abs().max()) if c.numel() else 0.0
    exp = math.floor(math.log10(big)) if 0 < big < 0.01 else 0  # small effects in units of 10^exp, not "800μ"
    unit = f", ×10<sup>{exp}</sup>" if exp else ""
    fig = go.Figure(
        go.Scatter(
            x=a.flatten().tolist(), y=(c.flatten() / 10.0**exp).tolist(), mode="markers", text=labels,
            customdata=c.flatten().tolist(),
            marker={"color": layers, "colorscale": SEQUENTIAL, "colorbar": cbar, "size": 7, "opacity": 0.8,
                    "line": {"width": 0.5, "color": "white"}},
            hovertemplate="%{text}: alpha = %{x:.3f}, CIE = %{customdata:.3g}<extra></extra>",
        )
    )  # fmt: skip
    note = f"Pearson r = {float(pearson(a, c)):.2f}, Spearman ρ = {float(spearman(a, c)):.2f}"
    _style(fig, f"{title}<br><sup>{note}</sup>", height=450, margin=dict(t=75))
    fig.update_layout(xaxis_title="alpha (head weight)", yaxis_title=f"CIE (change in answer probability{unit})")
    return fig


# ---------------------------------------------------------------- patching

PATCH_COLORS = {"top": "#0072B2", "bottom": "#D55E00", "random": "#7f7f7f"}
PATCH_NAMES = {"top": "top-k by alpha", "bottom": "bottom-k by alpha", "random": "random k"}
METRIC_TITLES = {
    "recovery_prob": "recovery of {ref}'s answer probability",
    "recovery_acc": "recovery of {ref}'s first-token accuracy",
    "acc": "first-token accuracy",
    "prob": "probability of the answer's first token",
}


def _rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def patching_curves(
    df: pd.DataFrame, metric: str = "recovery_prob", title: str = "Patching the task embedding into k heads"
) -> go.Figure:
    """Metric vs k for top-k, bottom-k and random-k, markers at the measured k only; every head patched apart.

    ``df`` is ``patching.head_patching_sweep`` output, one task or several concatenated
    (told apart by a ``task`` column). Lines are the mean over tasks of each task's
    mean over random draws; the band is the min-max over tasks (over random draws
    when there is one task). The k = all-heads point sits in its own panel, and
    SITE and zero-shot are labelled reference lines.
    """
    d = df.copy()
    if "task" not in d:
        d["task"] = "task"
    n_tasks = d.dropna(subset=[metric])["task"].nunique()
    total = int(d.loc[d["condition"] == "all", "k"].max()) if (d["condition"] == "all").any() else int(d["k"].max())
    sweep = d[d["condition"].isin(list(PATCH_NAMES))]
    per_task = sweep.groupby(["condition", "k", "task"], as_index=False)[metric].mean()  # mean over draws
    ref = str(d["reference"].iloc[0]) if "reference" in d and len(d) else "site"
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, column_widths=[0.86, 0.14], horizontal_spacing=0.025)
    n_draws = int(sweep.loc[sweep["condition"] == "random", "draw"].nunique())
    band_label = f"band: min-max over {n_tasks} tasks" if n_tasks > 1 else f"band: min-max over {n_draws} random draws"
    band_shown = False
    for cond, name in PATCH_NAMES.items():
        src = per_task if n_tasks > 1 else sweep.groupby(["condition", "k", "draw"], as_index=False)[metric].mean()
        g = src[(src["condition"] == cond) & (src["k"] < total)].groupby("k")[metric]
        if g.ngroups == 0:
            continue
        mean = per_task[(per_task["condition"] == cond) & (per_task["k"] < total)].groupby("k")[metric].mean()
        lo, hi = g.min(), g.max()
        ks, color = [int(k) for k in mean.index], PATCH_COLORS[cond]
        if (hi - lo).abs().max() > 0:
            fig.add_trace(
                go.Scatter(
                    x=ks + ks[::-1], y=list(hi) + list(lo)[::-1], fill="toself", mode="lines",
                    line={"width": 0}, fillcolor=_rgba(color, 0.18), hoverinfo="skip", legendgroup=cond,
                    showlegend=False,
                ),
                row=1, col=1,
            )  # fmt: skip
            band_shown = True
        fig.add_trace(
            go.Scatter(
                x=ks, y=list(mean), mode="lines+markers", name=name, legendgroup=cond,
                line={"color": color, "width": 2}, marker={"size": 7, "color": color},
                hovertemplate=f"{name}, k = %{{x}}: %{{y:.3f}}<extra></extra>",
            ),
            row=1, col=1,
        )  # fmt: skip
    if band_shown:  # one neutral legend entry says what every band is
        fig.add_trace(
            go.Scatter(
                x=[None], y=[None], mode="markers", name=band_label, hoverinfo="skip",
                marker={"symbol": "square", "size": 14, "color": "rgba(0,0,0,0.15)"},
            ),
            row=1, col=1,
        )  # fmt: skip
    # every head patched: the "all" condition (or the sweep's k = total), apart from the curve
    at_all = d[d["condition"] == "all"]
    if not len(at_all):
        at_all = sweep[sweep["k"] == total]
    if len(at_all):
        v = at_all.groupby("task")[metric].mean()
        err = {"type": "data", "symmetric": False, "array": [v.max() - v.mean()], "arrayminus": [v.mean() - v.min()]}
        fig.add_trace(
            go.Scatter(
                x=[f"all {total}"], y=[v.mean()], mode="markers", name=f"all {total} heads",
                marker={"symbol": "diamond", "size": 10, "color": "#222"},
                error_y=err if n_tasks > 1 else None,
                hovertemplate=f"all {total} heads: %{{y:.3f}}<extra></extra>",
            ),
            row=1, col=2,
        )  # fmt: skip
    for cond, label, dash in (("site", "SITE (soft alpha)", "dash"), ("zero_shot", "zero-shot", "dot")):
        r = d[d["condition"] == cond]
        if len(r):
            y = float(r.groupby("task")[metric].mean().mean())
            for col in (1, 2):
                fig.add_hline(y=y, line_dash=dash, line_color="#444", line_width=1.2, row=1, col=col)
            fig.add_annotation(
                text=label, x=0, xref="x domain", y=y, yref="y", xanchor="left", yanchor="bottom", showarrow=False,
                font={"size": 12, "color": "#444"},
            )  # fmt: skip
    ks_all = sorted(int(k) for k in sweep["k"].unique() if k < total)
    ytitle = METRIC_TITLES.get(metric, metric.replace("_", " ")).format(ref="SITE" if ref == "site" else "all heads")
    _style(fig, title, width=640, height=430, legend=dict(x=0.01, y=0.9, xanchor="left", yanchor="top"))
    fig.update_xaxes(type="log", tickvals=ks_all, ticktext=[str(k) for k in ks_all], row=1, col=1)
    fig.update_xaxes(title_text="heads patched (k)", row=1, col=1)
    fig.update_xaxes(type="category", showgrid=False, row=1, col=2)
    fig.update_yaxes(title_text=ytitle, row=1, col=1)
    return fig


# ---------------------------------------------------------------- task x task matrices

CATEGORY_ORDER = ("abstractive", "extractive")


def _category_key(c: str) -> tuple[int, str]:
    return (CATEGORY_ORDER.index(c) if c in CATEGORY_ORDER else len(CATEGORY_ORDER) + (c == "other"), c)


def grouped_order(matrix: pd.DataFrame, categories: Mapping[str, str] | None = None) -> list[str]:
    """Tasks by category (abstractive, extractive, others, 'other' last), clustered within each category."""
    from .overlap import cluster_order

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
            showarrow=False, font={"size": 13},
        )  # fmt: skip
        if s > 0:
            line = {"color": "black", "width": 2}
            fig.add_shape(type="line", x0=s - 0.5, x1=s - 0.5, y0=-0.5, y1=len(cats) - 0.5, line=line)
            fig.add_shape(type="line", y0=s - 0.5, y1=s - 0.5, x0=-0.5, x1=len(cats) - 0.5, line=line)


def _task_heatmap(z, order, text, hover, scale: dict, colorbar: dict, title: str, categories) -> go.Figure:
    n = len(order)
    fig = go.Figure(
        go.Heatmap(
            z=z, x=order, y=order, text=text, texttemplate="%{text}" if n <= 12 else None,
            textfont={"size": 11 if n > 7 else 12}, customdata=hover, hovertemplate="%{customdata}<extra></extra>",
            colorbar=colorbar, xgap=1, ygap=1, **scale,
        )
    )  # fmt: skip
    side = max(240, 46 * n)  # the plot area is about square: the width adds the labels and the colourbar
    _style(fig, title, width=side + 290, height=side + 210, plot_bgcolor=MASKED, margin=dict(t=80, l=10, r=10, b=10))
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
        cbar += f"<br><sup>{'; '.join(notes)}</sup>"
    text = [["" if i == j else f"{m[i, j]:.2f}" for j in range(len(order))] for i in range(len(order))]
    hover = [[f"{a} vs {b}: {m[i, j]:.3f}" for j, b in enumerate(order)] for i, a in enumerate(order)]
    return _task_heatmap(z, order, text, hover, scale, _colorbar(cbar, **ticks), title, categories)


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
    text = [["" if not np.isfinite(v) else f"{v:.2f}" for v in row] for row in rel]
    hover = [
        [f"alpha of {a}, t of {b}: accuracy {raw[i, j]:.2f}, own alpha {raw[j, j]:.2f}" for j, b in enumerate(order)]
        for i, a in enumerate(order)
    ]
    scale = {"colorscale": SEQUENTIAL, "zmin": 0.0, "zmax": zmax}
    cbar = _colorbar("accuracy relative to the task's own alpha<br><sup>1 = as good as its own alpha (outlined)</sup>")
    fig = _task_heatmap(rel, order, text, hover, scale, cbar, title, categories)
    for i in range(len(order)):
        fig.add_shape(
            type="rect", x0=i - 0.5, x1=i + 0.5, y0=i - 0.5, y1=i + 0.5, line={"color": "black", "width": 2.5}
        )
    fig.update_layout(xaxis_title="task evaluated (with its own t)", yaxis_title="alpha taken from")
    return fig


# ---------------------------------------------------------------- training and alpha distributions


def ema(values: Sequence[float], span: float) -> list[float]:
    """Bias-corrected exponential moving average (weight 2 / (span + 1)), skipping non-finite values."""
    w = 2.0 / (span + 1.0)
    s = norm = 0.0
    out = []
    for v in values:
        if math.isfinite(v):
            s, norm = (1 - w) * s + w * v, (1 - w) * norm + w
        out.append(s / norm if norm else float("nan"))
    return out


def training_curve(history: dict, title: str = "alpha training", span: float | None = None) -> go.Figure:
    """Train loss (one batch, faint, and smoothed), valid loss and the kept step, on log-log axes.

    ``history`` is a ``TrainHistory`` dict. The log step axis gives the first
    steps, where most of the drop happens, as much room as the rest; the log loss
    axis shows a drop from 3 to 0.05 as clearly as one from 6 to 3. It spans the
    smoothed and valid losses (down to a quarter of their lowest); single-batch
    losses below that are left off, as the legend says.
    """
    steps, loss = list(history.get("step", [])), [float(v) for v in history.get("loss", [])]
    span = float(span or max(5, round(len(steps) / 10)))
    smooth = ema(loss, span)
    valid = [float(v) for v in history.get("valid_loss") or []]
    finite = [v for v in smooth + valid if math.isfinite(v) and v > 0] or [1.0]
    lo, hi = min(finite) / 4, max([v for v in loss if math.isfinite(v)] + finite) * 1.3
    below = sum(v < lo for v in loss)
    raw_name = "train loss (one batch)" + (f"; {below} below the axis" if below else "")
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(x=steps, y=loss, mode="markers", name=raw_name, marker={"color": _rgba(COLORWAY[0], 0.3), "size": 4})
    )
    fig.add_trace(
        go.Scatter(
            x=steps, y=smooth, mode="lines", name=f"train loss, smoothed (EMA, span {span:g})",
            line={"color": COLORWAY[0], "width": 2.5},
        )
    )  # fmt: skip
    if valid:
        fig.add_trace(
            go.Scatter(
                x=history["valid_step"], y=valid, mode="lines+markers", name="valid loss",
                line={"color": COLORWAY[1], "width": 2}, marker={"size": 7},
            )
        )  # fmt: skip
    best = history.get("best_step")
    if best:
        fig.add_vline(x=best, line_dash="dot", line_color="#444", line_width=1.2)
        y = history.get("best_valid_loss")
        if y is not None:
            fig.add_trace(
                go.Scatter(
                    x=[best], y=[y], mode="markers", name=f"kept: step {best}",
                    marker={"symbol": "star", "size": 14, "color": "#222"},
                )
            )  # fmt: skip
    _style(fig, title, height=420, legend=dict(x=0.01, y=0.01, xanchor="left", yanchor="bottom"))
    last = max(steps + list(history.get("valid_step") or []) + [1])
    ticks = [t for t in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000) if t <= last / 1.3] + [last]
    fig.update_xaxes(type="log", title_text="training step", tickvals=ticks, range=[0, math.log10(last * 1.08)])
    yticks = [m * 10.0**e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1) for m in (1, 2, 5)]
    yticks = [t for t in yticks if lo <= t <= hi]
    fig.update_yaxes(
        type="log", title_text="first-token cross-entropy", range=[math.log10(lo), math.log10(hi)],
        tickvals=yticks, ticktext=[f"{t:g}" for t in yticks],
    )  # fmt: skip
    return fig


def alpha_histogram(
    alphas,
    title: str = "alpha distribution",
    nbins: int = 20,
    cols: int = 4,
    categories: Mapping[str, str] | None = None,
) -> go.Figure:
    """Histogram of alpha over heads: one tensor, or a dict task -> tensor as small multiples (one panel each).

    Every panel has the same axes; its title gives the task and the shares of heads
    below 0.1 and above 0.9. With ``categories`` (task -> category) the bars are
    coloured by category, with a legend.
    """
    cats = sorted(set((categories or {}).values()), key=_category_key)
    colors = {c: COLORWAY[i % len(COLORWAY)] for i, c in enumerate(cats)}
    shown: set[str] = set()
    items = list(alphas.items()) if isinstance(alphas, dict) else [("alpha", alphas)]
    cols = min(cols, len(items))
    rows = math.ceil(len(items) / cols)
    xs = [torch.as_tensor(a).detach().float().flatten() for _, a in items]
    titles = [
        f"{name}<br><span style='font-size:11px'>{(x < 0.1).float().mean():.0%} below 0.1, "
        f"{(x > 0.9).float().mean():.0%} above 0.9</span>"
        for (name, _), x in zip(items, xs)
    ]
    fig = make_subplots(
        rows=rows, cols=cols, subplot_titles=titles, horizontal_spacing=0.045, vertical_spacing=0.2 if rows > 1 else 0
    )  # fmt: skip
    top = 0
    for i, ((name, _), x) in enumerate(zip(items, xs)):
        counts = torch.histc(x.clamp(0, 1), bins=nbins, min=0, max=1)
        top = max(top, int(counts.max()))
        cat = (categories or {}).get(name)
        fig.add_trace(
            go.Histogram(
                x=x.tolist(), name=cat or name, legendgroup=cat, showlegend=bool(cat) and cat not in shown,
                xbins={"start": 0, "end": 1, "size": 1 / nbins},
                marker={"color": colors.get(cat, COLORWAY[0]), "line": {"width": 0.5, "color": "white"}},
                hovertemplate=f"{name}: %{{y}} heads with alpha in %{{x}}<extra></extra>",
            ),
            row=i // cols + 1, col=i % cols + 1,
        )  # fmt: skip
        shown.add(cat)
    fig.update_annotations(font_size=13)
    width = WIDTH if cols <= 1 else min(800, 180 * cols + 90)
    legend = dict(x=1, y=0, xanchor="right", yanchor="bottom", title_text="task category")
    _style(fig, title, width=width, height=250 * rows + 90, bargap=0.05, margin=dict(t=90), legend=legend)
    fig.update_xaxes(range=[0, 1], dtick=0.5)
    for c in range(cols):  # the axis title once, under each column's last panel
        last_row = (len(items) - 1 - c) // cols + 1
        fig.update_xaxes(title_text="alpha (head weight)", row=last_row, col=c + 1)
    fig.update_yaxes(range=[0, top * 1.08], showticklabels=False)
    fig.update_yaxes(showticklabels=True, title_text="heads", col=1)
    return fig


# ---------------------------------------------------------------- benchmark

METHOD_ORDER = ("zero_shot", "icl", "site", "fv", "tv", "i2cl", "mtv", "lora", "ia3")
METHOD_LABELS = {
    "zero_shot": "zero-shot", "icl": "10-shot ICL", "site": "SITE", "fv": "FV", "tv": "TV", "i2cl": "I2CL",
    "mtv": "MTV", "lora": "LoRA", "ia3": "(IA)<sup>3</sup>",
}  # fmt: skip
METRIC_LABELS = {"exact_match": "exact match (%)", "first_token_acc": "first-token accuracy (%)",
                 "strict_match": "strict match (%)"}  # fmt: skip


def _benchmark_panel(fig, rows: pd.DataFrame, methods, models, metric: str, row: int, show_legend: bool) -> None:
    rng = np.random.default_rng(0)  # jitter only; the same figure every time
    width = 0.8 / len(models)
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
                marker={"size": 5, "color": _rgba(color, 0.45)}, showlegend=show_legend,
                hovertemplate="%{text}: %{y:.0f}%<extra>" + model + "</extra>",
            ),
            row=row, col=1,
        )  # fmt: skip
        fig.add_trace(
            go.Scatter(
                x=mx, y=my, mode="markers", name=f"{model}: mean", legendgroup=model, showlegend=show_legend,
                marker={"symbol": "line-ew", "size": 26 * width / 0.4, "line": {"width": 3.5, "color": color}},
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
    fig = make_subplots(rows=len(cats), cols=1, shared_xaxes=True, subplot_titles=titles, vertical_spacing=0.09)
    for r, c in enumerate(cats, start=1):
        _benchmark_panel(fig, rows if c is None else rows[rows["category"] == c], methods, models, metric, r, r == 1)
        fig.update_yaxes(title_text=METRIC_LABELS.get(metric, metric.replace("_", " ")), range=[-3, 103], row=r)
    if "site" in methods:  # the method this package is about, on a light band (after the traces: none on empty panels)
        i = methods.index("site")
        fig.add_vrect(x0=i - 0.5, x1=i + 0.5, fillcolor="#efefef", line_width=0, layer="below", row="all", col=1)
    what = METRIC_LABELS.get(metric, metric.replace("_", " ")).split(" (")[0]
    title = title or f"{what} on {rows['task'].nunique()} tasks" + (", by task category" if by_category else "")
    legend = dict(orientation="h", x=0.5, xanchor="center", y=-0.1 if len(cats) == 1 else -0.06, yanchor="top")
    _style(
        fig,
        title,
        width=720,
        height=430 if len(cats) == 1 else 740,
        legend=legend,
        margin=dict(t=75 if by_category else 55),
    )
    fig.update_xaxes(
        tickvals=list(range(len(methods))), ticktext=[METHOD_LABELS.get(m, m) for m in methods], showgrid=False,
        range=[-0.6, len(methods) - 0.4],
    )  # fmt: skip
    return fig


# ---------------------------------------------------------------- output


def save_figure(fig: go.Figure, stem: str | Path) -> list[Path]:
    """Write STEM.html, and STEM.png if static export works here; returns the files written."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    written = [stem.with_suffix(".html")]
    fig.write_html(str(written[0]), include_plotlyjs="cdn")
    try:
        fig.write_image(str(stem.with_suffix(".png")), scale=2)
        written.append(stem.with_suffix(".png"))
    except Exception as e:  # no kaleido or no browser: HTML still written
        log.warning("PNG export unavailable (%s); wrote HTML only", _export_error(e))
    return written


def show(fig: go.Figure, scale: float = 2.0):
    """Display ``fig`` in a notebook as a static PNG (it renders wherever the notebook is viewed).

    Falls back to the interactive figure, with a one-line note of why, when the
    static exporter (kaleido + a Chromium) is not available here.
    """
    from IPython.display import Image, display

    try:
        display(Image(fig.to_image(format="png", scale=scale)))
    except Exception as e:  # no kaleido or no browser
        log.warning("static PNG unavailable (%s); showing the interactive figure", _export_error(e))
        fig.show()


def _export_error(e: Exception) -> str:
    msg = str(e).strip().split("\n")[0] or e.__class__.__name__
    return f"{msg}; for PNG export install a Chromium: `make chromium` or `apt-get install chromium`"
