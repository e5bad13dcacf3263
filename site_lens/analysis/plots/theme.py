"""The house theme and what every figure shares: the template, colour ranges, head labels, saving and showing."""

from __future__ import annotations

import logging
import math
import re
from numbers import Real
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

from ...locks import owner_tag

log = logging.getLogger(__name__)

THEME = "site_lens"

# ---------------------------------------------------------------- print size (the rule: see the package docstring)

PX_PER_INCH = 150  # layout px per printed inch
COLUMN = 525  # px: a single-column figure, printed 3.5 in wide
FULL = 1050  # px: a full-width figure, printed 7 in wide
WIDTHS = {"column": COLUMN, "full": FULL}
DPI = 300  # PNG pixels per printed inch
SCALE = DPI / PX_PER_INCH  # PNG px per layout px: 2, so PNGs are 1050 or 2100 px wide
MIN_PT = 7.0  # no text smaller than this at the printed width


def pt_to_px(pt: Real) -> float:
    """Layout px of ``pt`` points at the printed width (1 pt = 1/72 in)."""
    return pt * PX_PER_INCH / 72


def px_to_pt(px: Real) -> float:
    """Printed size in points of ``px`` layout px."""
    return px * 72 / PX_PER_INCH


FONT_SMALL = math.ceil(pt_to_px(MIN_PT))  # 15 px = 7.2 pt: ticks, legend, annotations, cell values, notes
FONT = 17  # px = 8.2 pt: axis and colour-bar titles, panel titles
FONT_TITLE = 19  # px = 9.1 pt: the figure's title
WIDTH = COLUMN  # the default width
GRID = "#e6e6e6"
MASKED = "#d9d9d9"  # cells with no value (a matrix's trivial diagonal)
COLORWAY = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"]  # Okabe-Ito
SEQUENTIAL = "Viridis"
DIVERGING = "RdBu"


def _register_theme() -> None:
    axis = dict(
        showgrid=True, gridcolor=GRID, zeroline=False, showline=True, linecolor="#444", ticks="outside",
        tickcolor="#444", ticklen=3, automargin=True, title=dict(standoff=6, font=dict(size=FONT)),
        tickfont=dict(size=FONT_SMALL),
    )  # fmt: skip
    t = go.layout.Template()
    t.layout = go.Layout(
        font=dict(family="Liberation Sans, Arial, Helvetica, sans-serif", size=FONT, color="#222"),
        title=dict(
            font_size=FONT_TITLE, subtitle_font_size=FONT_SMALL, x=0.5, xanchor="center", y=0.985, yanchor="top"
        ),
        paper_bgcolor="white",
        plot_bgcolor="white",
        colorway=COLORWAY,
        xaxis=axis,
        yaxis=axis,
        legend=dict(font=dict(size=FONT_SMALL), title_font_size=FONT_SMALL, bgcolor="rgba(255,255,255,0.85)"),
        margin=dict(l=50, r=12, t=40, b=45),
        hoverlabel=dict(font=dict(size=FONT_SMALL)),
        annotationdefaults=dict(font=dict(size=FONT_SMALL)),
    )
    pio.templates[THEME] = t


_register_theme()


def _style(
    fig: go.Figure, title: str, size: str = "column", height: int = 400, subtitle: str | None = None, **layout
) -> go.Figure:
    """The house template, ``title`` (and a ``subtitle`` line), and the width of ``size``: "column" or "full"."""
    fig.update_layout(template=THEME, title_text=title, width=WIDTHS[size], height=height, **layout)
    if subtitle:
        fig.update_layout(title_subtitle_text=subtitle)
    return fig


