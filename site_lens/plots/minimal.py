"""Figures of the minimal-head-set study: recovery against k per selection method, the sets, their overlap."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .theme import COLORWAY

SET_METHODS = {
    "sparse_l0": ("sparse SITE (L0)", COLORWAY[0]),
    "sparse_l1": ("sparse SITE (L1)", COLORWAY[5]),
    "dense_alpha": ("top-k by dense alpha", COLORWAY[1]),
    "cie": ("top-k by CIE", COLORWAY[2]),
    "random": ("random k", "#888888"),
}
METRIC_TITLES = {
    "recovery_em": "recovery of exact match (0 zero-shot, 1 SITE)",
    "recovery_prob": "recovery of answer probability",
    "exact_match": "exact match",
}


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def k_curves(
    scores: pd.DataFrame,
    metric: str = "recovery_em",
    split: str = "test",
    title: str = "Task recovery against heads kept",
) -> go.Figure:
    """``metric`` against k, one line per selection method, on binary head sets.

    ``scores`` is ``sweep.read_minimal``'s (one task or many, any seeds). Rankings and random
    sets: the mean over tasks, seeds and draws at each k (over several tasks, only the k of
    the common grid), the band the 25-75 % range over (task, seed) means (over draws when
    there is one). Sparse SITE: one marker per mask,
    its mean over tasks where several tasks reached the same k is not meaningful, so every
    (task, seed, weight) mask is drawn, joined per method in order of k when there is one task.
    """
    d = scores[(scores["split"] == split) & (scores["mode"] == "binary")].copy()
    one_task = d["task"].nunique() == 1
    fig = go.Figure()
    for method, (name, color) in SET_METHODS.items():
        g = d[d["method"] == method]
        if not len(g):
            continue
        if method.startswith("sparse"):
            g = g.sort_values("k")
            fig.add_trace(
                go.Scatter(
                    x=g["k"], y=g[metric], mode="lines+markers" if one_task else "markers", name=name,
                    line={"color": color, "width": 2}, marker={"size": 8, "color": color, "symbol": "diamond"},
                    customdata=np.stack([g["task"], g["seed"], g["weight"].astype(float)], -1),
                    hovertemplate=f"{name}<br>%{{customdata[0]}} seed %{{customdata[1]}}, weight %{{customdata[2]}}"
                    "<br>k = %{x}: %{y:.3f}<extra></extra>",
                )
            )  # fmt: skip
            continue
        per = g.groupby(["k", "task", "seed"], as_index=False)[metric].mean()
        if not one_task:  # only the k every (task, seed) has (the grid): a mean over the same tasks at each k
            units = per.groupby(["task", "seed"]).ngroups
            common = per.groupby("k").size()
            per = per[per.k.isin(common[common == units].index)]
        if one_task and per.groupby("k").size().max() == 1:  # one (task, seed): band over random draws
            per = g.rename(columns={"draw": "_unit"})
        stats = per.groupby("k")[metric].agg(mean="mean", lo=lambda x: x.quantile(0.25), hi=lambda x: x.quantile(0.75))
        ks = [int(k) for k in stats.index]
        if (stats["hi"] - stats["lo"]).abs().max() > 0:
            fig.add_trace(
                go.Scatter(
                    x=ks + ks[::-1], y=list(stats["hi"]) + list(stats["lo"])[::-1], fill="toself", mode="lines",
                    line={"width": 0}, fillcolor=_rgba(color, 0.15), hoverinfo="skip", showlegend=False,
                )
            )  # fmt: skip
        fig.add_trace(
            go.Scatter(
                x=ks, y=list(stats["mean"]), mode="lines+markers", name=name, line={"color": color, "width": 2},
                marker={"size": 6, "color": color}, hovertemplate=f"{name}, k = %{{x}}: %{{y:.3f}}<extra></extra>",
            )
        )  # fmt: skip
    if metric.startswith("recovery"):
        fig.add_hline(y=1.0, line_dash="dash", line_color="#444", line_width=1.2)
        fig.add_hline(y=0.9, line_dash="dot", line_color="#999", line_width=1)
        fig.add_hline(y=0.0, line_dash="dot", line_color="#444", line_width=1)
    fig.update_layout(
        template="site_lens", title=title, width=660, height=440, legend={"x": 0.01, "y": 0.99, "xanchor": "left"}
    )
    fig.update_xaxes(type="log", title_text="heads t is written into (k)")
    fig.update_yaxes(title_text=METRIC_TITLES.get(metric, metric))
    return fig
