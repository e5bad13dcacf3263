"""Parameter-efficient fine-tuning references, LoRA and (IA)3, as TransformerLens hooks.

Both train on the same data and loss as SITE (zero-shot train prompts, the
first answer token's cross-entropy, best valid loss kept) and change every
position, prompt and generated tokens alike (persistent hooks).

LoRA (Hu et al., 2022) on the query and value projections: the ln1 output x
is captured at ``blocks.{l}.ln1.hook_normalized`` (times ln1's weight and
bias, which TransformerLens applies after that hook), and ``hook_q`` /
``hook_v`` get ``+ (alpha / r) * x A B``, i.e. exactly W + (alpha / r) A B on
the projection. B starts at zero, so an untrained adapter changes nothing.

(IA)3 (Liu et al., 2022): learned vectors, initialised to one, rescale the
keys (``hook_k``), values (``hook_v``) and the MLP's inner activation
(``mlp.hook_post``).
"""

from __future__ import annotations

import math
from functools import partial

import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from ..gate import Hooks
from ..models.engines import norm_gain
from ..stages.objectives import train_valid_examples
from ..tasks import Task
from ..types import Model
from .base import Method, TaskContext, TrainConfig, method_seed, train_params


def capture_hook(
    x: Tensor, hook: HookPoint, store: dict[str, Tensor], gain: Tensor | None, bias: Tensor | None
) -> None:
    """Store the norm's output (``hook_normalized`` times its gain, plus bias)."""
    out = x * gain if gain is not None else x
    store["x"] = out + bias if bias is not None else out


def lora_hook(
    act: Float[Tensor, "batch pos head_index d_head"],
    hook: HookPoint,
    store: dict[str, Tensor],
    a: Tensor,
    b: Tensor,
    scale: float,
) -> Float[Tensor, "batch pos head_index d_head"]:
    """act += scale * (x A B), reshaped to heads."""
    delta = (store["x"].to(a.dtype) @ a) @ b  # (batch, pos, heads * d_head)
    return act + scale * delta.view(act.shape).to(act.dtype)


def scale_hook(act: Tensor, hook: HookPoint, s: Tensor) -> Tensor:
    """act *= s (broadcast over the trailing dimensions)."""
    return act * s.to(act.dtype)


class _Adapted(Method):
    """Parameters added to the frozen model through persistent hooks, trained by ``train_params``."""

    params: nn.ParameterList | None
    train_cfg: TrainConfig

    @property
    def n_trainable(self) -> int:
        return 0 if self.params is None else sum(p.numel() for p in self.params)

    def init_params(self, model: Model, seed: int = 0) -> None:
        raise NotImplementedError

    def fit(self, model: Model, task: Task, seed: int, ctx: TaskContext | None = None) -> None:
        self.init_params(model, seed)
        assert self.params is not None
        train, valid = train_valid_examples(model, task, self.train_cfg.objective)
        self.info = train_params(
            model, list(self.params), lambda: self.persistent_hooks(model), train, valid, self.train_cfg, seed
        )


class LoRA(_Adapted):
    """Low-rank updates of W_Q and W_V in every layer (rank 8, alpha 16)."""

    name = "lora"

    def __init__(self, rank: int = 8, alpha: float = 16.0, train: TrainConfig | None = None):
        super().__init__()
        self.rank, self.alpha = rank, alpha
        self.train_cfg = train or TrainConfig(steps=100, lr=1e-3, batch_size=8)
        self.params: nn.ParameterList | None = None  # per layer: A_q, B_q, A_v, B_v

    def init_params(self, model: Model, seed: int) -> None:
        cfg = model.cfg
        gen = torch.Generator().manual_seed(method_seed(seed, self.name))
        n_kv = cfg.n_key_value_heads or cfg.n_heads
        params = []
        for _ in range(cfg.n_layers):
            for width in (cfg.n_heads * cfg.d_head, n_kv * cfg.d_head):
                a = torch.empty(cfg.d_model, self.rank)
                nn.init.kaiming_uniform_(a.T, a=math.sqrt(5), generator=gen)  # as PEFT initialises A
                params += [
                    nn.Parameter(a.to(cfg.device)),
                    nn.Parameter(torch.zeros(self.rank, width, device=cfg.device)),
                ]
        self.params = nn.ParameterList(params)

    def persistent_hooks(self, model: Model) -> Hooks:
        self._fitted(self.params)
        hooks: Hooks = []
        scale = self.alpha / self.rank
        for layer in range(model.cfg.n_layers):
            store: dict[str, Tensor] = {}
            aq, bq, av, bv = self.params[4 * layer : 4 * layer + 4]
            ln = model.blocks[layer].ln1
            gain = norm_gain(model, ln) if hasattr(ln, "w") else None
            bias = getattr(ln, "b", None)
            hooks += [
                (f"blocks.{layer}.ln1.hook_normalized", partial(capture_hook, store=store, gain=gain, bias=bias)),
                (f"blocks.{layer}.attn.hook_q", partial(lora_hook, store=store, a=aq, b=bq, scale=scale)),
                (f"blocks.{layer}.attn.hook_v", partial(lora_hook, store=store, a=av, b=bv, scale=scale)),
            ]
        return hooks


class IA3(_Adapted):
    """Learned rescaling of keys, values and the MLP's inner activation in every layer."""

    name = "ia3"

    def __init__(self, train: TrainConfig | None = None):
        super().__init__()
        self.train_cfg = train or TrainConfig(steps=100, lr=3e-3, batch_size=8)
        self.params: nn.ParameterList | None = None  # per layer: l_k, l_v, l_ff

    def init_params(self, model: Model, seed: int = 0) -> None:
        cfg = model.cfg
        n_kv = cfg.n_key_value_heads or cfg.n_heads
        shapes = [(n_kv, cfg.d_head), (n_kv, cfg.d_head), (cfg.d_mlp,)]
        self.params = nn.ParameterList(
            [nn.Parameter(torch.ones(s, device=cfg.device)) for _ in range(cfg.n_layers) for s in shapes]
        )

    def persistent_hooks(self, model: Model) -> Hooks:
        self._fitted(self.params)
        hooks: Hooks = []
        for layer in range(model.cfg.n_layers):
            lk, lv, lff = self.params[3 * layer : 3 * layer + 3]
            hooks += [
                (f"blocks.{layer}.attn.hook_k", partial(scale_hook, s=lk)),
                (f"blocks.{layer}.attn.hook_v", partial(scale_hook, s=lv)),
                (f"blocks.{layer}.mlp.hook_post", partial(scale_hook, s=lff)),
            ]
        return hooks
