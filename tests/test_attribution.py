"""Attribution patching: the first-order estimate of each head's patching effect, against the measured effect."""

from __future__ import annotations

import functools

import pytest
import torch
from helpers import char_tokenizer, engines_here, needs_hooked, tiny

from site_lens.analysis.attribution import (
    answer_logit,
    answer_logprob,
    attribution_per_prompt,
    attribution_scores,
    exact_head_effects,
    zero_shot_examples,
)
from site_lens.engine.backend import use_backend
from site_lens.gate import z_names
from site_lens.models.bridge import bridge_from_hf
from site_lens.models.tiny import tiny_hf
from site_lens.stages.embeddings import build_task_embedding, last_token_z
from site_lens.tasks import load_task
from site_lens.tokens import make_examples

FEW_SHOT = ["Q: hot\nA: cold\nQ: up\nA:", "Q: big\nA: small\nQ: in\nA:", "Q: yes\nA: no\nQ: hi\nA:"]
PAIRS = [(f"Q: {w}\nA:", w[::-1]) for w in ("cat", "dog", "sun", "moon", "tree", "rock")]


@pytest.fixture(scope="module")
def tiny64():
    torch.manual_seed(0)
    return tiny(dtype=torch.float64)


@pytest.fixture(scope="module", params=["tiny", "bridge"])
def model64(request):
    """Two tiny float64 models: ``tiny()``'s (a HookedTransformer, on TransformerLens 4 its bridge counterpart)
    and a bridge around a transformers Llama."""
    if request.param == "tiny":
        torch.manual_seed(0)
        return tiny(dtype=torch.float64)
    return _bridge("llama")


def _bridge(arch: str, dtype: torch.dtype = torch.float64):
    tok = char_tokenizer()
    return bridge_from_hf(tiny_hf(arch, tok).to(dtype), tok, dtype=dtype)


def _toward(model, examples, t, eps: float) -> torch.Tensor:
    """Per prompt, z + eps (t - z): a patch eps as large as writing t itself."""
    z = last_token_z(model, [e.tokens for e in examples]).to(model.cfg.dtype)  # (prompt, layer, head, d_head)
    return z + eps * (t.to(z.dtype) - z)


def _central_difference(model, examples, t, h: float = 1e-4) -> torch.Tensor:
    """The measured effect's derivative along t - z, from patches of +-h of it."""
    up = exact_head_effects(model, examples, _toward(model, examples, t, h))
    down = exact_head_effects(model, examples, _toward(model, examples, t, -h))
    return (up - down) / (2 * h)


def test_the_error_falls_as_the_square_of_the_patch(model64):
    """|measured - estimated| shrinks about fourfold when the patch halves (a wrong slope would shrink it twofold)."""
    ex = make_examples(model64, PAIRS)
    t = build_task_embedding(model64, FEW_SHOT)
    err, size = {}, {}
    for eps in (0.1, 0.05):
        t_eps = _toward(model64, ex, t, eps)
        est, exact = attribution_scores(model64, ex, t_eps), exact_head_effects(model64, ex, t_eps)
        err[eps], size[eps] = float((exact - est).norm()), float(exact.norm())
    assert 3.5 < err[0.1] / err[0.05] < 4.5, err
    assert err[0.05] < 0.05 * size[0.05] and size[0.05] > 1e-4, (err, size)


def test_the_estimate_is_the_derivative_along_t_minus_z(tiny64):
    """Equal to a central finite difference of the measured effect."""
    ex = make_examples(tiny64, PAIRS)
    t = build_task_embedding(tiny64, FEW_SHOT)
    est = attribution_scores(tiny64, ex, t)
    fd = _central_difference(tiny64, ex, t)
    assert torch.allclose(est, fd, rtol=1e-5, atol=1e-8), (est - fd).abs().max()
    assert est.abs().max() > 1e-3


def test_the_estimate_is_t_minus_z_dot_the_gradient(tiny64):
    """One prompt, by hand: a zero delta added to every layer's z at the last token, back-propagated."""
    ex = make_examples(tiny64, PAIRS)
    t = build_task_embedding(tiny64, FEW_SHOT)
    tokens = torch.tensor([ex[0].tokens])
    deltas = {
        n: torch.zeros(tiny64.cfg.n_heads, tiny64.cfg.d_head, dtype=torch.float64, requires_grad=True)
        for n in z_names(tiny64)
    }
    zs = {}

    def add_delta(z, hook, name):  # name: the z hook's (a bridge's hook reports the point it aliases)
        zs[name] = z[0, -1].detach()
        return torch.cat([z[:, :-1], (z[:, -1] + deltas[name])[:, None]], dim=1)

    hooks = [(n, functools.partial(add_delta, name=n)) for n in z_names(tiny64)]
    logits = tiny64.run_with_hooks(tokens, fwd_hooks=hooks)[:, -1]
    answer_logprob(logits, torch.tensor([ex[0].target])).sum().backward()
    by_hand = torch.stack([((t[i] - zs[n]) * deltas[n].grad).sum(-1) for i, n in enumerate(z_names(tiny64))])
    got = attribution_per_prompt(tiny64, ex[:1], t)[0]
    assert torch.allclose(got, by_hand, rtol=1e-9, atol=1e-12), (got - by_hand).abs().max()


