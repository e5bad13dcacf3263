import dataclasses
import json
import math
import shutil

import pytest
import torch

from site_lens.adapter import AdapterError, load_adapter, save_adapter
from site_lens.config import ConfigError, EngineConfig, SelectionConfig, SparsityConfig
from site_lens.gate import AlphaGate, GateSpec, HardConcreteGate
from site_lens.stages.selection import AlphaTrainer
from site_lens.stages.sparse import SparseTrainer, fit_sparse, hard_concrete_theta, sparse_path
from site_lens.tasks import Task
from site_lens.tokens import make_examples

WORDS = ["cat", "dog", "sun", "moon", "tree", "rock", "fish", "bird", "leaf", "rain"]


def _examples(model, words=WORDS):
    return make_examples(model, [(f"Q: {w}\nA:", w[::-1]) for w in words])


def _t(model, scale=3.0):
    g = torch.Generator().manual_seed(1)
    return scale * torch.randn(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head, generator=g)


def _task():
    pairs = [(w, w[::-1]) for w in WORDS * 3]
    return Task("rev", pairs[:20], pairs[20:25], pairs[25:])


@pytest.mark.parametrize("fast", [True, False])
def test_l1_at_weight_zero_is_site_exactly(model, fast):
    ex = _examples(model)
    cfg, engine = SelectionConfig(steps=25, eval_every=10), EngineConfig(fast=fast)
    site = AlphaTrainer(model, _t(model), cfg, seed=3, engine=engine)
    site.fit(ex[:7], ex[7:])
    sparse = SparseTrainer(model, _t(model), cfg, SparsityConfig("l1", 0.0), seed=3, engine=engine)
    sparse.fit(ex[:7], ex[7:])
    assert torch.equal(site.gate.theta, sparse.gate.theta)
    assert site.history.loss == sparse.history.loss
    assert site.history.valid_loss == sparse.history.valid_loss


@pytest.mark.parametrize("penalty", ["l0", "l1"])
def test_a_large_weight_closes_every_gate(model, penalty):
    tr = SparseTrainer(
        model, _t(model), SelectionConfig(steps=200, eval_every=0), SparsityConfig(penalty, 50.0), seed=0
    )
    gate = tr.fit(_examples(model)[:7])
    alpha = gate.alpha()
    if penalty == "l0":
        assert torch.equal(alpha, torch.zeros_like(alpha))  # exact zeros
    else:
        assert alpha.max() < 0.01
    assert not (alpha > 0.5).any()


def test_a_small_weight_keeps_the_heads_that_matter_open(model):
    """A tiny L0 price leaves open (alpha > 0.9) the heads training opens with no price; 0.3 a head closes some."""

    def alpha(weight: float):
        cfg, sparsity = SelectionConfig(steps=40, eval_every=0), SparsityConfig("l0", weight)
        return SparseTrainer(model, _t(model), cfg, sparsity, seed=0).fit(_examples(model)[:7]).alpha()

    free, small, priced = alpha(0.0), alpha(1e-4), alpha(0.3)
    assert (free > 0.9).any() and torch.equal(small > 0.9, free > 0.9)
    assert int((priced > 0).sum()) < int((free > 0).sum())


def test_hard_concrete_gate():
    g = HardConcreteGate(3, 4)
    assert torch.allclose(g.alpha(), torch.full((3, 4), 0.5))  # where SITE starts
    with torch.no_grad():
        g.theta.copy_(torch.linspace(-8, 8, 12).view(3, 4))
    a = g.alpha()
    assert a.min() == 0 and a.max() == 1 and ((a >= 0) & (a <= 1)).all()
    gen = torch.Generator().manual_seed(0)
    draws = torch.stack([g.train_alpha(gen) for _ in range(4000)])
    assert torch.equal(g.train_alpha(torch.Generator().manual_seed(5)), g.train_alpha(torch.Generator().manual_seed(5)))
    p_open = (draws > 0).float().mean(0)  # Monte Carlo P(gate != 0)
    expected = g.open_heads().detach()
    assert abs(float(p_open.sum()) - float(expected)) < 0.15
    assert g.spec() == GateSpec("hard_concrete", -0.1, 1.1)


def test_hard_concrete_theta_matches_a_dense_alpha():
    theta = torch.linspace(-5, 5, 20).view(4, 5)
    g = HardConcreteGate(4, 5)
    with torch.no_grad():
        g.theta.copy_(hard_concrete_theta(theta))
    assert torch.allclose(g.alpha(), torch.sigmoid(theta), atol=1e-6)


