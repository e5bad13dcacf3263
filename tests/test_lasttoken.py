"""The packed last-token path equals the hooked model, and the trainer falls back where it cannot run."""

import contextlib

import pytest
import torch
from helpers import engines_here, needs_hooked, tiny_on

from site_lens.config import EngineConfig, SelectionConfig
from site_lens.engine import kernels
from site_lens.engine.backend import PackedBackend, backend_for, last_logits, logits_at, packed_blocker, use_backend
from site_lens.engine.hooked_pack import decode_from_hooked_cache, pack_hooked
from site_lens.engine.packed import LastToken
from site_lens.engine.packed_layer import unsupported
from site_lens.engine.prompt_cache import PromptCache
from site_lens.gate import injection_hooks
from site_lens.models.engines import is_bridge
from site_lens.stages.selection import AlphaTrainer
from site_lens.tokens import make_examples

WORDS = ["cat", "dog", "sun", "moon", "tree", "elephant", "ox", "rock"]


def _tiny(**overrides):
    from helpers import tiny

    torch.manual_seed(0)
    return tiny(**overrides)


def _packed(model):
    """The packed model of either model engine: ``LastToken`` over ``pack_hooked`` or ``pack_bridge``'s record."""
    return PackedBackend(model).runner


def _a_weight(model):
    """One of the model's MLP weight matrices, as a Parameter (written in place below)."""
    return next(p for name, p in model.named_parameters() if ".mlp." in name and p.dim() == 2)


