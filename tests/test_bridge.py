"""The TransformerBridge engine on tiny random configs of ten architectures (offline, seconds).

Where TransformerLens 3.9's HookedTransformer has the architecture (Llama, Gemma 3), the bridge's
task embedding and first training losses are held to it; everywhere, the bridge's logits equal
the transformers model's, and stages 1-3 and a patching sweep run.
"""

import pytest
import torch
from helpers import char_tokenizer

from site_lens.adapter import AdapterError
from site_lens.analysis.patching import head_patching_sweep
from site_lens.config import EmbeddingConfig, EngineConfig, EvalConfig, SelectionConfig, SiteConfig
from site_lens.methods.site import fit_site
from site_lens.models import engines
from site_lens.models.bridge import bridge_from_hf
from site_lens.models.identity import model_identity, register
from site_lens.models.tiny import TINY_ARCHITECTURES, tiny_bridge, tiny_hf
from site_lens.stages.embeddings import build_task_embedding
from site_lens.stages.generation import generate_greedy
from site_lens.stages.selection import AlphaTrainer
from site_lens.tasks import load_task
from site_lens.tokens import encode, make_examples

PROMPTS = ["Q: hot\nA: cold\nQ: up\nA:", "Q: big\nA: small\nQ: in\nA:", "Q: yes\nA:"]
WORDS = ["cat", "dog", "sun", "moon", "tree", "rock"]


@pytest.fixture
def tok():
    return char_tokenizer()  # fresh: HookedTransformer's setup may add tokens to the one it is given


@pytest.fixture(scope="module", params=TINY_ARCHITECTURES)
def bridge(request):
    return tiny_bridge(request.param, char_tokenizer())


def _cfg() -> SiteConfig:
    return SiteConfig(
        embedding=EmbeddingConfig(n_prompts=3, n_shots=2),
        selection=SelectionConfig(steps=4, eval_every=2, max_valid=3),
        eval=EvalConfig(max_new_tokens=4, max_test=4),
    )


def test_hook_z_fires_and_logits_equal_hf(bridge):
    c = bridge.cfg
    toks = torch.tensor([encode(bridge, ["Q: hot\nA:"])[0]])
    seen = {}

    def grab(z, hook):
        seen[hook.name] = z.shape
        return z

    logits = bridge.run_with_hooks(toks, fwd_hooks=[(f"blocks.{c.n_layers - 1}.attn.hook_z", grab)])
    assert list(seen.values()) == [torch.Size([1, toks.shape[1], c.n_heads, c.d_head])]
    assert torch.equal(logits, bridge.original_model(toks).logits)
    assert engines.engine_of(bridge) == "bridge"


def test_stages_and_patching_run(bridge):
    task = load_task("opposites")
    fit = fit_site(bridge, task, _cfg())
    t, alpha = fit.adapter.t, fit.adapter.alpha
    c = bridge.cfg
    assert t.shape == (c.n_layers, c.n_heads, c.d_head) and torch.isfinite(t).all()
    assert alpha.shape == (c.n_layers, c.n_heads) and not torch.equal(alpha, torch.full_like(alpha, 0.5))
    prompts = encode(bridge, ["Q: hot\nA:", "Q: a longer one\nA:"])
    hooks = fit.adapter.hooks
    gen, first = generate_greedy(bridge, prompts, max_new_tokens=3, prefill_hooks=lambda last: hooks(bridge, last))
    assert len(gen) == 2 and first.shape == (2, c.d_vocab)
    df = head_patching_sweep(bridge, task, fit.adapter, ks=[1, 2], draws=1, max_items=4, n_shots=2)
    full = df[df.condition == "zero_shot"].iloc[0]
    assert full.recovery_prob == pytest.approx(0.0, abs=1e-9)


