import numpy as np
import pandas as pd
import pytest
import torch

from site_lens.adapter import Adapter
from site_lens.analysis.overlap import (
    alpha_shares,
    category_summary,
    cluster_order,
    jaccard_matrix,
    pearson,
    pearson_matrix,
    spearman,
    spearman_matrix,
    transfer_matrix,
)
from site_lens.tasks import load_task


def _alphas():
    g = torch.Generator().manual_seed(0)
    a = torch.rand(3, 4, generator=g)
    return {"a": a, "a2": a * 0.5 + 0.1, "b": torch.rand(3, 4, generator=g), "c": 1 - a}


def test_self_overlap_is_one():
    al = _alphas()
    for m in (pearson_matrix(al), spearman_matrix(al), jaccard_matrix(al, k=3)):
        assert np.allclose(np.diag(m.to_numpy()), 1.0)
        assert list(m.index) == list(al)
    assert pearson_matrix(al).loc["a", "a2"] == pytest.approx(1.0)
    assert spearman_matrix(al).loc["a", "c"] == pytest.approx(-1.0)


def test_spearman_ties_and_pearson():
    assert spearman([1, 2, 2, 3], [1, 2, 2, 3]) == pytest.approx(1.0)
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)


def test_cluster_order_groups_similar():
    m = pd.DataFrame(
        [[1, 0.9, 0, 0], [0.9, 1, 0, 0], [0, 0, 1, 0.8], [0, 0, 0.8, 1]], index=list("wxyz"), columns=list("wxyz")
    )
    order = cluster_order(m.loc[list("wyxz"), list("wyxz")])
    assert sorted(order) == list("wxyz")
    assert abs(order.index("w") - order.index("x")) == 1 and abs(order.index("y") - order.index("z")) == 1


def test_category_summary():
    m = pearson_matrix(_alphas())
    s = category_summary(m, {"a": "x", "a2": "x", "b": "y", "c": "y"})
    assert s["n_within"] == 2 and s["n_across"] == 4
    assert s["within"] == pytest.approx((1.0 + m.loc["b", "c"]) / 2)


def test_alpha_shares():
    s = alpha_shares(torch.tensor([[0.0, 0.05, 0.5, 0.95]]))
    assert s == {"share_lt_0.1": 0.5, "share_gt_0.9": 0.25}


def test_transfer_matrix_shape(model):
    shape = (model.cfg.n_layers, model.cfg.n_heads)
    ads = {
        n: Adapter(t=torch.randn(*shape, model.cfg.d_head), theta=torch.randn(*shape), model={})
        for n in ("opposites", "uppercase")
    }
    tasks = {n: load_task(n) for n in ads}
    m = transfer_matrix(model, tasks, ads, max_items=4)
    assert m.shape == (2, 2) and ((m >= 0) & (m <= 1)).all().all()
