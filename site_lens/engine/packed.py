"""The speed path: one token through a Llama-style or Gemma 3 model from packed weights, against cached keys/values.

SITE's training loss needs one thing per prompt: the logits at the last prompt
token, with every layer's ``hook_z`` gated there. Every earlier position is
independent of alpha, so its keys and values are computed once (by the hooked
model, with TransformerLens's KV cache) and kept, already rotated, in the
layout attention wants. ``LastToken.logits`` then runs the one remaining token
straight from the model's weights:

    resid = W_E[tok]
    per layer:  q, k, v = rms(resid) @ W_QKV          (one product; rotary at position P as a matrix)
                z       = attention(q, [K_prefix; k], [V_prefix; v])   (one fused op)
                z       = (1 - alpha) * z + alpha * t  (``gate.AlphaGate.mix``)
                resid  += z @ W_O
                resid  += (act(rms(resid) @ W_gate) * (rms(resid) @ W_in)) @ W_out
    logits = rms(resid) @ W_U

It is the hooked model's computation with ``injection_hooks`` at the last
token, without hooks, TransformerLens's per-call reshapes and weight copies,
or re-rotating the whole cache each call. Weights are packed once per
``LastToken`` (``backend.PackedBackend`` keeps one per model): Q/K/V and gate/up
concatenated, the pre-norms' weights folded into the matrices after them,
all-zero biases dropped, every matrix input-major (d_in, d_out) for the
one-row C++ kernels of ``kernels.py`` (where they cannot be built, the down
projection is kept output-major for ``F.linear``, which MKL runs faster).
``LastToken.decode`` is the same step for greedy generation: one new token
per row against a preallocated buffer of rotated keys and values, taken over
from TransformerLens's cache after the (hooked) prefill.
Tests hold all three to the hooked model to 1e-5 (tests/test_lasttoken.py).

``LastToken.span_logits`` runs several tokens after the prefix the same way, the gate at
the first of them (the sequence objective's last prompt token and teacher-forced answer).
It covers Llama-style blocks (SmolLM2) and Gemma 3's additions (per-head
Q/K RMSNorm, RMSNorm of each sublayer's output, sliding-window layers).
``unsupported(model)`` names what it does not cover (LayerNorm, absolute
positions, post-norm blocks, soft caps); ``backend.backend_for`` then uses
the hooked model with a frozen KV cache instead.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache
from transformer_lens.utilities.architectures import POST_NORM_ARCHITECTURES

from ..gate import AlphaGate
from ..models.engines import Model
from .kernels import available as kernels_available
from .kernels import rms_norm, row_matmul, rows_matmul
from .prefix import DecodeCache, Prefix


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


class LastToken:
    """One-token (and few-token) forwards of a supported model, SITE's gate at the first token (see module docstring)."""

    def __init__(self, model: Model):
        why = unsupported(model)
        if why is not None:
            raise ValueError(f"LastToken cannot run this model: {why}")
        self.model = model
        c = model.cfg
        self.n_heads, self.d_head, self.d_mlp = c.n_heads, c.d_head, c.d_mlp
        self.n_kv = c.n_key_value_heads or c.n_heads
        self.rotary_dim = c.rotary_dim or c.d_head
        self.adjacent = bool(c.rotary_adjacent_pairs)  # rotary pairs (x0, x1), ... rather than halves
        self.n_ctx = c.n_ctx
        self.embed = model.W_E  # (d_vocab, d_model)
        self.embed_scale: float | None = None  # a factor on every embedding row (Gemma's, where W_E is unscaled)
        self.rows = kernels_available()  # one-row products from the C++ kernel: every matrix input-major
        # packed copies must be usable under autograd later, and never part of a graph themselves
        with torch.inference_mode(False), torch.no_grad():
            self.layers = [self._pack(b) for b in model.blocks]
            self.unembed = model.unembed.W_U.contiguous()  # (d_model, d_vocab), input-major (see _pack)
        self.w_final = model.ln_final.w
        self.eps_final = model.ln_final.eps
        self.b_U = _nonzero(model.unembed.b_U)
        self._share_tables()

    def _embed(self, tokens: Tensor) -> Tensor:
        e = self.embed[tokens]
        return e if self.embed_scale is None else e * self.embed_scale

    def _share_tables(self) -> None:
        self._rotations: dict[tuple[int, int], Tensor] = {}  # (rotary table, position) -> (d_head, d_head)
        tables: list[tuple[Tensor, Tensor]] = []  # layers with equal cos/sin tables share rotation matrices
        for w in self.layers:
            same = [j for j, (c, s) in enumerate(tables) if torch.equal(c, w["cos"]) and torch.equal(s, w["sin"])]
            if not same:
                tables.append((w["cos"], w["sin"]))
            w["table"] = same[0] if same else len(tables) - 1

    def _cover(self, n: int) -> None:
        """Grow every layer's rotary table to ``n`` positions, as TransformerLens grows its own on demand.

        TransformerLens builds 2,048 rows and extends them (same values) when a
        longer prompt runs; the packed copies are taken at build time, so they
        must follow, or a decode past position 2,047 indexes out of the table.
        """
        if n <= self.layers[0]["cos"].shape[0]:
            return
        for block, w in zip(self.model.blocks, self.layers):
            a = block.attn
            if a.rotary_cos.shape[0] < n:
                a._extend_rotary_embeddings(min(max(n, 2 * a.rotary_cos.shape[0]), self.model.cfg.n_ctx))
            w["cos"], w["sin"] = a.rotary_cos, a.rotary_sin

    def _pack(self, block) -> dict:
        a, mlp = block.attn, block.mlp

        def heads_in(w):  # (head, d_model, d_head) -> (d_model, head * d_head)
            return w.permute(1, 0, 2).reshape(w.shape[1], -1)

        w_k = a._W_K if hasattr(a, "_W_K") else a.W_K
        w_v = a._W_V if hasattr(a, "_W_V") else a.W_V
        b_k = a._b_K if hasattr(a, "_b_K") else a.b_K
        b_v = a._b_V if hasattr(a, "_b_V") else a.b_V
        return dict(
            # the pre-norms' weights are folded into the matrices after them: rms(x) * w @ W = rms(x) @ (w[:, None] W)
            eps1=block.ln1.eps,
            w_qkv=block.ln1.w[:, None]
            * torch.cat([heads_in(a.W_Q), heads_in(w_k), heads_in(w_v)], 1),  # (d_model, (h + 2 kv) d_head)
            b_qkv=_nonzero(torch.cat([a.b_Q.reshape(-1), b_k.reshape(-1), b_v.reshape(-1)])),
            w_o=a.W_O.reshape(-1, a.W_O.shape[-1]).contiguous(),  # (head d_head, d_model)
            b_o=_nonzero(a.b_O),
            scale=float(a.attn_scale),
            cos=a.rotary_cos,
            sin=a.rotary_sin,
            eps2=block.ln2.eps,
            w_gate_in=block.ln2.w[:, None] * torch.cat([mlp.W_gate, mlp.W_in], 1),  # (d_model, 2 d_mlp)
            b_in=_nonzero(mlp.b_in),
            # (d_mlp, d_model) input-major for the row kernel; else output-major (d_model, d_mlp) for F.linear
            w_out=mlp.W_out.contiguous() if self.rows else mlp.W_out.T.contiguous(),
            b_out=_nonzero(mlp.b_out),
            act=mlp.act_fn,
            # Gemma 3: per-head RMSNorm of q and k, RMSNorm of each sublayer's output, sliding window
            q_norm=_norm(getattr(a, "q_norm", None)),
            k_norm=_norm(getattr(a, "k_norm", None)),
            ln1_post=_norm(getattr(block, "ln1_post", None)),
            ln2_post=_norm(getattr(block, "ln2_post", None)),
            window=self.model.cfg.window_size if getattr(a, "attn_type", "global") == "local" else None,
        )

    # ------------------------------------------------------------ prefix

    @torch.no_grad()
    def prefix(self, tokens: Int[Tensor, "batch pos"]) -> Prefix:
        """Run prompt prefixes through the hooked model once; keep their keys (rotated) and values."""
        model = self.model
        cache = TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, tokens.shape[0])
        model(tokens, attention_mask=torch.ones_like(tokens), past_kv_cache=cache, return_type=None)
        keys, values = [], []
        for layer, entry in zip(self.layers, cache.entries):
            k = entry.past_keys.transpose(1, 2)  # (batch, kv_head, pos, d_head)
            n = k.shape[2]
            self._cover(n)
            keys.append(self._rotate(k, layer["cos"][:n], layer["sin"][:n]).contiguous())
            values.append(entry.past_values.transpose(1, 2).contiguous())
        return Prefix(keys, values)

    def _rotate(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """Rotary embedding on the last dim (cos/sin broadcast over it), as TransformerLens's apply_rotary."""
        r = self.rotary_dim
        x_rot, x_pass = x[..., :r], x[..., r:]
        if self.adjacent:
            flip = torch.stack((-x_rot[..., 1::2], x_rot[..., ::2]), -1).flatten(-2)
        else:
            flip = torch.cat((-x_rot[..., r // 2 :], x_rot[..., : r // 2]), -1)
        return torch.cat((x_rot * cos + flip * sin, x_pass), -1)

    # ------------------------------------------------------------ the token

    def logits(
        self,
        tokens: Int[Tensor, " batch"],
        prefix: Prefix,
        alpha: Float[Tensor, "*arows layer head_index"] | None,
        t: Float[Tensor, "*trows layer head_index d_head"] | None,
        resid_edits: dict[int, Callable[[Tensor], Tensor]] | None = None,
    ) -> Float[Tensor, "batch d_vocab"]:
        """Logits of the token after each row's prefix, with every head's z gated toward t.

        ``alpha`` is one gate for all rows, (layer, head), or one per row, (batch, layer, head);
        None runs no gate. ``t`` likewise: (layer, head, d_head) or one per row. A prefix of one row serves every row (e.g. one prompt under many
        gates). ``resid_edits[l]`` maps the token's (batch, d_model) residual at the input of
        layer l, as a hook on ``blocks.{l}.hook_resid_pre`` at that position would (FV, TV).
        """
        H, D = self.n_heads, self.d_head
        B, P = tokens.shape[0], prefix.length
        edits = resid_edits or {}
        if alpha is not None and alpha.dim() == 3 and alpha.shape[0] != B:
            raise ValueError(f"alpha has {alpha.shape[0]} rows for {B} tokens")
        if prefix.keys[0].shape[0] not in (1, B):
            raise ValueError(f"prefix has {prefix.keys[0].shape[0]} rows for {B} tokens")
        resid = self._embed(tokens)  # (batch, d_model)
        own = prefix.keys[0].shape[0] == B  # each row has its own prefix (training); else one shared prefix
        gated = alpha is not None and t is not None
        if gated:  # per-layer views, split once: one backward op instead of one per layer; lerp wants one dtype
            alphas = alpha.to(resid.dtype).unsqueeze(-1).unbind(-3)  # (*rows, head, 1) per layer
            ts = t.to(resid.dtype).unbind(-3)  # (*rows, head, d_head) per layer
        for i, w in enumerate(self.layers):
            if i in edits:
                resid = edits[i](resid)
            q, k, v = self._qkv(resid, w, rotation=self._rotation(w, P))  # rotary at position P
            local = w["window"] is not None and P - w["window"] >= 0  # keys at positions <= P - window hidden
            if own:
                # the G query heads of a K/V group act as G query positions over the P + 1 keys: one fused op
                keys, values = torch.cat((prefix.keys[i], k), 2), torch.cat((prefix.values[i], v), 2)
                mask = self._window_mask(P, w["window"], q.device) if local else None
                z = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=1.0 / w["scale"])
            else:  # one prefix for every row: attend over it without copying it per row
                scores = torch.cat((q @ prefix.keys[i].transpose(-1, -2), (q * k).sum(-1, keepdim=True)), -1)
                if local:
                    scores[..., : P - w["window"] + 1] = float("-inf")
                pattern = (scores / w["scale"]).softmax(-1)  # (batch, kv, group, P + 1)
                z = pattern[..., :P] @ prefix.values[i] + pattern[..., P:] * v
            z = z.reshape(B, H, D)  # (batch, head, d_head)
            if gated:
                z = AlphaGate.mix(z, ts[i], alphas[i])  # (1 - a) z + a t: SITE's gate
            resid = resid + _maybe_rms(_bias(row_matmul(z.reshape(B, H * D), w["w_o"]), w["b_o"]), w["ln1_post"])
            resid = resid + self._mlp(resid, w)
        x = _rms(resid, self.w_final, self.eps_final)
        return _bias(row_matmul(x, self.unembed), self.b_U)

    def span_logits(
        self,
        tokens: Int[Tensor, "batch n"],
        prefix: Prefix,
        alpha: Float[Tensor, "*arows layer head_index"] | None,
        t: Float[Tensor, "*trows layer head_index d_head"] | None,
    ) -> Float[Tensor, "batch n d_vocab"]:
        """Logits after each of ``n`` tokens that follow each row's prefix, the gate at the first of them.

        The teacher-forced answer of the sequence objective: the first token is the last prompt
        token (SITE's injection there), the rest see it only through attention. Causal among
        the n tokens, so right padding never reaches a real position. ``alpha``, ``t`` and the
        prefix's rows are as in ``logits``. Its products take all B n rows at once (``rows_matmul``:
        the C++ kernel for up to ``kernels.MAX_ROWS`` float32 CPU rows, torch's matmul otherwise).
        """
        H, KV, D = self.n_heads, self.n_kv, self.d_head
        (B, n), P = tokens.shape, prefix.length
        if alpha is not None and alpha.dim() == 3 and alpha.shape[0] != B:
            raise ValueError(f"alpha has {alpha.shape[0]} rows for {B} spans")
        if prefix.keys[0].shape[0] not in (1, B):
            raise ValueError(f"prefix has {prefix.keys[0].shape[0]} rows for {B} spans")
        self._cover(P + n)
        if P + n > self.layers[0]["cos"].shape[0]:
            raise ValueError(f"a span ending at position {P + n - 1} is past the model's context ({self.n_ctx})")
        resid = self._embed(tokens).reshape(B * n, -1)  # (batch n, d_model)
        gated = alpha is not None and t is not None
        if gated:
            alphas = alpha.to(resid.dtype).unsqueeze(-1).unbind(-3)  # (*rows, head, 1) per layer
            ts = t.to(resid.dtype).unbind(-3)  # (*rows, head, d_head) per layer
        q_pos = torch.arange(P, P + n, device=resid.device)[:, None]  # (n, 1)
        k_pos = torch.arange(P + n, device=resid.device)[None]  # (1, P + n)
        for i, w in enumerate(self.layers):
            qkv = _bias(rows_matmul(_rms(resid, None, w["eps1"]), w["w_qkv"]), w["b_qkv"]).view(B, n, -1)
            q, k, v = qkv.split((H * D, KV * D, KV * D), -1)
            q = _maybe_rms(q.reshape(B, n, H, D), w["q_norm"])
            k = _maybe_rms(k.reshape(B, n, KV, D), w["k_norm"])
            cos, sin = w["cos"][P : P + n, None], w["sin"][P : P + n, None]  # (n, 1, rot)
            q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
            # the G query heads of a K/V group and the n positions as G n query rows, ordered (g, position)
            q = q.view(B, n, KV, H // KV, D).permute(0, 2, 3, 1, 4).reshape(B, KV, -1, D)
            keys = torch.cat((prefix.keys[i].expand(B, -1, -1, -1), k.transpose(1, 2)), 2)  # (batch, kv, P + n, d_head)
            values = torch.cat((prefix.values[i].expand(B, -1, -1, -1), v.reshape(B, n, KV, D).transpose(1, 2)), 2)
            seen = k_pos <= q_pos  # (n, P + n)
            if w["window"] is not None:
                seen = seen & (k_pos > q_pos - w["window"])
            z = F.scaled_dot_product_attention(
                q, keys, values, attn_mask=seen.repeat(H // KV, 1), scale=1.0 / w["scale"]
            )
            z = z.view(B, KV, H // KV, n, D).permute(0, 3, 1, 2, 4).reshape(B, n, H, D)
            if gated:  # SITE's gate at the first token only
                z = torch.cat((AlphaGate.mix(z[:, 0], ts[i], alphas[i])[:, None], z[:, 1:]), 1)
            resid = resid + _maybe_rms(_bias(rows_matmul(z.reshape(B * n, H * D), w["w_o"]), w["b_o"]), w["ln1_post"])
            resid = resid + self._mlp(resid, w, rows_matmul)
        x = _rms(resid, self.w_final, self.eps_final)
        return _bias(rows_matmul(x, self.unembed), self.b_U).view(B, n, -1)

    def _rotation(self, w: dict, pos: int) -> Tensor:
        """The rotary embedding at one position as a (d_head, d_head) matrix: ``x @ R == _rotate(x)``."""
        key = (w["table"], pos)
        rot = self._rotations.get(key)
        if rot is None:
            self._cover(pos + 1)
            with torch.inference_mode(False), torch.no_grad():  # usable under autograd later
                eye = torch.eye(self.d_head, dtype=w["cos"].dtype, device=w["cos"].device)
                rot = self._rotations[key] = self._rotate(eye, w["cos"][pos], w["sin"][pos])
        return rot

    @staticmethod
    def _window_mask(pos: int, window: int, device: torch.device) -> Tensor:
        """Which of the P + 1 keys a local layer's token at ``pos`` sees: those after position pos - window."""
        return (torch.arange(pos + 1, device=device) > pos - window)[None]  # (1, P + 1), broadcast over rows, heads

    def _qkv(
        self,
        resid: Tensor,
        w: dict,
        cos: Tensor | None = None,
        sin: Tensor | None = None,
        rotation: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The token's q (batch, kv, group, d_head), k and v (batch, kv, 1, d_head); q and k normed and rotated.

        Rotary comes from ``rotation`` (one position for every row, see ``_rotation``) or from ``cos``/``sin``.
        """
        H, KV, D = self.n_heads, self.n_kv, self.d_head
        B = resid.shape[0]
        qkv = _bias(row_matmul(_rms(resid, None, w["eps1"]), w["w_qkv"]), w["b_qkv"])  # (batch, (h + 2 kv) d_head)
        if rotation is not None and w["q_norm"] is None and w["k_norm"] is None:  # q and k rotated in one product
            qk, v = qkv.split(((H + KV) * D, KV * D), -1)
            q, k = (qk.view(B, H + KV, D) @ rotation).split((H, KV), 1)
            return q.reshape(B, KV, H // KV, D), k.reshape(B, KV, 1, D), v.view(B, KV, 1, D)
        q, k, v = qkv.split((H * D, KV * D, KV * D), -1)
        q = _maybe_rms(q.view(B, KV, H // KV, D), w["q_norm"])
        k = _maybe_rms(k.view(B, KV, 1, D), w["k_norm"])
        v = v.view(B, KV, 1, D)
        if rotation is not None:
            return q @ rotation, k @ rotation, v
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin), v

    def _mlp(self, resid: Tensor, w: dict, matmul: Callable[[Tensor, Tensor], Tensor] = row_matmul) -> Tensor:
        x = _rms(resid, None, w["eps2"])
        gate, up = matmul(x, w["w_gate_in"]).split(self.d_mlp, -1)
        h = _bias(w["act"](gate) * up, w["b_in"])
        down = _bias(matmul(h, w["w_out"]), w["b_out"]) if self.rows else F.linear(h, w["w_out"], w["b_out"])
        return _maybe_rms(down, w["ln2_post"])

    # ------------------------------------------------------------ greedy decoding

    @torch.no_grad()
    def decode_cache(
        self, cache: TransformerLensKeyValueCache, attention_mask: Int[Tensor, "batch pos"], extra: int
    ) -> DecodeCache:
        """Take over a prefilled TransformerLens cache (right-padded rows) with room for ``extra`` tokens."""
        B, T = attention_mask.shape
        self._cover(T + extra)
        mask = attention_mask.bool()
        pos_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # rotary positions, as TransformerLens
        keys, values = [], []
        for layer, entry in zip(self.layers, cache.entries):
            k = entry.past_keys.transpose(1, 2)  # (batch, kv_head, T, d_head), not yet rotated
            cos, sin = layer["cos"][pos_ids][:, None], layer["sin"][pos_ids][:, None]  # (batch, 1, T, rot)
            kb = k.new_zeros(B, self.n_kv, T + extra, self.d_head)
            vb = torch.zeros_like(kb)
            kb[:, :, :T] = self._rotate(k, cos, sin)
            vb[:, :, :T] = entry.past_values.transpose(1, 2)
            keys.append(kb)
            values.append(vb)
        valid = torch.zeros(B, T + extra, dtype=torch.bool, device=mask.device)
        valid[:, :T] = mask
        return DecodeCache(keys, values, valid, T, attention_mask.sum(-1))

    @torch.no_grad()
    def start_decode(self, prefix: Prefix, extra: int) -> DecodeCache:
        """A decode cache holding equal-length prefixes (one per row) with room for ``extra`` tokens."""
        B, P = prefix.keys[0].shape[0], prefix.length
        self._cover(P + extra)
        keys, values = [], []
        for k, v in zip(prefix.keys, prefix.values):
            kb = k.new_zeros(B, self.n_kv, P + extra, self.d_head)
            vb = torch.zeros_like(kb)
            kb[:, :, :P], vb[:, :, :P] = k, v
            keys.append(kb)
            values.append(vb)
        valid = torch.zeros(B, P + extra, dtype=torch.bool, device=keys[0].device)
        valid[:, :P] = True
        return DecodeCache(keys, values, valid, P, torch.full((B,), P, dtype=torch.long, device=keys[0].device))

    @torch.no_grad()
    def decode(
        self,
        tokens: Int[Tensor, " batch"],
        cache: DecodeCache,
        alpha: Float[Tensor, "layer head_index"] | None = None,
        t: Float[Tensor, "layer head_index d_head"] | None = None,
    ) -> Float[Tensor, "batch d_vocab"]:
        """Logits after one more token per row; its keys and values are written into ``cache``.

        With ``alpha`` and ``t`` this token's z is gated toward t (SITE's injection at the last
        prompt token, when ``cache`` came from ``start_decode``); decode steps after it pass none.
        """
        H, D = self.n_heads, self.d_head
        B, n = tokens.shape[0], cache.used
        if n >= cache.valid.shape[1]:
            raise ValueError("DecodeCache is full")
        blocked = ~cache.valid[:, None, None, :n]  # (batch, 1, 1, n)
        resid = self._embed(tokens)  # (batch, d_model)
        for i, w in enumerate(self.layers):
            cos, sin = w["cos"][cache.pos][:, None, None], w["sin"][cache.pos][:, None, None]  # (batch, 1, 1, rot)
            q, k, v = self._qkv(resid, w, cos, sin)
            keys, values = cache.keys[i], cache.values[i]
            keys[:, :, n : n + 1] = k
            values[:, :, n : n + 1] = v
            scores = (q @ keys[:, :, : n + 1].transpose(-1, -2)) / w["scale"]  # (batch, kv, group, n + 1)
            scores[..., :n] = scores[..., :n].masked_fill(blocked, float("-inf"))
            if w["window"] is not None and n - w["window"] >= 0:  # local layer: slots <= n - window, as TransformerLens
                scores[..., : n - w["window"] + 1] = float("-inf")
            z = (scores.softmax(-1) @ values[:, :, : n + 1]).reshape(B, H * D)
            if alpha is not None and t is not None:
                z = AlphaGate.mix(z.view(B, H, D), t[i].to(z.dtype), alpha[i].to(z.dtype)[:, None]).reshape(B, H * D)
            resid = resid + _maybe_rms(_bias(row_matmul(z, w["w_o"]), w["b_o"]), w["ln1_post"])
            resid = resid + self._mlp(resid, w)
        cache.valid[:, n] = True
        cache.used = n + 1
        cache.pos = cache.pos + 1
        x = _rms(resid, self.w_final, self.eps_final)
        return _bias(row_matmul(x, self.unembed), self.b_U)


def _norm(module) -> tuple[Tensor, float] | None:
    return None if module is None else (module.w, module.eps)


def _maybe_rms(x: Tensor, norm: tuple[Tensor, float] | None) -> Tensor:
    return x if norm is None else _rms(x, *norm)


def _rms(x: Tensor, w: Tensor | None, eps: float) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * w, as TransformerLens's RMSNorm (w None: folded into the next matrix)."""
    return rms_norm(x, eps) if w is None else F.rms_norm(x, (x.shape[-1],), w, eps)


def _nonzero(b: Tensor | None) -> Tensor | None:
    """A bias, or None where it is all zeros (Llama-style models): one op less per use, forward and backward."""
    return None if b is None or not bool(b.detach().any()) else b


def _bias(x: Tensor, b: Tensor | None) -> Tensor:
    return x if b is None else x + b
