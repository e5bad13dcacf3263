"""The TransformerBridge's side of the last-token seam: prefixes in a Hugging Face KV cache, or as tokens.

The bridge runs the native transformers model with TransformerLens's hooks. Its
attention reads a cache handed to it as ``layer_past`` (TransformerLens's own
fallback name; the native ``past_key_values`` is not passed down to it by
transformers 5), and takes a 4-D additive mask as given; so a prefix's keys and
values are computed once into a ``DynamicCache`` and each call runs only the
new tokens, at explicit positions, under a mask built here from the key
positions (causal, padding, and each layer type's sliding window).

``BridgeBackend`` checks that path once per model on a probe prompt against
the full forward (a gated last token, a span, and a padded prefill with one
decode step); where it disagrees it keeps prefixes as tokens and re-runs them
with the last token(s), and generates without a cache. Both fire every hook.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor
from transformer_lens.utilities import get_act_name

from ..gate import Hooks, Injection
from ..models.engines import weights_stamp
from .prefix import Prefix, check_rows
from .probe import agreement, probe_inputs, relative_error, tolerance

log = logging.getLogger(__name__)

_CACHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # bridge -> (weights stamp, cached path agrees)
_POINTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # bridge -> {hook name or alias: HookPoint}


@contextlib.contextmanager
def attached(model, hooks: Hooks) -> Iterator[None]:
    """``model.hooks(fwd_hooks=hooks)`` for a bridge, with its hook points looked up once per model.

    The bridge's own ``hooks`` rebuilds its alias table for every hook it adds (on a 30-layer
    model, more than a training step's forward); this adds and removes the same hooks, at
    their own context level, through the hook points themselves.
    """
    points = hook_points(model)
    if any(not isinstance(name, str) or name not in points for name, _ in hooks):  # filters: the bridge's own way
        with model.hooks(fwd_hooks=list(hooks)):
            yield
        return
    level = model.context_level + 1
    added = []
    try:
        model.context_level = level
        for name, fn in hooks:
            points[name].add_hook(fn, dir="fwd", level=level)
            added.append(points[name])
        yield
    finally:
        for point in added:
            point.remove_hooks(dir="fwd", level=level)
        model.context_level = level - 1


def _windows(config: Any) -> dict[str, int | None] | int | None:
    """Each layer type's sliding window ({type: window or None}), one window for every layer, or None."""
    types = list(getattr(config, "layer_types", None) or [])
    window = getattr(config, "sliding_window", None)
    if types:
        return {kind: (window if "sliding" in kind else None) for kind in set(types)}
    return window if getattr(config, "use_sliding_window", True) and isinstance(window, int) else None


def _mask(k_pos: Tensor, valid: Tensor, q_pos: Tensor, window: int | None, dtype: torch.dtype) -> Tensor:
    """Additive mask (batch, 1, n, L): the last n of the L key slots are the queries; causal by slot,
    valid keys only, and keys within ``window`` positions of the query."""
    B, L = k_pos.shape
    n = q_pos.shape[1]
    slot_q = torch.arange(L - n, L, device=k_pos.device)[:, None]  # (n, 1)
    slot_k = torch.arange(L, device=k_pos.device)[None]  # (1, L)
    ok = (slot_k <= slot_q)[None] & valid[:, None, :]  # (batch, n, L)
    if window is not None:
        ok = ok & (k_pos[:, None, :] > q_pos[:, :, None] - window)
    ok = ok | (slot_k == slot_q)[None]  # its own slot: a pad's row is never all masked (no NaN)
    out = torch.zeros(B, 1, n, L, dtype=dtype, device=k_pos.device)
    return out.masked_fill_(~ok[:, None], torch.finfo(dtype).min)


def attention_masks(model, k_pos: Tensor, valid: Tensor, q_pos: Tensor) -> Tensor | dict[str, Tensor]:
    """The mask (or one per layer type, as transformers takes them) for queries at ``q_pos`` over keys at ``k_pos``."""
    dtype = model.cfg.dtype if model.cfg.dtype.is_floating_point else torch.float32
    windows = _windows(model.original_model.config)
    if isinstance(windows, dict):
        return {kind: _mask(k_pos, valid, q_pos, w, dtype) for kind, w in windows.items()}
    return _mask(k_pos, valid, q_pos, windows, dtype)


def keeps_logits(model) -> bool:
    """Whether the transformers model takes ``logits_to_keep`` (unembedding only the positions asked for)."""
    import inspect

    return "logits_to_keep" in inspect.signature(model.original_model.forward).parameters


def logits_at_positions(model, tokens: Tensor, positions: Tensor, **kwargs: Any) -> Tensor:
    """The bridge's logits at ``positions`` (batch, width) of each row, unembedding only the positions read."""
    rows = torch.arange(tokens.shape[0], device=tokens.device)[:, None]
    if not keeps_logits(model):
        return model(tokens, **kwargs)[rows, positions]
    keep = torch.unique(positions)  # sorted
    logits = model(tokens, logits_to_keep=keep, **kwargs)  # (batch, len(keep), d_vocab)
    return logits[rows, torch.searchsorted(keep, positions.contiguous())]


