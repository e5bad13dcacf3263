"""Stage 3: greedy generation with SITE injected once, at prefill, and the KV cache.

The one intervention SITE makes is, at one position p of each row,

    z[b, p_b, h] <- (1 - alpha[l, h]) * z[b, p_b, h] + alpha[l, h] * t[l, h]

on ``blocks.{l}.attn.hook_z`` for every layer l (``gate.injection_hooks``).
Generation injects only during the prefill pass (at the last prompt token);
the generated tokens reuse the cached keys and values and are never injected.
Decode steps run on the model's backend (``backend.backend_for``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor
from transformer_lens import HookedTransformer
from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache

from .backend import backend_for, last_logits
from .gate import HookFactory
from .tokens import check_context, fit_batches, newline_ids, pad_id, pad_right


@torch.inference_mode()
def generate_greedy(
    model: HookedTransformer,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int = 20,
    prefill_hooks: HookFactory | None = None,
    stop_ids: set[int] | None = None,
    batch_size: int = 16,
    use_cache: bool = True,
    backend: str | None = None,
) -> tuple[list[list[int]], Float[Tensor, "batch d_vocab"]]:
    """Greedy continuation of token prompts; returns (new tokens per prompt, first-step logits).

    ``prefill_hooks(last)`` gives the hooks for the prompt pass (``last`` holds
    each row's last prompt index): with the KV cache they run once, at prefill;
    without it (the reference path) they run on every full re-forward, always at
    those same absolute positions. Rows stop at any of ``stop_ids``. Prompts are
    sorted by length and right-padded; an explicit attention mask gives the
    rotary positions and masks the pads, so batching does not change results.
    With the cache, steps after the first run on the model's backend
    (``backend.backend_for``; ``backend="hooked"`` forces the hooked model, as do
    hooks attached while decoding). Tests check the packed, hooked and uncached
    paths give the same tokens.
    """
    check_context(model, [len(p) for p in prompts], max_new_tokens)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    outs: list[list[int]] = [[] for _ in prompts]
    first = torch.empty(len(prompts), model.cfg.d_vocab)
    stop = stop_ids if stop_ids is not None else newline_ids(model) | {pad_id(model)}
    lengths = [len(p) + max_new_tokens for p in prompts]  # the KV cache grows while decoding
    for idx in fit_batches(order, lengths, batch_size, model.cfg.n_heads):
        batch = [prompts[i] for i in idx]
        if use_cache:
            gen, logits0 = _generate_cached(model, batch, max_new_tokens, prefill_hooks, stop, backend)
        else:
            gen, logits0 = _generate_uncached(model, batch, max_new_tokens, prefill_hooks, stop)
        for j, i in enumerate(idx):
            outs[i] = gen[j]
            first[i] = logits0[j].float().cpu()
    return outs, first


def _finish(gen: list[list[int]], nxt: Tensor, done: Tensor, stop: set[int]) -> None:
    for j, tok in enumerate(nxt.tolist()):
        if not done[j]:
            gen[j].append(tok)
            if tok in stop:
                done[j] = True


def _generate_cached(model, batch, max_new, prefill_hooks, stop, backend=None):
    device = model.cfg.device
    tokens, mask, last = pad_right(batch, pad_id(model), device)
    cache = TransformerLensKeyValueCache.init_cache(model.cfg, device, len(batch))
    hooks = prefill_hooks(last) if prefill_hooks else []
    logits = last_logits(model, tokens, last, hooks=hooks, attention_mask=mask, past_kv_cache=cache)
    logits0 = logits
    gen: list[list[int]] = [[] for _ in batch]
    done = torch.zeros(len(batch), dtype=torch.bool)
    decoder = backend_for(model, backend).decoder(cache, mask, max_new) if max_new > 1 else None
    nxt = logits.argmax(-1)  # (batch,)
    for step in range(max_new):
        _finish(gen, nxt, done, stop)
        if bool(done.all()) or step == max_new - 1:
            break
        assert decoder is not None
        nxt = decoder.step(nxt, done)
    return gen, logits0


def _generate_uncached(model, batch, max_new, prefill_hooks, stop):
    """Reference path: re-run the whole sequence every step, injecting at the same positions."""
    device = model.cfg.device
    seqs = [list(s) for s in batch]
    _, _, last0 = pad_right(seqs, pad_id(model), device)
    gen: list[list[int]] = [[] for _ in batch]
    done = torch.zeros(len(batch), dtype=torch.bool)
    logits0 = None
    for step in range(max_new):
        tokens, mask, last = pad_right(seqs, pad_id(model), device)
        hooks = prefill_hooks(last0) if prefill_hooks else []
        logits = last_logits(model, tokens, last, hooks=hooks, attention_mask=mask)
        if logits0 is None:
            logits0 = logits
        nxt = logits.argmax(-1)
        _finish(gen, nxt, done, stop)
        if bool(done.all()):
            break
        for j in range(len(seqs)):
            seqs[j].append(int(nxt[j]))
    return gen, logits0