def test_injection_at_prefill_equals_uncached_reference(bridge):
    """Generation on the bridge injects once, at the last prompt token: alpha = 0 is the plain model."""
    c = bridge.cfg
    prompts = encode(bridge, PROMPTS)
    t = torch.randn(c.n_layers, c.n_heads, c.d_head)
    zero = torch.zeros(c.n_layers, c.n_heads)
    from site_lens.gate import injection_hooks

    plain, first_plain = generate_greedy(bridge, prompts, max_new_tokens=4)
    gated, first_gated = generate_greedy(
        bridge, prompts, max_new_tokens=4, prefill_hooks=lambda last: injection_hooks(bridge, t, zero, last)
    )
    assert plain == gated and torch.allclose(first_plain, first_gated, atol=1e-5)
    # each row's first-step logits equal its own unpadded forward (batching and padding change nothing)
    for i, p in enumerate(prompts):
        want = bridge.original_model(torch.tensor([p])).logits[0, -1]
        assert torch.allclose(first_plain[i], want, atol=1e-5)


# ---------------------------------------------------------------- against HookedTransformer

needs_hooked = pytest.mark.skipif(
    engines.HOOKED is None,
    reason="needs TransformerLens 3.x's HookedTransformer: compares the bridge with a HookedTransformer of the same weights",
)


@needs_hooked
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_bridge_agrees_with_hooked(arch, tok):
    from site_lens.models.convert import hooked_from_hf

    hooked = register(hooked_from_hf(tiny_hf(arch, tok), char_tokenizer()), f"tiny-{arch}")
    bridge = register(bridge_from_hf(tiny_hf(arch, tok), tok), f"tiny-{arch}")
    t_h = build_task_embedding(hooked, PROMPTS)
    t_b = build_task_embedding(bridge, PROMPTS)
    assert torch.allclose(t_h, t_b, atol=1e-5), (t_h - t_b).abs().max()
    ex = make_examples(hooked, [(f"Q: {w}\nA:", w[::-1]) for w in WORDS])
    losses = []
    for model in (hooked, bridge):
        tr = AlphaTrainer(model, t_h, SelectionConfig(steps=3, eval_every=0), engine=EngineConfig(backend="hooked"))
        tr.fit(ex)
        losses.append(tr.history.loss[:3])
    assert losses[0] == pytest.approx(losses[1], abs=1e-5)
    # one identity: the same weights and name on both engines
    ih, ib = model_identity(hooked), model_identity(bridge)
    assert ih["weights_sha256"] == ib["weights_sha256"]
    fit = fit_site(hooked, load_task("opposites"), _cfg())
    fit.adapter.check_model(ib)  # a HookedTransformer adapter applies to the bridge of the same model
    b_fit = fit_site(bridge, load_task("opposites"), _cfg())
    b_fit.adapter.check_model(ih)  # and the reverse


def test_adapters_refused_across_name_or_weights(tok):
    base = tiny_bridge("llama", tok, seed=0, name="tiny-llama-base")
    fit = fit_site(base, load_task("opposites"), _cfg())
    same = tiny_bridge("llama", tok, seed=0, name="tiny-llama-base")
    fit.adapter.check_model(model_identity(same))
    renamed = tiny_bridge("llama", tok, seed=0, name="tiny-llama-instruct")
    with pytest.raises(AdapterError, match="tiny-llama-base.*tiny-llama-instruct"):
        fit.adapter.check_model(model_identity(renamed))
    tuned = tiny_bridge("llama", tok, seed=1, name="tiny-llama-base")
    with pytest.raises(AdapterError, match="weights_sha256"):
        fit.adapter.check_model(model_identity(tuned))


def test_processed_bridge_refused(tok):
    raw = tiny_bridge("llama", tok)
    fit = fit_site(raw, load_task("opposites"), _cfg())
    processed = tiny_bridge("llama", tok)
    processed.enable_compatibility_mode(disable_warnings=True)
    register(processed, "tiny-llama")
    with pytest.raises(AdapterError, match="processing"):
        fit.adapter.check_model(model_identity(processed))


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_every_method_fits_and_scores_on_the_bridge(arch, tmp_path):
    """Each method's row on the bridge: its predictions those of greedy generation under the method's own hooks
    and prompts, its scores those outputs' (first-token accuracy from the first step's logits)."""
    from small import SMALL_EMBEDDING, check_row, small_methods, write_task_dir

    from site_lens.methods import TaskContext, score_method

    model = tiny_bridge(arch, char_tokenizer())
    task = load_task("upper", data_dir=write_task_dir(tmp_path))
    ctx = TaskContext(task, 0, SMALL_EMBEDDING)
    outs = set()
    for make in small_methods().values():
        m = make()
        m.fit(model, task, 0, ctx)
        r = score_method(model, m, task, 0, EvalConfig(max_test=3, max_new_tokens=3))
        outs.add(tuple(check_row(model, m, task, r, 3, 3)))
    assert len(outs) > 2  # the methods write different things, so the comparisons can tell them apart


