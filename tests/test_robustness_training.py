"""Robustness of training and stage 1 (issue 6).

A loss that turns non-finite mid-training stops training with a clear message
and keeps the last good theta; one seed gives bit-identical results end to end
on CPU and the seed is recorded; stage 1 keeps only the last position's hook_z.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch

import site_lens.stages.embeddings as emb
from site_lens.config import ConfigError, EmbeddingConfig, EngineConfig, EvalConfig, SelectionConfig, SiteConfig
from site_lens.experiments.run import evaluate, run_task
from site_lens.gate import z_names
from site_lens.methods import fit_site
from site_lens.stages.selection import AlphaTrainer
from site_lens.tasks import Task
from site_lens.tokens import make_examples

WORDS = ["cat", "dog", "sun", "moon", "tree", "rock", "fish", "bird", "leaf", "rain", "star", "wind", "lake", "hill"]


def _task() -> Task:
    pairs = [(w, w[::-1]) for w in WORDS]
    return Task(name="reverse", train=pairs[:8], valid=pairs[8:10], test=pairs[10:])


def _cfg(seed: int = 0, **selection) -> SiteConfig:
    return SiteConfig(
        seed=seed,
        embedding=EmbeddingConfig(n_prompts=4, n_shots=2, batch_size=3),
        selection=SelectionConfig(**{"steps": 12, "lr": 0.2, "eval_every": 4, **selection}),
        eval=EvalConfig(max_new_tokens=4, batch_size=2),
    )


class Poison:
    """A forward hook that turns the residual stream into NaN once ``on`` is set."""

    def __init__(self):
        self.on = False

    def __call__(self, act, hook):
        return act + float("nan") if self.on else act


def _fit_with_nan_after(model, k: int, fast: bool, valid: bool, keep_best: bool):
    t = torch.randn(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)
    ex = make_examples(model, [(f"Q: {w}\nA:", w[::-1]) for w in WORDS])
    cfg = SelectionConfig(steps=10, eval_every=2, keep_best=keep_best)
    tr = AlphaTrainer(model, t, cfg, seed=1, engine=EngineConfig(fast=fast))
    poison, thetas = Poison(), {0: tr.gate.theta.detach().clone()}
    poison.on = k == 0

    def progress(step, loss):
        thetas[step] = tr.gate.theta.detach().clone()
        poison.on = step >= k  # the forward passes of step k + 1 on give NaN

    with model.hooks(fwd_hooks=[("blocks.0.hook_resid_post", poison)]):
        gate = tr.fit(ex[:10], ex[10:] if valid else (), progress=progress)
    return tr, gate, thetas


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "naive"])
def test_nan_mid_training_stops_and_keeps_last_good_theta(model, fast, caplog):
    with caplog.at_level(logging.ERROR, logger="site_lens.stages.training"):
        tr, gate, thetas = _fit_with_nan_after(model, k=4, fast=fast, valid=False, keep_best=True)
    h = tr.history
    assert h.stopped_early == "non-finite loss (nan) at step 5; kept the theta of step 4"
    assert h.stopped_early in caplog.text
    assert h.step == [1, 2, 3, 4] and all(torch.isfinite(torch.tensor(h.loss)))
    assert torch.equal(gate.theta.detach(), thetas[4]) and not torch.equal(thetas[4], thetas[0])
    assert not model.hook_dict["blocks.0.hook_resid_post"].fwd_hooks  # no hook outlives the call


def test_nan_mid_training_with_validation_restores_best_finite_theta(model):
    tr, gate, thetas = _fit_with_nan_after(model, k=5, fast=True, valid=True, keep_best=True)
    h = tr.history
    assert "at step 6" in h.stopped_early and h.valid_step == [2, 4]  # validation after NaN never ran
    assert h.best_step in (2, 4) and torch.equal(gate.theta.detach(), thetas[h.best_step])
    tr, gate, thetas = _fit_with_nan_after(model, k=5, fast=True, valid=True, keep_best=False)
    assert torch.equal(gate.theta.detach(), thetas[5])


def test_nan_at_the_first_step_keeps_the_initial_theta(model):
    tr, gate, thetas = _fit_with_nan_after(model, k=0, fast=True, valid=True, keep_best=True)
    assert tr.history.stopped_early.endswith("at step 1; kept the theta of step 0")
    assert tr.history.step == [] and tr.history.best_step is None
    assert torch.equal(gate.theta.detach(), thetas[0])


def test_non_finite_training_settings_are_refused():
    for bad in (
        {"lr": float("inf")},
        {"lr": float("nan")},
        {"lr": 0.0},
        {"theta_init": float("nan")},
        {"theta_init": float("-inf")},
    ):
        with pytest.raises(ConfigError, match="finite|> 0") as e:
            SelectionConfig(**bad)
        assert "\n" not in str(e.value)


def test_stopped_training_is_recorded_in_the_adapter_and_results(model):
    poison = Poison()

    def progress(step, loss):
        poison.on = step >= 3

    with model.hooks(fwd_hooks=[("blocks.1.hook_resid_post", poison)]):
        adapter = fit_site(model, _task(), _cfg(eval_every=0), progress=progress).adapter
    assert "non-finite loss (nan) at step 4" in adapter.meta["history"]["stopped_early"]
    assert torch.isfinite(adapter.theta).all() and torch.isfinite(adapter.t).all()


# ---------------------------------------------------------------- seeds


def _strip_timings(obj):
    """Everything except wall-clock measurements."""
    if isinstance(obj, dict):
        return {k: _strip_timings(v) for k, v in obj.items() if "seconds" not in k and k != "ms_per_query"}
    if isinstance(obj, list):
        return [_strip_timings(v) for v in obj]
    return obj


def test_same_seed_gives_bit_identical_pipeline_on_cpu(model):
    """fit_site + evaluate, twice with one seed: identical t, theta, history, predictions and scores."""
    runs = []
    for _ in range(2):
        fit = fit_site(model, _task(), _cfg(seed=7))
        adapter, history = fit.adapter, fit.history
        scored = {m: evaluate(model, _task(), m, adapter, _cfg().eval, n_shots=2, seed=7) for m in ("site", "icl")}
        runs.append((adapter, history, scored))
    (a, ha, sa), (b, hb, sb) = runs
    assert torch.equal(a.t, b.t) and torch.equal(a.theta, b.theta)
    assert ha.loss == hb.loss and ha.valid_loss == hb.valid_loss and ha.best_step == hb.best_step
    assert _strip_timings(a.meta) == _strip_timings(b.meta)
    assert _strip_timings(sa) == _strip_timings(sb)
    assert len(ha.loss) == 12 and not torch.equal(a.theta, torch.zeros_like(a.theta))


def test_other_seed_is_recorded_and_changes_the_run(model, tmp_path):
    from site_lens.cli.commands import run_one

    results = {}
    for seed in (0, 1):
        res = run_one(model, _task(), _cfg(seed=seed), tmp_path / f"s{seed}")
        on_disk = json.loads((tmp_path / f"s{seed}" / "results.json").read_text())
        cfg = json.loads((tmp_path / f"s{seed}" / "adapter" / "cfg.json").read_text())
        assert res["config"]["seed"] == on_disk["config"]["seed"] == cfg["meta"]["seed"] == seed
        results[seed] = res
    assert results[0]["history"]["loss"] != results[1]["history"]["loss"]
    again, adapter = run_task(model, _task(), _cfg(seed=1))
    assert adapter.meta["seed"] == 1 and _strip_timings(again) == _strip_timings(results[1])


# ---------------------------------------------------------------- stage 1 memory


def test_stage1_keeps_only_the_last_position(model, monkeypatch):
    """The capture hook stores (batch, head, d_head) copies, whatever the prompt length; nothing else is hooked."""
    stored: list[tuple[str, torch.Tensor, torch.Tensor]] = []
    real = emb.capture_last_hook

    def spy(z, hook, store, last, key):
        real(z, hook, store, last, key)
        stored.append((key, z, store[key]))

    monkeypatch.setattr(emb, "capture_last_hook", spy)
    short, long = [[1, 2, 3]] * 3, [list(range(1, 61))] * 3
    for prompts in (short, long):
        stored.clear()
        out = emb.last_token_z(model, prompts, batch_size=2)
        assert out.shape == (3, model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)
        assert [n for n, _, _ in stored] == z_names(model) * 2  # two batches, z hooks only
        for _, z, kept in stored:
            assert z.shape[1] == len(prompts[0])  # the hook saw the full sequence ...
            assert kept.shape == (z.shape[0], model.cfg.n_heads, model.cfg.d_head)  # ... and kept one position
            assert kept.untyped_storage().nbytes() == kept.numel() * kept.element_size()  # a copy, not a view of z
            assert not kept.requires_grad
    assert not any(hp.fwd_hooks for hp in model.hook_dict.values())  # no hook outlives the call


def test_stage1_runs_no_full_cache_and_stops_before_unembed(model, monkeypatch):
    """No run_with_cache, and the forward stops at the last layer (no logits over the vocabulary)."""
    calls = []
    monkeypatch.setattr(type(model), "run_with_cache", lambda *a, **k: pytest.fail("full activation cache used"))
    real_forward = type(model).forward

    def forward(self, *a, **k):
        calls.append(k.get("stop_at_layer"))
        return real_forward(self, *a, **k)

    monkeypatch.setattr(type(model), "forward", forward)
    emb.build_task_embedding(model, [[1, 2, 3, 4], [5, 6]], batch_size=1)
    assert calls == [model.cfg.n_layers, model.cfg.n_layers]
