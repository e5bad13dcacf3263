import pandas as pd
import pytest
import torch

from site_lens.analysis.minimal import (
    HeadSet,
    add_recovery,
    heads_string,
    jaccard,
    mask_alpha,
    parse_heads,
    random_sets,
    ranking_sets,
    reference_sets,
    score_head_sets,
    seed_overlap,
    smallest_k,
    top_k_mask,
)
from site_lens.gate import injection_hooks
from site_lens.stages.generation import generate_greedy
from site_lens.tasks import Task
from site_lens.tokens import encode

WORDS = ["cat", "dog", "sun", "moon", "tree", "rock", "fish", "bird", "leaf", "rain"]


def _task():
    pairs = [(w, w[::-1]) for w in WORDS * 2]
    return Task("rev", pairs[:10], pairs[10:15], pairs[15:])


def _t(model):
    g = torch.Generator().manual_seed(1)
    return 3 * torch.randn(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head, generator=g)


def test_a_mask_of_every_head_is_alpha_one_everywhere(model):
    task, t = _task(), _t(model)
    shape = (model.cfg.n_layers, model.cfg.n_heads)
    every = ranking_sets(torch.rand(shape), [shape[0] * shape[1]], "dense_alpha")[0]
    assert torch.equal(every.alpha, torch.ones(shape))
    ones = HeadSet("ones", torch.ones(shape), every.k, mode="soft")
    df = score_head_sets(model, task, t, [every, ones], "valid", max_new_tokens=4)
    a, b = df.iloc[0], df.iloc[1]
    assert (a.exact_match, a.first_token_acc, a.prob) == (b.exact_match, b.first_token_acc, b.prob)


def test_scores_match_a_direct_generation(model):
    """Exact match, first-token accuracy and probability equal a direct generation's, on answers half of which it gets."""
    t = _t(model)
    shape = (model.cfg.n_layers, model.cfg.n_heads)
    alpha = torch.rand(shape, generator=torch.Generator().manual_seed(0))
    prompts = [f"Q: {w}\nA:" for w in WORDS]
    hooks = lambda last: injection_hooks(model, t, alpha, last)
    new, first = generate_greedy(model, encode(model, prompts), max_new_tokens=6, prefill_hooks=hooks)
    own = [model.tokenizer.decode(n).strip()[:2] for n in new]
    answers = [(o if i % 2 == 0 and o else "qq") for i, o in enumerate(own)]  # the model's own start, or not
    task = Task("own", [("x", "y")] * 4, [("x", "y")], list(zip(WORDS, answers)))
    df = score_head_sets(model, task, t, [HeadSet("x", alpha, 8, mode="soft")], "test", max_new_tokens=6)
    from site_lens.metrics import exact_match

    want = sum(exact_match(model.tokenizer.decode(n), a, bool(task.case_sensitive)) for n, a in zip(new, answers)) / len(WORDS)
    assert 0 < want < 1
    assert df.exact_match.iloc[0] == pytest.approx(want)
    targets = torch.tensor([encode(model, [p + (" " + a)])[0][len(encode(model, [p])[0])] for p, a in zip(prompts, answers)])
    assert df.first_token_acc.iloc[0] == pytest.approx(float((first.argmax(-1) == targets).float().mean()))
    assert df.n.iloc[0] == len(WORDS)


def test_zero_set_is_zero_shot_and_recovery_ends(model):
    task, t = _task(), _t(model)
    shape = (model.cfg.n_layers, model.cfg.n_heads)
    alpha = torch.rand(shape, generator=torch.Generator().manual_seed(0))
    sets = reference_sets(alpha) + [HeadSet("none", torch.zeros(shape), 0)]
    df = score_head_sets(model, task, t, sets, "valid", max_new_tokens=3)
    df["seed"] = 0
    df = add_recovery(df)
    zs, none = df[df.method == "zero_shot"].iloc[0], df[df.method == "none"].iloc[0]
    assert zs.prob == none.prob and zs.recovery_prob == 0
    assert df[df.method == "site"].recovery_prob.iloc[0] == pytest.approx(1.0)


