"""Plot functions: each takes tensors or DataFrames and returns a plotly ``go.Figure``.

Heads are labelled ``L{layer}H{head}``. ``save_figure`` writes interactive HTML
always, and PNG when a static exporter (kaleido + a Chromium) is available.
"""

from __future__ import annotations

import logging
from pathlib import Path

import plotly.graph_objects as go
import torch
from jaxtyping import Float
from torch import Tensor

log = logging.getLogger(__name__)


def head_label(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


def alpha_heatmap(alpha: Float[Tensor, "layer head_index"], title: str = "SITE alpha") -> go.Figure:
    """Layer x head heatmap of alpha in [0, 1]; hover shows the head and value."""
    a = torch.as_tensor(alpha).detach().float().cpu()
    n_layers, n_heads = a.shape
    text = [[head_label(layer, h) for h in range(n_heads)] for layer in range(n_layers)]
    fig = go.Figure(
        go.Heatmap(
            z=a.numpy(),
            x=list(range(n_heads)),
            y=list(range(n_layers)),
            zmin=0,
            zmax=1,
            colorscale="Viridis",
            text=text,
            hovertemplate="%{text}: alpha=%{z:.3f}<extra></extra>",
            colorbar={"title": "alpha"},
        )
    )
    fig.update_layout(title=title, xaxis_title="head", yaxis_title="layer", width=420, height=max(360, 18 * n_layers))
    return fig


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
        log.warning("PNG export unavailable (%s); wrote HTML only", str(e).split("\n")[0])
    return written


# ---------------------------------------------------------------- head specificity

PATCH_COLORS = {"top": "#1f77b4", "bottom": "#d62728", "random": "#7f7f7f"}


def patching_curves(df, metric: str = "recovery_prob", title: str = "Patching the task embedding into k heads") -> go.Figure:
    """Metric vs k for top-k, bottom-k (lines) and random-k (mean line, min-max band over draws).

    ``df`` is ``patching.head_patching_sweep`` output (several tasks are averaged per draw).
    """
    fig = go.Figure()
    d = df[df["condition"].isin(["top", "bottom", "random"])]
    per_draw = d.groupby(["condition", "k", "draw"], as_index=False)[metric].mean()
    for cond in ("top", "bottom", "random"):
        g = per_draw[per_draw["condition"] == cond].groupby("k")[metric]
        if g.ngroups == 0:
            continue
        mean, lo, hi = g.mean(), g.min(), g.max()
        ks = list(mean.index)
        color = PATCH_COLORS[cond]
        if cond == "random" and (hi - lo).abs().max() > 0:
            fig.add_trace(
                go.Scatter(
                    x=ks + ks[::-1], y=list(hi) + list(lo)[::-1], fill="toself", line={"width": 0},
                    fillcolor="rgba(127,127,127,0.25)", hoverinfo="skip", name="random (min-max over draws)",
                )
            )
        fig.add_trace(go.Scatter(x=ks, y=list(mean), mode="lines+markers", name=f"{cond}-k", line={"color": color}))
    for ref, dash in (("site", "dash"), ("zero_shot", "dot")):
        r = df[df["condition"] == ref]
        if len(r):
            fig.add_hline(y=float(r[metric].mean()), line_dash=dash, annotation_text=ref, line_color="black")
    fig.update_layout(title=title, xaxis_title="k (heads patched)", yaxis_title=metric, width=640, height=420)
    fig.update_xaxes(type="log")
    return fig


def overlap_heatmap(matrix, order=None, title: str = "alpha correlation across tasks", diverging: bool = True) -> go.Figure:
    """Task x task heatmap of a square DataFrame, rows and columns in ``order`` (e.g. ``overlap.cluster_order``).

    Diverging data (correlations) use RdBu centred at 0 on [-1, 1]; otherwise Viridis on [0, 1].
    """
    order = list(order) if order is not None else list(matrix.index)
    m = matrix.loc[order, order]
    scale = {"colorscale": "RdBu", "zmid": 0, "zmin": -1, "zmax": 1} if diverging else {"colorscale": "Viridis", "zmin": 0, "zmax": 1}
    fig = go.Figure(
        go.Heatmap(
            z=m.to_numpy(dtype=float), x=order, y=order, text=m.round(2).to_numpy(), texttemplate="%{text}",
            hovertemplate="%{y} vs %{x}: %{z:.3f}<extra></extra>", **scale,
        )
    )
    n = len(order)
    fig.update_layout(title=title, width=max(420, 60 * n + 200), height=max(380, 50 * n + 160))
    fig.update_yaxes(autorange="reversed")
    return fig


def alpha_cie_scatter(
    alpha: Float[Tensor, "layer head_index"], cie: Float[Tensor, "layer head_index"], title: str = "SITE alpha vs FV CIE"
) -> go.Figure:
    """One point per head (hover L{l}H{h}), coloured by layer."""
    a, c = torch.as_tensor(alpha).detach().float().cpu(), torch.as_tensor(cie).detach().float().cpu()
    n_layers, n_heads = a.shape
    layers = [layer for layer in range(n_layers) for _ in range(n_heads)]
    labels = [head_label(layer, h) for layer in range(n_layers) for h in range(n_heads)]
    fig = go.Figure(
        go.Scatter(
            x=a.flatten().tolist(), y=c.flatten().tolist(), mode="markers", text=labels,
            marker={"color": layers, "colorscale": "Viridis", "colorbar": {"title": "layer"}, "size": 7},
            hovertemplate="%{text}: alpha=%{x:.3f}, CIE=%{y:.4f}<extra></extra>",
        )
    )
    fig.update_layout(title=title, xaxis_title="alpha", yaxis_title="CIE (Δ P(answer))", width=560, height=420)
    return fig


def training_curve(history: dict, title: str = "alpha training") -> go.Figure:
    """Train loss per step and valid loss at the validation steps (a TrainHistory dict)."""
    fig = go.Figure(go.Scatter(x=history.get("step", []), y=history.get("loss", []), mode="lines", name="train loss", opacity=0.6))
    if history.get("valid_step"):
        fig.add_trace(go.Scatter(x=history["valid_step"], y=history["valid_loss"], mode="lines+markers", name="valid loss"))
    if history.get("best_step"):
        fig.add_vline(x=history["best_step"], line_dash="dot", annotation_text="best")
    fig.update_layout(title=title, xaxis_title="step", yaxis_title="first-token cross-entropy", width=560, height=380)
    return fig


def alpha_histogram(alphas, title: str = "alpha distribution", nbins: int = 20) -> go.Figure:
    """Histogram of alpha over heads: one tensor, or a dict task -> tensor (one trace each, overlaid)."""
    items = alphas.items() if isinstance(alphas, dict) else [("alpha", alphas)]
    fig = go.Figure()
    for name, a in items:
        fig.add_trace(
            go.Histogram(
                x=torch.as_tensor(a).detach().float().flatten().tolist(), name=name, opacity=0.6,
                xbins={"start": 0, "end": 1, "size": 1 / nbins},
            )
        )
    fig.update_layout(title=title, barmode="overlay", xaxis_title="alpha", yaxis_title="heads", width=560, height=380)
    return fig
