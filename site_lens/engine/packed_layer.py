"""One layer of the packed model: its weights as a typed record, packed from a HookedTransformer block (where
``unsupported`` finds nothing it cannot run), and the small tensor ops (RMSNorm, rotary, bias) the forward applies.

``packed.LastToken`` reads a ``PackedWeights`` record, one ``PackedLayer`` per block; ``pack_block``
builds a layer from a HookedTransformer block (``hooked_pack``) and ``bridge_pack`` from Hugging
Face-layout weights. In both,
Q/K/V and gate/up are concatenated, the pre-norms' gains folded into the matrices after them
(rms(x) * w @ W = rms(x) @ (w[:, None] W)), all-zero biases dropped, and every matrix is
input-major (d_in, d_out) for the one-row C++ kernels of ``kernels.py`` (where they cannot be
built, the down projection is kept output-major for ``F.linear``, which MKL runs faster).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from transformer_lens.utilities.architectures import POST_NORM_ARCHITECTURES

from ..types import Model
from .kernels import rms_norm

Norm = tuple[Tensor, float]  # an RMSNorm's gain and eps


@dataclass(eq=False)
class PackedLayer:
    """One block's weights as the packed forward reads them."""

    eps1: float  # the attention pre-norm's eps (its gain is folded into w_qkv)
    w_qkv: Tensor  # (d_model, (head + 2 kv_head) d_head): Q, K and V side by side
    b_qkv: Tensor | None
    w_o: Tensor  # (head d_head, d_model)
    b_o: Tensor | None
    scale: float  # attention scores are divided by it
    cos: Tensor  # (pos, rotary_dim): the rotary table, grown on demand (``LastToken.cover``)
    sin: Tensor
    eps2: float  # the MLP pre-norm's eps (its gain is folded into w_gate_in)
    w_gate_in: Tensor  # (d_model, 2 d_mlp): gate and up projections side by side
    b_in: Tensor | None
    w_out: Tensor  # (d_mlp, d_model) for the row kernels; (d_model, d_mlp) for F.linear where they are not built
    b_out: Tensor | None
    act: Callable[[Tensor], Tensor]
    q_norm: Norm | None = None  # Gemma 3: per-head RMSNorm of q and of k
    k_norm: Norm | None = None
    ln1_post: Norm | None = None  # Gemma 3: RMSNorm of each sublayer's output
    ln2_post: Norm | None = None
    window: int | None = None  # a local layer's sliding window: keys this many positions back are hidden
    table: int = 0  # which of the model's distinct rotary tables this is (layers sharing one share rotations)


@dataclass(eq=False)
class PackedWeights:
    """What the packed forward reads, whichever weights it was packed from: ``hooked_pack.pack_hooked`` (a
    HookedTransformer) and ``bridge_pack.pack_bridge`` (a TransformerBridge's transformers modules) each
    return one, and ``packed.LastToken`` is the one model over it."""

    layers: list[PackedLayer]
    embed: Tensor  # (d_vocab, d_model)
    embed_scale: float | None  # a factor on every embedding row (Gemma's, where the table is unscaled)
    unembed: Tensor  # (d_model, d_vocab), input-major
    b_U: Tensor | None
    w_final: Tensor  # the final RMSNorm's gain
    eps_final: float
    n_heads: int
    n_kv: int  # key/value heads (grouped-query attention)
    d_head: int
    d_mlp: int
    rotary_dim: int
    adjacent: bool  # rotary pairs (x0, x1), ... rather than halves
    n_ctx: int
    rows: bool  # matrices laid out for the one-row C++ kernels
    tables: Callable[[int], list[tuple[Tensor, Tensor]]]  # each layer's rotary cos, sin covering n positions
    prefix: Callable[[Tensor], tuple[list[Tensor], list[Tensor]]]  # prompt prefixes' keys and values, one run
    keys_rotated: bool  # whether ``prefix``'s keys come rotated (a Hugging Face cache) or not (TransformerLens's)


