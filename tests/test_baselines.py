"""Each baseline: what its hooks touch, that fitting lowers its loss, its parameter count."""

import copy

import pytest
import torch
from small import SMALL_EMBEDDING, check_row, small_methods, write_task_dir

from site_lens.config import EvalConfig
from site_lens.engine.backend import last_logits, use_backend
from site_lens.methods import I2CL, IA3, METHODS, OPTION_METHODS, SEQUENCE_METHODS, LoRA, TaskContext, score_method
from site_lens.stages.objectives import train_valid_examples
from site_lens.stages.training import first_token_loss
from site_lens.tasks import load_task


@pytest.fixture(scope="module")
def model():
    from helpers import tiny

    torch.manual_seed(0)
    return tiny(n_ctx=256)


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return load_task("upper", data_dir=write_task_dir(tmp_path_factory.mktemp("tasks")))


@pytest.fixture(scope="module")
def fitted(model, task):
    """Every method fitted once on the tiny task."""
    ctx = TaskContext(task, 0, SMALL_EMBEDDING)
    out = {}
    for name, make in small_methods().items():
        m = make()
        m.fit(model, task, 0, ctx)
        out[name] = m
    return out


def _all_logits(model, tokens, method):
    """Logits at every position with the method's hooks (prefill ones at the last position)."""
    last = torch.full((tokens.shape[0],), tokens.shape[1] - 1)
    factory = method.prefill_hooks(model)
    hooks = method.persistent_hooks(model) + (factory(last) if factory else [])
    return model.run_with_hooks(tokens, fwd_hooks=hooks)


def test_registry_names():
    base = ["zero_shot", "icl", "site", "fv", "tv", "i2cl", "mtv", "lora", "ia3"]
    assert list(METHODS) == [*base, *SEQUENCE_METHODS, *OPTION_METHODS]
    assert SEQUENCE_METHODS == ("site_seq", "i2cl_seq", "lora_seq", "ia3_seq")
    assert OPTION_METHODS == ("site_opt", "i2cl_opt", "lora_opt", "ia3_opt")


def test_trainable_parameter_counts(model, fitted):
    c = model.cfg
    kv = c.n_key_value_heads
    expected = {
        "zero_shot": 0,
        "icl": 0,
        "fv": 0,
        "tv": 0,
        "site": c.n_layers * c.n_heads,
        "mtv": c.n_layers * c.n_heads,
        "i2cl": 4 * c.n_layers,
        "lora": c.n_layers * (2 * c.d_model * 8 + 8 * c.n_heads * c.d_head + 8 * kv * c.d_head),
        "ia3": c.n_layers * (2 * kv * c.d_head + c.d_mlp),
    }
    expected |= {
        f"{b}_{s}": expected[b] for b in ("site", "i2cl", "lora", "ia3") for s in ("seq", "opt")
    }  # the same parameters
    assert {n: m.n_trainable for n, m in fitted.items()} == expected


@pytest.mark.parametrize("name", ["site", "fv", "tv", "mtv", "site_seq"])
def test_prefill_methods_change_only_the_last_position(model, fitted, name):
    m = fitted[name]
    assert m.persistent_hooks(model) == []
    tokens = torch.tensor([model.tokenizer("Q: b\nA:")["input_ids"]])
    base = model(tokens)
    hooked = _all_logits(model, tokens, m)
    torch.testing.assert_close(hooked[:, :-1], base[:, :-1])
    no_op = (name == "mtv" and m.mask.sum() == 0) or (name == "tv" and m.layer == 0)  # layer 0: same last token
    if not no_op:
        assert not torch.allclose(hooked[:, -1], base[:, -1])


@pytest.mark.parametrize("name", ["zero_shot", "icl"])
def test_prompting_methods_have_no_hooks(model, fitted, name):
    assert fitted[name].prefill_hooks(model) is None and fitted[name].persistent_hooks(model) == []


@pytest.mark.parametrize("name", ["site", "fv", "tv", "i2cl", "mtv", "lora", "ia3"])
def test_hooks_before_fit_are_refused_in_one_line(model, name):
    """A fitted method asked for its hooks before fit(): NotFittedError naming it (no assert, which -O drops)."""
    from site_lens.methods import make_method
    from site_lens.methods.base import NotFittedError

    method = make_method(name)
    with pytest.raises(NotFittedError, match=f"^{name}: call fit"):
        method.persistent_hooks(model)
        method.prefill_hooks(model)


