from functools import partial

import pytest
import torch
from helpers import engines_here, needs_hooked

from site_lens.engine.backend import last_logits
from site_lens.gate import gate_hook, injection_hooks, z_names
from site_lens.models.convert import fast_layout
from site_lens.models.tiny import tiny_model
from site_lens.stages.generation import generate_greedy
from site_lens.tokens import encode, pad_right


def _t(model):
    return torch.randn(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)


def test_alpha_zero_leaves_logits_identical(model):
    tokens = torch.tensor([encode(model, ["Q: cat\nA:"])[0]])
    alpha = torch.zeros(model.cfg.n_layers, model.cfg.n_heads)
    base = model(tokens)
    with model.hooks(fwd_hooks=injection_hooks(model, _t(model), alpha, -1)):
        patched = model(tokens)
    assert torch.equal(base, patched)


def _grab(seen: dict, name: str, z, hook):
    """Keep a copy of ``z`` under the z hook's own name (a bridge's hook reports the point hook_z aliases)."""
    seen[name] = z.detach().clone()


def test_alpha_one_replaces_z_at_last_token_only(model):
    tokens = torch.tensor([encode(model, ["Q: dog\nA:"])[0]])
    t = _t(model)
    alpha = torch.ones(model.cfg.n_layers, model.cfg.n_heads)
    _, clean = model.run_with_cache(tokens, names_filter=z_names(model))
    seen = {}

    hooks = injection_hooks(model, t, alpha, -1) + [(n, partial(_grab, seen, n)) for n in z_names(model)]
    with model.hooks(fwd_hooks=hooks):
        model(tokens)
    for layer, name in enumerate(z_names(model)):
        assert torch.equal(seen[name][0, -1], t[layer])
    # layer 0 sees clean inputs everywhere, so its earlier positions are untouched
    assert torch.equal(seen[z_names(model)[0]][0, :-1], clean[z_names(model)[0]][0, :-1])
    # and injection at the last token cannot change earlier positions in any layer (causal)
    for name in z_names(model):
        assert torch.allclose(seen[name][0, :-1], clean[name][0, :-1], atol=1e-6)


def test_padded_batch_changes_only_each_rows_last_token(model):
    seqs = encode(model, ["Q: a\nA:", "Q: longer one\nA:"])
    tokens, _, last = pad_right(seqs, 0)
    t = _t(model)
    alpha = torch.full((model.cfg.n_layers, model.cfg.n_heads), 0.7)
    _, clean = model.run_with_cache(tokens, names_filter=z_names(model))
    seen = {}

    grabs = [(n, partial(_grab, seen, n)) for n in z_names(model)]
    with model.hooks(fwd_hooks=injection_hooks(model, t, alpha, last) + grabs):
        model(tokens)
    name = z_names(model)[0]
    diff = (seen[name] - clean[name]).abs().sum(dim=(-1, -2))  # (batch, pos)
    changed = diff > 0
    expected = torch.zeros_like(changed)
    expected[torch.arange(2), last] = True
    assert torch.equal(changed, expected)
    # each row's injected logits equal that row run alone
    lb = last_logits(model, tokens, last, hooks=injection_hooks(model, t, alpha, last))
    for i, s in enumerate(seqs):
        alone = last_logits(
            model, torch.tensor([s]), torch.tensor([len(s) - 1]), hooks=injection_hooks(model, t, alpha, -1)
        )
        assert torch.allclose(lb[i], alone[0], atol=1e-5)


