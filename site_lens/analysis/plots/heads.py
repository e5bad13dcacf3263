"""Figures of one model's heads: alpha heatmaps, alpha against CIE, patching curves, training curves, alpha distributions."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Float
from plotly.subplots import make_subplots
from torch import Tensor

from .theme import (
    COLORWAY,
    FONT,
    FONT_SMALL,
    SEQUENTIAL,
    _category_key,
    _colorbar,
    _range_note,
    _rgba,
    _style,
    head_label,
    legend_below,
    note,
    sequential_range,
)

# ---------------------------------------------------------------- layer x head


def alpha_heatmap(
    alpha: Float[Tensor, "layer head_index"], title: str = "SITE alpha", colorbar_title: str = "alpha (head weight)"
) -> go.Figure:
    """Layer x head heatmap of alpha, or any per-head value in 0..1 named by ``colorbar_title`` (layer 0 at the top).

    Hover shows L{l}H{h} and the value. One column wide; a layer label on every row
    while rows are at least a label high, else on every second row.
    """
    a = torch.as_tensor(alpha).detach().float().cpu()
    n_layers, n_heads = a.shape
    zmin, zmax, fitted = sequential_range(a.numpy())
    text = [[head_label(layer, h) for h in range(n_heads)] for layer in range(n_layers)]
    fig = go.Figure(
        go.Heatmap(
            z=a.numpy(), x=list(range(n_heads)), y=list(range(n_layers)), zmin=zmin, zmax=zmax,
            colorscale=SEQUENTIAL, text=text, hovertemplate=f"%{{text}}: {colorbar_title} = %{{z:.3f}}<extra></extra>",
            colorbar=_colorbar(colorbar_title + (_range_note(zmin, zmax) if fitted else "")),
            xgap=1, ygap=1,
        )
    )  # fmt: skip
    row = 14 if n_layers > 12 else 22  # px per layer
    _style(fig, title, height=max(330, row * n_layers + 130), margin=dict(t=45, l=50, r=10, b=45))
    fig.update_xaxes(title_text="head", dtick=1 if n_heads <= 16 else 2, showgrid=False, showline=False, ticks="")
    fig.update_yaxes(
        title_text="layer", dtick=1 if row >= FONT_SMALL + 4 else 2, showgrid=False, showline=False, ticks=""
    )
    fig.update_yaxes(autorange="reversed")  # layer 0 at the top, as TransformerLens's imshow
    return fig


def alpha_cie_scatter(
    alpha: Float[Tensor, "layer head_index"],
    cie: Float[Tensor, "layer head_index"],
    title: str = "SITE alpha vs FV CIE",
) -> go.Figure:
    """One point per head (hover L{l}H{h}), coloured by layer; the Pearson and Spearman correlations noted."""
    from ...stats import pearson, spearman

    a, c = torch.as_tensor(alpha).detach().float().cpu(), torch.as_tensor(cie).detach().float().cpu()
    n_layers, n_heads = a.shape
    layers = [layer for layer in range(n_layers) for _ in range(n_heads)]
    labels = [head_label(layer, h) for layer in range(n_layers) for h in range(n_heads)]
    cbar = _colorbar("layer")
    big = float(c.abs().max()) if c.numel() else 0.0
    exp = math.floor(math.log10(big)) if 0 < big < 0.01 else 0  # small effects in units of 10^exp, not "800μ"
    unit = f", ×10{_superscript(exp)}" if exp else ""
    fig = go.Figure(
        go.Scatter(
            x=a.flatten().tolist(), y=(c.flatten() / 10.0**exp).tolist(), mode="markers", text=labels,
            customdata=c.flatten().tolist(),
            marker={"color": layers, "colorscale": SEQUENTIAL, "colorbar": cbar, "size": 6, "opacity": 0.8,
                    "line": {"width": 0.5, "color": "white"}},
            hovertemplate="%{text}: alpha = %{x:.3f}, CIE = %{customdata:.3g}<extra></extra>",
        )
    )  # fmt: skip
    corr = f"Pearson r = {float(pearson(a, c)):.2f}, Spearman ρ = {float(spearman(a, c)):.2f}"
    _style(fig, title, height=420, subtitle=corr, margin=dict(t=64, r=10))
    fig.update_layout(xaxis_title="alpha (head weight)", yaxis_title=f"CIE (Δ answer probability{unit})")
    return fig


def _superscript(n: int) -> str:
    """``n`` in Unicode superscript digits: a full-size glyph, where ``<sup>`` draws at 70 %."""
    return str(n).translate(str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹"))


# ---------------------------------------------------------------- patching

PATCH_COLORS = {"top": "#0072B2", "bottom": "#D55E00", "random": "#7f7f7f"}
PATCH_NAMES = {"top": "top-k by alpha", "bottom": "bottom-k by alpha", "random": "random k"}
PATCH_DASHES = {"top": "solid", "bottom": "dash", "random": "dot"}
PATCH_SYMBOLS = {"top": "circle", "bottom": "square", "random": "triangle-up"}
METRIC_TITLES = {
    "recovery_prob": "recovery of {ref}'s answer probability",
    "recovery_acc": "recovery of {ref}'s first-token accuracy",
    "acc": "first-token accuracy",
    "prob": "probability of the answer's first token",
}


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
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, column_widths=[0.83, 0.17], horizontal_spacing=0.03)
    n_draws = int(sweep.loc[sweep["condition"] == "random", "draw"].nunique())
    band_label = f"min-max of {n_tasks} tasks" if n_tasks > 1 else f"min-max of {n_draws} draws"  # a grey square
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
                line={"color": color, "width": 2, "dash": PATCH_DASHES[cond]},
                marker={"size": 6, "color": color, "symbol": PATCH_SYMBOLS[cond]},
                hovertemplate=f"{name}, k = %{{x}}: %{{y:.3f}}<extra></extra>",
            ),
            row=1, col=1,
        )  # fmt: skip
    if band_shown:  # one neutral legend entry says what every band is
        fig.add_trace(
            go.Scatter(
                x=[None], y=[None], mode="markers", name=band_label, hoverinfo="skip",
                marker={"symbol": "square", "size": 12, "color": "rgba(0,0,0,0.15)"},
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
                marker={"symbol": "diamond", "size": 9, "color": "#222"},
                error_y=err if n_tasks > 1 else None,
                hovertemplate=f"all {total} heads: %{{y:.3f}}<extra></extra>",
            ),
            row=1, col=2,
        )  # fmt: skip
    for cond, label, dash in (("site", "SITE (soft alpha)", "dash"), ("zero_shot", "zero-shot", "dot")):
        r = d[d["condition"] == cond]
        if len(r):  # a reference line across both panels, named in the legend (a label on the plot could hide data)
            y = float(r.groupby("task")[metric].mean().mean())
            for col in (1, 2):
                fig.add_hline(
                    y=y, line_dash=dash, line_color="#444", line_width=1.2, row=1, col=col, name=label,
                    showlegend=col == 1, legendgroup=cond,
                )  # fmt: skip
    ks_all = sorted(int(k) for k in sweep["k"].unique() if k < total)
    ytitle = METRIC_TITLES.get(metric, metric.replace("_", " ")).format(ref="SITE" if ref == "site" else "all heads")
    _style(fig, title, height=370)
    legend_below(fig)
    fig.update_xaxes(type="log", tickvals=ks_all, ticktext=[str(k) for k in ks_all], row=1, col=1)
    fig.update_xaxes(title_text="heads patched (k)", row=1, col=1)
    fig.update_xaxes(type="category", showgrid=False, row=1, col=2)
    fig.update_yaxes(title_text=ytitle, row=1, col=1)
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
    axis shows a drop from 3 to 0.05 as clearly as one from 6 to 3. It spans every
    positive loss drawn, single batches included, so no point is clipped; a loss
    of 0 (no place on a log axis) is drawn as a triangle on the axis's floor and
    counted in the legend.
    """
    steps, loss = list(history.get("step", [])), [float(v) for v in history.get("loss", [])]
    span = float(span or max(5, round(len(steps) / 10)))
    smooth = ema(loss, span)
    valid = [float(v) for v in history.get("valid_loss") or []]
    best_loss = history.get("best_valid_loss")
    drawn = [v for v in loss + smooth + valid + [best_loss or 0.0] if math.isfinite(v) and v > 0] or [1.0]
    lo, hi = min(drawn) / 1.5, max(drawn) * 1.5
    zero = [(s, v) for s, v in zip(steps, loss) if v <= 0]  # finite losses at or below 0: on the floor
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=steps, y=[v if v > 0 else None for v in loss], mode="markers", name="train loss, one batch",
            marker={"color": _rgba(COLORWAY[0], 0.3), "size": 4},
        )
    )  # fmt: skip
    if zero:
        fig.add_trace(
            go.Scatter(
                x=[s for s, _ in zero], y=[lo] * len(zero), mode="markers", cliponaxis=False,
                name=f"train loss 0 ({len(zero)} batches), drawn on the axis",
                marker={"color": COLORWAY[0], "size": 6, "symbol": "triangle-down-open"},
            )
        )  # fmt: skip
    fig.add_trace(
        go.Scatter(
            x=steps, y=smooth, mode="lines", name=f"train loss, EMA (span {span:g})",
            line={"color": COLORWAY[0], "width": 2.5},
        )
    )  # fmt: skip
    if valid:
        fig.add_trace(
            go.Scatter(
                x=history["valid_step"], y=valid, mode="lines+markers", name="valid loss",
                line={"color": COLORWAY[1], "width": 2}, marker={"size": 6},
            )
        )  # fmt: skip
    best = history.get("best_step")
    if best:
        fig.add_vline(x=best, line_dash="dot", line_color="#444", line_width=1.2)
        if best_loss is not None:
            fig.add_trace(
                go.Scatter(
                    x=[best], y=[best_loss], mode="markers", name=f"kept: step {best}", cliponaxis=False,
                    marker={"symbol": "star", "size": 12, "color": "#222"},
                )
            )  # fmt: skip
    _style(fig, title, height=360)
    legend_below(fig)
    last = max(steps + list(history.get("valid_step") or []) + [1])
    ticks = [t for t in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000) if t <= last / 1.3] + [last]
    fig.update_xaxes(type="log", title_text="training step", tickvals=ticks, range=[0, math.log10(last * 1.08)])
    decades = math.log10(hi / lo)
    mantissas = (1,) if decades > 4 else (1, 3) if decades > 2 else (1, 2, 5)
    yticks = [
        m * 10.0**e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1) for m in mantissas
    ]  # fmt: skip
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
        name + note(f"{(x < 0.1).float().mean():.0%} below 0.1, {(x > 0.9).float().mean():.0%} above 0.9")
        for (name, _), x in zip(items, xs)
    ]
    size = "full" if cols > 2 else "column"
    fig = make_subplots(
        rows=rows, cols=cols, subplot_titles=titles, horizontal_spacing=0.04 if size == "full" else 0.08,
        vertical_spacing=0.22 if rows > 1 else 0,
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
    fig.update_annotations(font_size=FONT)
    _style(fig, title, size, height=230 * rows + 90, bargap=0.05, margin=dict(t=85, l=55, r=10))
    if cats and len(items) < rows * cols:  # the legend in the first empty panel's place
        x0, x1 = fig.layout[f"xaxis{len(items) + 1}"].domain
        y0, y1 = fig.layout[f"yaxis{len(items) + 1}"].domain
        fig.update_layout(legend=dict(x=(x0 + x1) / 2, y=(y0 + y1) / 2, xanchor="center", yanchor="middle"))
    elif cats:
        legend_below(fig)
    fig.update_layout(legend_title_text="task category")
    fig.update_xaxes(range=[0, 1], dtick=0.5)
    for c in range(cols):  # the axis title once, under each column's last panel
        last_row = (len(items) - 1 - c) // cols + 1
        fig.update_xaxes(title_text="alpha (head weight)", row=last_row, col=c + 1)
    fig.update_yaxes(range=[0, top * 1.08], showticklabels=False)
    fig.update_yaxes(showticklabels=True, title_text="heads", col=1)
    return fig