def test_untrained_adapters_are_identities(model, task):
    """LoRA (B = 0), (IA)3 (ones) and I2CL with l0 = 0, l1 = 1 leave the logits unchanged."""
    tokens = torch.tensor([model.tokenizer("Q: b\nA: B")["input_ids"]])
    base = model(tokens)
    lora, ia3, i2cl = LoRA(), IA3(), I2CL()
    lora.init_params(model, 0)
    ia3.init_params(model)
    i2cl.init_params(model, torch.randn(2, model.cfg.n_layers, model.cfg.d_model))
    with torch.no_grad():
        i2cl.lam[..., 0] = 0
    for m in (lora, ia3, i2cl):
        torch.testing.assert_close(model.run_with_hooks(tokens, fwd_hooks=m.persistent_hooks(model)), base)


def _cache(model, tokens, hooks):
    names = ["blocks.0.attn.hook_q", "blocks.0.attn.hook_k", "blocks.0.attn.hook_v", "blocks.0.hook_mlp_out"]
    with model.hooks(fwd_hooks=hooks):
        _, cache = model.run_with_cache(tokens, names_filter=names)
    return cache


def test_lora_touches_q_and_v_only(model):
    tokens = torch.tensor([model.tokenizer("Q: b\nA:")["input_ids"]])
    lora = LoRA()
    lora.init_params(model, 0)
    with torch.no_grad():
        for p in lora.params[1::2]:  # the B matrices
            p.normal_()
    base, hooked = _cache(model, tokens, []), _cache(model, tokens, lora.persistent_hooks(model))
    torch.testing.assert_close(hooked["blocks.0.attn.hook_k"], base["blocks.0.attn.hook_k"])
    for name in ("blocks.0.attn.hook_q", "blocks.0.attn.hook_v"):
        assert not torch.allclose(hooked[name], base[name])


def test_lora_hook_equals_a_weight_update(model):
    """x A B added in hook_q is the same as W_Q + scale A B (the reason hooks can stand in for peft)."""
    tokens = torch.tensor([model.tokenizer("Q: b\nA:")["input_ids"]])
    lora = LoRA()
    lora.init_params(model, 0)
    with torch.no_grad():
        for i, p in enumerate(lora.params):
            if i > 1:  # only layer 0's q adapter (A, B) is non-zero
                p.zero_()
        lora.params[1].normal_()
    hooked = model.run_with_hooks(tokens, fwd_hooks=lora.persistent_hooks(model))
    assert (hooked - model(tokens)).abs().max() > 0.1  # the adapter moves the logits: there is something to match
    attn = model.blocks[0].attn
    a, b = lora.params[0].detach(), lora.params[1].detach()
    delta = (lora.alpha / lora.rank) * (a @ b).view(model.cfg.d_model, model.cfg.n_heads, model.cfg.d_head).permute(
        1, 0, 2
    )
    w_q = attn.W_Q.detach().clone()
    try:
        with torch.no_grad():
            attn.W_Q.add_(delta)
        torch.testing.assert_close(model(tokens), hooked, rtol=1e-4, atol=1e-4)
    finally:
        with torch.no_grad():
            attn.W_Q.copy_(w_q)


def test_ia3_touches_k_v_and_mlp_only(model):
    tokens = torch.tensor([model.tokenizer("Q: b\nA:")["input_ids"]])
    ia3 = IA3()
    ia3.init_params(model)
    with torch.no_grad():
        for p in ia3.params:
            p.uniform_(0.5, 1.5)
    base, hooked = _cache(model, tokens, []), _cache(model, tokens, ia3.persistent_hooks(model))
    torch.testing.assert_close(hooked["blocks.0.attn.hook_q"], base["blocks.0.attn.hook_q"])
    for name in ("blocks.0.attn.hook_k", "blocks.0.attn.hook_v", "blocks.0.hook_mlp_out"):
        assert not torch.allclose(hooked[name], base[name])


