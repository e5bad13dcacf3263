import math

import pytest
import torch

from site_lens.config import EngineConfig, SelectionConfig
from site_lens.engine.prompt_cache import PromptCache
from site_lens.stages.selection import AlphaTrainer
from site_lens.tokens import make_examples


def _examples(model, words):
    return make_examples(model, [(f"Q: {w}\nA:", w[::-1]) for w in words])


WORDS = ["cat", "dog", "sun", "moon", "tree", "rock", "fish", "bird", "leaf", "rain"]


def test_fast_loss_and_grad_equal_naive(model):
    t = torch.randn(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)
    ex = _examples(model, WORDS[:6] + ["elephant", "ox"])
    tr = AlphaTrainer(model, t, SelectionConfig(theta_init=0.3))
    with torch.no_grad():
        tr.gate.theta.normal_()
    cache = PromptCache(model, ex)
    idx = list(range(len(ex)))
    lf = tr.loss_fast(cache, idx)
    (gf,) = torch.autograd.grad(lf, tr.gate.theta)
    ln = tr.loss_naive(ex)
    (gn,) = torch.autograd.grad(ln, tr.gate.theta)
    assert abs(lf.item() - ln.item()) < 1e-5
    assert torch.allclose(gf, gn, atol=1e-5)


@pytest.mark.parametrize("fast", [True, False])
def test_fit_freezes_a_trainable_model_for_its_run(fast):
    """On a model whose weights require grad, fit trains theta only: no weight gets a gradient or changes,
    and every weight's requires_grad flag is as it was afterwards."""
    from helpers import tiny

    model = tiny()
    model.requires_grad_(True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    t = torch.randn(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head) * 3
    tr = AlphaTrainer(model, t, SelectionConfig(steps=5, eval_every=2), engine=EngineConfig(fast=fast))
    ex = _examples(model, WORDS)
    tr.fit(ex[:7], ex[7:])
    assert tr.gate.theta.grad is not None and not torch.equal(tr.gate.theta, torch.zeros_like(tr.gate.theta))
    assert all(p.grad is None for p in model.parameters())
    assert all(p.requires_grad for p in model.parameters())
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert [p for p in tr.gate.parameters()] == [tr.gate.theta]


def test_fit_lowers_training_loss(model):
    t = torch.randn(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head) * 3
    ex = make_examples(model, [(f"Q: {w}\nA:", "zebra") for w in WORDS])  # one answer: learnable by the gate
    tr = AlphaTrainer(model, t, SelectionConfig(steps=60, lr=0.2, eval_every=0))
    with torch.no_grad():
        start = float(tr.loss_naive(ex))
    tr.fit(ex)
    with torch.no_grad():
        end = float(tr.loss_naive(ex))
    assert end < start - 0.05


def test_keep_best_restores_lowest_valid_loss(model):
    t = torch.randn(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head) * 3
    ex = _examples(model, WORDS)
    tr = AlphaTrainer(model, t, SelectionConfig(steps=40, eval_every=10))
    gate = tr.fit(ex[:6], ex[6:])
    h = tr.history
    assert h.valid_step == [10, 20, 30, 40]
    assert h.best_valid_loss == min(h.valid_loss)
    with torch.no_grad():  # the gate kept is the best one, by the whole-prompt loss
        assert math.isclose(float(tr.loss_naive(ex[6:])), h.best_valid_loss, rel_tol=1e-5)
    assert gate is tr.gate


def test_same_seed_is_bit_identical_and_other_seed_differs(model):
    t = torch.randn(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)
    ex = _examples(model, WORDS)
    cfg = SelectionConfig(steps=15, eval_every=5)
    a = AlphaTrainer(model, t, cfg, seed=3).fit(ex[:7], ex[7:]).theta.detach()
    b = AlphaTrainer(model, t, cfg, seed=3).fit(ex[:7], ex[7:]).theta.detach()
    c = AlphaTrainer(model, t, cfg, seed=4).fit(ex[:7], ex[7:]).theta.detach()
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_non_finite_loss_stops_and_keeps_last_good_theta(model):
    t = torch.randn(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)
    t[0, 0, 0] = float("nan")  # poisons the loss from the first step
    tr = AlphaTrainer(model, t, SelectionConfig(steps=5, eval_every=0))
    gate = tr.fit(_examples(model, WORDS[:3]))
    assert tr.history.stopped_early and "non-finite" in tr.history.stopped_early
    assert torch.equal(gate.theta.detach(), torch.zeros_like(gate.theta))


def test_fit_rejects_empty_train(model):
    t = torch.zeros(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)
    with pytest.raises(ValueError, match="at least one"):
        AlphaTrainer(model, t).fit([])


def test_naive_fit_with_one_row_chunks_matches_whole_batches(model, monkeypatch):
    """Whole-prompt training accumulates gradients over memory-capped chunks: same theta, one row per pass."""
    from site_lens.stages import training as selection

    t = torch.randn(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)
    ex = _examples(model, WORDS[:6] + ["elephant", "ox"])
    cfg, naive = SelectionConfig(steps=4, batch_size=4, eval_every=0), EngineConfig(fast=False)
    whole = AlphaTrainer(model, t, cfg, engine=naive).fit(ex).theta.detach().clone()
    monkeypatch.setattr(selection, "GRAD_CELLS", 1)  # every chunk a single row
    rows = []
    real = selection.last_logits

    def counting(model, tokens, *args, **kwargs):
        rows.append(len(tokens))
        return real(model, tokens, *args, **kwargs)

    monkeypatch.setattr(selection, "last_logits", counting)
    chunked = AlphaTrainer(model, t, cfg, engine=naive).fit(ex).theta.detach()
    assert rows == [1] * (cfg.steps * cfg.batch_size)
    assert not torch.equal(whole, torch.zeros_like(whole))  # it trained
    torch.testing.assert_close(chunked, whole, atol=1e-5, rtol=1e-4)
