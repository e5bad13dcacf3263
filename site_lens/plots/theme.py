"""The house theme and what every figure shares: the template, colour ranges, head labels, saving and showing."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

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


def _rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


# ---------------------------------------------------------------- task x task matrices

CATEGORY_ORDER = ("abstractive", "extractive")


def _category_key(c: str) -> tuple[int, str]:
    return (CATEGORY_ORDER.index(c) if c in CATEGORY_ORDER else len(CATEGORY_ORDER) + (c == "other"), c)


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
