"""Stage 3: greedy generation with SITE injected once, at prefill, and the KV cache.

The one intervention SITE makes is, at one position p of each row,

    z[b, p_b, h] <- (1 - alpha[l, h]) * z[b, p_b, h] + alpha[l, h] * t[l, h]

on ``blocks.{l}.attn.hook_z`` for every layer l (``gate.injection_hooks``).
Generation injects only during the prefill pass (at the last prompt token);
the generated tokens reuse the cached keys and values and are never injected.
Decode steps run on the model's backend (``backend.backend_for``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from ..gate import HookFactory, injection_hooks
from ..models.engines import Model
from ..tokens import check_context, fit_batches, generation_stop_ids, pad_id, pad_right
from .backend import PackedBackend, backend_for, last_logits


@torch.inference_mode()
def generate_greedy(
    model: Model,
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
    stop = stop_ids if stop_ids is not None else generation_stop_ids(model)
    lengths = [len(p) + max_new_tokens for p in prompts]  # the KV cache grows while decoding
    for idx in fit_batches(order, lengths, batch_size, model.cfg.n_heads):
        batch = [prompts[i] for i in idx]
        if use_cache and backend_for(model, backend).kv_cache:
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
    hooks = prefill_hooks(last) if prefill_hooks else []
    logits, decoder = backend_for(model, backend).prefill(tokens, mask, last, hooks, max_new)
    logits0 = logits
    gen: list[list[int]] = [[] for _ in batch]
    done = torch.zeros(len(batch), dtype=torch.bool)
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


@torch.inference_mode()
def generate_under_gates(
    model: Model,
    prompts: Sequence[Sequence[int]],
    t: Float[Tensor, "layer head_index d_head"],
    alphas: Sequence[Float[Tensor, "layer head_index"]],
    *,
    max_new_tokens: int = 20,
    batch_size: int = 64,
    finished: Callable[[int, list[int]], bool] | None = None,
) -> Iterator[tuple[list[list[int]], Float[Tensor, "batch d_vocab"]]]:
    """``generate_greedy`` with t injected at the last prompt token, once per gate in ``alphas`` (yielded in turn).

    On the packed backend every prompt's prefix (all but its last token) is computed once and
    shared by all the gates; each gate then runs the last token and the decode steps only.
    Elsewhere (the hooked backend) each gate is a ``generate_greedy`` call. Rows stop at a newline,
    and, on the packed backend, once ``finished(prompt index, tokens so far)`` is true (a caller
    that only needs to know whether an answer matches stops rows whose verdict is settled).
    """
    check_context(model, [len(p) for p in prompts], max_new_tokens)
    dev, dt = model.cfg.device, model.cfg.dtype
    t = t.to(device=dev, dtype=dt)
    backend = backend_for(model)
    if not isinstance(backend, PackedBackend) or min(len(p) for p in prompts) < 2:
        for a in alphas:
            yield generate_greedy(
                model,
                prompts,
                max_new_tokens=max_new_tokens,
                prefill_hooks=lambda last, a=a: injection_hooks(model, t, a.to(device=dev, dtype=dt), last),
                batch_size=batch_size,
            )
        return
    runner = backend.runner
    stop = generation_stop_ids(model)
    by_len: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        by_len.setdefault(len(p), []).append(i)
    groups = []  # (prompt indices, their prefix, their last tokens)
    for idx in by_len.values():
        for part in fit_batches(idx, [len(p) + max_new_tokens for p in prompts], batch_size, model.cfg.n_heads):
            toks = torch.tensor([list(prompts[i]) for i in part], device=dev)
            groups.append((part, backend.prefix(toks[:, :-1]), toks[:, -1]))
    for alpha in alphas:
        a = alpha.to(device=dev, dtype=dt)
        gen_all: list[list[int]] = [[] for _ in prompts]
        first = torch.empty(len(prompts), model.cfg.d_vocab)
        for part, prefix, last in groups:
            cache = runner.start_decode(prefix, max_new_tokens)
            logits = runner.decode(last, cache, a, t)  # the last prompt token, gated
            first[part] = logits.float().cpu()
            gen: list[list[int]] = [[] for _ in part]
            done = torch.zeros(len(part), dtype=torch.bool)
            nxt = logits.argmax(-1)
            live = torch.arange(len(part))  # rows still in ``cache``, in its row order
            for step in range(max_new_tokens):
                _finish(gen, nxt, done, stop)
                if finished is not None:
                    for j in range(len(part)):
                        if not done[j] and finished(part[j], gen[j]):
                            done[j] = True
                if bool(done.all()) or step == max_new_tokens - 1:
                    break
                running = ~done[live]
                if int(running.sum()) <= 0.75 * len(live):  # drop finished rows from the batch
                    keep = running.nonzero()[:, 0]
                    cache, live = cache.select(keep.to(cache.pos.device)), live[keep]
                out = nxt.clone()
                out[live] = runner.decode(nxt[live], cache).argmax(-1)
                nxt = out
            for j, i in enumerate(part):
                gen_all[i] = gen[j]
        yield gen_all, first
