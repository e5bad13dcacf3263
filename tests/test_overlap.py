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
from site_lens.analysis.patching import patch_data, site_reference
from site_lens.engine.backend import last_logits
from site_lens.gate import injection_hooks
from site_lens.tasks import Task, load_task, zero_shot_prompts
from site_lens.tokens import encode


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


def test_overlap_matrices_on_hand_computed_alphas():
    """Top-3 Jaccard, Spearman (ties averaged) and Pearson of three 2 x 3 alphas, worked out by hand."""
    alphas = {
        "a": torch.tensor([[0.9, 0.1, 0.5], [0.3, 0.8, 0.2]]),  # top 3: (0,0) (1,1) (0,2); ranks 5 0 3 2 4 1
        "b": torch.tensor([[0.1, 0.7, 0.6], [0.95, 0.4, 0.2]]),  # top 3: (1,0) (0,1) (0,2); ranks 0 4 3 5 2 1
        "c": torch.tensor([[0.5, 0.5, 0.1], [0.1, 0.9, 0.5]]),  # top 3: (1,1) (0,0) (0,1) (ties: lower index first)
    }
    jac = jaccard_matrix(alphas, k=3)
    assert jac.loc["a", "b"] == pytest.approx(1 / 5)  # {(0,2)} of five heads
    assert jac.loc["a", "c"] == pytest.approx(2 / 4)  # {(0,0), (1,1)} of four
    assert jac.loc["b", "c"] == pytest.approx(1 / 5)  # {(0,1)} of five
    sp = spearman_matrix(alphas)
    # a, b without ties: 1 - 6 sum d^2 / (n (n^2 - 1)), d = (5, -4, 0, -3, 2, 0)
    assert sp.loc["a", "b"] == pytest.approx(1 - 6 * 54 / (6 * 35))
    # c's ranks with ties averaged: (3, 3, 0.5, 0.5, 5, 3); Pearson of the ranks, both means 2.5
    # deviations c (.5, .5, -2, -2, 2.5, .5), a (2.5, -2.5, .5, -.5, 1.5, -1.5): sum of products 3
    assert sp.loc["a", "c"] == pytest.approx(3 / np.sqrt(15 * 17.5))
    pe = pearson_matrix(alphas)
    flat = {n: a.flatten().double().numpy() for n, a in alphas.items()}
    for x in alphas:
        for y in alphas:
            assert pe.loc[x, y] == pytest.approx(np.corrcoef(flat[x], flat[y])[0, 1])
            assert sp.loc[x, y] == pytest.approx(sp.loc[y, x]) and jac.loc[x, y] == jac.loc[y, x]
    assert spearman([3, 1, 2], [30, 10, 20]) == 1.0 and spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)


def _digit_model():
    """A tiny model that only ever predicts a digit: its argmax is a digit answer's first token."""
    from helpers import tiny

    m = tiny()
    digits = [m.tokenizer.convert_tokens_to_ids(d) for d in "0123456789"]
    with torch.no_grad():
        keep = torch.zeros(m.cfg.d_vocab_out, dtype=torch.bool)
        keep[digits] = True
        m.unembed.b_U[~keep] = -1e4
    return m


def _answered_by(model, name: str, adapter: Adapter, n: int = 8) -> Task:
    """Task ``name`` whose test answers are the digits SITE's gate (``adapter``) makes the model predict."""
    pairs = load_task(name).test[:n]
    answers = []
    for prompt, _ in zero_shot_prompts(pairs):
        toks = torch.tensor(encode(model, [prompt]))
        last = torch.tensor([toks.shape[1] - 1])
        logits = last_logits(model, toks, last, hooks=injection_hooks(model, adapter.t, adapter.alpha, last))
        answers.append(model.tokenizer.decode([int(logits.argmax(-1))]))
    test = [(x, y) for (x, _), y in zip(pairs, answers)]
    return Task(name, load_task(name).train, load_task(name).valid, test)


