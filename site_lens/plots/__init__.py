"""Plot functions: each takes tensors or DataFrames and returns a plotly ``go.Figure`` in the house theme.

Every figure uses the ``site_lens`` template (``THEME``, registered on import): white
background, a light grid, fonts readable at a paper's column width. Heads are
labelled ``L{layer}H{head}``, and every matrix puts its first row (layer 0, the
first task) at the top. Quantities in 0..1 get a sequential scale, fitted to the
data when they span little of 0..1 (the colourbar says so); only signed
quantities (correlations) get ``RdBu`` centred at 0, over +-max |value|.
``save_figure`` writes interactive HTML always, and PNG when a static exporter
(kaleido + a Chromium) is available.
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
from .theme import THEME, diverging_range, head_label, save_figure, sequential_range, show

__all__ = [
    "METHOD_LABELS",
    "METHOD_ORDER",
    "PATCH_COLORS",
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
    "relative_transfer",
    "save_figure",
    "sequential_range",
    "show",
    "training_curve",
    "transfer_heatmap",
]