def legend_below(fig: go.Figure, axis_px: int = 50) -> go.Figure:
    """Put the legend in rows along the figure's bottom edge, clear of the data, and add its height to margin.b.

    ``axis_px`` is what the x axis needs under the plot (ticks and title). The rows are
    estimated from the entries' text in the widest font the theme may be drawn in; a legend
    of several rows gets columns of one fixed share of the width (``entrywidth``), so it has
    those rows in whichever font the browser finds.
    """
    names = [t.name or f"trace {i}" for i, t in enumerate(fig.data) if t.showlegend is not False]
    names += [s.name or "" for s in fig.layout.shapes if s.showlegend]  # reference lines with a legend entry
    rows, cols = _legend_rows(names, _legend_room(fig))
    legend = dict(orientation="h", xref="container", yref="container", x=0.01, y=0.0, xanchor="left")
    if rows > 1:
        legend.update(entrywidth=0.98 / cols, entrywidthmode="fraction")
    fig.update_layout(
        legend=dict(legend, yanchor="bottom", traceorder="normal"),
        margin_b=axis_px + rows * (FONT_SMALL + 8) + 4,
        height=(fig.layout.height or 400) + rows * (FONT_SMALL + 8),
    )
    return fig


# Advance widths (1/1000 em) of ASCII 32..126 in Arial / Helvetica, whose metrics Liberation Sans shares
_WIDTHS = [
    278, 278, 355, 556, 556, 889, 667, 191, 333, 333, 389, 584, 278, 333, 278, 278, 556, 556, 556, 556, 556, 556,
    556, 556, 556, 556, 278, 278, 584, 584, 584, 556, 1015, 667, 667, 722, 722, 667, 611, 778, 722, 278, 500, 667,
    556, 833, 722, 778, 667, 778, 722, 667, 611, 722, 667, 944, 667, 667, 611, 278, 278, 278, 469, 556, 333, 556,
    556, 500, 556, 556, 278, 556, 556, 222, 222, 500, 222, 833, 556, 556, 556, 556, 333, 500, 278, 556, 500, 722,
    500, 500, 500, 334, 260, 334, 584,
]  # fmt: skip


# The same for DejaVu Sans, which a machine without Liberation Sans or Arial (Debian's default) draws instead:
# about 13 % wider
_WIDTHS_DEJAVU = [
    318, 401, 460, 838, 636, 950, 780, 275, 390, 390, 500, 838, 318, 361, 318, 337, 636, 636, 636, 636, 636, 636,
    636, 636, 636, 636, 337, 337, 838, 838, 838, 531, 1000, 684, 686, 698, 770, 632, 575, 775, 752, 295, 295, 656,
    557, 863, 748, 787, 603, 787, 695, 635, 611, 732, 684, 989, 685, 611, 685, 390, 337, 390, 838, 500, 500, 613,
    635, 550, 635, 615, 352, 635, 634, 278, 278, 579, 278, 974, 634, 612, 635, 635, 411, 521, 392, 634, 592, 818,
    592, 592, 525, 636, 337, 636, 838,
]  # fmt: skip
# the fonts a figure may be drawn in (the template asks for Liberation Sans, then Arial; else the browser's sans-serif)
FONT_WIDTHS = {"Liberation Sans": _WIDTHS, "DejaVu Sans": _WIDTHS_DEJAVU}
_WIDEST = [max(w) for w in zip(*FONT_WIDTHS.values())]
_OTHER = {"Liberation Sans": 680, "DejaVu Sans": 840}  # any other character: about a wide letter's width


def _text_px(text: str, size: Real = FONT_SMALL, font: str | None = None) -> Real:
    """The width in px of one line of ``text`` at ``size`` px (tags left out; 5 % to spare).

    In ``font`` (a key of ``FONT_WIDTHS``), or by default in the widest of them, character by character: a
    layout made with this width holds in any of them.
    """
    plain = re.sub(r"<[^>]+>", "", text).replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">")
    widths = FONT_WIDTHS[font] if font else _WIDEST
    other = _OTHER[font] if font else max(_OTHER.values())
    return 1.05 * size / 1000 * sum(widths[ord(c) - 32] if 32 <= ord(c) < 127 else other for c in plain)


