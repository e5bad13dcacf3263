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

from ..engine.backend import (
    Backend,
    Decoder,
    PackedBackend,
    PackedDecoder,
    backend_for,
    last_logits,
    padded_window,
)
from ..gate import HookFactory, Injection
from ..threads import adapt, adaptive_threads
from ..tokens import by_length, check_context, fit_batches, generation_stop_ids, pad_id, pad_right
from ..types import Model

Finished = Callable[[int, list[int]], bool]  # (row or prompt index, its tokens so far) -> stop that row


@adaptive_threads()
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
    finished: Finished | None = None,
) -> tuple[list[list[int]], Float[Tensor, "batch d_vocab"]]:
    """Greedy continuation of token prompts; returns (new tokens per prompt, first-step logits).

    ``prefill_hooks(last)`` gives the hooks for the prompt pass (``last`` holds
    each row's last prompt index): with the KV cache they run once, at prefill;
    without it (the reference path) they run on every full re-forward, always at
    those same absolute positions. Rows stop at any of ``stop_ids``, and once
    ``finished(prompt index, tokens so far)`` is true. Prompts are
    sorted by length and right-padded; an explicit attention mask gives the
    rotary positions and masks the pads, so batching does not change results
    (HookedTransformer's sliding windows count the pads: where one would reach
    a shorter row's own tokens, rows of other lengths are generated apart).
    With the cache, steps after the first run on the model's backend, chosen once
    per call (``backend.backend_for``; ``backend="hooked"`` forces the hooked
    model, as do hooks attached to the model). Tests check the packed, hooked and
    uncached paths give the same tokens.

    Example:
        >>> import torch
        >>> import site_lens as sl
        >>> model = sl.tiny_model()
        >>> new, logits = generate_greedy(model, [[1, 5, 7], [3, 5]], max_new_tokens=4, stop_ids=set())
        >>> [len(toks) for toks in new], logits.shape    # 4 new tokens per prompt; the first step's logits
        ([4, 4], torch.Size([2, 50]))
        >>> t = torch.randn(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)
        >>> alpha = torch.full((model.cfg.n_layers, model.cfg.n_heads), 0.5)
        >>> inject = lambda last: sl.injection_hooks(model, t, alpha, pos=last)  # at each prompt's last token
        >>> new, _ = generate_greedy(model, [[1, 5, 7], [3, 5]], max_new_tokens=4, prefill_hooks=inject)
        >>> len(new)
        2
    """
    check_context(model, [len(p) for p in prompts], max_new_tokens)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    outs: list[list[int]] = [[] for _ in prompts]
    first = torch.empty(len(prompts), model.cfg.d_vocab)
    stop = stop_ids if stop_ids is not None else generation_stop_ids(model)
    lengths = [len(p) + max_new_tokens for p in prompts]  # the KV cache grows while decoding
    chosen = backend_for(model, backend) if use_cache else None
    batches = fit_batches(order, lengths, batch_size, model.cfg.n_heads)
    window = padded_window(model) if chosen is not None and chosen.kv_cache else None
    for idx in _apart_where_pads_count(batches, prompts, max_new_tokens, window):
        adapt()
        batch = [prompts[i] for i in idx]
        settled = None if finished is None else (lambda j, toks, idx=idx: finished(idx[j], toks))
        if chosen is not None and chosen.kv_cache:
            gen, logits0 = _generate_cached(chosen, model, batch, max_new_tokens, prefill_hooks, stop, settled)
        else:
            gen, logits0 = _generate_uncached(model, batch, max_new_tokens, prefill_hooks, stop, settled)
        for j, i in enumerate(idx):
            outs[i] = gen[j]
            first[i] = logits0[j].float().cpu()
    return outs, first


def _apart_where_pads_count(
    batches: list[list[int]], prompts: Sequence[Sequence[int]], max_new: int, window: int | None
) -> Iterator[list[int]]:
    """The batches, each split into prompts of one length where a sliding window that counts pads (``window``)
    would reach past a shorter row's own tokens before its last new one: so every row decodes as it would alone."""
    for idx in batches:
        if window is None or max(len(prompts[i]) for i in idx) + max_new <= window:
            yield idx
        else:
            yield from ([idx[j] for j in same] for same in by_length([len(prompts[i]) for i in idx]).values())


class UncachedDecoder:
    """The reference decoder: every step re-runs each row's whole sequence (no KV cache), the prefill hooks at
    the same absolute positions each time."""

    def __init__(self, model: Model, batch: Sequence[Sequence[int]], prefill_hooks: HookFactory | None):
        self.model, self.seqs = model, [list(s) for s in batch]
        _, _, self.last0 = pad_right(self.seqs, pad_id(model), model.cfg.device)
        self.hooks = prefill_hooks

    def logits(self) -> Float[Tensor, "batch d_vocab"]:
        """Each row's logits after its sequence so far."""
        tokens, mask, last = pad_right(self.seqs, pad_id(self.model), self.model.cfg.device)
        hooks = self.hooks(self.last0) if self.hooks else []
        return last_logits(self.model, tokens, last, hooks=hooks, attention_mask=mask)

    def step(self, nxt: Tensor, done: Tensor) -> Tensor:
        """Append each row's token, then every row's next one (finished rows' are ignored by the loop)."""
        for seq, tok in zip(self.seqs, nxt.tolist()):
            seq.append(tok)
        return self.logits().argmax(-1)


