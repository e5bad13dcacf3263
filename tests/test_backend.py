"""The last-token seam: both backends give the same numbers through one interface, and the gate is written once."""

import pytest
import torch
from test_lasttoken import VARIANTS, _variant_model

from site_lens.engine.backend import backend_for, last_logits, padded_window
from site_lens.engine.prompt_cache import PromptCache
from site_lens.gate import AlphaGate, injection_hooks
from site_lens.stages.generation import generate_greedy
from site_lens.tokens import Example, pad_right

PROMPTS = [[5, 9, 17, 3], [8, 8, 1, 30, 2, 11, 19], [3, 4, 5, 6], [12, 13, 14, 15, 16, 17, 18, 19, 20]]


def _both(model):
    packed = backend_for(model)
    assert packed.name == "packed", packed.reason
    return {"hooked": backend_for(model, "hooked"), "packed": packed}  # the engine's reference: every hook fires


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_backends_agree_through_the_seam(variant):
    model = _variant_model(variant)
    c = model.cfg
    gen = torch.Generator().manual_seed(1)
    t = torch.randn(c.n_layers, c.n_heads, c.d_head, generator=gen)
    alpha = torch.rand(c.n_layers, c.n_heads, generator=gen)
    per_t = torch.randn(len(PROMPTS), c.n_layers, c.n_heads, c.d_head, generator=gen)  # one t per prompt
    edit = {1: lambda r: r + 0.5}
    ex = [Example(p, 1) for p in PROMPTS]
    got = {}
    for name, b in _both(model).items():
        cache = PromptCache(model, ex, backend=b)
        out = {}
        for key, kw in {
            "plain": {},
            "gate": dict(alpha=alpha, t=t),
            "per-prompt t": dict(alpha=alpha, t=per_t),
        }.items():
            logits = torch.empty(len(ex), c.d_vocab)
            for idx, lg in cache.logits(range(len(ex)), **kw):
                logits[idx] = lg
            out[key] = logits
        out["edit"] = torch.stack([lg for _, lg in cache.logits([0], resid_edits=edit)])
        prefix = b.prefix(torch.tensor([PROMPTS[1][:-1]]))  # one prefix, many gates
        gates = torch.rand(3, c.n_layers, c.n_heads, generator=torch.Generator().manual_seed(2))
        out["many gates"] = b.logits(torch.full((3,), PROMPTS[1][-1]), prefix, gates, t)
        tokens, mask, last = pad_right(PROMPTS, 0)
        with torch.no_grad():  # generation's seam: the prefill (hooks fire there), then the backend's decode steps
            out["prefill"], dec = b.prefill(tokens, mask, last, injection_hooks(model, t, alpha, last), 4)
            nxt, steps = torch.tensor([1, 2, 3, 4]), []
            for _ in range(3):
                nxt = dec.step(nxt, torch.zeros(len(PROMPTS), dtype=torch.bool))
                steps.append(nxt)
        out["decode"] = torch.stack(steps).float()
        got[name] = out
    for key in got["hooked"]:
        assert torch.allclose(got["packed"][key], got["hooked"][key], atol=1e-5), (variant, key)
    # and the reference itself: whole prompts through the model with the gate at the last token (a bridge's
    # packed backend prefills and decodes on the bridge's own cache, so there its two backends share that path
    # and only this reference tests it)
    tokens, mask, last = pad_right(PROMPTS, 0)
    want = last_logits(model, tokens, last, hooks=injection_hooks(model, t, alpha, last), attention_mask=mask)
    assert torch.allclose(got["hooked"]["gate"], want, atol=1e-5)
    assert torch.allclose(got["hooked"]["prefill"], want, atol=1e-5)
    assert not torch.allclose(got["hooked"]["gate"], got["hooked"]["plain"], atol=1e-3)
    if padded_window(model) is None:  # else generation keeps rows of other lengths apart (test_lasttoken)
        assert torch.equal(got["hooked"]["decode"], _uncached_steps(model, t, alpha, [1, 2, 3, 4], 3))