def unsupported(model: Model) -> str | None:
    """Why ``LastToken`` cannot run this model (None when it can)."""
    c = model.cfg

    def kind(module) -> str:
        return type(module).__name__

    norms = [model.ln_final] + [n for b in model.blocks for n in (b.ln1, b.ln2)]
    if getattr(c, "use_normalization_before_and_after", False):
        norms += [n for b in model.blocks for n in (getattr(b, "ln1_post", None), getattr(b, "ln2_post", None))]
    qk = [getattr(b.attn, n, None) for b in model.blocks for n in ("q_norm", "k_norm")]
    checks = [
        (c.normalization_type != "RMS" or not c.final_rms, "normalization is not RMSNorm"),
        (any(kind(n) != "RMSNorm" for n in norms), "a norm module is not RMSNorm"),
        (c.positional_embedding_type != "rotary", "positions are not rotary"),
        (not c.gated_mlp or c.attn_only, "the MLP is not gated"),
        (any(kind(b.mlp) != "GatedMLP" for b in model.blocks), "the MLP is not TransformerLens's GatedMLP"),
        (c.parallel_attn_mlp, "attention and MLP run in parallel"),
        (c.original_architecture in POST_NORM_ARCHITECTURES, "post-norm blocks"),
        (getattr(c, "post_embedding_ln", False), "a norm after the embedding"),
        ((getattr(c, "attn_scores_soft_cap", -1.0) or -1.0) > 0, "attention soft cap"),
        ((getattr(c, "output_logits_soft_cap", -1.0) or -1.0) > 0, "logit soft cap"),
        (getattr(c, "clip_qkv", None) is not None, "Q/K/V clipping"),
        (
            any(q is not None and (kind(q) != "RMSNorm" or q.w.shape[-1] != c.d_head) for q in qk),
            "Q/K norm not per head",
        ),
        (getattr(c, "use_dynamic_ntk_rope", False) or getattr(c, "use_logn_attn", False), "dynamic rotary scaling"),
        (
            any(a != "global" for a in (c.attn_types or [])) and not isinstance(c.window_size, int),
            "local attention without a window size",
        ),
        (c.attention_dir != "causal", "attention is not causal"),
        (c.n_devices != 1, "the model is split over devices"),
        (c.dtype not in (torch.float32, torch.float64), "dtype is not float32/float64"),
    ]
    return next((why for bad, why in checks if bad), None)


def pack_block(block, window_size: int | None, rows: bool) -> PackedLayer:
    """A HookedTransformer block's weights as a ``PackedLayer`` (``rows``: the row kernels are built)."""
    a, mlp = block.attn, block.mlp

    def heads_in(w: Tensor) -> Tensor:  # (head, d_model, d_head) -> (d_model, head * d_head)
        return w.permute(1, 0, 2).reshape(w.shape[1], -1)

    w_k = a._W_K if hasattr(a, "_W_K") else a.W_K  # grouped-query attention keeps one K/V per group
    w_v = a._W_V if hasattr(a, "_W_V") else a.W_V
    b_k = a._b_K if hasattr(a, "_b_K") else a.b_K
    b_v = a._b_V if hasattr(a, "_b_V") else a.b_V
    return PackedLayer(
        eps1=block.ln1.eps,
        w_qkv=block.ln1.w[:, None] * torch.cat([heads_in(a.W_Q), heads_in(w_k), heads_in(w_v)], 1),
        b_qkv=bias_or_none(torch.cat([a.b_Q.reshape(-1), b_k.reshape(-1), b_v.reshape(-1)])),
        w_o=a.W_O.reshape(-1, a.W_O.shape[-1]).contiguous(),
        b_o=bias_or_none(a.b_O),
        scale=float(a.attn_scale),
        cos=a.rotary_cos,
        sin=a.rotary_sin,
        eps2=block.ln2.eps,
        w_gate_in=block.ln2.w[:, None] * torch.cat([mlp.W_gate, mlp.W_in], 1),
        b_in=bias_or_none(mlp.b_in),
        w_out=mlp.W_out.contiguous() if rows else mlp.W_out.T.contiguous(),
        b_out=bias_or_none(mlp.b_out),
        act=mlp.act_fn,
        q_norm=norm_of(getattr(a, "q_norm", None)),
        k_norm=norm_of(getattr(a, "k_norm", None)),
        ln1_post=norm_of(getattr(block, "ln1_post", None)),
        ln2_post=norm_of(getattr(block, "ln2_post", None)),
        window=window_size if getattr(a, "attn_type", "global") == "local" else None,
    )


def norm_of(module) -> Norm | None:
    """A TransformerLens RMSNorm's (gain, eps); None for no module."""
    return None if module is None else (module.w, module.eps)


def rms(x: Tensor, w: Tensor | None, eps: float) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * w, as TransformerLens's RMSNorm (w None: folded into the next matrix)."""
    return rms_norm(x, eps) if w is None else F.rms_norm(x, (x.shape[-1],), w, eps)


def maybe_rms(x: Tensor, norm: Norm | None) -> Tensor:
    """``rms`` with a norm's gain and eps; x itself where there is no norm."""
    return x if norm is None else rms(x, *norm)


def bias_or_none(b: Tensor | None) -> Tensor | None:
    """A bias, or None where it is all zeros (Llama-style models): one op less per use, forward and backward."""
    return None if b is None or not bool(b.detach().any()) else b


def add_bias(x: Tensor, b: Tensor | None) -> Tensor:
    """x + b, or x where the bias was dropped."""
    return x if b is None else x + b


def rotate(x: Tensor, cos: Tensor, sin: Tensor, rotary_dim: int, adjacent: bool) -> Tensor:
    """Rotary embedding on the last dim (cos/sin broadcast over it), as TransformerLens's apply_rotary.

    ``adjacent``: the rotated pairs are (x0, x1), (x2, x3) ... rather than the two halves.
    """
    r = rotary_dim
    x_rot, x_pass = x[..., :r], x[..., r:]
    if adjacent:
        flip = torch.stack((-x_rot[..., 1::2], x_rot[..., ::2]), -1).flatten(-2)
    else:
        flip = torch.cat((-x_rot[..., r // 2 :], x_rot[..., : r // 2]), -1)
    return torch.cat((x_rot * cos + flip * sin, x_pass), -1)