def _legend_room(fig: go.Figure) -> Real:
    """The width plotly wraps a horizontal legend at, the plot area's, less 50 px that automargin may take."""
    base = fig.layout.template.layout.margin if fig.layout.template is not None else None
    side = [
        next((v for v in (getattr(fig.layout.margin, k), getattr(base, k, None)) if v is not None), 80) for k in "lr"
    ]
    return (fig.layout.width or COLUMN) - sum(side) - 50


def _legend_rows(names: list[str], width: Real) -> tuple[int, int]:
    """(rows, columns) of a horizontal legend ``width`` px wide: one row if every entry fits, else a grid of the widest."""
    widths = [40 + _text_px(n) + 5 for n in names]  # the symbol and its gap, the text, the gap to the next entry
    if not widths:
        return 0, 0
    if sum(widths) < width:
        return 1, len(widths)
    cols = max(1, int(width // max(widths)))
    return math.ceil(len(widths) / cols), cols


def note(text: str) -> str:
    """A second, smaller line under an axis, colour-bar or panel title (``FONT_SMALL``, still at least ``MIN_PT``).

    Not ``<sup>``, which plotly draws at 70 % size; a figure's title takes a ``subtitle`` instead.
    """
    return f"<br><span style='font-size:{FONT_SMALL}px'>{text}</span>"


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
        title=dict(text=title, side="right", font=dict(size=FONT)), thickness=12, outlinewidth=0, ticks="outside",
        ticklen=3, tickfont=dict(size=FONT_SMALL), **kw,
    )  # fmt: skip


def _range_note(zmin: float, zmax: float) -> str:
    return note(f"colour range fitted to the data: {zmin:.2f} to {zmax:.2f}")


def _rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


# ---------------------------------------------------------------- task x task matrices

CATEGORY_ORDER = ("abstractive", "extractive")


def _category_key(c: str) -> tuple[int, str]:
    return (CATEGORY_ORDER.index(c) if c in CATEGORY_ORDER else len(CATEGORY_ORDER) + (c == "other"), c)


# ---------------------------------------------------------------- text that fits

_SPAN = re.compile(r"(<span style='font-size:(\d+)px'>)([^<]*)(</span>)")


def _wrap(text: str, size: Real, room: Real) -> str:
    """``text`` with every line longer than ``room`` px (``_text_px``) broken at spaces into lines that fit.

    A line is plain text at ``size`` px or one ``note`` span at its own size; other markup is left as it is.
    """
    out = []
    for line in text.split("<br>"):
        m = _SPAN.fullmatch(line)
        pre, px, inner, post = (m[1], float(m[2]), m[3], m[4]) if m else ("", size, line, "")
        if _text_px(inner, px) <= room or (not m and "<" in line):
            out.append(line)
            continue
        pieces: list[str] = []
        for word in inner.split(" "):
            if pieces and _text_px(f"{pieces[-1]} {word}", px) <= room:
                pieces[-1] = f"{pieces[-1]} {word}"
            else:
                pieces.append(word)
        out += [f"{pre}{piece}{post}" for piece in pieces]
    return "<br>".join(out)


def fit_text(fig: go.Figure) -> go.Figure:
    """Break every axis and colour-bar title longer than its axis or colour bar into lines that fit; returns ``fig``.

    Lengths are measured in the widest font the theme may be drawn in (``FONT_WIDTHS``: Liberation Sans,
    Arial's metrics, or DejaVu Sans where neither is installed), so no title runs off the figure's edge in
    any of them. ``save_figure`` and ``show`` call it; it changes nothing that fits already.
    """
    lay = fig.layout
    base = lay.template.layout.margin if lay.template is not None else None
    margin = {k: getattr(lay.margin, k) for k in "lrtb"}
    for k, v in margin.items():
        margin[k] = v if v is not None else getattr(base, k, None) if base is not None else None
        margin[k] = 80 if margin[k] is None else margin[k]  # plotly's defaults (100 at the top)
    plot_w = (lay.width or 700) - margin["l"] - margin["r"]
    plot_h = (lay.height or 450) - margin["t"] - margin["b"]
    for axes, length in ((fig.select_xaxes(), plot_w), (fig.select_yaxes(), plot_h)):
        for ax in axes:
            if ax.title.text:
                d0, d1 = ax.domain or (0, 1)
                ax.title.text = _wrap(ax.title.text, ax.title.font.size or FONT, length * (d1 - d0))
    for trace in fig.data:
        bars = [getattr(trace, "colorbar", None), getattr(getattr(trace, "marker", None), "colorbar", None)]
        for bar in (b for b in bars if b is not None and b.title.text):
            room = bar.len if bar.lenmode == "pixels" else plot_h * (bar.len if bar.len is not None else 1)
            bar.title.text = _wrap(bar.title.text, bar.title.font.size or FONT, room)
    return fig


PLOTLY_JS = "plotly.min.js"  # written once per output folder; every HTML file there loads it by this relative name


def save_figure(fig: go.Figure, stem: str | Path) -> list[Path]:
    """Write STEM.html, and STEM.png if static export works here; returns the figure's files written.

    Titles too long for their axis are broken into lines first (``fit_text``).

    The HTML opens offline: it loads plotly.js from ``plotly.min.js`` next to it (written
    with the first figure in a folder, or when the installed plotly's differs), not from
    a CDN. The PNG is ``SCALE`` times the layout's size: ``DPI`` dots per printed inch.
    """
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    fit_text(fig)
    _write_plotly_js(stem.parent)
    written = [stem.with_suffix(".html")]
    fig.write_html(str(written[0]), include_plotlyjs=PLOTLY_JS)
    png = stem.with_suffix(".png")
    for attempt in (1, 2):
        try:
            fig.write_image(str(png), scale=SCALE)
            written.append(png)
            _PNG_WORKED.append(True)
            break
        except Exception as e:  # no kaleido or no browser: HTML still written
            if attempt == 1 and _PNG_WORKED:  # it worked before in this process: kaleido's page was not ready
                continue  # (seen on a loaded machine: "kaleido_scopes is not defined"); once more
            if _PNG_WORKED:  # a browser is there: this figure failed twice, the next may not
                log.warning("PNG export of %s failed twice (%s); wrote HTML only", stem.name, _short(e))
            else:
                log.warning("PNG export unavailable (%s); wrote HTML only", _export_error(e))
            break
    return written


_PNG_WORKED: list[bool] = []  # a PNG export succeeded in this process (then a failure is retried once)


_JS_CHECKED: set[Path] = set()


def _write_plotly_js(folder: Path) -> None:
    """``folder/plotly.min.js``: the installed plotly's, checked once per folder and process."""
    path = (folder / PLOTLY_JS).resolve()
    if path in _JS_CHECKED and path.is_file():
        return
    from plotly.offline import get_plotlyjs

    js = get_plotlyjs()
    _JS_CHECKED.add(path)
    if not (path.is_file() and path.read_text(encoding="utf-8") == js):
        tmp = path.with_name(f".{PLOTLY_JS}.{owner_tag()}.tmp")  # one per writer: processes may share a folder
        tmp.write_text(js, encoding="utf-8")
        tmp.replace(path)


def show(fig: go.Figure, scale: float = SCALE):
    """Display ``fig`` in a notebook as a static PNG (it renders wherever the notebook is viewed).

    Falls back to the interactive figure, with a one-line note of why, when the
    static exporter (kaleido + a Chromium) is not available here.
    """
    from IPython.display import Image, display

    fit_text(fig)
    try:
        display(Image(fig.to_image(format="png", scale=scale)))
    except Exception as e:  # no kaleido or no browser
        log.warning("static PNG unavailable (%s); showing the interactive figure", _export_error(e))
        fig.show()


def _short(e: Exception) -> str:
    msg = str(e).strip().split("\n")[0] or e.__class__.__name__
    return msg if len(msg) <= 160 else msg[:157] + "..."  # a browser's error can be a whole JSON record


def _export_error(e: Exception) -> str:
    msg = _short(e)
    return f"{msg}; for PNG export install a Chromium: `make chromium` or `apt-get install chromium`"