def _cache_of(prefix: Prefix, batch: int):
    from transformers import DynamicCache

    cache = DynamicCache()
    for i, (k, v) in enumerate(zip(prefix.keys, prefix.values)):
        cache.update(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1), i)
    return cache


def _edit_at(resid: Tensor, hook, edit: Callable[[Tensor], Tensor], pos: int) -> Tensor:
    """``edit`` applied to every row's residual at position ``pos``."""
    out = resid.clone()
    out[:, pos] = edit(resid[:, pos])
    return out


class BridgeBackend:
    """A TransformerBridge: prefixes in a KV cache when the probe agrees, else as tokens; every hook fires."""

    name = "bridge"

    def __init__(self, model, reason: str = "", cached: bool | None = None):
        self.model = model
        self.cached = cache_agrees(model) if cached is None else cached
        self.kv_cache = self.cached  # generation prefills a cache and decodes against it
        how = "KV cache" if self.cached else "prefix re-run (the cached path disagreed on the probe)"
        self.reason = f"{reason}; {how}" if reason else how

    # ------------------------------------------------------------ prefixes

    @torch.no_grad()  # not inference_mode: these tensors enter autograd graphs later
    def prefix(self, tokens: Int[Tensor, "batch pos"]) -> Prefix:
        """Keys and values of equal-length prompt prefixes (or the tokens themselves, uncached)."""
        if not self.cached:
            return Prefix([], [], tokens)
        from transformers import DynamicCache

        B, P = tokens.shape
        cache = DynamicCache()
        pos = torch.arange(P, device=tokens.device).expand(B, -1)
        valid = torch.ones(B, P, dtype=torch.bool, device=tokens.device)
        logits_at_positions(
            self.model,
            tokens,
            pos[:, -1:],
            layer_past=cache,
            position_ids=pos,
            attention_mask=attention_masks(self.model, pos, valid, pos),
        )
        return Prefix([layer.keys for layer in cache.layers], [layer.values for layer in cache.layers])

    def run(self, tokens: Int[Tensor, "batch n"], prefix: Prefix, hooks: Hooks) -> Tensor:
        """Logits of n tokens after each row's prefix, with ``hooks`` (positions counted from the first new token)."""
        B, n = tokens.shape
        P = prefix.length
        if not self.cached:
            full = torch.cat((prefix.tokens.expand(B, -1), tokens), 1)  # (batch, P + n)
            shifted = [(name, _shifted(fn, P, n)) for name, fn in hooks]
            positions = torch.arange(P, P + n, device=tokens.device).expand(B, -1)
            with attached(self.model, shifted):
                return logits_at_positions(self.model, full, positions)  # (batch, n, d_vocab)
        dev = tokens.device
        k_pos = torch.arange(P + n, device=dev).expand(B, -1)
        q_pos = k_pos[:, P:]
        valid = torch.ones(B, P + n, dtype=torch.bool, device=dev)
        with attached(self.model, hooks):
            return self.model(
                tokens,
                layer_past=_cache_of(prefix, B),
                position_ids=q_pos,
                attention_mask=attention_masks(self.model, k_pos, valid, q_pos),
            )

    def logits(self, tokens, prefix, alpha=None, t=None, resid_edits=None) -> Tensor:
        """Logits of the token after each row's prefix (see ``LastToken.logits`` for the arguments)."""
        check_rows(tokens.shape[0], prefix, alpha)
        hooks: Hooks = []
        if alpha is not None and t is not None:  # the new token is the last prompt token
            hooks += Injection(t, alpha, at=prefix.length).hooks(self.model, start=prefix.length)
        for layer, edit in (resid_edits or {}).items():
            hooks.append((get_act_name("resid_pre", layer), partial(_edit_at, edit=edit, pos=0)))
        return self.run(tokens[:, None], prefix, hooks)[:, 0]

    def span_logits(self, tokens, prefix, alpha=None, t=None) -> Tensor:
        """Logits after each of n tokens following each row's prefix, the gate at the first (``LastToken.span_logits``)."""
        check_rows(tokens.shape[0], prefix, alpha, "spans")
        hooks = [] if alpha is None or t is None else Injection(t, alpha, prefix.length).hooks(self.model, prefix.length)
        return self.run(tokens, prefix, hooks)

    # ------------------------------------------------------------ generation

    @torch.no_grad()
    def prefill(self, tokens: Tensor, mask: Tensor, last: Tensor, hooks: Hooks, max_new: int):
        """(logits at each row's last prompt token, a decoder) for right-padded prompts; ``hooks`` fire here only."""
        from transformers import DynamicCache

        if not self.cached:
            raise ValueError("this bridge's KV-cache path disagreed with its full forward: generate without a cache")
        B, L = tokens.shape
        cache = DynamicCache()
        pos = torch.arange(L, device=tokens.device).expand(B, -1)
        valid = mask.bool()
        with attached(self.model, hooks):
            logits = logits_at_positions(
                self.model,
                tokens,
                last[:, None].to(tokens.device),
                layer_past=cache,
                position_ids=pos,
                attention_mask=attention_masks(self.model, pos, valid, pos),
            )[:, 0]
        return logits, (BridgeDecoder(self.model, cache, pos, valid, last + 1) if max_new > 1 else None)