def decode_greedy(
    decoder: Decoder | UncachedDecoder | None,
    logits: Float[Tensor, "batch d_vocab"],
    max_new: int,
    stop: set[int],
    finished: Finished | None = None,
) -> list[list[int]]:
    """Each row's greedy tokens from its first-step ``logits``, then ``decoder.step`` until every row has met a
    token of ``stop`` or ``finished(row, tokens so far)``, or has ``max_new`` tokens (``decoder``: None
    for ``max_new`` 1). The one decode loop of every generation, cached or not (``UncachedDecoder``)."""
    gen: list[list[int]] = [[] for _ in range(logits.shape[0])]
    done = torch.zeros(len(gen), dtype=torch.bool)
    nxt = logits.argmax(-1)  # (batch,)
    for step in range(max_new):
        _finish(gen, nxt, done, stop, finished)
        if bool(done.all()) or step == max_new - 1:
            break
        assert decoder is not None
        adapt()
        nxt = decoder.step(nxt, done)
    return gen


def _finish(gen: list[list[int]], nxt: Tensor, done: Tensor, stop: set[int], finished: Finished | None) -> None:
    """Append each running row's token; a row is done at a stop token or once ``finished`` says so."""
    for j, tok in enumerate(nxt.tolist()):
        if not done[j]:
            gen[j].append(tok)
            if tok in stop or (finished is not None and finished(j, gen[j])):
                done[j] = True


def _generate_cached(backend: Backend, model, batch, max_new, prefill_hooks, stop, finished=None):
    """Prefill on ``backend`` (the hooks fire there only), then its decode steps."""
    tokens, mask, last = pad_right(batch, pad_id(model), model.cfg.device)
    hooks = prefill_hooks(last) if prefill_hooks else []
    logits, decoder = backend.prefill(tokens, mask, last, hooks, max_new)
    return decode_greedy(decoder, logits, max_new, stop, finished), logits


def _generate_uncached(model, batch, max_new, prefill_hooks, stop, finished=None):
    """Reference path: the one decode loop over ``UncachedDecoder``."""
    decoder = UncachedDecoder(model, batch, prefill_hooks)
    logits = decoder.logits()
    return decode_greedy(decoder, logits, max_new, stop, finished), logits


@torch.inference_mode()
def generate_under_gates(
    model: Model,
    prompts: Sequence[Sequence[int]],
    t: Float[Tensor, "layer head_index d_head"],
    alphas: Sequence[Float[Tensor, "layer head_index"]],
    *,
    max_new_tokens: int = 20,
    batch_size: int = 64,
    finished: Finished | None = None,
) -> Iterator[tuple[list[list[int]], Float[Tensor, "batch d_vocab"]]]:
    """``generate_greedy`` with t injected at the last prompt token, once per gate in ``alphas`` (yielded in turn).

    On the packed backend every prompt's prefix (all but its last token) is computed once and
    shared by all the gates; each gate then runs the last token and the decode steps only.
    Elsewhere (the hooked backend) each gate is a ``generate_greedy`` call. Rows stop at the model's
    stop tokens (a newline), and once ``finished(prompt index, tokens so far)`` is true (a caller
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
                prefill_hooks=lambda last, a=a: Injection(t, a.to(device=dev, dtype=dt), at=last).hooks(model),
                batch_size=batch_size,
                finished=finished,
            )
        return
    runner = backend.runner
    stop = generation_stop_ids(model)
    groups = []  # (prompt indices, their prefix, their last tokens)
    for idx in by_length(len(p) for p in prompts).values():
        for part in fit_batches(idx, [len(p) + max_new_tokens for p in prompts], batch_size, model.cfg.n_heads):
            toks = torch.tensor([list(prompts[i]) for i in part], device=dev)
            groups.append((part, backend.prefix(toks[:, :-1]), toks[:, -1]))
    for alpha in alphas:
        a = alpha.to(device=dev, dtype=dt)
        gen: list[list[int]] = [[] for _ in prompts]
        first = torch.empty(len(prompts), model.cfg.d_vocab)
        for part, prefix, last in groups:
            cache = runner.start_decode(prefix, max_new_tokens)
            logits = runner.decode(last, cache, a, t)  # the last prompt token, gated
            first[part] = logits.float().cpu()
            settled = None if finished is None else (lambda j, toks, part=part: finished(part[j], toks))
            rows = decode_greedy(PackedDecoder(runner, cache, len(part)), logits, max_new_tokens, stop, settled)
            for j, i in enumerate(part):
                gen[i] = rows[j]
        yield gen, first
