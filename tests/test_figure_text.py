"""Every figure's text fits in each font the theme may be drawn in: Liberation Sans (Arial's metrics) and DejaVu Sans.

Widths come from ``theme.FONT_WIDTHS``, checked here against the font files where they are installed;
no browser is needed. Titles are measured after ``fit_text``, as ``save_figure`` writes them.
"""

import math
import struct
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from test_plots import _all_figures, _rows, _sweep

from site_lens.analysis import plots
from site_lens.analysis.patching import k_sweep
from site_lens.analysis.plots import theme
from site_lens.analysis.plots.claims import method_intervals_figure, patching_contrast, seed_stability_figure

FONT_FILES = {
    "Liberation Sans": ["/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
                        "/usr/share/fonts/truetype/liberation2/LiberationSans-Regular.ttf"],
    "DejaVu Sans": ["/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"],
}  # fmt: skip
FV_NAMES = ["alphabetically_last_5", "choose_middle_of_3", "country-capital", "english-french", "next_capital_letter"]


def _patching(n_tasks: int, total: int = 270) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for t in range(n_tasks):
        rows += [
            (f"task{t}", "zero_shot", 0, 0, 0.0),
            (f"task{t}", "all", total, 0, 0.1),
            (f"task{t}", "site", total, 0, 1.0),
        ]
        for cond, draws in (("top", 1), ("bottom", 1), ("random", 5)):
            rows += [(f"task{t}", cond, k, d, rng.uniform(0, k / total)) for d in range(draws) for k in k_sweep(total)]
    df = pd.DataFrame(rows, columns=["task", "condition", "k", "draw", "recovery_prob"])
    return df.assign(reference="site")


def _figures():
    """Every kind of figure the package draws, at the sizes of the embedded models and of the 45 FV tasks."""
    g = torch.Generator().manual_seed(0)
    alphas = {n: torch.rand(30, 9, generator=g) for n in FV_NAMES}
    cats = dict(zip(FV_NAMES, ["extractive", "extractive", "abstractive", "abstractive", "abstractive"]))
    tm = pd.DataFrame(np.random.default_rng(0).uniform(0.1, 0.9, (5, 5)), index=FV_NAMES, columns=FV_NAMES)
    iv = pd.DataFrame(
        [(m, met, 0.1 * i, 0.1 * i - 0.05, 0.1 * i + 0.02) for i, m in enumerate(["icl", "site"]) for met in
         ("exact_match", "strict_match")], columns=["method", "metric", "mean", "low", "high"])  # fmt: skip
    contrast = pd.DataFrame(
        [(t, 0, c, d, r) for t in FV_NAMES for c, r in (("top", 0.8), ("bottom", 0.1), ("random", 0.3)) for d in
         range(2)], columns=["task", "seed", "condition", "draw", "recovery_acc"])  # fmt: skip
    stab = pd.DataFrame({"task": FV_NAMES, "jaccard": 0.5, "spearman": 0.9, "jaccard_chance": 0.05})
    return [
        *_all_figures(),
        plots.alpha_heatmap(torch.rand(30, 9, generator=g), title="alphabetically_last_5: SITE alpha (smollm2-135m)"),
        plots.alpha_heatmap(0.45 + 0.1 * torch.rand(18, 4, generator=g)),  # a fitted range: a note under the title
        plots.alpha_heatmap(0.45 + 0.1 * torch.rand(2, 4, generator=g)),  # a tiny model's few layers
        plots.patching_curves(_patching(1), title="alphabetically_last_5: patching t into k heads"),
        plots.patching_curves(_patching(45), title="patching t into k heads, 45 tasks"),
        plots.patching_curves(_patching(1).assign(recovery_acc=0.5), metric="recovery_acc"),
        plots.patching_curves(_sweep()),
        plots.alpha_cie_scatter(torch.rand(30, 9), 1e-4 * torch.randn(30, 9)),
        plots.alpha_histogram(alphas, title="alpha over heads, per task", categories=cats),
        plots.overlap_heatmap(pd.DataFrame(np.eye(5), index=FV_NAMES, columns=FV_NAMES), FV_NAMES, categories=cats),
        plots.transfer_heatmap(tm, FV_NAMES, cats),
        plots.benchmark_figure(_rows(), by_category=True),
        method_intervals_figure({"SmolLM2-135M": iv, "Gemma 3 270M": iv}),
        patching_contrast(contrast, k=27),
        seed_stability_figure(stab),
    ]


def _lines(text: str) -> list[tuple[str, float | None]]:
    """Each line of a title and its size (None: the title's own)."""
    out = []
    for line in text.split("<br>"):
        m = theme._SPAN.fullmatch(line)
        out.append((m[3], float(m[2])) if m else (line, None))
    return out


def _margins(fig) -> dict[str, float]:
    base = fig.layout.template.layout.margin
    return {k: next(v for v in (getattr(fig.layout.margin, k), getattr(base, k), 80) if v is not None) for k in "lrtb"}