def _shifted(fn: Callable, offset: int, n: int) -> Callable:
    """A hook written for the n new tokens' positions, run on the prefix and them together (positions + offset,
    negative ones counted from the end of the new tokens); a hook bound to no position (a persistent one:
    LoRA, (IA)3) is taken as it is."""
    inner = getattr(fn, "keywords", {})
    if isinstance(fn, partial) and "pos" in inner:
        pos = inner["pos"]
        pos = (pos + n if pos < 0 else pos) if isinstance(pos, int) else torch.where(pos < 0, pos + n, pos)
        return partial(fn.func, *fn.args, **{**inner, "pos": pos + offset})
    return fn  # a hook bound to no position acts on every position, the prefix's too, as it did there


class BridgeDecoder:
    """One token per row against the bridge's KV cache; finished rows are decoded too (the caller ignores them)."""

    def __init__(self, model, cache, k_pos: Tensor, valid: Tensor, next_pos: Tensor):
        self.model, self.cache = model, cache
        self.k_pos, self.valid, self.next_pos = k_pos, valid, next_pos.to(k_pos.device)

    @torch.no_grad()
    def step(self, nxt: Tensor, done: Tensor) -> Tensor:
        """Next greedy token of every row."""
        return self.logits(nxt).argmax(-1)

    def logits(self, nxt: Tensor) -> Tensor:
        """Logits after each row's token ``nxt`` (which joins the cache)."""
        q = self.next_pos[:, None]  # (batch, 1)
        self.k_pos = torch.cat((self.k_pos, q), 1)
        self.valid = torch.cat((self.valid, torch.ones_like(q, dtype=torch.bool)), 1)
        logits = self.model(
            nxt[:, None].to(q.device),
            layer_past=self.cache,
            position_ids=q,
            attention_mask=attention_masks(self.model, self.k_pos, self.valid, q),
        )
        self.next_pos = self.next_pos + 1
        return logits[:, -1]


# ---------------------------------------------------------------- the probe


@torch.no_grad()
def probe_error(model) -> float:
    """Max |cached - full forward| logit, relative to the largest, on a seeded prompt: a gated last token,
    a three-token span, and a padded prefill with one decode step."""
    tokens, alpha, t = probe_inputs(model, n=12, rows=2)
    n, dev, t = tokens.shape[1], tokens.device, 0.1 * t
    cached, full = BridgeBackend(model, cached=True), BridgeBackend(model, cached=False)
    err = agreement(cached, full, tokens, alpha, t)
    rel = relative_error
    lengths = torch.tensor([n - 4, n - 1], device=dev)  # right-padded rows of two lengths
    mask = (torch.arange(n - 1, device=dev)[None] < lengths[:, None]).long()
    first, decoder = cached.prefill(tokens[:, :-1], mask, lengths - 1, [], 2)
    nxt = torch.tensor([3, 5], device=dev)
    second = decoder.logits(nxt)
    for r in range(2):
        row = tokens[r : r + 1, : int(lengths[r])]
        err = max(err, rel(first[r], model(row)[0, -1]))
        err = max(err, rel(second[r], model(torch.cat((row, nxt[r].view(1, 1)), 1))[0, -1]))
    return err


def cache_agrees(model) -> bool:
    """Whether the KV-cache path agrees with the full forward on this bridge (checked once per weights).

    With hooks attached to the model the probe is not run (they would fire in it) and the
    re-run path, which is the full forward, is used for this call only.
    """
    stamp = weights_stamp(model)
    known = _CACHED.get(model)
    if known is not None and known[0] == stamp:
        return known[1]
    if any(hp.fwd_hooks or hp.bwd_hooks for hp in hook_points(model).values()):
        return False
    try:
        err = probe_error(model)
    except TypeError as e:  # an architecture whose attention takes no cache this way
        why = str(e).splitlines()[-1][-160:]  # the message can embed a whole module's repr
        log.warning("bridge: no KV-cache path for this architecture (%s); prefixes are re-run", why)
        err = float("inf")
    ok = err <= tolerance(model.cfg.dtype)
    if not ok and err != float("inf"):
        log.warning(
            "bridge: the KV-cache path differs from the full forward by %.1e on the probe; prefixes are re-run", err
        )
    _CACHED[model] = (stamp, ok)
    return ok


def hook_points(model) -> dict:
    """The bridge's hook points by name and alias, looked up once per model."""
    points = _POINTS.get(model)
    if points is None:
        points = _POINTS[model] = dict(model.hook_dict)
    return points


def forget(model) -> None:
    """Drop what is remembered about this bridge (its probe verdict and hook points)."""
    _CACHED.pop(model, None)
    _POINTS.pop(model, None)