def test_transfer_matrix_pairs_each_task_with_its_own_t():
    """The diagonal is each task's own SITE (site_reference); off it, task B's t with task A's alpha."""
    model = _digit_model()
    g = torch.Generator().manual_seed(3)
    shape = (model.cfg.n_layers, model.cfg.n_heads)
    ads = {
        n: Adapter(
            t=4 * torch.randn(*shape, model.cfg.d_head, generator=g),
            theta=3 * torch.randn(*shape, generator=g),
            model={},
        )
        for n in ("opposites", "uppercase")
    }
    tasks = {n: _answered_by(model, n, ad) for n, ad in ads.items()}
    m = transfer_matrix(model, tasks, ads, max_items=8)
    for b in ads:
        data = patch_data(model, tasks[b], max_items=8)
        for a in ads:
            assert m.loc[a, b] == site_reference(model, data, ads[b].t, ads[a].alpha)[0], (a, b)
        assert m.loc[b, b] == 1.0  # the answers are what B's own gate predicts
        other = next(x for x in ads if x != b)
        assert site_reference(model, data, ads[other].t, ads[b].alpha)[0] < 1.0  # another task's t would show
    assert (m.to_numpy() < 1.0).any()  # and another task's alpha


def test_one_top_k_for_patching_overlap_and_minimal_sets():
    from site_lens.analysis.minimal import ranking_sets
    from site_lens.analysis.overlap import top_k_set
    from site_lens.analysis.patching import bottom_k_heads, top_k_heads
    from site_lens.stats import top_k_mask

    score = torch.tensor([[0.5, 0.1, 0.5], [0.5, 0.9, 0.1]])
    assert top_k_mask(score, 3).tolist() == [[True, False, True], [False, True, False]]  # ties: lower index first
    assert top_k_mask(score, 2, largest=False).tolist() == [[False, True, False], [False, False, True]]
    assert not top_k_mask(score, 0).any() and top_k_mask(score, 9).all()
    with pytest.raises(ValueError, match="k must be >= 0"):
        top_k_mask(score, -1)
    for k in range(7):
        top = top_k_mask(score, k)
        assert torch.equal(top_k_heads(score, k), top) and torch.equal(bottom_k_heads(score, k), top_k_mask(-score, k))
        assert top_k_set(score, k) == {tuple(i) for i in top.nonzero().tolist()}
        assert torch.equal(ranking_sets(score, [k], "x")[0].alpha, top.float())


def test_expected_jaccard_is_the_chance_overlap_of_random_sets():
    import random as _random

    from site_lens.analysis.overlap import expected_jaccard, jaccard

    rng = _random.Random(0)
    n, k = 40, 7
    sims = [jaccard(set(rng.sample(range(n), k)), set(rng.sample(range(n), k))) for _ in range(20_000)]
    assert expected_jaccard(n, k) == pytest.approx(sum(sims) / len(sims), abs=0.003)
    assert expected_jaccard(5, 5) == 1.0
    assert expected_jaccard(10, 1) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="0 < k <= n"):
        expected_jaccard(5, 6)


def test_permutation_test_finds_category_structure_and_only_that():
    import numpy as np
    import pandas as pd

    from site_lens.analysis.overlap import category_permutation_test, permutation_null

    names = [f"t{i}" for i in range(10)]
    cats = {n: "a" if i < 5 else "b" for i, n in enumerate(names)}
    same = np.array([[1.0 if cats[x] == cats[y] else 0.2 for y in names] for x in names])
    r = category_permutation_test(pd.DataFrame(same, names, names), cats, n_perm=2000)
    assert r["gap"] == pytest.approx(0.8) and r["within"] == 1.0 and r["across"] == pytest.approx(0.2)
    assert r["p_value"] < 0.01  # 1 / C(10, 5) * 2 of the labellings reach it
    noise = np.random.default_rng(0).random((10, 10))
    noise = (noise + noise.T) / 2
    pvals = [
        category_permutation_test(pd.DataFrame(noise, names, names), dict(zip(names, lab)), n_perm=300, seed=s)[
            "p_value"
        ]
        for s, lab in enumerate(np.random.default_rng(1).permuted(np.array(["a"] * 5 + ["b"] * 5)[None].repeat(20, 0), axis=1))
    ]
    assert 0.2 < float(np.mean(pvals)) < 0.8  # no structure: p-values spread over (0, 1)
    lone = category_permutation_test(pd.DataFrame(same[:2, :2], names[:2], names[:2]), {"t0": "a", "t5": "b", "t1": "b"})
    assert np.isnan(lone["gap"]) and np.isnan(lone["p_value"])  # no pair within a category: no test, not p ~ 0
    observed, null = permutation_null(pd.DataFrame(same, names, names), cats, n_perm=2000)
    assert observed == r["gap"] and len(null) == 2000 and null.mean() == pytest.approx(r["null_mean"])
    assert (1 + (null >= observed - 1e-12).sum()) / 2001 == r["p_value"]  # the figure draws the test's own shuffles
    # a shuffle keeps the group sizes: two groups of five always give 20 pairs within, so the null is centred near 0
    assert abs(null.mean()) < 0.05 and len(permutation_null(pd.DataFrame(same[:2, :2], names[:2], names[:2]), cats)[1]) == 0
    # families within categories: tasks of a family share only what their category shares, so with the
    # category kept (strata) the family gap is no more than chance, while a free shuffle calls it significant
    fams = {n: f"{cats[n]}{i % 2}" for i, n in enumerate(names)}
    free = category_permutation_test(pd.DataFrame(same, names, names), fams, n_perm=2000)
    kept = category_permutation_test(pd.DataFrame(same, names, names), fams, n_perm=2000, strata=cats)
    assert free["p_value"] < 0.05 and kept["p_value"] > 0.5


