"""Figures of the claims across tasks and seeds: the headline with intervals, the patching contrast, stability.

method_intervals_figure({"SmolLM2-135M": iv1, "Gemma 3 270M": iv2})   # seed_report.method_intervals tables
patching_contrast(df)                                                  # head_claims' patching rows
seed_stability_figure(stability)                                       # one row per task
permutation_null_figure({"category, seed 1": overlap.permutation_null(m, cats)})
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .theme import COLORWAY, FONT_SMALL, _style, legend_below

METRIC_TITLES = {"exact_match": "prefix match %", "strict_match": "strict match %"}
CONDITIONS = {"top": ("top-k by alpha", COLORWAY[0]), "random": ("random k", "#888888"), "bottom": ("bottom-k by alpha", COLORWAY[1])}  # fmt: skip


def method_intervals_figure(tables: Mapping[str, pd.DataFrame], methods: list[str] | None = None) -> go.Figure:
    """Mean % per method with its 95 % interval (error bars), one colour per model; prefix and strict side by side."""
    from .tasks import METHOD_LABELS

    first = next(iter(tables.values()))
    methods = methods or list(dict.fromkeys(first.method))
    fig = make_subplots(rows=1, cols=2, subplot_titles=[METRIC_TITLES[m] for m in METRIC_TITLES], shared_yaxes=True)
    offsets = np.linspace(-0.15, 0.15, len(tables)) if len(tables) > 1 else [0.0]
    for i, ((model, table), dx) in enumerate(zip(tables.items(), offsets)):
        for col, metric in enumerate(METRIC_TITLES, start=1):
            sub = table[table.metric == metric].set_index("method").reindex(methods)
            x = np.arange(len(methods)) + dx
            fig.add_trace(
                go.Scatter(
                    x=100 * sub["mean"],
                    y=x,
                    mode="markers",
                    name=model,
                    legendgroup=model,
                    showlegend=col == 1,
                    marker=dict(color=COLORWAY[i], size=8),
                    error_x=dict(
                        type="data",
                        symmetric=False,
                        array=100 * (sub["high"] - sub["mean"]),
                        arrayminus=100 * (sub["mean"] - sub["low"]),
                        thickness=1.5,
                        width=3,
                    ),
                ),
                row=1,
                col=col,
            )
            fig.update_xaxes(range=[0, 100], title_text="% (95 % interval)", row=1, col=col)
    labels = [METHOD_LABELS.get(m, m) for m in methods]
    fig.update_yaxes(tickvals=list(range(len(methods))), ticktext=labels, autorange="reversed", row=1, col=1)
    _style(fig, "Mean over tasks, 95 % intervals", height=140 + 34 * len(methods), margin=dict(t=75))
    return legend_below(fig)


def patching_contrast(df: pd.DataFrame, metric: str = "recovery_acc", k: int | None = None) -> go.Figure:
    """Recovery per task (points, mean over seeds and random draws) for top-k, random-k and bottom-k, with the mean."""
    rows = df[df.condition.isin(list(CONDITIONS))]
    per_task = rows.groupby(["condition", "task"])[metric].mean().reset_index()
    fig = go.Figure()
    rng = np.random.default_rng(0)  # horizontal jitter only
    for i, (cond, (label, color)) in enumerate(CONDITIONS.items()):
        v = per_task[per_task.condition == cond]
        fig.add_trace(
            go.Scatter(
                x=i + rng.uniform(-0.18, 0.18, len(v)),
                y=v[metric],
                mode="markers",
                name=label,
                marker=dict(color=color, size=6, opacity=0.6),
                text=v.task,
                hovertemplate="%{text}: %{y:.2f}<extra></extra>",
            )
        )
        fig.add_trace(
            go.Scatter(
                x=[i - 0.3, i + 0.3], y=[v[metric].mean()] * 2, mode="lines", line=dict(color="black", width=2),
                showlegend=False, hoverinfo="skip",
            )
        )  # fmt: skip
    what = "first-token accuracy" if metric == "recovery_acc" else "answer probability"
    fig.update_xaxes(tickvals=[0, 1, 2], ticktext=[v[0] for v in CONDITIONS.values()], showgrid=False)
    fig.update_yaxes(title_text="recovery (0 zero-shot, 1 SITE)")
    fig.add_hline(y=0, line=dict(color="#bbbbbb", width=1))
    heads = f"{k} heads" if k else "k heads"
    subtitle = f"recovery of {what}; a point per task, bar: mean"
    _style(fig, f"t written into {heads}", height=380, showlegend=False, subtitle=subtitle, margin=dict(t=80))
    return fig


def seed_stability_figure(stability: pd.DataFrame) -> go.Figure:
    """Per task: top-k Jaccard across seeds (points) against its chance level (line), and the alphas' Spearman."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=["top-k Jaccard", "Spearman of alpha"])
    rng = np.random.default_rng(0)
    for col, column in ((1, "jaccard"), (2, "spearman")):
        fig.add_trace(
            go.Scatter(
                x=rng.uniform(-0.2, 0.2, len(stability)),
                y=stability[column],
                mode="markers",
                marker=dict(color=COLORWAY[0], size=6, opacity=0.7),
                text=stability.task,
                hovertemplate="%{text}: %{y:.2f}<extra></extra>",
                showlegend=False,
            ),
            row=1,
            col=col,
        )
        fig.update_xaxes(showticklabels=False, showgrid=False, range=[-0.5, 0.5], row=1, col=col)
    chance = float(stability.jaccard_chance.iloc[0])
    fig.add_hline(y=chance, line=dict(color=COLORWAY[1], dash="dash"), row=1, col=1)
    fig.add_annotation(
        x=0.45, y=chance, text="chance", showarrow=False, yshift=9, xanchor="right", font_size=FONT_SMALL, row=1, col=1
    )
    fig.add_hline(y=0, line=dict(color=COLORWAY[1], dash="dash"), row=1, col=2)
    fig.update_yaxes(range=[0, 1], row=1, col=1)
    fig.update_yaxes(range=[-0.2, 1], row=1, col=2)
    title = f"Seed pairs of one task, {len(stability)} tasks"
    return _style(fig, title, height=340, margin=dict(t=75, b=30))


