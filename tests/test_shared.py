import pytest
import torch

from site_lens.config import SelectionConfig
from site_lens.stages.selection import AlphaTrainer
from site_lens.stages.shared import fit_shared
from site_lens.tasks import Task, zero_shot_prompts
from site_lens.tokens import make_examples

WORDS = ["cat", "dog", "sun", "moon", "tree", "rock", "fish", "bird", "leaf", "rain", "sea", "sky"]


def _task(name, fn):
    pairs = [(w, fn(w)) for w in WORDS * 2]
    return Task(name, pairs[:16], pairs[16:20], pairs[20:])


def _t(model, seed):
    g = torch.Generator().manual_seed(seed)
    return 3 * torch.randn(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head, generator=g)


def test_shared_over_one_task_is_site_exactly(model):
    task = _task("rev", lambda w: w[::-1])
    t = _t(model, 0)
    cfg = SelectionConfig(steps=20, eval_every=5)
    site = AlphaTrainer(model, t, cfg, seed=2)
    site.fit(make_examples(model, zero_shot_prompts(task.train)), make_examples(model, zero_shot_prompts(task.valid)))
    shared = fit_shared(model, {"rev": t}, {"rev": task}, cfg, seed=2)
    assert torch.equal(site.gate.theta.detach().cpu(), shared.theta)
    assert site.history.loss == shared.history.loss
    assert site.history.valid_loss == shared.history.valid_loss


def test_shared_over_two_tasks_averages_their_losses(model):
    a, b = _task("rev", lambda w: w[::-1]), _task("up", str.upper)
    ta, tb = _t(model, 0), _t(model, 1)
    cfg = SelectionConfig(steps=1, eval_every=0, lr=1e-9)
    shared = fit_shared(model, {"rev": ta, "up": tb}, {"rev": a, "up": b}, cfg, seed=0)
    one_a = fit_shared(model, {"rev": ta}, {"rev": a}, cfg, seed=0)
    one_b = fit_shared(model, {"up": tb}, {"up": b}, cfg, seed=0)
    assert shared.history.loss[0] == pytest.approx((one_a.history.loss[0] + one_b.history.loss[0]) / 2, rel=1e-6)
    assert shared.tasks == ["rev", "up"]


def test_shared_needs_a_t_per_task(model):
    with pytest.raises(ValueError, match="one t per task"):
        fit_shared(model, {}, {"rev": _task("rev", lambda w: w[::-1])})