def test_seed_stability_of_equal_and_of_independent_alphas():
    from site_lens.analysis.overlap import expected_jaccard, seed_stability

    a = torch.rand(30, 9, generator=torch.Generator().manual_seed(0))
    same = seed_stability([a, a.clone(), a * 2], k=27)  # a monotone change keeps the ranking
    assert same["spearman"] == pytest.approx(1.0) and same["jaccard"] == 1.0 and same["n_seeds"] == 3
    g = torch.Generator().manual_seed(1)
    indep = [seed_stability([torch.rand(30, 9, generator=g), torch.rand(30, 9, generator=g)], k=27) for _ in range(200)]
    assert abs(sum(r["spearman"] for r in indep) / 200) < 0.02
    assert sum(r["jaccard"] for r in indep) / 200 == pytest.approx(expected_jaccard(270, 27), abs=0.01)
    with pytest.raises(ValueError, match="two or more"):
        seed_stability([a], k=3)


def _families_matrix(category_effect: float, seed: int = 0):
    """20 tasks in two categories of five two-task families: family pairs share 0.6, category pairs
    ``0.1 + category_effect``, the rest 0.1, plus a little symmetric noise."""
    import numpy as np
    import pandas as pd

    names = [f"t{i}" for i in range(20)]
    cats = {n: "a" if i < 10 else "b" for i, n in enumerate(names)}
    fams = {n: f"f{i // 2}" for i, n in enumerate(names)}
    noise = np.random.default_rng(seed).normal(0, 0.02, (20, 20))
    m = np.array([[0.6 if fams[x] == fams[y] else 0.1 + (category_effect if cats[x] == cats[y] else 0.0)
                   for y in names] for x in names]) + (noise + noise.T) / 2  # fmt: skip
    return pd.DataFrame(m, names, names), cats, fams


def test_family_aware_test_does_not_call_a_family_effect_a_category_effect():
    from site_lens.analysis.overlap import category_permutation_test, format_p

    m, cats, fams = _families_matrix(category_effect=0.0)
    naive = category_permutation_test(m, cats, n_perm=2000)
    aware = category_permutation_test(m, cats, n_perm=2000, blocks=fams)
    assert naive["p_value"] < 0.01  # family pairs always sit within a category: a task-level shuffle is fooled
    assert aware["p_value"] > 0.05 and aware["p_excl"] > 0.05  # whole families shuffled: no category effect
    assert abs(aware["gap_excl"]) < 0.02 and aware["pairs_excl"] == 190 - 10
    assert aware["gap"] == naive["gap"] and (aware["p_floor"], aware["sided"]) == (1 / 2001, "greater")
    assert format_p(1 / 2001, 2000) == "<= 1/2,001" and format_p(0.01234, 2000) == "0.0123"


def test_family_aware_test_finds_a_real_category_effect_and_refuses_split_families():
    from site_lens.analysis.overlap import category_permutation_test

    m, cats, fams = _families_matrix(category_effect=0.1)
    aware = category_permutation_test(m, cats, n_perm=2000, blocks=fams)
    assert aware["p_value"] < 0.01 and aware["p_excl"] < 0.01
    assert aware["gap_excl"] == pytest.approx(0.1, abs=0.02)
    split = {**fams, "t0": "f1"}  # t0 (category a) joins t2, t3's family... still a; t10 joining makes one span
    category_permutation_test(m, cats, n_perm=10, blocks=split)
    with pytest.raises(ValueError, match="spans two groups"):
        category_permutation_test(m, cats, n_perm=10, blocks={**fams, "t10": "f0"})
