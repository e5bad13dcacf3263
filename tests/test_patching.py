import random

import numpy as np
import pytest
import torch

from site_lens.adapter import Adapter
from site_lens.analysis.patching import (
    bottom_k_heads,
    generic_head_patch,
    head_patching_sweep,
    k_sweep,
    patch_data,
    random_k_heads,
    top_k_heads,
)
from site_lens.stages.embeddings import last_token_z
from site_lens.tasks import load_task


@pytest.fixture(scope="module")
def adapter(model):
    g = torch.Generator().manual_seed(1)
    shape = (model.cfg.n_layers, model.cfg.n_heads)
    return Adapter(
        t=torch.randn(*shape, model.cfg.d_head, generator=g) * 2, theta=torch.randn(*shape, generator=g) * 3, model={}
    )


def test_head_sets_have_size_k_and_are_disjoint():
    alpha = torch.rand(4, 6)
    for k in (1, 3, 12):
        top, bottom = top_k_heads(alpha, k), bottom_k_heads(alpha, k)
        rnd = random_k_heads(alpha.shape, k, random.Random(0), exclude=top | bottom)
        assert int(top.sum()) == int(bottom.sum()) == int(rnd.sum()) == k
        assert not (top & bottom).any()
        if k <= 8:  # 24 heads: the rest holds k heads
            assert not (rnd & (top | bottom)).any()
        assert alpha[top].min() >= alpha[~top].max()


def test_k_sweep():
    assert k_sweep(12) == [1, 2, 4, 8, 12]
    assert k_sweep(1) == [1]


def test_clean_into_clean_changes_nothing(model):
    task = load_task("opposites")
    data = patch_data(model, task, max_items=6)
    own = last_token_z(model, data.tokens)  # each prompt's own zero-shot z
    every = torch.ones(model.cfg.n_layers, model.cfg.n_heads, dtype=torch.bool)
    acc, prob = generic_head_patch(model, data, own, [~every, every])
    assert torch.allclose(prob[0], prob[1], atol=1e-5) and acc[0] == acc[1]


def test_sweep_recovers_zero_and_one(model, adapter):
    task = load_task("opposites")
    df = head_patching_sweep(model, task, adapter, draws=2, reference="all", max_items=6)
    z = df[df.condition == "zero_shot"].iloc[0]
    assert z.recovery_prob == pytest.approx(0.0, abs=1e-9)
    total = model.cfg.n_layers * model.cfg.n_heads
    full = df[(df.condition == "top") & (df.k == total)].iloc[0]
    assert full.recovery_prob == pytest.approx(1.0, abs=1e-4)
    assert set(df.condition) == {"zero_shot", "all", "site", "top", "bottom", "random"}
    assert len(df[df.condition == "random"]) == 2 * len(k_sweep(total))
    assert (
        df.n_heads[df.condition.isin(["top", "bottom", "random"])]
        == df.k[df.condition.isin(["top", "bottom", "random"])]
    ).all()
    assert np.isfinite(df.prob).all()


def test_per_query_source(model, adapter):
    task = load_task("opposites")
    df = head_patching_sweep(model, task, adapter, ks=[1, 2], draws=1, source="per_query", max_items=4, n_shots=2)
    assert (df.source == "per_query").all() and len(df) == 3 + 2 + 2 + 2