def test_gate_spec_kinds():
    theta = torch.tensor([[-3.0, 0.1, 4.0]])
    assert torch.equal(GateSpec().alpha(theta), torch.sigmoid(theta))
    hc = GateSpec("hard_concrete", -0.1, 1.1)
    assert hc.alpha(theta)[0, 0] == 0 and hc.alpha(theta)[0, 2] == 1
    assert GateSpec(threshold=0.5).alpha(theta).tolist() == [[0.0, 1.0, 1.0]]
    for spec in (GateSpec(), hc, GateSpec("hard_concrete", -0.2, 1.3, threshold=0.25)):
        assert GateSpec.from_dict(spec.to_dict()) == spec
    # the older form, kept in an adapter's meta: a mask wraps its gate
    old = {"kind": "mask", "threshold": 0.5, "of": {"kind": "hard_concrete", "low": -0.1, "high": 1.1}}
    assert GateSpec.from_dict(old) == GateSpec("hard_concrete", -0.1, 1.1, threshold=0.5)
    assert GateSpec.from_dict({"kind": "mask", "threshold": 0.5, "of": None}) == GateSpec(threshold=0.5)
    with pytest.raises(ValueError, match="mask of a mask"):
        GateSpec.from_dict({"kind": "mask", "threshold": 0.9, "of": {"kind": "mask", "threshold": 0.1, "of": None}})
    for bad in ({"kind": "nope"}, {"kind": "hard_concrete"}, {"kind": "sigmoid", "stretch": 2}):
        with pytest.raises(ValueError, match="is no gate"):
            GateSpec.from_dict(bad)


def test_sparse_adapters_round_trip_and_bad_gate_is_refused(model, tmp_path):
    fit = fit_sparse(model, _task(), SparsityConfig("l0", 0.01), t=_t(model), cfg=None)
    path = save_adapter(fit.adapter, tmp_path / "a")
    back = load_adapter(path)
    assert torch.equal(back.alpha, fit.alpha)
    thresholded = dataclasses.replace(fit.adapter.gate, threshold=fit.sparsity.threshold)
    masked = load_adapter(save_adapter(dataclasses.replace(fit.adapter, gate=thresholded), tmp_path / "m"))
    assert torch.equal(masked.alpha.bool(), fit.mask())
    saved = {"kind": "hard_concrete", "low": -0.1, "high": 1.1, "threshold": None}
    assert json.loads((path / "cfg.json").read_text())["gate"] == saved
    assert back.gate == fit.adapter.gate and "gate" not in back.meta
    # a folder written before the gate field: the gate in meta, a mask as {"kind": "mask", "of": ...}
    old = json.loads((tmp_path / "m" / "cfg.json").read_text())
    gate = old.pop("gate")
    old["meta"]["gate"] = {"kind": "mask", "threshold": gate.pop("threshold"), "of": gate}
    assert old["format"] == "site-lens-adapter/2"  # a gate other than sigmoid; such folders were /1
    plain = save_adapter(dataclasses.replace(fit.adapter, gate=GateSpec()), tmp_path / "plain")
    assert json.loads((plain / "cfg.json").read_text())["format"] == "site-lens-adapter/1"  # earlier readers' format
    with pytest.raises(AdapterError, match="'gate' entry"):
        dataclasses.replace(fit.adapter, meta={"gate": {"kind": "sigmoid"}})
    old["format"] = "site-lens-adapter/1"
    (tmp_path / "m" / "cfg.json").write_text(json.dumps(old))
    assert torch.equal(load_adapter(tmp_path / "m").alpha, masked.alpha)
    for bad in ({"kind": "hard_concrete"}, {"kind": "additive"}, {"kind": "sigmoid", "threshold": "x"}):
        cfg = json.loads((path / "cfg.json").read_text())
        cfg["gate"] = bad
        (tmp_path / "bad").mkdir(exist_ok=True)
        (tmp_path / "bad" / "cfg.json").write_text(json.dumps(cfg))
        shutil.copy(path / "adapter.safetensors", tmp_path / "bad")
        with pytest.raises(AdapterError, match="gate is not a gate this version reads") as e:
            load_adapter(tmp_path / "bad")
        assert len(str(e.value).splitlines()) == 1


def test_sparse_path_is_warm_started_and_checks_weights(model):
    from site_lens.config import EmbeddingConfig, SiteConfig
    from site_lens.methods.site import fit_site

    task = _task()
    cfg = SiteConfig(
        embedding=EmbeddingConfig(n_prompts=3, n_shots=2), selection=SelectionConfig(steps=10, eval_every=5)
    )
    dense = fit_site(model, task, cfg).adapter
    fits = sparse_path(model, task, [0.0, 0.5], dense, "l1", steps=5, cfg=cfg)
    assert [f.sparsity.weight for f in fits] == [0.0, 0.5]
    assert all(len(f.history.step) == 5 for f in fits)
    assert fits[1].alpha.sum() < fits[0].alpha.sum()
    with pytest.raises(ConfigError, match="increasing"):
        sparse_path(model, task, [0.5, 0.1], dense)
    # zero steps: each path starts exactly where dense SITE ended (in its gate's parameterisation)
    (l1,) = sparse_path(model, task, [0.0], dense, "l1", steps=0, cfg=cfg)
    (l0,) = sparse_path(model, task, [0.0], dense, "l0", steps=0, cfg=cfg)
    assert torch.equal(l1.adapter.theta, dense.theta)
    assert torch.equal(l0.adapter.theta, hard_concrete_theta(dense.theta))
    assert torch.allclose(l0.alpha, dense.alpha, atol=1e-6)


