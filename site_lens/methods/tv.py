"""Task vectors (Hendel et al., Findings of EMNLP 2023).

The residual stream at the input of layer L (``blocks.{L}.hook_resid_pre``) at
the last token, averaged over 10-shot prompts, *replaces* the zero-shot
query's at that layer and position. L is chosen by the lowest first-token
loss on the valid split. Nothing is trained. (The paper averages over
prompts whose query is a dummy; here the queries come from train, the same
50 ten-shot prompts SITE's stage 1 uses.)
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens.hook_points import HookPoint
from transformer_lens.utilities import get_act_name

from ..gate import HookFactory
from ..stages.objectives import train_valid_examples
from ..tasks import Task
from ..types import Model
from .base import Method, TaskContext, choose_layer, sum_last_token


def replace_at_hook(
    resid: Float[Tensor, "batch pos d_model"], hook: HookPoint, v: Float[Tensor, " d_model"], pos: Int[Tensor, " batch"]
) -> Float[Tensor, "batch pos d_model"]:
    """resid[b, pos_b] <- v."""
    rows = torch.arange(resid.shape[0], device=resid.device)
    return resid.index_put((rows, pos), v.to(resid.dtype).expand(len(rows), -1))


def mean_last_resid(model: Model, prompts: Sequence[str], batch_size: int = 10) -> Float[Tensor, "layer d_model"]:
    """hook_resid_pre of every layer at the last token, averaged over prompts."""
    names = [get_act_name("resid_pre", layer) for layer in range(model.cfg.n_layers)]
    return sum_last_token(model, prompts, names, batch_size) / len(prompts)


class TaskVector(Method):
    """Mean few-shot last-token residual patched into the zero-shot query at one layer."""

    name = "tv"

    def __init__(self, max_valid: int = 50) -> None:
        super().__init__()
        self.max_valid = max_valid  # valid items scoring each layer
        self.vectors: Tensor | None = None  # (layer, d_model)
        self.layer = 0

    def fit(self, model: Model, task: Task, seed: int, ctx: TaskContext | None = None) -> None:
        ctx = ctx or TaskContext(task, seed)
        self.vectors = mean_last_resid(model, [p for p, _ in ctx.icl_prompts()])
        _, valid = train_valid_examples(model, task)
        vecs = self.vectors.to(device=model.cfg.device, dtype=model.cfg.dtype)
        self.layer, losses = choose_layer(
            model,
            valid[: self.max_valid],
            lambda layer: lambda r: vecs[layer].expand_as(r),
            list(range(model.cfg.n_layers)),
        )
        self.info = {"layer": self.layer, "valid_loss_by_layer": losses}

    def _factory(self, model: Model):
        vecs = self.vectors.to(device=model.cfg.device)

        def at_layer(layer: int) -> HookFactory:
            return lambda last: [(get_act_name("resid_pre", layer), partial(replace_at_hook, v=vecs[layer], pos=last))]

        return at_layer

    def prefill_hooks(self, model: Model) -> HookFactory | None:
        self._fitted(self.vectors)
        return self._factory(model)(self.layer)