def test_kv_cache_path_equals_the_full_forward(bridge):
    """Prefixes in the Hugging Face cache (explicit positions and masks) give the full forward's logits;
    the embedded models' architectures take that path."""
    from site_lens.engine.bridge_backend import BridgeBackend, probe_error
    from site_lens.engine.probe import PROBE_TOL

    be = BridgeBackend(bridge)
    if engines.architecture(bridge) in ("LlamaForCausalLM", "Gemma3ForCausalLM"):
        assert be.cached and be.kv_cache
    if be.cached:
        assert probe_error(bridge) <= PROBE_TOL
    else:  # the re-run path is the full forward by construction; only GPT-NeoX's attention takes no cache this way
        assert engines.architecture(bridge) == "GPTNeoXForCausalLM", engines.architecture(bridge)
        toks = torch.tensor([encode(bridge, ["Q: hot\nA:"])[0]])
        got = be.logits(toks[:, -1], be.prefix(toks[:, :-1]))
        assert torch.allclose(got, bridge(toks)[:, -1], atol=1e-5)


@needs_hooked
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_every_method_fitted_on_either_engine_gives_the_same_logits(arch, tmp_path):
    """Each method fitted with the same seed on the HookedTransformer and on the bridge of the same weights
    (norm gains perturbed, so Gemma's (1 + w) norms matter) moves the logits identically."""
    from small import SMALL_EMBEDDING, small_methods, write_task_dir

    from site_lens.engine.backend import last_logits
    from site_lens.methods import TaskContext
    from site_lens.models.convert import hooked_from_hf

    hf = tiny_hf(arch, char_tokenizer())
    with torch.no_grad():
        for n, p in hf.named_parameters():
            if "norm" in n:
                p.add_(0.3 * torch.randn_like(p))
    twin = tiny_hf(arch, char_tokenizer())
    twin.load_state_dict(hf.state_dict())
    models = {"hooked": hooked_from_hf(hf, char_tokenizer()), "bridge": bridge_from_hf(twin, char_tokenizer())}
    task = load_task("upper", data_dir=write_task_dir(tmp_path))
    toks = torch.tensor([encode(models["hooked"], ["Q: k\nA:"])[0]])
    last = torch.tensor([toks.shape[1] - 1])
    for name, make in small_methods().items():
        out = []
        for model in models.values():
            torch.manual_seed(0)
            m = make()
            m.fit(model, task, 0, TaskContext(task, 0, SMALL_EMBEDDING))
            hooks = list(m.persistent_hooks(model))
            prefill = m.prefill_hooks(model)
            hooks += prefill(last) if prefill is not None else []
            with torch.no_grad():
                out.append(last_logits(model, toks, last, hooks=hooks)[0])
        assert torch.allclose(out[0], out[1], atol=1e-4), (name, (out[0] - out[1]).abs().max())