@pytest.mark.parametrize("name", ["i2cl", "lora", "ia3"])
def test_fit_lowers_training_loss(model, task, name):
    from small import SMALL_TRAIN

    from site_lens.methods import TrainConfig

    cls = {"i2cl": I2CL, "lora": LoRA, "ia3": IA3}[name]
    m = cls(train=TrainConfig(steps=15, lr=SMALL_TRAIN.lr, batch_size=8, eval_every=0))
    train, _ = train_valid_examples(model, task)
    m.fit(model, task, 0, None)
    with torch.no_grad():
        after = float(first_token_loss(model, train, m.persistent_hooks(model)))
    first = m.info["loss"][0]
    assert after < first


def test_mtv_without_validation_keeps_its_last_policy(model, task):
    """eval_every 0 means never validate (the training loop's meaning): the last phi's mask, no best step."""
    from site_lens.methods import MTVConfig, MultimodalTaskVector

    m = MultimodalTaskVector(MTVConfig(steps=3, batch_size=2, eval_every=0))
    m.fit(model, task, 0, None)
    assert m.info["best_step"] == 0 and m.mask is not None and m.mask.shape == (model.cfg.n_layers, model.cfg.n_heads)


def test_site_fit_lowers_training_loss(model, task):
    from site_lens.config import SelectionConfig, SiteConfig
    from site_lens.methods import Site

    m = Site(SiteConfig(embedding=SMALL_EMBEDDING, selection=SelectionConfig(steps=15, eval_every=0, keep_best=False)))
    m.fit(model, task, 0)
    train, _ = train_valid_examples(model, task)
    after = float(first_token_loss(model, train, prefill=m.prefill_hooks(model)))
    assert after < m.adapter.meta["history"]["loss"][0]


def test_fv_and_tv_choose_a_layer_on_valid(fitted, model):
    for name in ("fv", "tv"):
        info = fitted[name].info
        assert len(info["valid_loss_by_layer"]) == model.cfg.n_layers
        assert info["layer"] == min(range(model.cfg.n_layers), key=lambda i: info["valid_loss_by_layer"][i])
    assert len(fitted["fv"].info["heads"]) == 3


def test_fv_and_tv_layer_losses_packed_equal_hooked(fitted, model, task):
    from site_lens.methods.base import choose_layer

    _, valid = train_valid_examples(model, task)
    layers = list(range(model.cfg.n_layers))
    fv, tv = fitted["fv"], fitted["tv"]
    v = fv.v.to(model.cfg.dtype)
    cases = {
        "fv": (fv._factory(model), lambda _: lambda r: r + v),
        "tv": (tv._factory(model), lambda layer: lambda r: tv.vectors[layer].expand_as(r)),
    }
    from site_lens.engine.backend import backend_for

    assert backend_for(model).name == "packed"  # the default below is the packed backend
    for name, (factory, edit) in cases.items():
        whole = [float(first_token_loss(model, valid, prefill=factory(layer))) for layer in layers]  # whole prompts
        _, packed = choose_layer(model, valid, edit, layers)
        use_backend(model, "hooked")
        try:
            _, hooked = choose_layer(model, valid, edit, layers)
        finally:
            use_backend(model, "auto")
        assert packed == pytest.approx(whole, abs=1e-5), name
        assert hooked == pytest.approx(whole, abs=1e-5), name
        assert max(whole) - min(whole) > 1e-3  # the layer matters, so the comparison means something


def test_score_method_rows(model, task, fitted):
    """Each method's row: the same twice, its outputs those of greedy generation under the method's own hooks
    and prompts, its scores those outputs' (first-token accuracy by hand)."""
    cfg = EvalConfig(max_test=3, max_new_tokens=3)
    outs = set()
    for name, m in fitted.items():
        r = score_method(model, m, task, 0, cfg)
        again = score_method(model, m, task, 0, cfg)
        assert {**again, "eval_seconds": 0, "ms_per_query": 0} == {**r, "eval_seconds": 0, "ms_per_query": 0}, name
        outs.add(tuple(check_row(model, m, task, r, 3, 3)))
    assert len(outs) > 2  # the methods write different things, so the comparisons can tell them apart


