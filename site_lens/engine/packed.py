"""The packed model: a Llama-style or Gemma 3 model's forward from packed weights, for the few tokens SITE runs.

SITE's training loss needs one thing per prompt: the logits at the last prompt
token, with every layer's ``hook_z`` gated there. Every earlier position is
independent of alpha, so its keys and values are computed once (by the model
itself, into its KV cache) and kept, already rotated, in the layout attention
wants. ``LastToken`` then runs the remaining token(s) straight from the
model's weights, a ``packed_layer.PackedWeights`` record holding one
``PackedLayer`` per block, packed from a HookedTransformer
(``hooked_pack.pack_hooked``) or a TransformerBridge's transformers modules
(``bridge_pack.pack_bridge``):

    resid = W_E[tok]
    per layer:  q, k, v = rms(resid) @ W_QKV          (one product; rotary at position P as a matrix)
                z       = attention(q, [K_prefix; k], [V_prefix; v])
                z       = (1 - alpha) * z + alpha * t  (``gate.AlphaGate.mix``)
                resid  += z @ W_O
                resid  += (act(rms(resid) @ W_gate) * (rms(resid) @ W_in)) @ W_out
    logits = rms(resid) @ W_U

It is the hooked model's computation with ``gate.Injection``'s hooks at the last
token, without hooks, TransformerLens's per-call reshapes and weight copies,
or re-rotating the whole cache each call. One forward (``_forward``) serves
three entry points, which differ in what the new tokens attend to and where
their rotary positions come from:

* ``logits``: one token per row after its prefix (each row its own, or one
  prefix for every row, attended without copying it); rotary at position P
  as one precomputed matrix (q and k rotated in one product where no Q/K
  norm comes between); attention in one fused op where each row has its
  own prefix.
* ``span_logits``: n tokens per row after the prefix, causal among
  themselves, the gate at the first (the sequence objective's last prompt
  token and teacher-forced answer); rotary from the cos/sin tables; products
  over all B n rows at once (``kernels.rows_matmul``).
* ``decode``: one token per row against a ``prefix.DecodeCache`` (greedy
  generation), its keys and values written into it; rotary at each row's own
  position.

It covers Llama-style blocks (SmolLM2) and Gemma 3's additions (per-head Q/K
RMSNorm, RMSNorm of each sublayer's output, sliding-window layers).
``packed_layer.unsupported(model)`` names what it does not cover (LayerNorm,
absolute positions, post-norm blocks, soft caps); ``backend.backend_for``
then uses the hooked model with a frozen KV cache instead. Tests hold every entry point
to the hooked model to 1e-5 (tests/test_lasttoken.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from ..gate import AlphaGate
from .kernels import row_matmul, rows_matmul
from .packed_layer import PackedLayer, PackedWeights, add_bias, maybe_rms, rms, rotate
from .prefix import DecodeCache, Prefix, check_rows, seen

ResidEdits = dict[int, Callable[[Tensor], Tensor]]


class LastToken:
    """One-token (and few-token) forwards over packed weights, SITE's gate at the first token (see module docstring).

    ``weights`` comes from ``hooked_pack.pack_hooked`` or ``bridge_pack.pack_bridge``; nothing here asks which.
    """

    def __init__(self, weights: PackedWeights):
        w = self.weights = weights
        self.layers, self.embed, self.embed_scale, self.unembed, self.b_U = (
            w.layers, w.embed, w.embed_scale, w.unembed, w.b_U
        )
        self.w_final, self.eps_final, self.rows = w.w_final, w.eps_final, w.rows
        self.n_heads, self.n_kv, self.d_head, self.d_mlp = w.n_heads, w.n_kv, w.d_head, w.d_mlp
        self.rotary_dim, self.adjacent, self.n_ctx = w.rotary_dim, w.adjacent, w.n_ctx
        self._share_tables()

    def _embed(self, tokens: Tensor) -> Tensor:
        e = self.embed[tokens]
        return e if self.embed_scale is None else e * self.embed_scale

    def _share_tables(self) -> None:
        """Number the distinct rotary tables (layers with equal ones share rotation matrices), collect the windows."""
        self._rotations: dict[tuple[int, int], Tensor] = {}  # (rotary table, position) -> (d_head, d_head)
        tables: list[tuple[Tensor, Tensor]] = []
        for w in self.layers:
            same = [j for j, (c, s) in enumerate(tables) if torch.equal(c, w.cos) and torch.equal(s, w.sin)]
            if not same:
                tables.append((w.cos, w.sin))
            w.table = same[0] if same else len(tables) - 1
        self._windows = {w.window for w in self.layers}  # one attention mask per window and forward

    def cover(self, n: int) -> None:
        """Grow every layer's rotary table to ``n`` positions (``PackedWeights.tables``), as the source model grows
        its own on demand: a decode past the tables' first size would otherwise index out of them."""
        if n <= self.layers[0].cos.shape[0]:
            return
        for w, (cos, sin) in zip(self.layers, self.weights.tables(n)):
            w.cos, w.sin = cos, sin

    def rotate(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        return rotate(x, cos, sin, self.rotary_dim, self.adjacent)

    def _rotation(self, w: PackedLayer, pos: int) -> Tensor:
        """The rotary embedding at one position as a (d_head, d_head) matrix: ``x @ R == rotate(x)``."""
        key = (w.table, pos)
        rot = self._rotations.get(key)
        if rot is None:
            self.cover(pos + 1)
            with torch.inference_mode(False), torch.no_grad():  # usable under autograd later
                eye = torch.eye(self.d_head, dtype=w.cos.dtype, device=w.cos.device)
                rot = self._rotations[key] = self.rotate(eye, w.cos[pos], w.sin[pos])
        return rot

    # ------------------------------------------------------------ prefixes and decode caches

    @torch.no_grad()
    def prefix(self, tokens: Int[Tensor, "batch pos"]) -> Prefix:
        """Run prompt prefixes through the source model once (``PackedWeights.prefix``); keep their keys, rotated,
        and values."""
        self.cover(tokens.shape[1] + 1)
        keys, values = self.weights.prefix(tokens)
        if not self.weights.keys_rotated:
            n = tokens.shape[1]
            keys = [self.rotate(k, w.cos[:n], w.sin[:n]).contiguous() for w, k in zip(self.layers, keys)]
        return Prefix(keys, values)

    @torch.no_grad()
    def start_decode(self, prefix: Prefix, extra: int) -> DecodeCache:
        """A decode cache holding equal-length prefixes (one per row) with room for ``extra`` tokens."""
        B, P = prefix.keys[0].shape[0], prefix.length
        self.cover(P + extra)
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

    # ------------------------------------------------------------ the entry points

    def logits(
        self,
        tokens: Int[Tensor, " batch"],
        prefix: Prefix,
        alpha: Float[Tensor, "*arows layer head_index"] | None,
        t: Float[Tensor, "*trows layer head_index d_head"] | None,
        resid_edits: ResidEdits | None = None,
    ) -> Float[Tensor, "batch d_vocab"]:
        """Logits of the token after each row's prefix, with every head's z gated toward t.

        ``alpha`` is one gate for all rows, (layer, head), or one per row, (batch, layer, head);
        None runs no gate. ``t`` likewise: (layer, head, d_head) or one per row. A prefix of one row serves every row (e.g. one prompt under many
        gates). ``resid_edits[l]`` maps the token's (batch, d_model) residual at the input of
        layer l, as a hook on ``blocks.{l}.hook_resid_pre`` at that position would (FV, TV).
        """
        check_rows(tokens.shape[0], prefix, alpha)
        return self._forward(tokens[:, None], prefix, alpha, t, resid_edits)

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
        (B, n), P = tokens.shape, prefix.length
        check_rows(B, prefix, alpha, "spans")
        self.cover(P + n)
        if P + n > self.layers[0].cos.shape[0]:
            raise ValueError(f"a span ending at position {P + n - 1} is past the model's context ({self.n_ctx})")
        return self._forward(tokens, prefix, alpha, t, span=True).view(B, n, -1)

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
        slot = cache.used
        if slot >= cache.valid.shape[1]:
            raise ValueError("DecodeCache is full")
        cache.valid[:, slot] = True
        logits = self._forward(tokens[:, None], cache, alpha, t)
        cache.used, cache.pos = slot + 1, cache.pos + 1
        return logits

    # ------------------------------------------------------------ the forward

    def _forward(
        self,
        tokens: Int[Tensor, "batch n"],
        keys: Prefix | DecodeCache,
        alpha: Tensor | None,
        t: Tensor | None,
        resid_edits: ResidEdits | None = None,
        span: bool = False,
    ) -> Float[Tensor, "batch_n d_vocab"]:
        """Logits after each of the n new tokens of every row, each layer's z gated toward t at the first of them.

        The tokens attend to themselves (causally) and to ``keys``: a prefix (one per row, or one for
        every row), or a decode cache's filled slots, where their keys and values are written first.
        Rotary: one matrix at position P for a lone token after a prefix; else the cos/sin tables at
        P .. P + n - 1 (``span``) or at each row's own position (decoding). ``span`` takes every product
        over all B n rows at once (``rows_matmul``).
        """
        H, KV, D = self.n_heads, self.n_kv, self.d_head
        B, n = tokens.shape
        edits = resid_edits or {}
        decoding = isinstance(keys, DecodeCache)
        ragged = not decoding and keys.lengths is not None  # prefixes of many lengths, right-padded (Prefix.pad)
        # a span's few rows: the kernel streaming W once; many tasks' rows (ragged): ATen's blocked product
        matmul = rows_matmul if span else torch.matmul if ragged else row_matmul
        # what the tokens attend to: a decode cache, [prefix; tokens] in one fused op (own prefix per row,
        # or a span), or one prefix shared by every row (or right-padded ones), attended without copying it
        mode = "cache" if decoding else "fused" if (span or keys.rows == B) and not ragged else "shared"
        P = keys.used if decoding else keys.length  # the first new token's position (cache slot)
        resid = self._embed(tokens.reshape(-1))  # (batch n, d_model)
        gated = alpha is not None and t is not None
        if gated:  # per-layer views, split once: one backward op instead of one per layer; lerp wants one dtype
            alphas = alpha.to(resid.dtype).unsqueeze(-1).unbind(-3)  # (*rows, head, 1) per layer
            ts = t.to(resid.dtype).unbind(-3)  # (*rows, head, d_head) per layer
        masks = self._masks(keys, P, n, resid.device)
        at = None  # one position in every row: rotary as a matrix; else the tables at (rows, n) positions
        if decoding:
            at = keys.pos[:, None]
        elif ragged:  # each row's token right after its own prefix
            if span:
                raise ValueError("span logits take prefixes of one length")
            at = keys.lengths[:, None]
            self.cover(P + 1)
        elif span:
            at = torch.arange(P, P + n, device=resid.device)[None]
        for i, w in enumerate(self.layers):
            if i in edits:
                resid = edits[i](resid)
            rotary = self._rotation(w, P) if at is None else (w.cos[at].unsqueeze(-2), w.sin[at].unsqueeze(-2))
            z = self._attend(mode, i, w, self._qkv(resid, w, B, n, matmul, rotary), keys, masks[w.window])
            if n == 1:
                z = z.reshape(B, H, D)  # (batch, head, d_head)
                if gated:
                    z = AlphaGate.mix(z, ts[i], alphas[i])  # (1 - a) z + a t: SITE's gate
            else:  # (batch, n, head, d_head), the gate at the first token only
                z = z.view(B, KV, H // KV, n, D).permute(0, 3, 1, 2, 4).reshape(B, n, H, D)
                if gated:
                    z = torch.cat((AlphaGate.mix(z[:, 0], ts[i], alphas[i])[:, None], z[:, 1:]), 1)
            resid = resid + maybe_rms(add_bias(matmul(z.reshape(B * n, H * D), w.w_o), w.b_o), w.ln1_post)
            resid = resid + self._mlp(resid, w, matmul)
        x = rms(resid, self.w_final, self.eps_final)
        return add_bias(matmul(x, self.unembed), self.b_U)

    def _masks(self, keys: Prefix | DecodeCache, P: int, n: int, device: torch.device) -> dict:
        """This forward's attention mask for each window (None: every key seen), as ``_attend`` takes it."""
        if isinstance(keys, DecodeCache):  # the filled slots that hold real tokens, within the window
            valid = keys.valid[:, None, None, : P + 1]  # (batch, 1, 1, P + 1)
            masks = {win: seen(P, 1, win, device) for win in self._windows}
            return {win: valid if m is None else valid & m for win, m in masks.items()}
        if keys.lengths is not None:  # right-padded prefixes (Prefix.pad)
            return {win: keys.seen_by_next(win) for win in self._windows}
        masks = {win: seen(P, n, win, device) for win in self._windows}
        if n == 1:
            return masks
        G = self.n_heads // self.n_kv  # a span's query rows are ordered (group, position)
        return {win: m.repeat(G, 1) for win, m in masks.items()}

    def _qkv(self, resid: Tensor, w: PackedLayer, B: int, n: int, matmul: Callable, rotary) -> tuple[Tensor, ...]:
        """q (batch, kv, group n, d_head), its rows ordered (group, position); k and v (batch, kv, n, d_head).

        q and k are normed and rotated: ``rotary`` is one (d_head, d_head) matrix (one token at one position,
        see ``_rotation``) or (cos, sin) tables broadcast over (batch, n, head, rot).
        """
        H, KV, D = self.n_heads, self.n_kv, self.d_head
        G = H // KV
        qkv = add_bias(matmul(rms(resid, None, w.eps1), w.w_qkv), w.b_qkv)  # (batch n, (head + 2 kv) d_head)
        matrix = isinstance(rotary, Tensor)
        if matrix and w.q_norm is None and w.k_norm is None:  # q and k rotated in one product
            qk, v = qkv.split(((H + KV) * D, KV * D), -1)
            q, k = (qk.view(B, H + KV, D) @ rotary).split((H, KV), 1)
            return q.reshape(B, KV, G, D), k.reshape(B, KV, 1, D), v.view(B, KV, 1, D)
        q, k, v = qkv.split((H * D, KV * D, KV * D), -1)
        q = maybe_rms(q.view(B, n, H, D), w.q_norm)
        k = maybe_rms(k.view(B, n, KV, D), w.k_norm)
        if matrix:
            q, k = q @ rotary, k @ rotary
        else:
            q, k = self.rotate(q, *rotary), self.rotate(k, *rotary)
        if n == 1:
            return q.reshape(B, KV, G, D), k.reshape(B, KV, 1, D), v.view(B, KV, 1, D)
        # the G query heads of a K/V group and the n positions as G n query rows
        q = q.view(B, n, KV, G, D).permute(0, 2, 3, 1, 4).reshape(B, KV, G * n, D)
        return q, k.transpose(1, 2), v.view(B, n, KV, D).transpose(1, 2)

    @staticmethod
    def _attend(
        mode: str, i: int, w: PackedLayer, qkv: tuple, keys: Prefix | DecodeCache, mask: Tensor | None
    ) -> Tensor:
        """Layer i's z of the new tokens, (batch, kv, group n, d_head), by ``_forward``'s ``mode``."""
        q, k, v = qkv
        if mode == "fused":  # the query rows over the P + n keys: one fused op
            pk, pv = keys.keys[i], keys.values[i]
            if pk.shape[0] != q.shape[0]:
                pk, pv = pk.expand(q.shape[0], -1, -1, -1), pv.expand(q.shape[0], -1, -1, -1)
            return F.scaled_dot_product_attention(
                q, torch.cat((pk, k), 2), torch.cat((pv, v), 2), attn_mask=mask, scale=1.0 / w.scale
            )
        if mode == "shared":  # (batch, kv, group, P + 1) scores against the one prefix and the token itself
            P = keys.length
            scores = torch.cat((q @ keys.keys[i].transpose(-1, -2), (q * k).sum(-1, keepdim=True)), -1)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            pattern = (scores / w.scale).softmax(-1)
            return pattern[..., :P] @ keys.values[i] + pattern[..., P:] * v
        slot = keys.used  # "cache": the token's keys and values into its slot, then attention over the slots
        keys.keys[i][:, :, slot : slot + 1] = k
        keys.values[i][:, :, slot : slot + 1] = v
        scores = (q @ keys.keys[i][:, :, : slot + 1].transpose(-1, -2)) / w.scale  # (batch, kv, group, slot + 1)
        return scores.masked_fill(~mask, float("-inf")).softmax(-1) @ keys.values[i][:, :, : slot + 1]

    def _mlp(self, resid: Tensor, w: PackedLayer, matmul: Callable[[Tensor, Tensor], Tensor] = row_matmul) -> Tensor:
        x = rms(resid, None, w.eps2)
        gate, up = matmul(x, w.w_gate_in).split(self.d_mlp, -1)
        h = add_bias(w.act(gate) * up, w.b_in)
        down = add_bias(matmul(h, w.w_out), w.b_out) if self.rows else F.linear(h, w.w_out, w.b_out)
        return maybe_rms(down, w.ln2_post)