def test_a_split_device_map_and_a_float64_layer(tmp_path):
    """``load_model(folder, engine="bridge", device_map=...)`` takes an explicit per-module map (one device
    here: a real split is in benchmarks/device_check.py); a layer kept in float64 inside a float32 model gets
    t and alpha in its own dtype; generation under the adapter matches the plain model."""
    from site_lens.models import load_model

    hf = tiny_hf("llama", char_tokenizer())
    hf.config.architectures = ["LlamaForCausalLM"]
    hf.save_pretrained(tmp_path / "tiny")
    char_tokenizer().save_pretrained(tmp_path / "tiny")
    split = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu"}
    split.update({"model.layers.1": "cpu", "model.norm": "cpu", "lm_head": "cpu"})
    plain = load_model(str(tmp_path / "tiny"), engine="bridge")
    mapped = load_model(str(tmp_path / "tiny"), engine="bridge", device_map=split)
    assert model_identity(plain) == model_identity(mapped)
    fit = fit_site(plain, load_task("opposites"), _cfg())
    fit.adapter.check_model(model_identity(mapped))
    prompts = encode(plain, PROMPTS)
    want = generate_greedy(plain, prompts, max_new_tokens=4, prefill_hooks=lambda last: fit.adapter.hooks(plain, last))
    got = generate_greedy(mapped, prompts, max_new_tokens=4, prefill_hooks=lambda last: fit.adapter.hooks(mapped, last))
    assert got[0] == want[0] and torch.allclose(got[1], want[1], atol=1e-5)

    mixed = load_model(str(tmp_path / "tiny"), engine="bridge")
    layer = mixed.original_model.model.layers[1]
    layer.to(torch.float64)
    seen = []
    cast_in = layer.register_forward_pre_hook(
        lambda m, a, k: (
            tuple(x.double() if torch.is_tensor(x) and x.is_floating_point() else x for x in a),
            {n: (v.double() if torch.is_tensor(v) and v.is_floating_point() else v) for n, v in k.items()},
        ),
        with_kwargs=True,
    )
    cast_out = layer.register_forward_hook(lambda m, a, out: out.float() if torch.is_tensor(out) else out)

    def grab(z, hook):
        seen.append(z.dtype)
        return z

    with mixed.hooks(fwd_hooks=[("blocks.1.attn.hook_z", grab)]):
        got = generate_greedy(
            mixed, prompts, max_new_tokens=4, prefill_hooks=lambda last: fit.adapter.hooks(mixed, last)
        )
    cast_in.remove()
    cast_out.remove()
    assert torch.float64 in seen
    assert torch.allclose(got[1], want[1], atol=1e-4)


@needs_hooked
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_option_scores_equal_across_engines(arch):
    from site_lens.gate import injection_hooks
    from site_lens.models.convert import hooked_from_hf
    from site_lens.stages.options import option_logprobs

    hf = tiny_hf(arch, char_tokenizer())
    twin = tiny_hf(arch, char_tokenizer())
    hooked, bridge = hooked_from_hf(hf, char_tokenizer()), bridge_from_hf(twin, char_tokenizer())
    c = hooked.cfg
    t = torch.randn(c.n_layers, c.n_heads, c.d_head)
    alpha = torch.rand(c.n_layers, c.n_heads)
    prompts, options = ["Q: hot\nA:", "x"], [[" cold", " warm", " c"], [" y", " zz"]]
    scores = [
        option_logprobs(m, prompts, options, prefill=lambda pos, m=m: injection_hooks(m, t, alpha, pos))
        for m in (hooked, bridge)
    ]
    for a, b in zip(*scores):
        assert a == pytest.approx(b, abs=1e-4)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_tokens_after_a_prefix_under_injection_equal_on_both_bridge_paths(arch):
    """The tokens an option adds after a cached prefix, gated at the first: the KV-cache path and the re-run
    path of the bridge give the same logits."""
    from site_lens.engine.bridge_backend import BridgeBackend
    from site_lens.gate import injection_hooks

    bridge = bridge_from_hf(tiny_hf(arch, char_tokenizer()), char_tokenizer())
    c = bridge.cfg
    t = torch.randn(c.n_layers, c.n_heads, c.d_head)
    alpha = torch.rand(c.n_layers, c.n_heads)
    prefix = torch.tensor([encode(bridge, ["Q: hot\nA"])[0]])
    toks = torch.tensor([[5, 6, 7]])
    hooks = injection_hooks(bridge, t, alpha, 0)
    cached, rerun = BridgeBackend(bridge, cached=True), BridgeBackend(bridge, cached=False)
    got = cached.run(toks, cached.prefix(prefix), hooks)
    want = rerun.run(toks, rerun.prefix(prefix), hooks)
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(got, cached.run(toks, cached.prefix(prefix), []), atol=1e-3)  # the gate acted


