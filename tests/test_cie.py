import pytest
import torch

from site_lens.analysis.cie import alpha_cie_correlation, causal_indirect_effect, shuffled_label_prompts
from site_lens.engine.backend import backend_for, last_logits, use_backend
from site_lens.engine.prompt_cache import PromptCache
from site_lens.stages.embeddings import build_task_embedding
from site_lens.tasks import load_task
from site_lens.tokens import Example, encode, pad_id, pad_right


def test_cached_last_token_matches_full_forward(model):
    prompts = ["Q: a\nA:", "Q: hello\nA:", "Q: xy\nA: z\n\nQ: b\nA:", "Q: b\nA:"]
    toks = encode(model, prompts)
    tokens, mask, last = pad_right(toks, pad_id(model))
    full = last_logits(model, tokens, last, attention_mask=mask)
    for kind in ("hooked", "packed"):
        use_backend(model, kind)
        try:
            cache = PromptCache(model, [Example(t, 1) for t in toks], batch_size=1)
        finally:
            use_backend(model, "auto")
        assert cache.backend.name == backend_for(model, kind).name  # "hooked": the engine's reference (a bridge's own)
        got = torch.empty_like(full)
        for idx, logits in cache.logits([3, 1, 0, 2]):
            got[idx] = logits
        assert torch.allclose(got, full, atol=1e-4), kind


def test_shuffled_label_prompts_keep_labels_and_shots():
    task = load_task("opposites")
    pairs = shuffled_label_prompts(task, n_prompts=4, n_shots=3, seed=1)
    assert len(pairs) == 4
    for prompt, answer in pairs:
        assert prompt.count("Q:") == 4 and prompt.endswith("A:")
        assert answer in {y for _, y in task.valid}


def test_cie_shape_and_zero_when_t_is_the_corrupted_mean(model):
    task = load_task("opposites")
    pairs = shuffled_label_prompts(task, n_prompts=1, n_shots=2, seed=0)
    # t equal to the corrupted prompt's own z: patching changes nothing, so CIE = 0
    t = build_task_embedding(model, [p for p, _ in pairs])
    cie = causal_indirect_effect(model, pairs, t)
    assert cie.shape == (model.cfg.n_layers, model.cfg.n_heads)
    assert cie.abs().max() < 1e-5


def _by_definition(model, task, t, n_prompts, n_shots, layer, head):
    """CIE of one head from whole prompts: mean of P(y | head patched to t) - P(y | corrupted)."""
    from site_lens.analysis.cie import _prompts_and_targets
    from site_lens.gate import injection_hooks

    tokens, targets = _prompts_and_targets(model, task, n_prompts, n_shots, 0)
    alpha = torch.zeros(model.cfg.n_layers, model.cfg.n_heads)
    alpha[layer, head] = 1
    rise = 0.0
    for toks, y in zip(tokens, targets):
        ids = torch.tensor([toks])
        last = torch.tensor([len(toks) - 1])
        base = last_logits(model, ids, last).softmax(-1)[0, y]
        patched = last_logits(model, ids, last, hooks=injection_hooks(model, t, alpha, last)).softmax(-1)[0, y]
        rise += float(patched - base) / len(tokens)
    return rise


def test_cie_of_a_task_is_cie_of_its_shuffled_label_prompts(model):
    task = load_task("opposites")
    t = torch.randn(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head) * 3
    cie = causal_indirect_effect(model, task, t, n_prompts=3, n_shots=2, seed=5)
    pairs = shuffled_label_prompts(task, n_prompts=3, n_shots=2, seed=5)
    assert torch.equal(cie, causal_indirect_effect(model, pairs, t))
    assert cie.abs().max() > 1e-4
    assert not torch.equal(cie, causal_indirect_effect(model, task, t, n_prompts=3, n_shots=2, seed=6))


def test_alpha_cie_correlation():
    cie = torch.tensor([[0.3, -0.1, 0.2], [0.0, 0.5, -0.4]])
    assert alpha_cie_correlation(cie * 2 + 1, cie) == {"pearson": pytest.approx(1.0), "spearman": 1.0, "n_heads": 6}
    back = alpha_cie_correlation(-cie, cie)
    assert back["pearson"] == pytest.approx(-1.0) and back["spearman"] == -1.0
    alpha = torch.tensor([[0.9, 0.1, 0.2], [0.3, 0.8, 0.0]])  # cie's order with two pairs of neighbours swapped
    assert alpha_cie_correlation(alpha, cie)["spearman"] == pytest.approx(1 - 6 * 4 / (6 * 35))  # sum of d^2 = 4


def test_packed_cie_equals_hooked_cie_and_one_head_at_a_time(model):
    task = load_task("opposites")
    t = torch.randn(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head) * 3
    assert backend_for(model).name == "packed"  # so the comparison below is packed against hooked
    packed = causal_indirect_effect(model, task, t, n_prompts=4, n_shots=2, rows_per_call=3)  # several calls a prompt
    use_backend(model, "hooked")
    try:
        hooked = causal_indirect_effect(model, task, t, n_prompts=4, n_shots=2)
    finally:
        use_backend(model, "auto")
    assert torch.allclose(hooked, packed, atol=1e-6), (hooked - packed).abs().max()
    assert hooked.abs().max() > 1e-4
    # the definition, head by head on whole prompts: P(y | head patched to t) - P(y | corrupted)
    layer, head = divmod(int(packed.abs().argmax()), model.cfg.n_heads)
    assert abs(_by_definition(model, task, t, 4, 2, layer, head) - float(packed[layer, head])) < 1e-5


def test_cie_falls_back_to_hooks_on_unsupported_models():
    from helpers import tiny

    ln = tiny(normalization_type="LN", final_rms=False)
    task = load_task("opposites")
    t = torch.randn(ln.cfg.n_layers, ln.cfg.n_heads, ln.cfg.d_head) * 3
    assert backend_for(ln).name == backend_for(ln, "hooked").name  # the engine's reference, not the packed one
    cie = causal_indirect_effect(ln, task, t, n_prompts=2, n_shots=2)
    assert cie.shape == (ln.cfg.n_layers, ln.cfg.n_heads) and cie.abs().max() > 1e-4
    for layer in range(ln.cfg.n_layers):  # every head, by the definition
        for head in range(ln.cfg.n_heads):
            assert abs(_by_definition(ln, task, t, 2, 2, layer, head) - float(cie[layer, head])) < 1e-5, (layer, head)
