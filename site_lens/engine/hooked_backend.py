"""The reference backend: the hooked model itself against a frozen TransformerLens KV cache, every hook firing.

Also the hooked model's forwards at chosen positions (``logits_at``, ``last_logits``), which unembed
only those positions, and its prefill into a new TransformerLens cache for generation.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache
from transformer_lens.utilities import get_act_name

from ..gate import Hooks, Injection
from ..models.engines import is_bridge
from ..types import Model
from .bridge_backend import attached, logits_at_positions
from .packed import ResidEdits
from .prefix import Prefix, check_rows


def logits_at(
    model: Model,
    tokens: Int[Tensor, "batch pos"],
    positions: Int[Tensor, "batch width"],
    *,
    hooks: Hooks = (),
    attention_mask: Int[Tensor, "batch pos"] | None = None,
    past_kv_cache: TransformerLensKeyValueCache | None = None,
) -> Float[Tensor, "batch width d_vocab"]:
    """Logits at ``positions`` of each row through the hooked model, unembedding only those positions.

    On a TransformerBridge the native model unembeds every position (no KV cache is taken).
    """
    if is_bridge(model):
        if past_kv_cache is not None:
            raise ValueError("a TransformerBridge takes no TransformerLens KV cache")
        with attached(model, list(hooks)):
            return logits_at_positions(model, tokens, positions.to(tokens.device), attention_mask=attention_mask)
    with model.hooks(fwd_hooks=list(hooks)):
        resid = model(
            tokens, stop_at_layer=model.cfg.n_layers, attention_mask=attention_mask, past_kv_cache=past_kv_cache
        )  # (batch, pos, d_model)
        rows = torch.arange(tokens.shape[0], device=resid.device)[:, None]
        r = resid[rows, positions]  # (batch, width, d_model)
        if model.cfg.normalization_type is not None:
            r = model.ln_final(r)
        logits = model.unembed(r)  # (batch, width, d_vocab)
    cap = getattr(model.cfg, "output_logits_soft_cap", -1.0) or -1.0
    if cap > 0:
        logits = cap * torch.tanh(logits / cap)
    return logits


def last_logits(
    model: Model,
    tokens: Int[Tensor, "batch pos"],
    last: Int[Tensor, " batch"],
    *,
    hooks: Hooks = (),
    attention_mask: Int[Tensor, "batch pos"] | None = None,
    past_kv_cache: TransformerLensKeyValueCache | None = None,
) -> Float[Tensor, "batch d_vocab"]:
    """Logits at one position per row through the hooked model, without unembedding every position."""
    return logits_at(
        model, tokens, last[:, None], hooks=list(hooks), attention_mask=attention_mask, past_kv_cache=past_kv_cache
    )[:, 0]


def hooked_prefill(
    model: Model, tokens: Tensor, mask: Tensor, last: Tensor, hooks: Hooks
) -> tuple[Tensor, TransformerLensKeyValueCache]:
    """Right-padded prompts through the hooked model into a new TransformerLens cache; logits at ``last``."""
    cache = TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, tokens.shape[0])
    return last_logits(model, tokens, last, hooks=hooks, attention_mask=mask, past_kv_cache=cache), cache


class HookedBackend:
    """The reference: the hooked model against a frozen TransformerLens KV cache; every hook fires."""

    name = "hooked"
    kv_cache = True  # generation prefills a TransformerLens cache and decodes against it

    def __init__(self, model: Model, reason: str = ""):
        self.model, self.reason = model, reason

    @torch.no_grad()  # not inference_mode: these tensors enter autograd graphs later
    def prefix(self, tokens: Int[Tensor, "batch pos"]) -> Prefix:
        """Keys and values of equal-length prompt prefixes (TransformerLens's layout, unrotated)."""
        cache = TransformerLensKeyValueCache.init_cache(self.model.cfg, self.model.cfg.device, tokens.shape[0])
        self.model(tokens, attention_mask=torch.ones_like(tokens), past_kv_cache=cache, return_type=None)
        # (batch, pos, kv_head, d_head) stored as (batch, kv_head, pos, d_head) views, the Prefix layout
        return Prefix(
            [e.past_keys.transpose(1, 2) for e in cache.entries], [e.past_values.transpose(1, 2) for e in cache.entries]
        )

    def frozen_cache(self, prefix: Prefix, batch: int) -> TransformerLensKeyValueCache:
        """A frozen TransformerLens cache holding ``prefix`` for ``batch`` rows (later tokens attend to it)."""
        model = self.model
        cache = TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, batch)
        for entry, k, v in zip(cache.entries, prefix.keys, prefix.values):
            entry.past_keys = k.transpose(1, 2).expand(batch, -1, -1, -1)
            entry.past_values = v.transpose(1, 2).expand(batch, -1, -1, -1)
        cache.previous_attention_mask = torch.ones((batch, prefix.length), dtype=torch.long, device=model.cfg.device)
        cache.freeze()
        return cache

    def logits(
        self,
        tokens: Int[Tensor, " batch"],
        prefix: Prefix,
        alpha: Float[Tensor, "*arows layer head_index"] | None = None,
        t: Float[Tensor, "*trows layer head_index d_head"] | None = None,
        resid_edits: ResidEdits | None = None,
    ) -> Float[Tensor, "batch d_vocab"]:
        """Logits of the token after each row's prefix (see ``LastToken.logits`` for the arguments)."""
        B = tokens.shape[0]
        check_rows(B, prefix, alpha)
        hooks: Hooks = []
        if alpha is not None and t is not None:  # the new token is the last prompt token
            hooks += Injection(t, alpha, at=prefix.length).hooks(self.model, start=prefix.length)
        for layer, edit in (resid_edits or {}).items():
            hooks.append((get_act_name("resid_pre", layer), lambda r, hook, edit=edit: edit(r[:, 0])[:, None]))
        zero = torch.zeros(B, dtype=torch.long, device=tokens.device)
        one = tokens[:, None]  # (batch, 1)
        cache = self.frozen_cache(prefix, B)
        return last_logits(self.model, one, zero, hooks=hooks, attention_mask=torch.ones_like(one), past_kv_cache=cache)

    def span_logits(
        self,
        tokens: Int[Tensor, "batch n"],
        prefix: Prefix,
        alpha: Float[Tensor, "*arows layer head_index"] | None = None,
        t: Float[Tensor, "*trows layer head_index d_head"] | None = None,
    ) -> Float[Tensor, "batch n d_vocab"]:
        """Logits after each of n tokens following each row's prefix, the gate at the first (``LastToken.span_logits``)."""
        B = tokens.shape[0]
        check_rows(B, prefix, alpha, "spans")
        hooks = [] if alpha is None or t is None else Injection(t, alpha, prefix.length).hooks(self.model, prefix.length)
        cache = self.frozen_cache(prefix, B)
        return self.model.run_with_hooks(
            tokens, attention_mask=torch.ones_like(tokens), past_kv_cache=cache, fwd_hooks=hooks
        )

    def run(self, tokens: Int[Tensor, "batch n"], prefix: Prefix, hooks: Hooks) -> Float[Tensor, "batch n d_vocab"]:
        """Logits of n tokens after each row's prefix, with ``hooks`` (positions counted from the first new token)."""
        B, n = tokens.shape
        positions = torch.arange(n, device=tokens.device).expand(B, -1)
        cache = self.frozen_cache(prefix, B)
        return logits_at(
            self.model, tokens, positions, hooks=hooks, attention_mask=torch.ones_like(tokens), past_kv_cache=cache
        )

    def prefill(
        self, tokens: Tensor, mask: Tensor, last: Tensor, hooks: Hooks, max_new: int
    ) -> tuple[Tensor, HookedDecoder | None]:
        """(logits at each row's last prompt token, a decoder for the ``max_new - 1`` steps after it, None where
        there are none): the hooked model fills TransformerLens's cache and decodes against it."""
        logits, cache = hooked_prefill(self.model, tokens, mask, last, hooks)
        return logits, (HookedDecoder(self.model, cache) if max_new > 1 else None)


class HookedDecoder:
    """One token per row through the hooked model and TransformerLens's cache."""

    def __init__(self, model: Model, cache: TransformerLensKeyValueCache):
        self.model, self.cache = model, cache

    def step(self, nxt: Int[Tensor, " batch"], done: Tensor) -> Int[Tensor, " batch"]:
        """Next greedy token of every row (finished rows too; the caller ignores them)."""
        one = nxt[:, None]
        zero = torch.zeros(len(nxt), dtype=torch.long, device=nxt.device)
        return last_logits(self.model, one, zero, attention_mask=torch.ones_like(one), past_kv_cache=self.cache).argmax(
            -1
        )