def test_rerun_path_counts_negative_positions_from_the_new_tokens():
    """A hook at position -1 means the last new token on both bridge paths, not a prefix position."""
    from site_lens.engine.bridge_backend import BridgeBackend
    from site_lens.gate import injection_hooks

    bridge = tiny_bridge("llama", char_tokenizer())
    c = bridge.cfg
    t, alpha = torch.randn(c.n_layers, c.n_heads, c.d_head), torch.rand(c.n_layers, c.n_heads)
    prefix, toks = torch.tensor([encode(bridge, ["Q: hot\nA"])[0]]), torch.tensor([[5, 6, 7]])
    cached, rerun = BridgeBackend(bridge, cached=True), BridgeBackend(bridge, cached=False)
    for pos in (-1, 2, torch.tensor([-2])):
        hooks = injection_hooks(bridge, t, alpha, pos)
        got = cached.run(toks, cached.prefix(prefix), hooks)
        want = rerun.run(toks, rerun.prefix(prefix), hooks)
        assert torch.allclose(got, want, atol=1e-5), pos


ARCHS = ["llama", "gemma3", "qwen2", "qwen3", "mistral", "mistral-window", "glm", "phi3", "phi3-window"]


@pytest.mark.parametrize("arch", ARCHS)
def test_packed_engine_from_transformers_weights_equals_the_bridge(arch):
    """One packed engine for both model engines: packed from the bridge's transformers weights, its last-token
    logits, spans and gated generations equal the bridge's own forward (GLM and Phi-3: fused matrices, partial
    rotary over adjacent pairs or halves; Mistral and Phi-3 with a sliding window of four in every layer)."""
    from site_lens.engine.backend import backend_for
    from site_lens.engine.bridge_backend import BridgeBackend
    from site_lens.gate import injection_hooks
    from site_lens.stages.generation import generate_under_gates

    window = {"sliding_window": 4}
    extra = {"llama": {"attention_bias": True}, "phi3-window": window, "mistral-window": window}.get(arch, {})
    hf = tiny_hf(arch.removesuffix("-window"), char_tokenizer(), **extra)
    with torch.no_grad():  # unequal norm gains and non-zero biases, so every fold and bias shows
        for n, p in hf.named_parameters():
            if "norm" in n or n.endswith(".bias"):
                p.add_(0.3 * torch.randn_like(p))
    bridge = bridge_from_hf(hf, char_tokenizer())
    packed, ref = backend_for(bridge), BridgeBackend(bridge)
    assert packed.name == "packed", packed.reason
    c = bridge.cfg
    t = torch.randn(c.n_layers, c.n_heads, c.d_head) * 0.5
    alpha = torch.rand(c.n_layers, c.n_heads)
    prompts = encode(bridge, PROMPTS)
    toks = torch.tensor([prompts[0]])
    got = packed.logits(toks[:, -1], packed.prefix(toks[:, :-1]), alpha, t)
    want = ref.logits(toks[:, -1], ref.prefix(toks[:, :-1]), alpha, t)
    assert torch.allclose(got, want, atol=1e-5)
    got = packed.span_logits(toks[:, -3:], packed.prefix(toks[:, :-3]), alpha, t)
    want = ref.span_logits(toks[:, -3:], ref.prefix(toks[:, :-3]), alpha, t)
    assert torch.allclose(got, want, atol=1e-5)
    (gen, first), *_ = generate_under_gates(bridge, prompts, t, [alpha], max_new_tokens=5)
    want_gen, want_first = generate_greedy(
        bridge, prompts, max_new_tokens=5, prefill_hooks=lambda last: injection_hooks(bridge, t, alpha, last)
    )
    assert gen == want_gen and torch.allclose(first, want_first, atol=1e-5)