def _central_differences(f, theta: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """d f / d theta, one entry at a time: (f(theta + eps e_i) - f(theta - eps e_i)) / (2 eps)."""
    out = torch.zeros_like(theta)
    with torch.no_grad():
        for i in range(theta.numel()):
            e = torch.zeros(theta.numel(), dtype=theta.dtype)
            e[i] = eps
            e = e.view_as(theta)
            out.view(-1)[i] = (f(theta + e) - f(theta - e)) / (2 * eps)
    return out


def test_gate_hook_gradient_in_theta_equals_finite_differences():
    """alpha = sigmoid(theta) through the gate, a non-linear loss after it: autograd equals central differences."""
    from transformer_lens.hook_points import HookPoint

    g = torch.Generator().manual_seed(0)
    z = torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64)
    t = torch.randn(4, 5, generator=g, dtype=torch.float64)
    w = torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64)
    pos = torch.tensor([2, 1])

    def loss(theta):
        return (gate_hook(z, HookPoint(), t, theta.sigmoid(), pos).tanh() * w).sum()

    theta = torch.randn(4, generator=g, dtype=torch.float64).requires_grad_(True)
    (grad,) = torch.autograd.grad(loss(theta), theta)
    # by hand: d/d alpha of z' at each row's position is (t - z), and d alpha / d theta = alpha (1 - alpha)
    alpha = theta.detach().sigmoid()
    rows = torch.arange(2)
    mixed = (1 - alpha[:, None]) * z[rows, pos] + alpha[:, None] * t  # (batch, head, d_head)
    by_hand = ((1 - mixed.tanh() ** 2) * w[rows, pos] * (t - z[rows, pos])).sum((0, 2)) * alpha * (1 - alpha)
    torch.testing.assert_close(grad, by_hand, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, _central_differences(loss, theta.detach()), rtol=1e-7, atol=1e-9)
    assert grad.abs().min() > 1e-3  # every head's gradient is far from zero, so the comparison means something


FLOATS = (torch.float32, torch.float64)


def _float32_and_float64_twins(engine: str) -> dict:
    """The same tiny random Llama weights in float32 and float64, on ``engine``."""
    from helpers import char_tokenizer, tiny

    from site_lens.models.bridge import bridge_from_hf
    from site_lens.models.tiny import tiny_hf

    if engine == "bridge":
        return {d: bridge_from_hf(tiny_hf("llama", char_tokenizer()).to(d), char_tokenizer()) for d in FLOATS}
    torch.manual_seed(0)
    models = {torch.float32: tiny(), torch.float64: tiny(dtype=torch.float64)}
    models[torch.float64].load_state_dict(models[torch.float32].state_dict())
    return models


@pytest.mark.parametrize("engine", engines_here())
def test_model_gradient_in_theta_equals_finite_differences(engine):
    """The loss SITE trains (cross-entropy of the last token's logits) through the packed and the reference
    backend: the autograd gradient of theta equals central differences of the float64 model, in float64 and,
    with the C++ kernels' hand-written backward where built, in float32."""
    from site_lens.engine.backend import backend_for

    models = _float32_and_float64_twins(engine)
    c = models[torch.float64].cfg
    tokens = torch.tensor([encode(models[torch.float64], ["Q: cat\nA:"])[0]])
    target = torch.tensor([11])
    g = torch.Generator().manual_seed(0)
    t = 2 * torch.randn(c.n_layers, c.n_heads, c.d_head, generator=g, dtype=torch.float64)
    theta = torch.randn(c.n_layers, c.n_heads, generator=g, dtype=torch.float64)

    def loss_fn(model, kind):
        be = backend_for(model, kind)
        assert be.name == ("packed" if kind == "packed" else engine)
        prefix = be.prefix(tokens[:, :-1])
        dtype = model.cfg.dtype
        return lambda th: torch.nn.functional.cross_entropy(
            be.logits(tokens[:, -1], prefix, th.sigmoid().to(dtype), t.to(dtype)).double(), target
        )

    # from the packed path: float64 throughout (the transformers model casts RMSNorm inputs to float32)
    want = _central_differences(loss_fn(models[torch.float64], "packed"), theta)
    assert want.abs().max() > 1e-2  # far above the tolerances below
    for dtype, tol in ((torch.float64, 1e-8), (torch.float32, 2e-6)):
        for kind in ("packed", "hooked"):
            th = theta.clone().requires_grad_(True)
            (grad,) = torch.autograd.grad(loss_fn(models[dtype], kind)(th), th)
            torch.testing.assert_close(grad, want, rtol=0, atol=tol, msg=f"{dtype} {kind}")


