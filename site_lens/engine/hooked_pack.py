"""The packed weights of a HookedTransformer (``packed_layer.PackedWeights``), and decoding from its KV cache.

``pack_hooked`` reads one ``PackedLayer`` per block (``packed_layer.pack_block``),
the embedding and the unembedding; prefixes come from TransformerLens's KV cache
(keys not yet rotated: ``LastToken.prefix`` rotates them), and the rotary tables
grow as TransformerLens grows its own. ``decode_from_hooked_cache`` lets packed
decode steps take over the cache a hooked prefill filled (stage 3 on the
HookedTransformer).
"""

from __future__ import annotations

import torch
from jaxtyping import Int
from torch import Tensor
from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache

from ..types import Model
from .kernels import available as kernels_available
from .packed import LastToken
from .packed_layer import PackedWeights, bias_or_none, pack_block, unsupported
from .prefix import DecodeCache


def pack_hooked(model: Model) -> PackedWeights:
    """A HookedTransformer's weights packed for ``LastToken`` (ValueError where ``unsupported`` finds a reason)."""
    why = unsupported(model)
    if why is not None:
        raise ValueError(f"the packed model cannot run this model: {why}")
    c = model.cfg
    rows = kernels_available()  # one-row products from the C++ kernel: every matrix input-major
    # packed copies must be usable under autograd later, and never part of a graph themselves
    with torch.inference_mode(False), torch.no_grad():
        layers = [pack_block(b, c.window_size, rows) for b in model.blocks]
        unembed = model.unembed.W_U.contiguous()  # (d_model, d_vocab), input-major

    def tables(n: int) -> list[tuple[Tensor, Tensor]]:
        """TransformerLens builds 2,048 rotary rows and extends them (same values) when a longer prompt runs."""
        out = []
        for block in model.blocks:
            a = block.attn
            if a.rotary_cos.shape[0] < n:
                a._extend_rotary_embeddings(min(max(n, 2 * a.rotary_cos.shape[0]), c.n_ctx))
            out.append((a.rotary_cos, a.rotary_sin))
        return out

    def prefix(tokens: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        cache = TransformerLensKeyValueCache.init_cache(c, c.device, tokens.shape[0])
        model(tokens, attention_mask=torch.ones_like(tokens), past_kv_cache=cache, return_type=None)
        keys = [e.past_keys.transpose(1, 2) for e in cache.entries]  # (batch, kv_head, pos, d_head), not rotated
        return keys, [e.past_values.transpose(1, 2).contiguous() for e in cache.entries]

    return PackedWeights(
        layers=layers,
        embed=model.W_E,
        embed_scale=None,
        unembed=unembed,
        b_U=bias_or_none(model.unembed.b_U),
        w_final=model.ln_final.w,
        eps_final=model.ln_final.eps,
        n_heads=c.n_heads,
        n_kv=c.n_key_value_heads or c.n_heads,
        d_head=c.d_head,
        d_mlp=c.d_mlp,
        rotary_dim=c.rotary_dim or c.d_head,
        adjacent=bool(c.rotary_adjacent_pairs),
        n_ctx=c.n_ctx,
        rows=rows,
        tables=tables,
        prefix=prefix,
        keys_rotated=False,
    )


@torch.no_grad()
def decode_from_hooked_cache(
    runner: LastToken, cache: TransformerLensKeyValueCache, attention_mask: Int[Tensor, "batch pos"], extra: int
) -> DecodeCache:
    """Take over a prefilled TransformerLens cache (right-padded rows) with room for ``extra`` tokens."""
    B, T = attention_mask.shape
    runner.cover(T + extra)
    mask = attention_mask.bool()
    pos_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # rotary positions, as TransformerLens
    keys, values = [], []
    for layer, entry in zip(runner.layers, cache.entries):
        k = entry.past_keys.transpose(1, 2)  # (batch, kv_head, T, d_head), not yet rotated
        cos, sin = layer.cos[pos_ids][:, None], layer.sin[pos_ids][:, None]  # (batch, 1, T, rot)
        kb = k.new_zeros(B, runner.n_kv, T + extra, runner.d_head)
        vb = torch.zeros_like(kb)
        kb[:, :, :T] = runner.rotate(k, cos, sin)
        vb[:, :, :T] = entry.past_values.transpose(1, 2)
        keys.append(kb)
        values.append(vb)
    valid = torch.zeros(B, T + extra, dtype=torch.bool, device=mask.device)
    valid[:, :T] = mask
    return DecodeCache(keys, values, valid, T, attention_mask.sum(-1))
