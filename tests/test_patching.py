import random
from functools import partial

import numpy as np
import pytest
import torch
from transformer_lens.utilities import get_act_name

from site_lens.adapter import Adapter
from site_lens.analysis.patching import (
    bottom_k_heads,
    generic_head_patch,
    head_patching_sweep,
    k_sweep,
    patch_data,
    patch_scores,
    random_k_heads,
    site_reference,
    top_k_heads,
)
from site_lens.metrics import answer_probability, first_token_accuracy
from site_lens.stages.embeddings import last_token_z
from site_lens.tasks import load_task


def _mix_last(z, hook, t, alpha):
    """z at the last position mixed toward t by alpha, written out by hand (one prompt, no padding)."""
    z = z.clone()
    z[0, -1] = (1 - alpha[:, None]) * z[0, -1] + alpha[:, None] * t
    return z


def _by_hand(model, data, source, alpha):
    """Each prompt's last-token logits from a whole forward, hook_z at the last token mixed toward its source."""
    rows = []
    for i, toks in enumerate(data.tokens):
        src = source[i] if source.dim() == 4 else source
        hooks = [
            (get_act_name("z", layer), partial(_mix_last, t=src[layer], alpha=alpha[layer].float()))
            for layer in range(model.cfg.n_layers)
        ]
        with torch.no_grad():
            rows.append(model.run_with_hooks(torch.tensor([toks]), fwd_hooks=hooks)[0, -1])
    return torch.stack(rows).float()  # (prompt, d_vocab)


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
    acc, prob = patch_scores(model, data, own, [~every, every])
    assert torch.allclose(prob[0], prob[1], atol=1e-5) and acc[0] == acc[1]


def _target_logit(logits, targets):
    """A per-prompt metric: each prompt's logit of its answer's first token."""
    return logits[torch.arange(len(targets)), targets]


def test_patched_scores_equal_whole_forwards_by_hand(model, adapter):
    """No heads is zero-shot, every head (alpha = 1) replaces z by t, and a soft alpha mixes it in."""
    data = patch_data(model, load_task("opposites"), max_items=8)
    assert len({len(x) for x in data.tokens}) > 1  # several prefix lengths: the cache regroups the prompts
    none = torch.zeros_like(adapter.alpha, dtype=torch.bool)
    acc, prob = patch_scores(model, data, adapter.t, [none, ~none])
    for i, alpha in enumerate([none.float(), (~none).float()]):
        logits = _by_hand(model, data, adapter.t, alpha)
        assert float(acc[i]) == first_token_accuracy(logits, data.targets)
        assert float(prob[i]) == pytest.approx(answer_probability(logits, data.targets), abs=1e-6)
    assert not torch.allclose(prob[0], prob[1], atol=1e-4)  # the patch changes something
    site = site_reference(model, data, adapter.t, adapter.alpha)
    logits = _by_hand(model, data, adapter.t, adapter.alpha)
    assert site == pytest.approx(
        (first_token_accuracy(logits, data.targets), answer_probability(logits, data.targets)), abs=1e-6
    )


def test_the_metric_sees_every_prompt_in_order(model, adapter):
    """A per-prompt metric comes back in the prompts' order, whatever order the cache ran them in."""
    data = patch_data(model, load_task("opposites"), max_items=8)
    mask = top_k_heads(adapter.alpha, 3)
    got = generic_head_patch(model, data, adapter.t, [mask, ~mask], _target_logit)
    assert got.shape == (2, len(data.tokens))
    for row, gate in zip(got, [mask, ~mask]):
        want = _target_logit(_by_hand(model, data, adapter.t, gate.float()), data.targets)
        torch.testing.assert_close(row, want.double(), atol=1e-4, rtol=1e-5)


def test_sweep_recovers_zero_and_one(model, adapter):
    task = load_task("opposites")
    df = head_patching_sweep(model, task, adapter, draws=2, reference="all", max_items=6)
    z = df[df.condition == "zero_shot"].iloc[0]
    assert z.recovery_prob == pytest.approx(0.0, abs=1e-9)
    total = model.cfg.n_layers * model.cfg.n_heads
    full = df[(df.condition == "top") & (df.k == total)].iloc[0]
    every = df[df.condition == "all"].iloc[0]
    assert full.recovery_prob == 1.0 and full.prob == every.prob and full.acc == every.acc  # the same run
    site = df[df.condition == "site"].iloc[0]
    assert (site.acc, site.prob) == site_reference(
        model, patch_data(model, task, max_items=6), adapter.t, adapter.alpha
    )
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
    # every head: each prompt gets its own query's clean z, not another prompt's, nor t
    data = patch_data(model, task, max_items=4, per_query=True, n_shots=2)
    logits = _by_hand(model, data, data.clean_z, torch.ones_like(adapter.alpha))
    every = df[df.condition == "all"].iloc[0]
    assert every.prob == pytest.approx(answer_probability(logits, data.targets), abs=1e-6)
    assert every.acc == first_token_accuracy(logits, data.targets)
    mine = generic_head_patch(model, data, data.clean_z, [torch.ones_like(adapter.alpha)], _target_logit)[0]
    torch.testing.assert_close(mine, _target_logit(logits, data.targets).double(), atol=1e-4, rtol=1e-5)
    shuffled = _by_hand(model, data, data.clean_z.roll(1, 0), torch.ones_like(adapter.alpha))
    assert not torch.allclose(mine, _target_logit(shuffled, data.targets).double(), atol=1e-3)