@pytest.mark.parametrize("forced", ["letter", "space"])
def test_every_method_scores_a_one_token_model_as_predicted(task, forced):
    """A model whose unembedding bias leaves one token possible writes it over and over under any method.
    One of the test answers' letters: prefix match is the share of answers that are that letter (the
    answers differ), first-token accuracy 0 (an answer's first token is the space before it), strict
    match 0. The space: first-token accuracy 1, both matches 0."""
    from helpers import tiny

    torch.manual_seed(0)
    model = tiny(n_ctx=256)
    answers = [y for _, y in task.test]
    token = answers[1] if forced == "letter" else " "
    with torch.no_grad():
        bias = torch.full((model.cfg.d_vocab_out,), -1e4)
        bias[model.tokenizer.convert_tokens_to_ids(token)] = 0
        model.unembed.b_U.add_(bias)
    want = (0.0, 1 / len(answers), 0.0) if forced == "letter" else (1.0, 0.0, 0.0)
    ctx = TaskContext(task, 0, SMALL_EMBEDDING)
    for name in ("zero_shot", "icl", "site", "tv", "i2cl", "ia3"):  # prompts, a gate, a vector, adapters
        m = small_methods()[name]()
        m.fit(model, task, 0, ctx)
        r = score_method(model, m, task, 0, EvalConfig(max_test=len(answers), max_new_tokens=3))
        assert [p["output"] for p in r["predictions"]] == [token * 3] * len(answers), name
        assert (r["first_token_acc"], r["exact_match"], r["strict_match"]) == pytest.approx(want), name


TRAINED = ("site", "i2cl", "mtv", "lora", "ia3")


def test_fitting_twice_with_one_seed_gives_the_same_method(model, task, fitted):
    """Each trained method fitted again with the same seed: the same trainable parameters, bit for bit."""
    ctx = TaskContext(task, 0, SMALL_EMBEDDING)
    for name in TRAINED:
        m = small_methods()[name]()
        m.fit(model, task, 0, ctx)
        assert _state(m), name
        for a, b in zip(_state(m), _state(fitted[name]), strict=True):
            assert torch.equal(a, b), name


def _state(method) -> list[torch.Tensor]:
    """What a fitted method learnt or computed, as tensors."""
    out = [v for v in vars(method).values() if torch.is_tensor(v)]
    for v in vars(method).values():
        if isinstance(v, list | tuple | torch.nn.ParameterList) and len(v) and all(torch.is_tensor(x) for x in v):
            out += list(v)
    adapter = getattr(method, "adapter", None)
    if adapter is not None:
        out += [adapter.t, adapter.theta]
    return out


def test_site_without_its_gate_is_zero_shot(model, task, fitted):
    """SITE's key ingredient is the gate: with every alpha 0 (theta = -inf) its row is zero-shot's; with its
    trained gate the last-token logits move."""
    import dataclasses

    cfg = EvalConfig(max_test=5, max_new_tokens=3)
    site = fitted["site"]
    zero = score_method(model, fitted["zero_shot"], task, 0, cfg)
    closed = copy.copy(site)
    closed.adapter = dataclasses.replace(site.adapter, theta=torch.full_like(site.adapter.theta, -torch.inf))
    shut = score_method(model, closed, task, 0, cfg)
    for k in ("first_token_acc", "exact_match", "strict_match", "predictions"):
        assert shut[k] == zero[k], k
    tokens = torch.tensor([model.tokenizer("Q: b\nA:")["input_ids"]])
    assert not torch.allclose(_all_logits(model, tokens, site)[:, -1], _all_logits(model, tokens, closed)[:, -1])


