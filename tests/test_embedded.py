"""The real embedded model (slow; part of `make test`)."""

import pytest
import torch

pytestmark = pytest.mark.slow


def test_smollm2_shape_and_hf_parity(smollm):
    assert (smollm.cfg.n_layers, smollm.cfg.n_heads, smollm.cfg.d_head) == (30, 9, 64)
    from site_lens.tokens import encode

    ids = torch.tensor(encode(smollm, ["Q: hot\nA: cold\n\nQ: big\nA: small\n\nQ: fast\nA:"]))
    assert smollm.to_string(smollm(ids)[0, -1].argmax()) == " slow"


def test_weight_cache_loads_identical_model(smollm, tmp_path, monkeypatch):
    import gguf

    from site_lens.models import PROCESSING_FLAGS, load_model, model_identity
    from site_lens.tokens import encode

    reads = []
    make = gguf.GGUFReader

    def counted(path, *args, **kwargs):
        reads.append(str(path))
        return make(path, *args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", counted)
    a = load_model("smollm2-135m", cache_dir=tmp_path)  # cold: dequantises, writes the cache
    assert len(reads) == 1, reads  # one header reader for config, tokenizer and weights (transformers: 3)
    assert gguf.GGUFReader is counted  # put back after the load
    b = load_model("smollm2-135m", cache_dir=tmp_path)  # warm: reads the cache
    assert len(reads) == 1
    texts = ["Q: go\nA:", "a", "east ->"]
    assert encode(a, texts) == encode(b, texts) == encode(smollm, texts)  # each its own tokenizer
    assert encode(a, ["a"])[0][0] == a.tokenizer.bos_token_id  # BOS first, as the bridge tokenises too
    assert a.cfg.to_dict() == b.cfg.to_dict()
    assert torch.equal(a.to_tokens(texts[0]), b.to_tokens(texts[0]))
    ids = torch.tensor(encode(a, texts[:1]))
    assert torch.equal(a(ids), b(ids)) and torch.allclose(a(ids), smollm(ids))
    ident = model_identity(b)  # the flags it was loaded with, and the GGUF's digest
    assert ident == model_identity(a) == model_identity(smollm)
    assert ident["processing"] == PROCESSING_FLAGS and len(ident["source_sha256"]) == 64


def test_site_beats_zero_shot_on_builtin_task(smollm):
    from site_lens import SiteConfig, evaluate, fit_site, load_task
    from site_lens.config import SelectionConfig

    task = load_task("opposites")
    cfg = SiteConfig(selection=SelectionConfig(steps=150, eval_every=50))
    fit = fit_site(smollm, task, cfg)
    adapter, history = fit.adapter, fit.history
    assert fit.backend["name"] == "packed" and set(fit.seconds) == {"embedding", "selection"}
    zero = evaluate(smollm, task, "zero_shot", cfg=cfg.eval)
    site = evaluate(smollm, task, "site", adapter, cfg=cfg.eval)
    print("zero", zero["exact_match"], "site", site["exact_match"])
    assert site["exact_match"] >= zero["exact_match"] + 0.3
    assert history.loss[-1] < history.loss[0]


def _fast_and_naive(model):
    """(naive loss, naive theta-grad, {path: (fast loss, fast theta-grad)}) on three real prompts, random theta."""
    from site_lens import build_task_embedding
    from site_lens.engine.backend import backend_for
    from site_lens.engine.prompt_cache import PromptCache
    from site_lens.stages.selection import AlphaTrainer
    from site_lens.tokens import make_examples

    t = build_task_embedding(model, ["Q: up\nA: down\n\nQ: big\nA: small\n\nQ: hot\nA:", "Q: in\nA: out\n\nQ: dry\nA:"])
    ex = make_examples(model, [("Q: hot\nA:", "cold"), ("Q: wide\nA:", "narrow"), ("Q: ancient\nA:", "modern")])
    tr = AlphaTrainer(model, t)
    with torch.no_grad():
        tr.gate.theta.normal_(generator=torch.Generator().manual_seed(0))
    ln = tr.loss_naive(ex)
    (gn,) = torch.autograd.grad(ln, tr.gate.theta)
    assert tr.backend().name == "packed"  # both embedded models run on the packed last-token path
    fast = {}
    for name in ("hooked", "packed"):
        lf = tr.loss_fast(PromptCache(model, ex, backend=backend_for(model, name)), range(len(ex)))
        fast[name] = (lf.item(), torch.autograd.grad(lf, tr.gate.theta)[0])
    return ln.item(), gn, fast


def test_fast_path_equals_naive_on_embedded_model(smollm):
    ln, gn, fast = _fast_and_naive(smollm)
    for lf, gf in fast.values():
        assert abs(lf - ln) < 1e-5
        assert torch.allclose(gf, gn, atol=1e-5)


def test_packed_decoding_equals_hooked_on_embedded_model(smollm):
    from site_lens.stages.generation import generate_greedy
    from site_lens.tokens import encode

    prompts = encode(
        smollm,
        ["Q: hot\nA:", "Q: up\nA: down\n\nQ: big\nA: small\n\nQ: wide\nA:", "The capital of France is", "Q: cat\nA:"],
    )
    kw = dict(max_new_tokens=10, stop_ids=set(), batch_size=4)
    packed, first_p = generate_greedy(smollm, prompts, **kw)
    hooked, first_h = generate_greedy(smollm, prompts, backend="hooked", **kw)
    assert packed == hooked
    assert torch.allclose(first_p, first_h)


def test_gemma3_packed_paths_equal_hooked(gemma):
    """Gemma 3 270M (the second embedded family): packed training loss/grad and decoding equal the hooked model."""
    from site_lens.stages.generation import generate_greedy
    from site_lens.tokens import encode

    ln, gn, fast = _fast_and_naive(gemma)
    for lf, _ in fast.values():
        assert abs(lf - ln) < 1e-5
    assert torch.allclose(fast["hooked"][1], gn, atol=1e-5)
    # The packed unembedding (input-major, faster) sums in another order than TransformerLens's
    # F.linear; over Gemma's 262k-token vocabulary that moves the gradient by ~1e-5 of ~0.4
    # (3e-5 relative), against 7e-7 for the hooked fast path, which uses the same kernels.
    assert (fast["packed"][1] - gn).abs().max() < 1e-4 * gn.abs().max()
    prompts = encode(gemma, ["Q: hot\nA:", "Q: up\nA: down\n\nQ: big\nA: small\n\nQ: wide\nA:", "Q: cat\nA:"])
    kw = dict(max_new_tokens=8, stop_ids=set())
    assert generate_greedy(gemma, prompts, **kw)[0] == generate_greedy(gemma, prompts, backend="hooked", **kw)[0]


@pytest.mark.parametrize("which", ["smollm", "gemma"])
def test_numeric_answer_targets_a_digit(which, request):
    """'A:5' has no space before a number, so the first target token is the digit itself, as in the demonstrations."""
    from site_lens.tasks import build_prompt
    from site_lens.tokens import answer_ids, encode

    model = request.getfixturevalue(which)
    for answer in ("5", "12", "1990"):
        prompt = build_prompt([("cat", "3"), ("house", "5")], "zebra")
        first = model.tokenizer.decode([answer_ids(model, prompt, answer)[0]])
        assert first == answer[0], (answer, first)
        assert encode(model, [prompt + answer])[0][-len(answer_ids(model, prompt, answer)) :] == answer_ids(model, prompt, answer)
    # the old format's dead target: the token after "A:" for " 5" is a bare space on these tokenizers
    spaced = encode(model, ["Q: zebra\nA: 5"])[0][len(encode(model, ["Q: zebra\nA:"])[0])]
    assert model.tokenizer.decode([spaced]).strip() == ""
    # a word keeps its leading space inside its first token
    assert model.tokenizer.decode([answer_ids(model, "Q: hot\nA:", "cold")[0]]).startswith(" ")


@pytest.mark.parametrize("which", ["smollm", "gemma"])
def test_sequence_objective_cached_paths_equal_whole_prompts(which, request):
    """The answer-sequence loss: the packed and hooked cached paths against whole prompts, loss and theta-grad."""
    from site_lens import build_task_embedding
    from site_lens.engine.backend import backend_for
    from site_lens.gate import injection_hooks
    from site_lens.stages.objectives import SequenceCache, sequence_examples, sequence_loss

    model = request.getfixturevalue(which)
    t = build_task_embedding(model, ["Q: France\nA: Paris\n\nQ: Peru\nA: Lima\n\nQ: Chad\nA:"])
    ex = sequence_examples(model, [("Q: Cambodia\nA:", "Phnom Penh"), ("Q: Ethiopia\nA:", "Addis Ababa"), ("Q: Mali\nA:", "Bamako")])
    theta = torch.randn(model.cfg.n_layers, model.cfg.n_heads, generator=torch.Generator().manual_seed(0)).requires_grad_(True)
    whole = sequence_loss(model, ex, prefill=lambda last: injection_hooks(model, t, torch.sigmoid(theta), last))
    (gw,) = torch.autograd.grad(whole, theta)
    for name in ("packed", "hooked"):
        cached = SequenceCache(model, ex, backend=backend_for(model, name)).loss(range(len(ex)), torch.sigmoid(theta), t)
        (gc,) = torch.autograd.grad(cached, theta)
        assert abs(cached.item() - whole.item()) < 1e-5, name
        assert (gc - gw).abs().max() < 1e-4 * gw.abs().max(), name  # summation order (see the Gemma test above)
