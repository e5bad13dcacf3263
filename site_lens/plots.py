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
            colorbar=dict(title="alpha"),
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