def test_head_sets_and_strings():
    score = torch.tensor([[0.1, 0.9, 0.5], [0.8, 0.2, 0.9]])
    assert top_k_mask(score, 2).tolist() == [[False, True, False], [False, False, True]]  # ties by index
    sets = random_sets((2, 3), [1, 2], draws=2, seed=0)
    assert [s.k for s in sets] == [1, 2, 1, 2] and all(int(s.alpha.sum()) == s.k for s in sets)
    assert [s.alpha.tolist() for s in random_sets((2, 3), [2], 2, 0)] == [
        s.alpha.tolist() for s in random_sets((2, 3), [2], 2, 0)
    ]
    m = mask_alpha(top_k_mask(score, 3))
    assert parse_heads(heads_string(m)) == {(0, 1), (1, 0), (1, 2)}
    assert parse_heads("") == set() and parse_heads(float("nan")) == set()
    assert jaccard({1, 2}, {2, 3}) == pytest.approx(1 / 3) and jaccard(set(), set()) == 1.0
    assert seed_overlap([{1, 2}, {1, 2}, {1}]) == pytest.approx((1 + 0.5 + 0.5) / 3)


def _frame(split, values):
    rows = [
        {
            "task": "x",
            "seed": 0,
            "split": split,
            "method": "zero_shot",
            "mode": "binary",
            "k": 0,
            "exact_match": 0.0,
            "prob": 0.0,
        },
        {
            "task": "x",
            "seed": 0,
            "split": split,
            "method": "site",
            "mode": "soft",
            "k": 9,
            "exact_match": 1.0,
            "prob": 1.0,
        },
    ]
    for k, v in values:
        rows.append(
            {
                "task": "x",
                "seed": 0,
                "split": split,
                "method": "top",
                "mode": "binary",
                "k": k,
                "exact_match": v,
                "prob": v,
            }
        )
    df = pd.DataFrame(rows)
    df["n"], df["weight"], df["threshold"], df["draw"] = 10, None, None, 0
    return add_recovery(df)


def test_smallest_k_chooses_on_valid_and_reports_test():
    valid = _frame("valid", [(2, 0.5), (4, 0.95), (8, 1.0)])
    test = _frame("test", [(2, 0.9), (4, 0.7), (8, 1.0)])  # test would pick 2; valid picks 4
    row = smallest_k(valid, test).iloc[0]
    assert row.k == 4 and row.test_value == pytest.approx(0.7) and row.valid_value == pytest.approx(0.95)
    assert row.test_em_low < 0.7 < row.test_em_high
    never = smallest_k(_frame("valid", [(2, 0.1)]), _frame("test", [(2, 0.1)])).iloc[0]
    assert never.k is None or pd.isna(never.k)


@pytest.mark.parametrize("gemma_like", [False, True])
def test_gates_over_shared_prefixes_match_generate_greedy(gemma_like):
    from helpers import tiny

    from site_lens.engine.backend import backend_for
    from site_lens.stages.generation import generate_under_gates

    torch.manual_seed(0)
    model = tiny(use_qk_norm=True, use_normalization_before_and_after=True) if gemma_like else tiny()
    assert backend_for(model).name == "packed"
    t = _t(model)
    prompts = encode(model, [f"Q: {w}\nA:" for w in WORDS] + ["Q: a\nA:", "xy"])
    shape = (model.cfg.n_layers, model.cfg.n_heads)
    alphas = [torch.zeros(shape), torch.rand(shape, generator=torch.Generator().manual_seed(3)), torch.ones(shape)]
    got = list(generate_under_gates(model, prompts, t, alphas, max_new_tokens=5, batch_size=4))
    cut = list(generate_under_gates(model, prompts, t, alphas, max_new_tokens=5, finished=lambda i, toks: len(toks) >= i % 4 + 1))
    for alpha, (new, first), (short, _) in zip(alphas, got, cut):
        want_new, want_first = generate_greedy(
            model, prompts, max_new_tokens=5, prefill_hooks=lambda last, a=alpha: injection_hooks(model, t, a, last)
        )
        assert new == want_new
        assert torch.allclose(first, want_first, atol=1e-4, rtol=1e-4)
        assert short == [w[: i % 4 + 1] for i, w in enumerate(want_new)]  # rows stopped early, the rest unchanged