def test_sparsity_config_checks():
    with pytest.raises(ConfigError, match="penalty"):
        SparsityConfig("l2")
    with pytest.raises(ConfigError, match="weight"):
        SparsityConfig("l1", -1.0)
    with pytest.raises(ConfigError, match="weight"):
        SparsityConfig("l1", math.inf)
    with pytest.raises(ConfigError, match="threshold"):
        SparsityConfig("l0", 0.1, threshold=1.0)


def test_l0_needs_the_fast_path(model):
    with pytest.raises(ConfigError, match="fast path"):
        SparseTrainer(model, _t(model), SelectionConfig(), SparsityConfig("l0", 0.1), engine=EngineConfig(fast=False))


def test_gate_defaults_are_site():
    g = AlphaGate(2, 3)
    assert torch.equal(g.train_alpha(), g.alpha()) and g.spec() == GateSpec()
    assert torch.allclose(g.open_heads(), g.alpha().sum())


@pytest.mark.parametrize("penalty", ["l0", "l1"])
def test_site_config_sparsity_is_fit_site_sparse(model, penalty):
    """SiteConfig.sparsity set: fit_site trains sparse SITE, the same theta and gate as fit_sparse."""
    from site_lens.config import EmbeddingConfig, SiteConfig
    from site_lens.methods.site import fit_site

    task, sparsity = _task(), SparsityConfig(penalty, 0.05)
    cfg = SiteConfig(
        embedding=EmbeddingConfig(n_prompts=3, n_shots=2), selection=SelectionConfig(steps=12, eval_every=4)
    )
    want = fit_sparse(model, task, sparsity, cfg)
    got = fit_site(model, task, dataclasses.replace(cfg, sparsity=sparsity))
    dense = fit_site(model, task, cfg)
    assert torch.equal(got.adapter.theta, want.adapter.theta) and got.adapter.gate == want.adapter.gate
    assert torch.equal(got.adapter.alpha, want.alpha) and not torch.equal(got.adapter.theta, dense.adapter.theta)
    assert got.adapter.meta["sparsity"] == sparsity.to_dict() and "sparsity" not in dense.adapter.meta
    assert dense.adapter.gate == GateSpec()
    assert fit_sparse(model, task, cfg=dataclasses.replace(cfg, sparsity=sparsity)).sparsity == sparsity


def test_site_config_sparsity_round_trips_and_is_checked(model):
    from site_lens.config import SiteConfig
    from site_lens.experiments.row_spec import row_spec
    from site_lens.methods.site import fit_site_many

    sparse = SiteConfig(sparsity=SparsityConfig("l1", 0.1))
    assert SiteConfig.from_dict(sparse.to_dict()) == sparse
    assert "sparsity" not in SiteConfig().to_dict()  # a dense config saves as it did before the part existed
    assert SiteConfig.from_dict(SiteConfig().to_dict()).sparsity is None
    with pytest.raises(ConfigError, match="first answer token"):
        SiteConfig(selection=SelectionConfig(objective="sequence"), sparsity=SparsityConfig())
    with pytest.raises(ConfigError, match="fast path only"):
        SiteConfig(engine=EngineConfig(fast=False), sparsity=SparsityConfig("l0", 0.1))
    SiteConfig(engine=EngineConfig(fast=False), sparsity=SparsityConfig("l1", 0.1))  # l1 runs whole prompts too
    with pytest.raises(ConfigError, match="one task at a time"):
        fit_site_many(model, [_task()], sparse)
    # a sparse row is keyed apart from SITE's by what training reads (not the mask's threshold); other methods not
    assert row_spec("m", sparse, "site")["settings"] == {"sparsity": {"penalty": "l1", "weight": 0.1}}
    masked = SiteConfig(sparsity=SparsityConfig("l1", 0.1, threshold=0.2))
    assert row_spec("m", masked, "site") == row_spec("m", sparse, "site")
    assert row_spec("m", sparse, "fv") == row_spec("m", SiteConfig(), "fv")


def test_minimal_sets_and_sparse_path_start_from_dense_site(model):
    from site_lens.config import SiteConfig
    from site_lens.experiments.sweep import minimal_sets

    task = _task()
    with pytest.raises(ConfigError, match="cfg.sparsity must be None"):
        minimal_sets(model, task, cfg=SiteConfig(sparsity=SparsityConfig("l0", 0.1)))
    t = _t(model)
    hard = _adapter_of(model, t, GateSpec("hard_concrete", -0.1, 1.1))
    with pytest.raises(ConfigError, match="dense SITE adapter"):
        sparse_path(model, task, [0.1], hard)


def _adapter_of(model, t, gate):
    from site_lens.adapter import Adapter
    from site_lens.models import model_identity

    theta = torch.zeros(model.cfg.n_layers, model.cfg.n_heads)
    return Adapter(t=t, theta=theta, model=model_identity(model), gate=gate)