def _randomise_biases(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.split(".")[-1].startswith(("b_", "_b_", "bias")):  # HookedTransformer's, transformers'
                p.normal_(std=0.5)


def _randomise_norms(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            # RMSNorm gains (ln1, ln2, ln1_post, ln2_post, q_norm, k_norm, ln_final; transformers' *norm.weight)
            if name.endswith(".w") or ("norm" in name and name.endswith(".weight")):
                p.uniform_(0.5, 1.5)


def _variant_model(variant, engine=None):
    """A tiny model of one VARIANTS shape (on ``engine``, else ``tiny()``'s), with its biases or norm gains made
    non-trivial where that matters."""
    torch.manual_seed(0)
    model = tiny_on(engine, **VARIANTS[variant]) if engine else _tiny(**VARIANTS[variant])
    if variant == "biases":
        _randomise_biases(model)
    if variant == "gemma3-like":
        _randomise_norms(model)
    return model


def _examples(model):
    return make_examples(model, [(f"Q: {w}\nA:", w[::-1]) for w in WORDS])


VARIANTS = {
    "gqa": {},
    "mha": dict(n_key_value_heads=None),
    "partial-rotary": dict(rotary_dim=4),
    "adjacent-rotary": dict(rotary_adjacent_pairs=True),
    "gelu": dict(act_fn="gelu_new"),
    "biases": dict(),
    # Gemma 3's additions: per-head Q/K norm, post-sublayer norms, local layers with a short window
    "gemma3-like": dict(
        use_normalization_before_and_after=True,
        use_qk_norm=True,
        use_local_attn=True,
        attn_types=["local", "global"],
        window_size=4,
        rotary_base_local=100.0,
        act_fn="gelu_pytorch_tanh",
    ),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_logits_equal_hooked_model_with_gate(variant):
    model = _variant_model(variant)
    assert packed_blocker(model) is None
    runner = _packed(model)
    c = model.cfg
    t = torch.randn(c.n_layers, c.n_heads, c.d_head)
    alpha = torch.rand(c.n_layers, c.n_heads)
    tokens = torch.tensor([[5, 9, 17, 3, 22, 40, 7], [8, 8, 1, 30, 2, 11, 19]])
    prefix = runner.prefix(tokens[:, :-1])
    got = runner.logits(tokens[:, -1], prefix, alpha, t)
    last = torch.full((2,), tokens.shape[1] - 1)
    want = last_logits(model, tokens, last, hooks=injection_hooks(model, t, alpha, last))
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    # and it is the gate that moves them: alpha = 0 gives the plain model
    plain = model(tokens)[:, -1]
    assert torch.allclose(runner.logits(tokens[:, -1], prefix, torch.zeros_like(alpha), t), plain, atol=1e-5)
    assert not torch.allclose(got, plain, atol=1e-3)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_span_logits_equal_hooked_model_with_gate_at_its_first_token(variant):
    """Several tokens after the prefix (the sequence objective): gate at the first, later ones causal, windows held."""
    model = _variant_model(variant)
    runner = _packed(model)
    c = model.cfg
    g = torch.Generator().manual_seed(3)
    t = torch.randn(c.n_layers, c.n_heads, c.d_head, generator=g)
    theta = torch.randn(2, c.n_layers, c.n_heads, generator=g).requires_grad_(True)  # one gate per row
    tokens = torch.tensor([[5, 9, 17, 3, 22, 40, 7, 12], [8, 8, 1, 30, 2, 11, 19, 4]])
    P = 3  # spans of five tokens: past gemma3-like's window of four
    got = runner.span_logits(tokens[:, P:], runner.prefix(tokens[:, :P]), torch.sigmoid(theta), t)
    (g_got,) = torch.autograd.grad(got.square().mean(), theta)
    last = torch.full((2,), P)
    positions = torch.arange(P, tokens.shape[1]).expand(2, -1)
    want = logits_at(model, tokens, positions, hooks=injection_hooks(model, t, torch.sigmoid(theta), last))
    (g_want,) = torch.autograd.grad(want.square().mean(), theta)
    assert got.shape == want.shape == (2, tokens.shape[1] - P, c.d_vocab)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    assert torch.allclose(g_got, g_want, atol=1e-5) and g_got.abs().sum() > 0
    one = runner.span_logits(tokens[:, P : P + 1], runner.prefix(tokens[:, :P]), torch.sigmoid(theta), t)[:, 0]
    assert torch.allclose(
        one, runner.logits(tokens[:, P], runner.prefix(tokens[:, :P]), torch.sigmoid(theta), t), atol=1e-5
    )


def test_span_logits_share_one_prefix_row_across_spans():
    """A prefix of one row serves every span (the shared few-shot prefix): the same as that prefix repeated."""
    model = _variant_model("gemma3-like")
    runner = _packed(model)
    c = model.cfg
    g = torch.Generator().manual_seed(4)
    t = torch.randn(c.n_layers, c.n_heads, c.d_head, generator=g)
    alpha = torch.rand(c.n_layers, c.n_heads, generator=g)
    prefix = torch.tensor([[5, 9, 17, 3]])
    spans = torch.tensor([[22, 40, 7], [11, 19, 4], [8, 1, 30]])
    got = runner.span_logits(spans, runner.prefix(prefix), alpha, t)
    want = runner.span_logits(spans, runner.prefix(prefix.expand(3, -1)), alpha, t)
    assert torch.allclose(got, want, atol=1e-6)
    with pytest.raises(ValueError, match="prefix has 2 rows for 3 spans"):
        runner.span_logits(spans, runner.prefix(prefix.expand(2, -1)), alpha, t)


@pytest.mark.parametrize("engine", engines_here())
def test_span_past_the_context(engine):
    """HookedTransformer's rotary tables end at n_ctx, so a packed span past it is refused; a bridge, like
    transformers, runs past max_position_embeddings, and the packed span equals its forward there."""
    torch.manual_seed(0)
    model = tiny_on(engine)
    runner = _packed(model)
    n_ctx = model.cfg.n_ctx
    tokens = torch.randint(0, model.cfg.d_vocab, (1, n_ctx + 2))
    span, prefix = tokens[:, n_ctx - 1 :], runner.prefix(tokens[:, : n_ctx - 1])
    if engine == "hooked":
        with pytest.raises(ValueError, match="context"):
            runner.span_logits(span, prefix, None, None)
        return
    got = runner.span_logits(span, prefix, None, None)[0]
    want = model(tokens)[0, n_ctx - 1 :]  # the logits after each span token, at positions n_ctx - 1 to n_ctx + 1
    assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


def test_probe_covers_spans(monkeypatch):
    """A packed span that disagrees with the hooked model sends the model to the hooked backend."""
    from site_lens.engine import packed

    model = _tiny()
    real = LastToken.span_logits
    monkeypatch.setattr(packed.LastToken, "span_logits", lambda self, *a, **k: real(self, *a, **k) * 1.01)
    b = backend_for(model)
    assert b.name != "packed" and "probe" in b.reason  # the reference backend


def test_packed_fast_loss_and_grad_equal_naive(model):
    t = torch.randn(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)
    ex = _examples(model)
    tr = AlphaTrainer(model, t)
    with torch.no_grad():
        tr.gate.theta.normal_()
    assert isinstance(tr.backend(), PackedBackend)
    cache = PromptCache(model, ex, batch_size=3)  # several chunks per length group
    idx = [5, 0, 6, 2, 1]  # mixed prefix lengths, out of order
    lf = tr.loss_fast(cache, idx)
    (gf,) = torch.autograd.grad(lf, tr.gate.theta)
    ln = tr.loss_naive([ex[i] for i in idx])
    (gn,) = torch.autograd.grad(ln, tr.gate.theta)
    assert abs(lf.item() - ln.item()) < 1e-5
    assert torch.allclose(gf, gn, atol=1e-5)
    assert gf.abs().sum() > 0


def test_fit_packed_equals_fit_hooked(model):
    t = torch.randn(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)
    ex = _examples(model)
    thetas = []
    for backend in ("packed", "hooked"):
        cfg = SelectionConfig(steps=12, eval_every=4)
        gate = AlphaTrainer(model, t, cfg, seed=1, engine=EngineConfig(backend=backend)).fit(ex[:6], ex[6:])
        thetas.append(gate.theta.detach().clone())
    assert torch.allclose(thetas[0], thetas[1], atol=1e-4)
    assert thetas[0].abs().sum() > 0


@pytest.mark.parametrize(
    "overrides, reason, bridge_reason",
    [
        # LayerNorm: HookedTransformer's tiny model (Llama-named) fails the structural check; the tiny bridge with
        # it is GPT-NeoX, off the bridge's packed list
        (dict(normalization_type="LN", final_rms=False), "normalization", "architecture GPTNeoXForCausalLM"),
        # learned positions: the tiny bridge with them is GPT-2, off the bridge's packed list
        (dict(positional_embedding_type="standard", rotary_dim=None), "rotary", "architecture GPT2LMHeadModel"),
        # a plain MLP: the tiny bridge with it is Arcee, off the bridge's packed list
        (dict(gated_mlp=False), "gated", "architecture ArceeForCausalLM"),
        (dict(output_logits_soft_cap=30.0, use_qk_norm=True), "soft cap", "soft cap"),  # Gemma-like: both engines
    ],
)
def test_unsupported_configs_are_named_and_fall_back(overrides, reason, bridge_reason):
    """Either engine: the packed backend is refused naming why, and the trainer runs on the reference backend,
    its cached loss equal to the whole-prompt one. (On a bridge the reason is the bridge's own: the soft cap, or the
    architecture a shape's tiny bridge is, which the packed path does not cover.)"""
    model = _tiny(**overrides)
    if is_bridge(model):
        reason = bridge_reason
    why = packed_blocker(model)
    assert why is not None and reason in why, why
    if not is_bridge(model):  # HookedTransformer's structural check and packer name it too
        assert reason in unsupported(model)
        with pytest.raises(ValueError, match=reason):
            pack_hooked(model)
    t = torch.randn(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)
    tr = AlphaTrainer(model, t)
    assert tr.backend().name != "packed" and reason in tr.backend().reason  # the reference backend
    with pytest.raises(ValueError, match=reason):
        backend_for(model, "packed")
    ex = _examples(model)
    lf = tr.loss_fast(PromptCache(model, ex), range(len(ex)))
    assert abs(lf.item() - tr.loss_naive(ex).item()) < 1e-5


@needs_hooked("the allow-list is HookedTransformer's (the bridge's packed list has Qwen2)")
def test_architecture_off_the_allow_list_uses_the_hooked_backend():
    """A config that passes every structural check but is not an architecture the tests cover (e.g. Qwen2)."""
    model = _tiny(original_architecture="Qwen2ForCausalLM")
    assert unsupported(model) is None
    b = backend_for(model)
    assert b.name == "hooked" and "Qwen2ForCausalLM" in b.reason


def test_probe_mismatch_falls_back_to_hooked(monkeypatch, caplog):
    """When packed weights disagree with the hooked model on the probe prompt, the hooked backend is used (logged)."""
    from site_lens.engine import packed

    model = _tiny()
    real = LastToken.logits
    monkeypatch.setattr(packed.LastToken, "logits", lambda self, *a, **k: real(self, *a, **k) * 1.01)
    with caplog.at_level("WARNING", logger="site_lens.engine.backend"):
        b = backend_for(model)
    assert b.name != "packed" and "probe" in b.reason  # the reference backend
    assert "probe" in caplog.text


def test_backend_is_chosen_once_and_recorded(model):
    b = backend_for(model)
    assert b.name == "packed" and "probe" in b.reason
    assert backend_for(model) is b  # chosen once per model
    use_backend(model, "hooked")
    try:
        assert backend_for(model).name != "packed"
    finally:
        use_backend(model, "auto")
    assert backend_for(model) is b


def test_hooks_left_on_the_model_select_the_hooked_backend(model):
    model.blocks[0].attn.hook_z.add_hook(lambda act, hook: act * 2)
    try:
        b = backend_for(model)
        assert b.name != "packed" and "hooks" in b.reason
    finally:
        model.reset_hooks()
    assert backend_for(model).name == "packed"


def test_one_prefix_many_gates_equals_row_by_row(model):
    runner = _packed(model)
    c = model.cfg
    t = torch.randn(c.n_layers, c.n_heads, c.d_head)
    tokens = torch.tensor([5, 9, 17, 3, 22, 40, 7])
    prefix = runner.prefix(tokens[None, :-1])  # one row
    alphas = torch.rand(4, c.n_layers, c.n_heads)
    got = runner.logits(tokens[-1:].expand(4), prefix, alphas, t)
    for r in range(4):
        want = runner.logits(tokens[-1:], prefix, alphas[r], t)
        assert torch.allclose(got[r], want[0], atol=1e-5)
    assert not torch.allclose(got[0], got[1], atol=1e-3)
    with pytest.raises(ValueError, match="rows"):
        runner.logits(tokens[-1:].expand(3), prefix, alphas, t)


DECODE_VARIANTS = ["gqa", "mha", "partial-rotary", "adjacent-rotary", "biases", "gemma3-like"]


@pytest.mark.parametrize("variant", DECODE_VARIANTS)
def test_packed_decode_logits_equal_the_models_forward(variant):
    """Packed decode steps from a prefix give the model's own logits for the grown sequence (either engine)."""
    model = _variant_model(variant)
    runner = _packed(model)
    tokens = torch.tensor([[5, 9, 17, 3, 22], [8, 8, 1, 30, 2], [3, 4, 5, 6, 7]])
    state = runner.start_decode(runner.prefix(tokens), 4)
    with torch.no_grad():
        for step in range(4):  # past gemma3-like's window of four
            nxt = torch.tensor([(13 * step + 7 * j) % 50 + 1 for j in range(len(tokens))])
            got = runner.decode(nxt, state)
            tokens = torch.cat([tokens, nxt[:, None]], 1)
            want = model(tokens)[:, -1]
            assert torch.allclose(got, want, atol=1e-5), (step, (got - want).abs().max())
        with pytest.raises(ValueError, match="full"):
            runner.decode(nxt, state)


@pytest.mark.parametrize("engine", engines_here())
@pytest.mark.parametrize("variant", DECODE_VARIANTS)
def test_decode_after_a_padded_prefill_equals_the_engines_own(variant, engine):
    """Generation's prefill of right-padded rows, then decode steps: HookedTransformer's packed decode taking
    over TransformerLens's KV cache equals that cache's own steps; a bridge's decoder on its transformers cache
    equals each row's unpadded forward."""
    from site_lens.tokens import pad_right

    model = _variant_model(variant, engine)
    prompts = [[5, 9, 17], [8, 8, 1, 30, 2, 11, 19], [3, 4, 5, 6, 7]]  # right-padded to 7
    tokens, mask, last = pad_right(prompts, 0)
    if engine == "bridge":
        from site_lens.engine.bridge_backend import BridgeBackend

        rows = [list(p) for p in prompts]

        def unpadded():  # each row's own forward, its last logits
            return torch.stack([model(torch.tensor([r]))[0, -1] for r in rows])

        with torch.no_grad():
            got, decoder = BridgeBackend(model, cached=True).prefill(tokens, mask, last, [], 5)
            assert torch.allclose(got, unpadded(), atol=1e-5)
            for step in range(4):  # with window 4, the local layer's window starts to bite
                nxt = torch.tensor([(13 * step + 7 * j) % 50 + 1 for j in range(len(prompts))])
                for r, n in zip(rows, nxt.tolist()):
                    r.append(n)
                got, want = decoder.logits(nxt), unpadded()
                assert torch.allclose(got, want, atol=1e-5), (step, (got - want).abs().max())
        return
    from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache

    runner = _packed(model)
    cache = TransformerLensKeyValueCache.init_cache(model.cfg, "cpu", len(prompts))
    zero = torch.zeros(len(prompts), dtype=torch.long)
    with torch.no_grad():
        logits = last_logits(model, tokens, last, attention_mask=mask, past_kv_cache=cache)
        state = decode_from_hooked_cache(runner, cache, mask, 4)
        ones = torch.ones((len(prompts), 1), dtype=torch.long)
        for step in range(4):  # with window 4, the local layer's window starts to bite
            nxt = torch.tensor([(13 * step + 7 * j) % 50 + 1 for j in range(len(prompts))])
            got = runner.decode(nxt, state)
            logits = last_logits(model, nxt[:, None], zero, attention_mask=ones, past_kv_cache=cache)
            assert torch.allclose(got, logits, atol=1e-5), (step, (got - logits).abs().max())
        with pytest.raises(ValueError, match="full"):
            runner.decode(nxt, state)


@pytest.mark.parametrize("engine", engines_here())
def test_batched_generation_equals_each_prompt_alone_under_a_sliding_window(engine):
    """Right-padded rows of several lengths, a window of four: HookedTransformer masks its window by cache slot,
    pads included, so such rows are generated apart; a bridge's masks follow positions. Either way each prompt's
    tokens are the ones it gets alone, injected or not."""
    from site_lens.engine.backend import padded_window
    from site_lens.stages.generation import generate_greedy

    model = _variant_model("gemma3-like", engine)
    assert padded_window(model) == (4 if engine == "hooked" else None)
    c = model.cfg
    t = torch.randn(c.n_layers, c.n_heads, c.d_head, generator=torch.Generator().manual_seed(3))
    alpha = torch.rand(c.n_layers, c.n_heads, generator=torch.Generator().manual_seed(4))
    prompts = [[5, 9, 17, 3], [8, 8, 1, 30, 2, 11, 19], [3, 4, 5, 6], [12, 13, 14, 15, 16, 17, 18, 19, 20]]
    for hooks in (None, lambda last: injection_hooks(model, t, alpha, last)):
        for backend in ("auto", "hooked"):
            kw = dict(max_new_tokens=6, stop_ids=set(), prefill_hooks=hooks, backend=backend)
            batched, _ = generate_greedy(model, prompts, **kw)
            assert batched == [generate_greedy(model, [p], **kw)[0][0] for p in prompts], (hooks, backend)


def test_generation_packed_equals_hooked_and_uncached(model):
    from site_lens.stages.generation import generate_greedy

    c = model.cfg
    t = torch.randn(c.n_layers, c.n_heads, c.d_head) * 2
    alpha = torch.rand(c.n_layers, c.n_heads)
    prompts = [[5, 9, 17], [8, 8, 1, 30, 2, 11, 19], [3, 4, 5, 6, 7], [40]]

    def hooks(last):
        return injection_hooks(model, t, alpha, last)

    runs = {
        "packed": generate_greedy(model, prompts, max_new_tokens=12, prefill_hooks=hooks, stop_ids=set()),
        "hooked": generate_greedy(
            model, prompts, max_new_tokens=12, prefill_hooks=hooks, stop_ids=set(), backend="hooked"
        ),
        "uncached": generate_greedy(
            model, prompts, max_new_tokens=12, prefill_hooks=hooks, stop_ids=set(), use_cache=False
        ),
    }
    assert runs["packed"][0] == runs["hooked"][0] == runs["uncached"][0]
    assert len(set(map(tuple, runs["packed"][0]))) > 1  # rows differ: the test can tell them apart
    assert all(len(g) == 12 for g in runs["packed"][0])


def test_runner_is_kept_and_rebuilt_when_weights_change(model):
    def runner():
        return backend_for(model).runner

    r1 = runner()
    assert runner() is r1
    assert not hasattr(model, "_site_lens_lasttoken")  # nothing stashed on the model
    w = _a_weight(model)
    with torch.no_grad():
        w.mul_(1.0)  # an in-place write, even of the same values, bumps the version
    r2 = runner()
    assert r2 is not r1
    assert runner() is r2
    w.data = w.data.clone()  # replaced storage (as .to() does), same Parameter object
    assert runner() is not r2


def test_runner_built_under_inference_mode_still_trains(model):
    from site_lens.stages.generation import generate_greedy

    with torch.no_grad():
        _a_weight(model).mul_(1.0)  # weights changed: the next call rebuilds the runner
    generate_greedy(model, [[5, 9, 17]], max_new_tokens=3, stop_ids=set())  # builds the kept runner
    t = torch.randn(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)
    trainer = AlphaTrainer(model, t, SelectionConfig(steps=2, eval_every=0))
    gate = trainer.fit(_examples(model))
    assert trainer.backend_used.name == "packed"
    # the same two steps on the hooked reference give the same theta, and the steps moved it
    ref = AlphaTrainer(model, t, SelectionConfig(steps=2, eval_every=0), engine=EngineConfig(backend="hooked"))
    want = ref.fit(_examples(model)).theta.detach()
    assert ref.backend_used.name != "packed"
    torch.testing.assert_close(gate.theta.detach(), want, rtol=0, atol=5e-5)
    assert trainer.history.loss == pytest.approx(ref.history.loss, abs=1e-5)
    assert want.abs().min() > 1e-2  # every head moved from theta = 0


@pytest.mark.parametrize("use_kernels", [True, False])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_one_row_logits_and_gate_gradient_equal_hooked_model(variant, use_kernels):
    """Batch 1, as SITE trains: the C++ row kernels (where built) or torch's, fused attention, folded norm weights."""
    with contextlib.nullcontext() if use_kernels else kernels.disabled():
        _one_row_equals_hooked(variant)


def _one_row_equals_hooked(variant):
    model = _variant_model(variant)
    runner = _packed(model)
    c = model.cfg
    t = torch.randn(c.n_layers, c.n_heads, c.d_head)
    tokens = torch.tensor([[5, 9, 17, 3, 22, 40, 7]])  # past the gemma3-like window of 4
    target = torch.tensor([11])
    prefix = runner.prefix(tokens[:, :-1])
    theta = torch.randn(c.n_layers, c.n_heads, requires_grad=True)
    got = runner.logits(tokens[:, -1], prefix, theta.sigmoid(), t)
    (g_got,) = torch.autograd.grad(torch.nn.functional.cross_entropy(got, target), theta)
    last = torch.tensor([tokens.shape[1] - 1])
    want = last_logits(model, tokens, last, hooks=injection_hooks(model, t, theta.sigmoid(), last))
    (g_want,) = torch.autograd.grad(torch.nn.functional.cross_entropy(want, target), theta)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    assert torch.allclose(g_got, g_want, atol=1e-5), (g_got - g_want).abs().max()
    assert g_got.abs().sum() > 0


def test_packed_generation_drops_finished_rows_without_changing_any_row(model, monkeypatch):
    """Rows stopping at different steps: the packed decoder compacts its batch; every row's tokens stay the same.
    (A bridge decodes on its own cache on both backends: there the stopping alone is checked.)"""
    from site_lens.stages.generation import generate_greedy

    prompts = [[5, 9, 17], [8, 8, 1, 30, 2, 11, 19], [3, 4, 5, 6, 7], [40], [12, 13], [22, 23, 24, 25]]
    free, _ = generate_greedy(model, prompts, max_new_tokens=10, stop_ids=set(), backend="hooked")
    stop = {free[0][1], free[1][3]}  # row 0 ends by step 2, row 1 by step 4; others when they meet these
    want = [g[: next((k + 1 for k, tok in enumerate(g) if tok in stop), len(g))] for g in free]
    assert len({len(g) for g in want}) > 1 and max(len(g) for g in want) == 10  # rows finish at different steps
    from site_lens.engine.prefix import DecodeCache

    calls = []
    select = DecodeCache.select
    monkeypatch.setattr(DecodeCache, "select", lambda self, rows: calls.append(len(rows)) or select(self, rows))
    for backend in ("packed", "hooked"):
        got, _ = generate_greedy(model, prompts, max_new_tokens=10, stop_ids=stop, backend=backend)
        assert got == want, backend
    if not is_bridge(model):  # a bridge decodes against its own cache (BridgeBackend), not the packed decoder
        assert calls and min(calls) < len(prompts)  # the packed decoder did drop rows


def test_float64_model_with_float32_gate(model):
    """theta (and so alpha) stays float32; a float64 model still gates like the hooked model."""
    from helpers import tiny

    torch.manual_seed(0)
    m64 = tiny(dtype=torch.float64)
    runner = _packed(m64)
    c = m64.cfg
    t = torch.randn(c.n_layers, c.n_heads, c.d_head)
    alpha = torch.rand(c.n_layers, c.n_heads)  # float32
    tokens = torch.tensor([[5, 9, 17, 3, 22]])
    got = runner.logits(tokens[:, -1], runner.prefix(tokens[:, :-1]), alpha, t)
    last = torch.tensor([4])
    want = last_logits(m64, tokens, last, hooks=injection_hooks(m64, t, alpha, last))
    assert got.dtype == torch.float64
    assert torch.allclose(got, want.to(got.dtype), atol=1e-6)


def test_runner_packed_while_weights_require_grad_trains_and_leaves_them_alone():
    model = _tiny()
    model.requires_grad_(True)  # e.g. a model loaded straight from TransformerLens
    runner = _packed(model)
    assert all(not v.requires_grad for w in runner.layers for v in vars(w).values() if isinstance(v, torch.Tensor))
    c = model.cfg
    t = torch.randn(c.n_layers, c.n_heads, c.d_head)
    tokens = torch.tensor([[5, 9, 17, 3, 22]])
    prefix = runner.prefix(tokens[:, :-1])
    theta = torch.zeros(c.n_layers, c.n_heads, requires_grad=True)
    for _ in range(2):  # a second backward must not reach a graph freed by the first
        runner.logits(tokens[:, -1], prefix, theta.sigmoid(), t).logsumexp(-1).sum().backward()
    assert theta.grad is not None and theta.grad.abs().sum() > 0


@needs_hooked("its rotary tables")
def test_packed_path_past_transformer_lens_initial_rotary_table(monkeypatch):
    # TransformerLens starts with 2,048 rotary rows and grows them on demand; the packed
    # copies must follow (a 10-shot squad_val prompt crashed at position 2,048)
    from transformer_lens.components.abstract_attention import AbstractAttention

    from site_lens.stages.generation import generate_greedy

    monkeypatch.setattr(AbstractAttention, "ROTARY_INITIAL_CACHE_SIZE", 8)
    model = _tiny()
    assert model.blocks[0].attn.rotary_cos.shape[0] == 8 < model.cfg.n_ctx
    prompts = [[(7 * i + j) % 50 + 1 for i in range(n)] for j, n in enumerate([6, 11, 19])]
    packed = generate_greedy(model, prompts, max_new_tokens=10, stop_ids=set())
    hooked = generate_greedy(model, prompts, max_new_tokens=10, stop_ids=set(), backend="hooked")
    uncached = generate_greedy(model, prompts, max_new_tokens=10, stop_ids=set(), use_cache=False)
    assert packed[0] == hooked[0] == uncached[0]
    assert torch.allclose(packed[1], uncached[1], atol=1e-5)
    # the one-row training path (rotation at the last position) past the initial table too
    runner = backend_for(model).runner
    tokens = torch.tensor([prompts[2]])
    gate = torch.rand(model.cfg.n_layers, model.cfg.n_heads)
    t = torch.randn(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)
    want = last_logits(model, tokens, torch.tensor([tokens.shape[1] - 1]), hooks=injection_hooks(model, t, gate, -1))
    got = runner.logits(tokens[:, -1], runner.prefix(tokens[:, :-1]), gate, t)
    assert torch.allclose(got, want, atol=1e-5)


def test_forcing_the_packed_backend(model):
    """Asked for, packed runs where it can; never while hooks are attached (they would be skipped); else a one-line error."""
    from site_lens.config import ConfigError

    assert backend_for(model, "packed").name == "packed"
    model.blocks[0].hook_resid_pre.add_hook(lambda act, hook: act + 1)
    try:
        assert backend_for(model, "packed").name != "packed"
    finally:
        model.reset_hooks()
    with pytest.raises(ConfigError, match="normalization|architecture"):  # a bridge's LayerNorm model is GPT-NeoX
        backend_for(_tiny(normalization_type="LN", final_rms=False), "packed")


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_prompts_of_many_lengths_in_one_forward_equal_one_forward_per_length(variant):
    """A ragged PromptCache (prefixes right-padded into one batch, each row's token at its own position)
    gives each prompt the logits and gate gradient of the per-length forwards, one gate and t per row;
    prompts past the gemma3-like window of 4 check the window is measured from each row's own end."""
    model = _variant_model(variant)
    c = model.cfg
    g = torch.Generator().manual_seed(5)
    words = ["ab", "abcdefgh", "abc", "abcdefghijk", "a", "abcde"]
    examples = make_examples(model, [(f"Q: {w}\nA:", w[::-1]) for w in words])
    assert len({len(e.tokens) for e in examples}) == len(words)
    t = torch.randn(len(words), c.n_layers, c.n_heads, c.d_head, generator=g)
    theta = torch.randn(len(words), c.n_layers, c.n_heads, generator=g).requires_grad_()
    backend = backend_for(model)
    assert backend.name == "packed"
    got = {}
    for ragged in (False, True):
        cache = PromptCache(model, examples, backend=backend, ragged=ragged)
        parts = cache.logits(list(range(len(words))), torch.sigmoid(theta), t)
        assert cache.ragged == ragged and len(parts) == (1 if ragged else len(words))
        logits = torch.zeros(len(words), c.d_vocab_out)
        for idx, lg in parts:
            logits = logits.index_copy(0, torch.tensor(idx), lg)
        (grad,) = torch.autograd.grad(logits.logsumexp(-1).sum(), theta)
        got[ragged] = (logits.detach(), grad)
    assert torch.allclose(got[True][0], got[False][0], atol=1e-5)
    assert torch.allclose(got[True][1], got[False][1], atol=1e-5)
