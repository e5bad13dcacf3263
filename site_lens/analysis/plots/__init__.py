"""Plot functions: each takes tensors or DataFrames and returns a plotly ``go.Figure`` in the house theme.

Every figure uses the ``site_lens`` template (``THEME``, registered on import): white
background, a light grid. Heads are labelled ``L{layer}H{head}``, and every matrix
puts its first row (layer 0, the first task) at the top. Quantities in 0..1 get a
sequential scale, fitted to the data when they span little of 0..1 (the colourbar
says so); only signed quantities (correlations) get ``RdBu`` centred at 0, over
+-max |value|.

Print size, one rule for every figure (``theme.py``):

- every figure is one of two widths: ``COLUMN`` = 525 px, printed 3.5 in wide (one
  column), or ``FULL`` = 1050 px, printed 7 in wide (the page): 150 layout px per
  printed inch, so 1 px prints as 0.48 pt (``px_to_pt``, ``pt_to_px``);
- no text is smaller than ``MIN_PT`` = 7 pt printed: ``FONT_SMALL`` = 15 px (7.2 pt)
  for tick labels, legends, annotations, colour-bar ticks, cell values and notes,
  ``FONT`` = 17 px (8.2 pt) for axis, colour-bar and panel titles, ``FONT_TITLE`` =
  19 px (9.1 pt) for the title. Second lines of titles use ``note`` (15 px), never
  ``<sup>``/``<sub>``, which plotly draws at 70 % size;
- PNGs are written at ``SCALE`` = 2: 1050 or 2100 px wide, 300 dpi at the printed width.

``save_figure`` writes interactive HTML always, and PNG when a static exporter
(kaleido + a Chromium) is available. The HTML opens offline: it loads plotly.js from
one ``plotly.min.js`` written next to it (once per folder, rather than
in every file or from a CDN).
"""

from .heads import PATCH_COLORS, alpha_cie_scatter, alpha_heatmap, alpha_histogram, ema, patching_curves, training_curve
from .tasks import (
    METHOD_LABELS,
    METHOD_ORDER,
    benchmark_figure,
    grouped_order,
    jaccard_chance,
    overlap_heatmap,
    relative_transfer,
    transfer_heatmap,
)
from .theme import (
    COLUMN,
    DPI,
    FULL,
    MIN_PT,
    SCALE,
    THEME,
    diverging_range,
    head_label,
    pt_to_px,
    px_to_pt,
    save_figure,
    sequential_range,
    show,
)

__all__ = [
    "COLUMN",
    "DPI",
    "FULL",
    "METHOD_LABELS",
    "METHOD_ORDER",
    "MIN_PT",
    "PATCH_COLORS",
    "SCALE",
    "THEME",
    "alpha_cie_scatter",
    "alpha_heatmap",
    "alpha_histogram",
    "benchmark_figure",
    "diverging_range",
    "ema",
    "grouped_order",
    "head_label",
    "jaccard_chance",
    "overlap_heatmap",
    "patching_curves",
    "pt_to_px",
    "px_to_pt",
    "relative_transfer",
    "save_figure",
    "sequential_range",
    "show",
    "training_curve",
    "transfer_heatmap",
]
