import torch

from site_lens.gate import z_names
from site_lens.stages.embeddings import build_task_embedding, last_token_z
from site_lens.tokens import encode


def test_stage1_equals_hand_computation(model):
    prompts = ["Q: a\nA: b\n\nQ: c\nA:", "Q: hello\nA: world\n\nQ: x\nA:", "Q: zz\nA:"]
    t = build_task_embedding(model, prompts, batch_size=2)
    hand = []
    for p in prompts:
        tokens = torch.tensor([encode(model, [p])[0]])
        _, cache = model.run_with_cache(tokens, names_filter=z_names(model))
        hand.append(torch.stack([cache[n][0, -1] for n in z_names(model)]))  # (layer, head, d_head)
    expected = torch.stack(hand).mean(0)
    assert t.shape == (model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)
    assert torch.allclose(t, expected, atol=1e-6)


def test_batch_size_does_not_change_embedding(model):
    prompts = [f"Q: {w}\nA:" for w in ["a", "bb", "ccc", "dddd", "e"]]
    assert torch.allclose(build_task_embedding(model, prompts, 1), build_task_embedding(model, prompts, 5), atol=1e-6)


def test_only_last_position_is_kept(model):
    # one vector per prompt, layer and head: each prompt's own hook_z at its last token, in the prompts' order
    prompts = ["Q: a long prompt indeed\nA:", "Q: b\nA:", "Q: medium one\nA:"]
    z = last_token_z(model, encode(model, prompts), batch_size=2)
    assert z.shape == (3, model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)
    for i, p in enumerate(prompts):
        _, cache = model.run_with_cache(torch.tensor(encode(model, [p])), names_filter=z_names(model))
        torch.testing.assert_close(z[i], torch.stack([cache[n][0, -1] for n in z_names(model)]), atol=1e-6, rtol=1e-5)


def test_attention_budget_does_not_change_embedding(model, monkeypatch):
    from site_lens import tokens as inject

    prompts = ["Q: a\nA: b\n\nQ: c\nA:", "Q: dd\nA: ee\n\nQ: ffff gg\nA:", "Q: x\nA:"]
    full = build_task_embedding(model, prompts, batch_size=10)
    monkeypatch.setattr(inject, "ATTN_CELLS", 1)
    assert torch.allclose(build_task_embedding(model, prompts, batch_size=10), full, atol=1e-5)