def _linear_in_z(kind: str):
    """One layer whose answer logit is linear in each head's last-token z: HookedTransformer's attention-only
    block without norms, or a bridge of a one-layer Llama whose MLP writes zero and whose final norm's scale is
    pinned to one (a permanent hook; a hooked model runs on the reference backend)."""
    if kind == "hooked":
        model = tiny(n_layers=1, attn_only=True, normalization_type=None, dtype=torch.float64)
        use_backend(model, "hooked")  # the packed path's checks expect a final norm
        return model
    tok = char_tokenizer()
    hf = tiny_hf("llama", tok, num_hidden_layers=1, initializer_range=0.8 / 32**0.5).to(torch.float64)
    with torch.no_grad():
        hf.model.layers[0].mlp.down_proj.weight.zero_()
    model = bridge_from_hf(hf, tok, dtype=torch.float64)
    ex = make_examples(model, PAIRS)
    t = build_task_embedding(model, FEW_SHOT)
    gap = attribution_scores(model, ex, t, metric=answer_logit) - exact_head_effects(model, ex, t, metric=answer_logit)
    assert gap.abs().max() > 1e-6  # the final RMSNorm alone makes the logit non-linear in z
    model.ln_final.hook_scale.add_hook(lambda scale, hook: torch.ones_like(scale), is_permanent=True)
    return model


@pytest.mark.filterwarnings("ignore:A forward hook edited hook_scale")  # TransformerLens 4 notes the pinned scale
@pytest.mark.parametrize("kind", engines_here())
def test_exact_where_the_metric_is_linear_in_z(kind):
    """The answer's logit linear in each head's last-token z: the estimate is the measured effect."""
    model = _linear_in_z(kind)
    ex = make_examples(model, PAIRS)
    t = build_task_embedding(model, FEW_SHOT)
    est = attribution_scores(model, ex, t, metric=answer_logit)
    exact = exact_head_effects(model, ex, t, metric=answer_logit)
    assert torch.allclose(est, exact, rtol=1e-9, atol=1e-12), (est - exact).abs().max()
    assert exact.abs().max() > 1e-3
    # the log-probability is not linear: there the estimate is only approximate
    gap = attribution_scores(model, ex, t) - exact_head_effects(model, ex, t)
    assert gap.abs().max() > 1e-6


def _engine(kind: str):
    if kind == "hooked":
        torch.manual_seed(0)
        return tiny()
    return _bridge("llama", torch.float32)


@pytest.mark.parametrize("kind", engines_here())
def test_one_forward_and_one_backward_per_batch(kind, monkeypatch):
    """The whole (layer, head) map costs one forward and one backward pass per batch; batching changes nothing."""
    model = _engine(kind)
    ex = make_examples(model, PAIRS)
    t = build_task_embedding(model, FEW_SHOT)
    calls = {"forward": 0, "backward": 0}
    grad, backward = torch.autograd.grad, torch.autograd.backward

    def counted(fn):
        def wrapper(*args, **kwargs):
            calls["backward"] += 1
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(torch.autograd, "grad", counted(grad))
    monkeypatch.setattr(torch.autograd, "backward", counted(backward))
    handle = model.register_forward_hook(lambda *_: calls.__setitem__("forward", calls["forward"] + 1))
    try:
        scores = {b: attribution_scores(model, ex, t, batch_size=b) for b in (4, 1)}
    finally:
        handle.remove()
    n_heads = model.cfg.n_layers * model.cfg.n_heads
    assert calls == {"forward": 2 + 6, "backward": 2 + 6} and n_heads > 2  # batches of 4 (2), then of 1 (6)
    assert torch.allclose(scores[4], scores[1], atol=1e-6), (scores[4] - scores[1]).abs().max()


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2"])
def test_the_bridge_estimate_is_the_derivative(arch):
    """On a TransformerBridge too, the estimate equals a central finite difference of the measured effect."""
    bridge = _bridge(arch)
    ex = zero_shot_examples(bridge, load_task("opposites"), max_items=4)
    t = build_task_embedding(bridge, FEW_SHOT)
    est = attribution_scores(bridge, ex, t)
    fd = _central_difference(bridge, ex, t)
    assert est.shape == (bridge.cfg.n_layers, bridge.cfg.n_heads) and est.abs().max() > 1e-4
    assert torch.allclose(est, fd, rtol=1e-4, atol=1e-8), (est - fd).abs().max()


@needs_hooked("the same weights on both engines")
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_both_engines_give_the_same_scores(arch):
    from site_lens.models.convert import hooked_from_hf

    hooked = hooked_from_hf(tiny_hf(arch, char_tokenizer()), char_tokenizer())
    bridge = _bridge(arch, torch.float32)
    t = build_task_embedding(hooked, FEW_SHOT)
    scores = [attribution_scores(m, PAIRS, t) for m in (hooked, bridge)]
    assert torch.allclose(scores[0], scores[1], atol=1e-5), (scores[0] - scores[1]).abs().max()
    assert scores[0].abs().max() > 1e-4


def test_bad_input_is_refused(model64):
    c = model64.cfg
    ex = make_examples(model64, PAIRS)
    with pytest.raises(ValueError, match="layer, head, d_head"):
        attribution_scores(model64, ex, torch.zeros(c.n_layers, c.n_heads + 1, c.d_head))
    with pytest.raises(ValueError, match="one per prompt"):
        exact_head_effects(model64, ex, torch.zeros(len(ex) + 1, c.n_layers, c.n_heads, c.d_head))
    with pytest.raises(ValueError, match="at least one prompt"):
        attribution_scores(model64, [], torch.zeros(c.n_layers, c.n_heads, c.d_head))
