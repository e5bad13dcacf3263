"""Function vectors (Todd et al., ICLR 2024).

1. Mean head outputs: hook_z at the last token averaged over 10-shot prompts
   (shared with SITE's stage 1, ``TaskContext.mean_z``).
2. Causal indirect effect of every head on shuffled-label 10-shot prompts
   (``site_lens.analysis.cie.causal_indirect_effect``); keep the top k = 10 heads.
3. The function vector v = sum over those heads of mean_z[l, h] @ W_O[l, h]
   (each head's mean contribution to the residual stream, without b_O). Where
   a norm sits between W_O and the residual stream (Gemma 2/3's ``ln1_post``),
   each head's output also goes through that norm linearised at the last
   token: times the RMSNorm's gain over its scale, the inverse scale
   averaged over the same 10-shot prompts (TransformerLens 3.9 builds only
   RMSNorms there).
4. At inference v is added to the residual stream at the last prompt token,
   at the input of one layer (``blocks.{L}.hook_resid_pre``), L chosen by the
   lowest first-token loss on the valid split. Nothing is trained.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens.hook_points import HookPoint
from transformer_lens.utilities import get_act_name

from ..analysis.cie import causal_indirect_effect
from ..gate import HookFactory
from ..models.engines import norm_gain
from ..stages.objectives import train_valid_examples
from ..tasks import Task
from ..types import Model
from .base import Method, TaskContext, choose_layer, sum_last_token


def add_at_hook(
    resid: Float[Tensor, "batch pos d_model"], hook: HookPoint, v: Float[Tensor, " d_model"], pos: Int[Tensor, " batch"]
) -> Float[Tensor, "batch pos d_model"]:
    """resid[b, pos_b] += v."""
    rows = torch.arange(resid.shape[0], device=resid.device)
    return resid.index_put((rows, pos), resid[rows, pos] + v.to(resid.dtype))


def post_attn_norms(model: Model) -> list[torch.nn.Module | None]:
    """Per layer, the norm between the attention's W_O and the residual stream (``ln1_post``), or None."""
    norms = [getattr(block, "ln1_post", None) for block in model.blocks]
    return [n if hasattr(n, "hook_scale") else None for n in norms]  # an Identity changes nothing


def mean_inv_post_scale(model: Model, prompts: Sequence[str], batch_size: int = 10) -> Float[Tensor, " layer"]:
    """Per layer, 1 / the post-attention norm's scale at the last token, averaged over prompts (1 where no norm)."""
    norms = post_attn_norms(model)
    layers = [layer for layer, n in enumerate(norms) if n is not None]
    inv = torch.ones(model.cfg.n_layers)
    if layers:
        names = [norms[layer].hook_scale.name for layer in layers]
        total = sum_last_token(model, prompts, names, batch_size, lambda s: 1.0 / s, stop_at_layer=max(layers) + 1)
        inv[layers] = total[:, 0] / len(prompts)  # (layer,) from (layer, 1)
    return inv


def function_vector(
    model: Model,
    mean_z: Float[Tensor, "layer head_index d_head"],
    heads: list[tuple[int, int]],
    inv_scale: Float[Tensor, " layer"] | None = None,
) -> Float[Tensor, " d_model"]:
    """Sum of the chosen heads' mean outputs through their W_O (and the post-attention norm, if any)."""
    norms = post_attn_norms(model)
    v = torch.zeros(model.cfg.d_model)
    for layer, head in heads:
        w_o = model.blocks[layer].attn.W_O[head].detach().float().cpu()  # (d_head, d_model)
        out = mean_z[layer, head].float() @ w_o  # (d_model,)
        norm = norms[layer]
        if norm is not None:
            if inv_scale is None:
                raise ValueError(f"layer {layer} has a post-attention norm: pass inv_scale (mean_inv_post_scale)")
            out = out * norm_gain(model, norm).detach().float().cpu() * inv_scale[layer]
        v += out
    return v


class FunctionVector(Method):
    """Top-k CIE heads' mean outputs summed into one vector, added at one layer."""

    name = "fv"

    def __init__(self, k: int = 10, n_cie_prompts: int = 25, n_shots: int = 10, max_valid: int = 50):
        super().__init__()
        self.k, self.n_cie_prompts, self.n_shots, self.max_valid = k, n_cie_prompts, n_shots, max_valid
        self.v: Tensor | None = None
        self.layer = 0

    def fit(self, model: Model, task: Task, seed: int, ctx: TaskContext | None = None) -> None:
        ctx = ctx or TaskContext(task, seed)
        mean_z = ctx.mean_z(model)
        cie = causal_indirect_effect(model, task, mean_z, n_prompts=self.n_cie_prompts, n_shots=self.n_shots, seed=seed)
        k = min(self.k, cie.numel())
        top = torch.topk(cie.flatten(), k).indices.tolist()
        heads = [divmod(i, model.cfg.n_heads) for i in top]
        inv_scale = None
        if any(n is not None for n in post_attn_norms(model)):
            inv_scale = mean_inv_post_scale(model, [p for p, _ in ctx.icl_prompts()], ctx.embedding.batch_size)
        self.v = function_vector(model, mean_z, heads, inv_scale)
        _, valid = train_valid_examples(model, task)
        v = self.v.to(device=model.cfg.device, dtype=model.cfg.dtype)
        self.layer, losses = choose_layer(
            model, valid[: self.max_valid], lambda _: lambda r: r + v, list(range(model.cfg.n_layers))
        )
        self.info = {"heads": [f"L{l}H{h}" for l, h in heads], "layer": self.layer, "valid_loss_by_layer": losses}

    def _factory(self, model: Model):
        v = self.v.to(device=model.cfg.device)

        def at_layer(layer: int) -> HookFactory:
            return lambda last: [(get_act_name("resid_pre", layer), partial(add_at_hook, v=v, pos=last))]

        return at_layer

    def prefill_hooks(self, model: Model) -> HookFactory | None:
        self._fitted(self.v)
        return self._factory(model)(self.layer)