def test_cached_generation_equals_uncached_with_injection_at_same_position(model):
    prompts = encode(model, ["Q: sun\nA:", "Q: moonlight\nA:", "Q: x\nA:"])
    t = _t(model) * 3
    alpha = torch.rand(model.cfg.n_layers, model.cfg.n_heads)

    def hooks(last):
        return injection_hooks(model, t, alpha, last)

    cached, first_c = generate_greedy(model, prompts, max_new_tokens=8, prefill_hooks=hooks, stop_ids=set())
    uncached, first_u = generate_greedy(
        model, prompts, max_new_tokens=8, prefill_hooks=hooks, stop_ids=set(), use_cache=False
    )
    assert cached == uncached
    assert all(len(c) == 8 for c in cached)
    assert torch.allclose(first_c, first_u, atol=1e-5)
    # batching does not change results either
    single = [generate_greedy(model, [p], max_new_tokens=8, prefill_hooks=hooks, stop_ids=set())[0][0] for p in prompts]
    assert single == cached
    # and injection matters: without it the continuation differs for some prompt
    plain, _ = generate_greedy(model, prompts, max_new_tokens=8, stop_ids=set())
    assert plain != cached


def test_generation_stops_at_stop_ids(model):
    prompts = encode(model, ["Q: sun\nA:"])
    out, _ = generate_greedy(model, prompts, max_new_tokens=10, stop_ids=set())
    stop = {out[0][2]}
    out2, _ = generate_greedy(model, prompts, max_new_tokens=10, stop_ids=stop)
    assert out2[0] == out[0][: out[0].index(out[0][2]) + 1]


@needs_hooked("its weight layout")
def test_fast_layout_is_bit_identical():
    from helpers import char_tokenizer

    torch.manual_seed(1)
    a = tiny_model(tokenizer=char_tokenizer(), d_vocab=101)
    tokens = torch.tensor([encode(a, ["Q: layout\nA:"])[0]])
    before = a(tokens)
    # undo the layout: plain contiguous copies, as TransformerLens stores them
    for p in a.parameters():
        p.data = p.data.contiguous()
    plain = a(tokens)
    fast_layout(a)
    after = a(tokens)
    assert torch.equal(before, after) and torch.allclose(plain, after, atol=1e-6)


def test_fit_batches_respects_rows_and_attention_budget():
    from site_lens.tokens import fit_batches

    lengths = [5, 5, 5, 10, 10, 40]
    # 2 heads, budget 400 cells: three 5-token rows fit (3*2*25=150), a 10-token row joins (4*2*100=800 > 400: new batch)
    batches = fit_batches(range(6), lengths, max_rows=3, n_heads=2, cells=400)
    assert batches == [[0, 1, 2], [3, 4], [5]]  # 2*2*100=400 fits; 40 tokens alone exceed it and still run
    assert sum(batches, []) == list(range(6))
    for b in batches:
        assert len(b) <= 3
        n = max(lengths[i] for i in b)
        assert len(b) == 1 or len(b) * 2 * n * n <= 400
    # short prompts keep the full batch under the default budget
    assert fit_batches(range(64), [60] * 64, max_rows=64, n_heads=9) == [list(range(64))]


def test_by_length_groups_indices_in_order_of_first_appearance():
    from site_lens.tokens import by_length

    assert by_length([3, 5, 3, 7, 5, 3]) == {3: [0, 2, 5], 5: [1, 4], 7: [3]}
    assert list(by_length([9, 2, 9])) == [9, 2]  # the first length seen leads
    assert by_length([]) == {}


def test_uncached_decoder_stops_rows_at_stop_tokens_like_the_cached_loop(model):
    """The reference decoder runs in the one decode loop: a row stops at its stop token, the others go on."""
    prompts = [[1, 5, 7, 9], [3, 5, 2]]
    free, _ = generate_greedy(model, prompts, max_new_tokens=6, stop_ids=set(), use_cache=False)
    stop = {free[0][1]}  # row 0's second token
    for use_cache in (False, True):
        got, _ = generate_greedy(model, prompts, max_new_tokens=6, stop_ids=stop, use_cache=use_cache)
        for row, full in zip(got, free):
            cut = next((i + 1 for i, tok in enumerate(full) if tok in stop), len(full))
            assert row == full[:cut]


def test_attention_budget_does_not_change_generation(model, monkeypatch):
    from site_lens import tokens as inject

    prompts = encode(model, ["Q: sun\nA:", "Q: moonlight\nA:", "Q: x\nA:", "Q: a longer question here\nA:"])
    full, first_full = generate_greedy(model, prompts, max_new_tokens=6, stop_ids=set())
    monkeypatch.setattr(inject, "ATTN_CELLS", 1)  # every batch holds one prompt
    one, first_one = generate_greedy(model, prompts, max_new_tokens=6, stop_ids=set())
    assert one == full
    assert torch.allclose(first_one, first_full, atol=1e-5)


