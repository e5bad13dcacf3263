"""Figures of the minimal-head-set study: recovery against k per selection method, the sets, their overlap."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .theme import COLORWAY, _style, legend_below

SET_METHODS = {  # name, Okabe-Ito colour; sparse sets are markers (symbol), rankings lines (dash)
    "sparse_l0": ("sparse SITE (L0)", COLORWAY[0]),
    "sparse_l1": ("sparse SITE (L1)", COLORWAY[3]),
    "dense_alpha": ("top-k by dense alpha", COLORWAY[1]),
    "cie": ("top-k by CIE", COLORWAY[2]),
    "attribution": ("top-k by attribution", COLORWAY[4]),
    "random": ("random k", "#888888"),
}
SYMBOLS = {"sparse_l0": "diamond", "sparse_l1": "triangle-up"}
DASHES = {"dense_alpha": "solid", "cie": "dash", "attribution": "dashdot", "random": "dot"}
LOG_TICKS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)  # all labelled at full size (plotly's own 2, 5 are small)
METRIC_TITLES = {
    "recovery_em": "recovery of prefix match",  # 0 zero-shot, 1 SITE: the legend names both lines
    "recovery_prob": "recovery of answer probability",
    "exact_match": "prefix match",
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
    Every head (k = all) is one set whatever the method: one black marker of its own, with
    the 25-75 % range over tasks, not the end of any curve. The reference lines (SITE, the 0.9
    target, zero-shot) are named in the legend, which sits under the axes.
    """
    d = scores[(scores["split"] == split) & (scores["mode"] == "binary")].copy()
    one_task = d["task"].nunique() == 1
    soft = scores[(scores["split"] == split) & (scores["method"] == "site")]
    ks = soft["k"] if len(soft) else d["k"]  # every head: SITE's soft alpha covers them all
    total = int(ks.max()) if len(ks) else 0
    at_all = d[(d["k"] == total) & ~d["method"].str.startswith("sparse")]
    d = d[d["k"] < total]
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
                    line={"color": color, "width": 1.5}, opacity=0.85,
                    marker={"size": 7, "color": color, "symbol": SYMBOLS[method], "line": {"width": 0.5, "color": "white"}},
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
                x=ks, y=list(stats["mean"]), mode="lines+markers", name=name,
                line={"color": color, "width": 2, "dash": DASHES.get(method, "solid")}, marker={"size": 5, "color": color},
                hovertemplate=f"{name}, k = %{{x}}: %{{y:.3f}}<extra></extra>",
            )
        )  # fmt: skip
    if len(at_all):  # every head: the same set for every ranking, apart from the curves
        v = at_all.groupby(["task", "seed"])[metric].mean()
        err = {"type": "data", "symmetric": False, "array": [v.quantile(0.75) - v.mean()],
               "arrayminus": [v.mean() - v.quantile(0.25)], "color": "#222"}  # fmt: skip
        fig.add_trace(
            go.Scatter(
                x=[total], y=[v.mean()], mode="markers", name=f"all {total} heads", cliponaxis=False,
                marker={"symbol": "x", "size": 9, "color": "#222"}, error_y=err if len(v) > 1 else None,
                hovertemplate=f"all {total} heads: %{{y:.3f}}<extra></extra>",
            )
        )  # fmt: skip
    if metric.startswith("recovery"):
        for y, dash, color, name in ((1.0, "dash", "#444", "SITE (1)"), (0.9, "dot", "#999", "target (0.9)"),
                                     (0.0, "dot", "#444", "zero-shot (0)")):  # fmt: skip
            fig.add_hline(y=y, line_dash=dash, line_color=color, line_width=1.2, name=name, showlegend=True)
    _style(fig, title, height=380)
    ticks = [t for t in LOG_TICKS if t <= total / 1.6] + [total]  # k = all heads labelled, clear of its neighbour
    fig.update_xaxes(
        type="log", title_text="heads t is written into (k)", tickvals=ticks, ticktext=list(map(str, ticks))
    )
    fig.update_yaxes(title_text=METRIC_TITLES.get(metric, metric))
    return legend_below(fig)
