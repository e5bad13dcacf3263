import pandas as pd
import plotly.graph_objects as go
import torch

from site_lens.overlap import cluster_order, pearson_matrix
from site_lens.plots import (
    alpha_cie_scatter,
    alpha_heatmap,
    alpha_histogram,
    overlap_heatmap,
    patching_curves,
    save_figure,
    training_curve,
)


def _sweep():
    rows = [
        {"condition": "zero_shot", "k": 0, "draw": 0, "recovery_prob": 0.0},
        {"condition": "site", "k": 8, "draw": 0, "recovery_prob": 1.0},
    ]
    for cond, draws in (("top", 1), ("bottom", 1), ("random", 3)):
        for d in range(draws):
            rows += [{"condition": cond, "k": k, "draw": d, "recovery_prob": k / 8 + 0.1 * d} for k in (1, 2, 4, 8)]
    return pd.DataFrame(rows)


def test_alpha_heatmap_shape():
    fig = alpha_heatmap(torch.rand(3, 4))
    assert isinstance(fig, go.Figure) and fig.data[0].z.shape == (3, 4)
    assert fig.data[0].text[2][1] == "L2H1"


def test_patching_curves():
    fig = patching_curves(_sweep())
    names = [t.name for t in fig.data]
    assert names == ["top-k", "bottom-k", "random (min-max over draws)", "random-k"]
    assert list(fig.data[0].x) == [1, 2, 4, 8] and len(fig.data[2].x) == 8
    assert fig.layout.xaxis.title.text.startswith("k") and fig.layout.yaxis.title.text == "recovery_prob"


def test_overlap_heatmap_diverging_and_order():
    al = {n: torch.rand(2, 3) for n in "abc"}
    m = pearson_matrix(al)
    order = cluster_order(m)
    fig = overlap_heatmap(m, order)
    assert fig.data[0].z.shape == (3, 3) and list(fig.data[0].x) == order
    assert fig.data[0].zmid == 0 and fig.data[0].colorscale[0][1].startswith("rgb")


def test_alpha_cie_scatter():
    fig = alpha_cie_scatter(torch.rand(2, 3), torch.randn(2, 3))
    assert len(fig.data[0].x) == 6 and fig.data[0].text[4] == "L1H1"
    assert fig.layout.xaxis.title.text == "alpha"


def test_training_curve():
    fig = training_curve(
        {"step": [1, 2, 3], "loss": [3.0, 2.0, 1.0], "valid_step": [3], "valid_loss": [1.5], "best_step": 3}
    )
    assert [len(t.x) for t in fig.data] == [3, 1]


def test_alpha_histogram_dict_and_tensor():
    assert len(alpha_histogram({"a": torch.rand(2, 3), "b": torch.rand(2, 3)}).data) == 2
    fig = alpha_histogram(torch.rand(2, 3))
    assert len(fig.data) == 1 and len(fig.data[0].x) == 6


def test_save_figure_writes_html(tmp_path):
    written = save_figure(alpha_heatmap(torch.rand(2, 2)), tmp_path / "sub" / "fig")
    assert written[0].suffix == ".html" and written[0].is_file()
    assert all(p.is_file() for p in written)