def test_generation_under_gates_is_the_same_on_either_backend(model):
    """generate_under_gates' hooked branch (one generate_greedy call per gate) gives the packed branch's tokens,
    first-step logits and early stops."""
    from site_lens.engine.backend import backend_for, use_backend
    from site_lens.stages.generation import generate_under_gates

    prompts = encode(model, ["Q: sun\nA:", "Q: moonlight\nA:", "Q: x\nA:", "Q: a longer one\nA:"])
    t = _t(model) * 3
    shape = (model.cfg.n_layers, model.cfg.n_heads)
    alphas = [torch.rand(shape) * (torch.rand(shape) > 0.5), torch.ones(shape)]  # a partial gate, half the heads off

    def settled(i, toks):
        return len(toks) >= i + 1

    runs = {}
    for kind in ("packed", "hooked"):
        use_backend(model, kind)
        try:
            assert backend_for(model).name == backend_for(model, kind).name  # hooked: the engine's reference
            runs[kind] = [
                list(generate_under_gates(model, prompts, t, alphas, max_new_tokens=6, finished=f))
                for f in (None, settled)
            ]
        finally:
            use_backend(model, "auto")
    (full, cut), (full_h, cut_h) = runs["packed"], runs["hooked"]
    for (gen, first), (gen_h, first_h), (short, _), (short_h, _) in zip(full, full_h, cut, cut_h):
        assert gen == gen_h and short == short_h
        assert torch.allclose(first, first_h, atol=1e-5)
        assert short == [g[: i + 1] for i, g in enumerate(gen)] != gen  # rows stopped early, the rest unchanged
    assert full[0][0] != full[1][0]  # the gates differ, so the comparison can tell them apart


def test_injection_record_says_where_in_each_forward():
    """One rule for every path: the last prompt token at ``at``; a forward from ``start`` finds it at at - start,
    and one that starts after it (a decode step) injects nothing."""
    from site_lens.gate import Injection

    model = tiny_model()
    c = model.cfg
    t, alpha = torch.randn(c.n_layers, c.n_heads, c.d_head), torch.rand(c.n_layers, c.n_heads)
    at = torch.tensor([4, 6])
    inj = Injection(t, alpha, at)
    assert torch.equal(inj.where(0), at) and torch.equal(inj.where(4), torch.tensor([0, 2]))
    assert inj.where(7) is None and inj.hooks(model, start=7) == []
    with pytest.raises(ValueError, match="before position 5 and some after"):
        inj.where(5)
    assert Injection(t, alpha, -1).where(9) == -1  # counted from the end of whatever runs
    back = torch.tensor([-1, -2])  # one per row, from the end: a whole sequence only
    assert torch.equal(Injection(t, alpha, back).where(0), back)
    with pytest.raises(ValueError, match="counted from the end cannot be placed in a forward from position 3"):
        Injection(t, alpha, back).where(3)
    z = torch.zeros(2, 5, c.n_heads, c.d_head)
    hook = dict(Injection(t, alpha, back).hooks(model))["blocks.0.attn.hook_z"]
    from transformer_lens.hook_points import HookPoint

    out = hook(z, HookPoint())
    assert out[0, 4].ne(0).any() and out[1, 3].ne(0).any() and out[0, :4].eq(0).all() and out[1, 4].eq(0).all()
    # the whole sequence from 0 and its last token after a cached prefix of 6 inject the same
    tokens = torch.randint(1, c.d_vocab, (1, 7))
    one = Injection(t, alpha, 6)
    with model.hooks(fwd_hooks=one.hooks(model)):
        whole = model(tokens)[0, -1]
    from site_lens.engine.backend import backend_for

    hooked = backend_for(model, "hooked")
    cached = hooked.logits(tokens[:, -1], hooked.prefix(tokens[:, :-1]), alpha, t)[0]
    assert torch.allclose(whole, cached, atol=1e-5)
    assert not torch.allclose(whole, model(tokens)[0, -1], atol=1e-3)  # and the injection changed the logits