def _uncached_steps(model, t, alpha, first: list[int], n: int) -> torch.Tensor:
    """Greedy steps after each prompt and its forced first token from generation's reference decoder: every step
    re-runs each whole row, the gate at the prompt's last token (so its keys and values carry the injection, as
    the cache's do)."""
    from site_lens.stages.generation import UncachedDecoder

    decoder = UncachedDecoder(model, PROMPTS, lambda last: injection_hooks(model, t, alpha, last))
    nxt, steps, running = torch.tensor(first), [], torch.zeros(len(PROMPTS), dtype=torch.bool)
    with torch.no_grad():
        for _ in range(n):
            nxt = decoder.step(nxt, running)
            steps.append(nxt)
    return torch.stack(steps).float()


def test_the_gate_formula_is_written_once(model, monkeypatch):
    """Patching AlphaGate.mix changes injection, the packed path, patching and generation alike."""
    from site_lens.analysis.patching import PatchData, patch_scores

    c = model.cfg
    t = torch.randn(c.n_layers, c.n_heads, c.d_head) * 3
    alpha = torch.full((c.n_layers, c.n_heads), 0.5)
    ex = [Example(p, 1) for p in PROMPTS]
    data = PatchData([list(p) for p in PROMPTS], torch.ones(len(PROMPTS), dtype=torch.long))
    mask = torch.ones(c.n_layers, c.n_heads, dtype=torch.bool)

    def run():
        tokens, m, last = pad_right(PROMPTS, 0)
        return {
            "hooks": last_logits(model, tokens, last, hooks=injection_hooks(model, t, alpha, last), attention_mask=m),
            "packed": torch.cat(
                [
                    lg
                    for _, lg in PromptCache(model, ex, backend=backend_for(model, "packed")).logits(range(4), alpha, t)
                ]
            ),
            "hooked": torch.cat(
                [
                    lg
                    for _, lg in PromptCache(model, ex, backend=backend_for(model, "hooked")).logits(range(4), alpha, t)
                ]
            ),
            "patching": patch_scores(model, data, t, [mask])[1],
            "generation": generate_greedy(
                model,
                PROMPTS,
                max_new_tokens=1,
                prefill_hooks=lambda last: injection_hooks(model, t, alpha, last),
                stop_ids=set(),
            )[1],
        }

    before = run()
    monkeypatch.setattr(AlphaGate, "mix", staticmethod(lambda z, tt, a: z + 2 * a * (tt - z)))  # another formula
    after = run()
    for key in before:
        assert not torch.allclose(before[key], after[key], atol=1e-4), key


def test_a_packed_snapshot_stays_whole_when_weights_change():
    """A live PromptCache keeps the weights it was built from; backend_for then hands out a new snapshot."""
    from test_lasttoken import _tiny

    from site_lens.config import SelectionConfig
    from site_lens.engine.backend import forget, use_backend
    from site_lens.stages.selection import AlphaTrainer

    model = _tiny()
    ex = [Example(p, 1) for p in PROMPTS]
    old = PromptCache(model, ex)
    before = torch.cat([lg for _, lg in old.logits(range(4))])
    with torch.no_grad():
        model.blocks[0].mlp.W_in.mul_(3.0)
    for kind in ("auto", "packed"):  # neither rebuilds the snapshot the old cache holds
        assert backend_for(model, kind) is not old.backend
    assert torch.allclose(torch.cat([lg for _, lg in old.logits(range(4))]), before)
    new = torch.cat([lg for _, lg in PromptCache(model, ex).logits(range(4))])
    ref = torch.cat([lg for _, lg in PromptCache(model, ex, backend=backend_for(model, "hooked")).logits(range(4))])
    assert torch.allclose(new, ref, atol=1e-5) and not torch.allclose(new, before, atol=1e-3)
    # a write through .data is not seen until forget()
    with torch.no_grad():
        model.blocks[0].mlp.W_in.data.mul_(0.5)
    stale = backend_for(model)
    forget(model)
    assert backend_for(model) is not stale
    # use_backend reaches SITE's training too ('auto' in its config defers to it)
    use_backend(model, "hooked")
    try:
        reference = backend_for(model, "hooked").name  # "hooked", or "bridge" (a bridge's own forward)
        assert AlphaTrainer(model, torch.zeros(2, 4, 8), SelectionConfig()).backend().name == reference != "packed"
    finally:
        use_backend(model, "auto")