def permutation_null_figure(tests: Mapping[str, tuple[float, np.ndarray]]) -> go.Figure:
    """Per test (one row each): the gaps of shuffled groupings (violin) and the observed gap (diamond).

    ``tests`` maps a label to ``overlap.permutation_null``'s (observed gap, null gaps).
    """
    fig = go.Figure()
    labels = list(tests)
    for i, (label, (observed, null)) in enumerate(tests.items()):
        fig.add_trace(
            go.Violin(
                x=null, y=[label] * len(null), orientation="h", side="both", points=False, line_color="#888888",
                fillcolor="rgba(136,136,136,0.35)", width=0.8, name="shuffled groups", showlegend=i == 0,
                hoverinfo="skip", spanmode="hard",
            )
        )  # fmt: skip
        fig.add_trace(
            go.Scatter(
                x=[observed], y=[label], mode="markers", name="observed", showlegend=i == 0,
                marker=dict(color=COLORWAY[0], size=10, symbol="diamond"),
                hovertemplate=f"{label}: %{{x:.3f}}<extra></extra>",
            )
        )  # fmt: skip
    fig.add_vline(x=0, line=dict(color="#bbbbbb", width=1))
    fig.update_xaxes(title_text="top-k Jaccard within minus across groups")
    fig.update_yaxes(categoryorder="array", categoryarray=labels[::-1])
    _style(fig, "Do tasks of a group share heads?", height=120 + 45 * len(labels), margin=dict(t=60))
    return legend_below(fig)