def test_function_vector_goes_through_the_post_attention_norm():
    """One prompt, every head of a layer: v + the bias's share is exactly what the attention adds to the residual."""
    from helpers import tiny

    from site_lens.methods.fv import function_vector, mean_inv_post_scale
    from site_lens.models.engines import norm_gain
    from site_lens.stages.embeddings import build_task_embedding

    torch.manual_seed(0)
    model = tiny(n_ctx=64, use_normalization_before_and_after=True)
    for p in model.parameters():  # non-trivial gains and biases everywhere
        p.data += 0.3 * torch.randn_like(p)
    prompt = "Q: abc\nA: ABC\n\nQ: de\nA:"
    mean_z = build_task_embedding(model, [prompt], 1)
    inv = mean_inv_post_scale(model, [prompt])
    _, cache = model.run_with_cache(prompt, names_filter=lambda n: n.endswith(("hook_attn_out", "ln1_post.hook_scale")))
    for layer in range(model.cfg.n_layers):
        block = model.blocks[layer]
        heads = [(layer, h) for h in range(model.cfg.n_heads)]
        v = function_vector(model, mean_z, heads, inv)
        bias_share = block.attn.b_O.detach() * norm_gain(model, block.ln1_post).detach() * inv[layer]
        want = cache[f"blocks.{layer}.hook_attn_out"][0, -1]
        assert torch.allclose(inv[layer], 1 / cache[f"blocks.{layer}.ln1_post.hook_scale"][0, -1, 0])
        assert torch.allclose(v + bias_share, want, atol=1e-4), (v + bias_share - want).abs().max()
        # without the norm (the old vector) it is not what the layer adds
        plain = sum(mean_z[layer, h] @ block.attn.W_O[h] for h in range(model.cfg.n_heads))
        assert not torch.allclose(plain + block.attn.b_O, want, atol=1e-2)
    with pytest.raises(ValueError, match="post-attention norm"):
        function_vector(model, mean_z, [(0, 0)])


def test_last_token_means_equal_the_cache(model):
    """TV's mean residual and I2CL's context vectors: the last token's activations averaged over prompts of unequal length."""
    from site_lens.methods.i2cl import context_vectors
    from site_lens.methods.tv import mean_last_resid

    prompts = ["Q: ab\nA: AB", "Q: hello\nA: HELLO", "Q: x\nA:"]
    want_resid, want_attn, want_mlp = 0, 0, 0
    for p in prompts:
        _, cache = model.run_with_cache(p)
        want_resid = want_resid + cache.stack_activation("resid_pre")[:, 0, -1] / len(prompts)
        want_attn = want_attn + cache.stack_activation("attn_out")[:, 0, -1] / len(prompts)
        want_mlp = want_mlp + cache.stack_activation("mlp_out")[:, 0, -1] / len(prompts)
    assert torch.allclose(mean_last_resid(model, prompts, batch_size=2), want_resid, atol=1e-5)
    cv = context_vectors(model, prompts, batch_size=2)
    assert torch.allclose(cv[0], want_attn, atol=1e-5) and torch.allclose(cv[1], want_mlp, atol=1e-5)


def test_loss_chunks_accumulate_the_same_gradient(model, task, monkeypatch):
    """One-row chunks back-propagated one at a time give the whole batch's loss and gradient."""
    from site_lens.stages import training

    m = I2CL()
    m.init_params(model, torch.randn(2, model.cfg.n_layers, model.cfg.d_model))
    train, _ = train_valid_examples(model, task)
    batch = train[:6]
    loss = first_token_loss(model, batch, m.persistent_hooks(model))
    loss.backward()
    whole = m.lam.grad.clone()
    m.lam.grad = None
    monkeypatch.setattr(training, "GRAD_CELLS", 1)  # every chunk a single row
    seen = []

    def counting(model, tokens, *args, **kwargs):
        seen.append(len(tokens))
        return last_logits(model, tokens, *args, **kwargs)

    monkeypatch.setattr(training, "last_logits", counting)
    acc = first_token_loss(model, batch, m.persistent_hooks(model), backward=True)
    assert seen == [1] * len(batch)
    assert not acc.requires_grad
    torch.testing.assert_close(acc, loss.detach())
    torch.testing.assert_close(m.lam.grad, whole)


def test_training_with_one_row_chunks_matches_whole_batches(model, task, monkeypatch):
    """The memory cap changes how a step is computed, not what it learns."""
    from site_lens.methods import TrainConfig
    from site_lens.stages import training

    cfg = TrainConfig(steps=5, batch_size=4, eval_every=0)
    a = I2CL(train=cfg)
    a.fit(model, task, 0)
    monkeypatch.setattr(training, "GRAD_CELLS", 1)
    b = I2CL(train=cfg)
    b.fit(model, task, 0)
    torch.testing.assert_close(b.lam, a.lam)
    assert b.info["loss"] == pytest.approx(a.info["loss"])