def test_tiny_model_as_a_bridge_has_the_tiny_shape_and_refuses_what_it_cannot_build():
    """tiny_model's TransformerBridge (what it gives on TransformerLens 4; built directly here on either line):
    the HookedTransformer's defaults and overrides, the packed backend after its probe, one-line errors."""
    from site_lens.engine.backend import backend_for
    from site_lens.models import ModelError, model_identity
    from site_lens.models.tiny import _tiny_bridge

    model = _tiny_bridge(None, {})
    c = model.cfg
    shape = (c.n_layers, c.d_model, c.n_heads, c.d_head, c.n_key_value_heads, c.d_mlp, c.d_vocab, c.n_ctx)
    assert shape == (2, 32, 4, 8, 2, 64, 50, 64)
    assert model_identity(model)["name"] == "tiny-2x4" and c.default_prepend_bos is False
    assert backend_for(model).name == "packed"  # the Llama it wraps is on the packed engine's list, and agrees
    wide = _tiny_bridge(None, {"n_layers": 3, "n_heads": 8, "n_key_value_heads": 4, "seed": 1})
    assert (wide.cfg.n_layers, wide.cfg.n_heads) == (3, 8)
    with pytest.raises(ModelError, match="cannot set positional_embedding_type"):
        _tiny_bridge(None, {"positional_embedding_type": "standard"})
    with pytest.raises(ModelError, match="d_vocab=60 but the tokenizer has 101 ids"):
        _tiny_bridge(char_tokenizer(), {"d_vocab": 60})
    with pytest.raises(ModelError, match="at most 101 ids, not 500: pass one"):
        _tiny_bridge(None, {"d_vocab": 500})


@pytest.mark.parametrize("arch", ["llama", "gemma3", "glm", "phi3"])
def test_packed_bridge_rotary_tables_grow_as_the_model_computes_them(arch):
    """pack_bridge's tables start at 2,048 positions and grow on demand (LastToken.cover); the grown rows equal the
    model's own rotary embedding there (GLM's each frequency twice side by side, as it applies them) and the first
    rows are unchanged."""
    from site_lens.engine.bridge_pack import pack_bridge
    from site_lens.engine.packed import LastToken

    bridge = tiny_bridge(arch, char_tokenizer())
    runner = LastToken(pack_bridge(bridge))
    before = [w.cos.clone() for w in runner.layers]
    assert before[0].shape[0] == 2048
    runner.cover(3000)
    hf = bridge.original_model
    x = torch.zeros(1, 1, bridge.cfg.d_head)
    assert runner.rotary_dim == (4 if arch in ("glm", "phi3") else bridge.cfg.d_head)
    assert runner.adjacent == (arch == "glm")
    types = list(getattr(hf.config, "layer_types", None) or []) or [None] * len(runner.layers)
    for w, old, kind in zip(runner.layers, before, types):
        assert w.cos.shape[0] >= 3000 and torch.equal(w.cos[:2048], old)
        args = (x, torch.tensor([[2999]])) if kind is None else (x, torch.tensor([[2999]]), kind)
        cos, sin = hf.model.rotary_emb(*args)
        if arch == "glm":  # (freqs, freqs) -> (f0, f0, f1, f1, ...)
            cos, sin = (u[..., : u.shape[-1] // 2].repeat_interleave(2, -1) for u in (cos, sin))
        assert torch.allclose(w.cos[2999], cos[0, 0], atol=1e-6) and torch.allclose(w.sin[2999], sin[0, 0], atol=1e-6)


def test_pack_bridge_refuses_what_its_config_says_it_cannot_run(tok):
    """The structural checks run where the packing does (a float16 bridge here), as pack_hooked's do."""
    from site_lens.engine.bridge_pack import pack_bridge, unpackable

    bridge = tiny_bridge("llama", tok)
    assert unpackable(bridge) is None
    bridge.cfg.dtype = torch.float16
    with pytest.raises(ValueError, match="dtype is not float32/float64"):
        pack_bridge(bridge)
    gpt2 = tiny_bridge("gpt2", char_tokenizer())
    with pytest.raises(ValueError, match="architecture GPT2LMHeadModel is not one the packed path covers"):
        pack_bridge(gpt2)
