"""Implicit in-context learning, I2CL (Li et al., 2024).

Context vectors: each of 10 train demonstrations 'Q: x\\nA: y' is run on its
own, and every layer's attention output (``hook_attn_out``) and MLP output
(``hook_mlp_out``) at its last token are averaged over them. At inference
each of those outputs is changed at *every* position, prompt and generated
tokens alike, as

    out <- l1 * out + l0 * c

with four scalars per layer (l0, l1 for the attention and for the MLP),
initialised l0 = 0.1, l1 = 1, and trained with Adam on the first answer
token's cross-entropy over zero-shot train prompts (the model frozen; or every
answer token and its end, ``TrainConfig.objective``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import partial

import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint
from transformer_lens.utilities import get_act_name

from ..gate import Hooks
from ..stages.objectives import train_valid_examples
from ..tasks import Task, format_pair
from ..types import Model
from .base import Method, TaskContext, TrainConfig, sum_last_token, train_params

KINDS = ("attn_out", "mlp_out")


def linear_combine_hook(
    out: Float[Tensor, "batch pos d_model"], hook: HookPoint, c: Float[Tensor, " d_model"], lam: Float[Tensor, " 2"]
) -> Float[Tensor, "batch pos d_model"]:
    """out <- lam[1] * out + lam[0] * c at every position."""
    return lam[1].to(out.dtype) * out + lam[0].to(out.dtype) * c.to(out.dtype)


def context_vectors(model: Model, demos: Sequence[str], batch_size: int = 10) -> Float[Tensor, "kind layer d_model"]:
    """Mean attention and MLP outputs at each demonstration's last token, per layer."""
    names = [get_act_name(k, layer) for k in KINDS for layer in range(model.cfg.n_layers)]
    total = sum_last_token(model, demos, names, batch_size)  # (kind * layer, d_model)
    return total.view(len(KINDS), model.cfg.n_layers, -1) / len(demos)


class I2CL(Method):
    """Demonstration context vectors mixed into every layer's attention and MLP outputs."""

    name = "i2cl"

    def __init__(self, n_demos: int = 10, train: TrainConfig | None = None):
        super().__init__()
        self.n_demos = n_demos
        self.train_cfg = train or TrainConfig(steps=100, lr=1e-2, batch_size=8)
        self.c: Tensor | None = None  # (kind, layer, d_model)
        self.lam: nn.Parameter | None = None  # (kind, layer, 2): (l0, l1)

    @property
    def n_trainable(self) -> int:
        """Four scalars per layer."""
        return 0 if self.lam is None else self.lam.numel()

    def init_params(self, model: Model, c: Tensor) -> None:
        self.c = c.clone().to(device=model.cfg.device)  # a normal tensor (c comes from inference mode)
        lam = torch.tensor([0.1, 1.0]).repeat(len(KINDS), model.cfg.n_layers, 1)  # (kind, layer, 2)
        self.lam = nn.Parameter(lam.to(model.cfg.device))

    def fit(self, model: Model, task: Task, seed: int, ctx: TaskContext | None = None) -> None:
        rng = random.Random(seed)
        demos = rng.sample(list(task.train), min(self.n_demos, len(task.train)))
        self.init_params(model, context_vectors(model, [format_pair(x, y) for x, y in demos]))
        train, valid = train_valid_examples(model, task, self.train_cfg.objective)
        self.info = train_params(
            model, [self.lam], lambda: self.persistent_hooks(model), train, valid, self.train_cfg, seed
        )

    def persistent_hooks(self, model: Model) -> Hooks:
        self._fitted(self.lam, self.c)
        return [
            (get_act_name(kind, layer), partial(linear_combine_hook, c=self.c[k, layer], lam=self.lam[k, layer]))
            for k, kind in enumerate(KINDS)
            for layer in range(model.cfg.n_layers)
        ]