def _overflows(fig, font: str) -> list[str]:
    """Titles longer than what holds them, and legends taller than the room left for them, in ``font``."""
    theme.fit_text(fig)
    lay, m = fig.layout, _margins(fig)
    width, height = lay.width or 700, lay.height or 450
    plot_w, plot_h = width - m["l"] - m["r"], height - m["t"] - m["b"]
    bad = []

    def check(text, size, room, what):
        for line, px in _lines(text or ""):
            if theme._text_px(line, px or size, font) > room:
                bad.append(f"{what} {line!r}: {theme._text_px(line, px or size, font):.0f} px > {room:.0f} px")

    check(lay.title.text, theme.FONT_TITLE, width - 10, "title")
    for axes, length, name in ((fig.select_xaxes(), plot_w, "x title"), (fig.select_yaxes(), plot_h, "y title")):
        for ax in axes:
            d0, d1 = ax.domain or (0, 1)
            check(ax.title.text, ax.title.font.size or theme.FONT, length * (d1 - d0), name)
    for trace in fig.data:
        for bar in (getattr(trace, "colorbar", None), getattr(getattr(trace, "marker", None), "colorbar", None)):
            if bar is not None:
                check(bar.title.text, bar.title.font.size or theme.FONT, plot_h * (bar.len or 1), "colour-bar title")
    if lay.legend.orientation == "h" and lay.legend.yref == "container":  # legend_below: rows as plotly lays them
        names = [t.name for t in fig.data if t.showlegend is not False and t.name]
        names += [s.name for s in lay.shapes if s.showlegend]
        items = [40 + theme._text_px(n, theme.FONT_SMALL, font) + 5 for n in names]  # symbol, text, gap
        room = width - m["l"] - m["r"] - 50  # plotly wraps at the plot's width; automargin may widen margin.l
        if lay.legend.entrywidth:  # columns of a fixed share of the width: the text must fit in one
            assert lay.legend.entrywidthmode == "fraction"
            share = lay.legend.entrywidth * room
            bad += [f"legend entry {n!r} wider than {share:.0f} px" for n, w in zip(names, items) if w > share + 5]
            rows = math.ceil(len(items) / math.floor(1 / lay.legend.entrywidth))
        else:
            rows = 1
            if sum(items) >= room:
                bad.append(f"legend of one row {sum(items):.0f} px wide in {room:.0f} px")
        if rows * (theme.FONT_SMALL + 8) + 30 > m["b"]:
            bad.append(f"legend of {rows} rows in a bottom margin of {m['b']} px")
    return bad


@pytest.mark.parametrize("font", list(theme.FONT_WIDTHS))
def test_every_figure_leaves_room_for_its_text_in_each_font(font):
    problems = {}
    for i, fig in enumerate(_figures()):
        found = _overflows(fig, font)
        if found:
            problems[f"{i}: {fig.layout.title.text}"] = found
    assert not problems, problems


def test_the_widest_font_is_what_layouts_are_made_with():
    text = "recovery of SITE's answer probability"
    widths = [theme._text_px(text, theme.FONT, f) for f in theme.FONT_WIDTHS]
    assert theme._text_px(text, theme.FONT) == pytest.approx(max(widths), rel=0.01) and widths[1] > 1.1 * widths[0]
    long = plots.patching_curves(_patching(1))
    theme.fit_text(long)
    assert long.layout.yaxis.title.text.count("<br>") <= 1  # broken at most once, at a space


def _advance_widths(path: str, chars: str) -> list[float]:
    """Advance widths (1/1000 em) from a TrueType file: its cmap (format 4) and hmtx tables."""
    data = Path(path).read_bytes()

    def u16(at: int) -> int:
        return struct.unpack(">H", data[at : at + 2])[0]

    tables = {data[12 + 16 * i : 16 + 16 * i].decode("latin-1"): struct.unpack(">I", data[20 + 16 * i : 24 + 16 * i])[0]
              for i in range(u16(4))}  # fmt: skip
    upem, n_metrics, hmtx, cmap = u16(tables["head"] + 18), u16(tables["hhea"] + 34), tables["hmtx"], tables["cmap"]
    sub = next(
        cmap + off
        for pid, eid, off in (struct.unpack(">HHI", data[cmap + 4 + 8 * i : cmap + 12 + 8 * i]) for i in range(u16(cmap + 2)))
        if (pid, eid) in ((3, 1), (0, 3)) and u16(cmap + off) == 4
    )  # fmt: skip
    seg2 = u16(sub + 6)
    ends, starts = sub + 14, sub + 16 + seg2
    deltas, offsets = starts + seg2, starts + 2 * seg2

    def glyph(c: int) -> int:
        s = next(s for s in range(0, seg2, 2) if u16(ends + s) >= c)
        if c < u16(starts + s):
            return 0
        delta, ro = struct.unpack(">h", data[deltas + s : deltas + s + 2])[0], u16(offsets + s)
        g = c if ro == 0 else u16(offsets + s + ro + 2 * (c - u16(starts + s)))
        return (g + delta) & 0xFFFF if ro == 0 or g else 0

    return [u16(hmtx + 4 * min(glyph(ord(ch)), n_metrics - 1)) * 1000 / upem for ch in chars]


@pytest.mark.parametrize("font", list(theme.FONT_WIDTHS))
def test_width_tables_are_the_fonts_own(font):
    path = next((p for p in FONT_FILES[font] if Path(p).is_file()), None)
    if path is None:
        pytest.skip(f"{font} is not installed here")
    ascii_ = "".join(chr(c) for c in range(32, 127))
    assert [round(w) for w in _advance_widths(path, ascii_)] == theme.FONT_WIDTHS[font]
    assert max(_advance_widths(path, "ρΔα×−·")) <= theme._OTHER[font]
