"""Function vectors (Todd et al., ICLR 2024).

1. Mean head outputs: hook_z at the last token averaged over 10-shot prompts
   (shared with SITE's stage 1, ``TaskContext.mean_z``).
2. Causal indirect effect of every head on shuffled-label 10-shot prompts
   (``site_lens.cie.causal_indirect_effect``); keep the top k = 10 heads.
3. The function vector v = sum over those heads of mean_z[l, h] @ W_O[l, h]
   (each head's mean contribution to the residual stream, without b_O).
4. At inference v is added to the residual stream at the last prompt token,
   at the input of one layer (``blocks.{L}.hook_resid_pre``), L chosen by the
   lowest first-token loss on the valid split. Nothing is trained.
"""

from __future__ import annotations

from functools import partial

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer
from transformer_lens.hook_points import HookPoint
from transformer_lens.utilities import get_act_name

from ..cie import causal_indirect_effect
from ..inject import HookFactory
from ..tasks import Task
from .base import Method, TaskContext, choose_layer, train_valid_examples


def add_at_hook(
    resid: Float[Tensor, "batch pos d_model"], hook: HookPoint, v: Float[Tensor, " d_model"], pos: Int[Tensor, " batch"]
) -> Float[Tensor, "batch pos d_model"]:
    """resid[b, pos_b] += v."""
    rows = torch.arange(resid.shape[0], device=resid.device)
    return resid.index_put((rows, pos), resid[rows, pos] + v.to(resid.dtype))


def function_vector(
    model: HookedTransformer, mean_z: Float[Tensor, "layer head_index d_head"], heads: list[tuple[int, int]]
) -> Float[Tensor, " d_model"]:
    """Sum of the chosen heads' mean outputs through their W_O."""
    v = torch.zeros(model.cfg.d_model)
    for layer, head in heads:
        w_o = model.blocks[layer].attn.W_O[head].detach().float().cpu()  # (d_head, d_model)
        v += mean_z[layer, head].float() @ w_o
    return v


class FunctionVector(Method):
    """Top-k CIE heads' mean outputs summed into one vector, added at one layer."""

    name = "fv"

    def __init__(self, k: int = 10, n_cie_prompts: int = 25, n_shots: int = 10):
        super().__init__()
        self.k, self.n_cie_prompts, self.n_shots = k, n_cie_prompts, n_shots
        self.v: Tensor | None = None
        self.layer = 0

    def fit(self, model: HookedTransformer, task: Task, seed: int, ctx: TaskContext | None = None) -> None:
        ctx = ctx or TaskContext(task, seed)
        mean_z = ctx.mean_z(model)
        cie = causal_indirect_effect(model, task, mean_z, n_prompts=self.n_cie_prompts, n_shots=self.n_shots, seed=seed)
        k = min(self.k, cie.numel())
        top = torch.topk(cie.flatten(), k).indices.tolist()
        heads = [divmod(i, model.cfg.n_heads) for i in top]
        self.v = function_vector(model, mean_z, heads)
        _, valid = train_valid_examples(model, task)
        v = self.v.to(device=model.cfg.device, dtype=model.cfg.dtype)
        self.layer, losses = choose_layer(
            model, valid[:50], self._factory(model), list(range(model.cfg.n_layers)), edit=lambda _: lambda r: r + v
        )
        self.info = {"heads": [f"L{l}H{h}" for l, h in heads], "layer": self.layer, "valid_loss_by_layer": losses}

    def _factory(self, model: HookedTransformer):
        v = self.v.to(device=model.cfg.device)

        def at_layer(layer: int) -> HookFactory:
            return lambda last: [(get_act_name("resid_pre", layer), partial(add_at_hook, v=v, pos=last))]

        return at_layer

    def prefill_hooks(self, model: HookedTransformer) -> HookFactory | None:
        assert self.v is not None, "fit first"
        return self._factory(model)(self.layer)
