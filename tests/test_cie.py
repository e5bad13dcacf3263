import torch

from site_lens.cie import (
    alpha_cie_correlation,
    causal_indirect_effect,
    last_token_batches,
    run_last_token,
    shuffled_label_prompts,
)
from site_lens.embeddings import build_task_embedding
from site_lens.inject import encode, last_logits, pad_id, pad_right
from site_lens.tasks import load_task


def test_cached_last_token_matches_full_forward(model):
    prompts = ["Q: a\nA:", "Q: hello\nA:", "Q: xy\nA: z\n\nQ: b\nA:"]
    toks = encode(model, prompts)
    batches = last_token_batches(model, toks, [1, 2, 3], batch_size=2)
    tokens, mask, last = pad_right(toks, pad_id(model))
    full = last_logits(model, tokens, last, attention_mask=mask)
    got = torch.empty_like(full)
    for b in batches:
        got[b.index] = run_last_token(model, b)
    assert torch.allclose(got, full, atol=1e-4)


def test_shuffled_label_prompts_keep_labels_and_shots():
    task = load_task("antonym")
    pairs = shuffled_label_prompts(task, n_prompts=4, n_shots=3, seed=1)
    assert len(pairs) == 4
    for prompt, answer in pairs:
        assert prompt.count("Q:") == 4 and prompt.endswith("A:")
        assert answer in {y for _, y in task.valid}


def test_cie_shape_and_zero_when_t_is_the_corrupted_mean(model):
    task = load_task("antonym")
    pairs = shuffled_label_prompts(task, n_prompts=1, n_shots=2, seed=0)
    # t equal to the corrupted prompt's own z: patching changes nothing, so CIE = 0
    t = build_task_embedding(model, [p for p, _ in pairs])
    cie = causal_indirect_effect(model, pairs, t)
    assert cie.shape == (model.cfg.n_layers, model.cfg.n_heads)
    assert cie.abs().max() < 1e-5


def test_cie_nonzero_for_other_embedding(model):
    task = load_task("antonym")
    t = torch.randn(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head) * 3
    cie = causal_indirect_effect(model, task, t, n_prompts=3, n_shots=2)
    assert cie.abs().max() > 0
    stats = alpha_cie_correlation(torch.rand(model.cfg.n_layers, model.cfg.n_heads), cie)
    assert set(stats) == {"pearson", "spearman", "n_heads"} and -1 <= stats["spearman"] <= 1


def test_packed_cie_equals_hooked_cie(model):
    from site_lens.cie import _cie_hooked, _cie_packed, _prompts_and_targets

    task = load_task("antonym")
    t = torch.randn(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head) * 3
    tokens, targets = _prompts_and_targets(model, task, 4, 2, 0)
    with torch.inference_mode():
        hooked = _cie_hooked(model, tokens, targets, t, batch_size=3)
        packed = _cie_packed(model, tokens, targets, t, rows_per_call=3)  # several calls per prompt
    assert torch.allclose(hooked, packed, atol=1e-6), (hooked - packed).abs().max()
    assert hooked.abs().max() > 1e-4


def test_cie_falls_back_to_hooks_on_unsupported_models():
    from helpers import tiny

    ln = tiny(normalization_type="LN", final_rms=False)
    task = load_task("antonym")
    t = torch.randn(ln.cfg.n_layers, ln.cfg.n_heads, ln.cfg.d_head) * 3
    cie = causal_indirect_effect(ln, task, t, n_prompts=2, n_shots=2)
    assert cie.shape == (ln.cfg.n_layers, ln.cfg.n_heads) and cie.abs().max() > 0
