"""SITE's gate: z <- (1 - alpha) z + alpha t, written once.

``AlphaGate`` holds theta, one scalar per (layer, head), with alpha =
sigmoid(theta), in the spirit of pyvene's ``SigmoidMaskIntervention``:
parameter and math in one object. ``AlphaGate.mix`` is the interpolation
itself; every path that mixes a head's ``hook_z`` toward a source calls it at
run time: the injection hook here (stage 3, the naive and hooked training
paths, patching, MTV), and the packed last-token engine (``lasttoken``).
Patching a head is the same mix with alpha in {0, 1}.

    gate = AlphaGate(n_layers, n_heads)
    hooks = injection_hooks(model, t, gate.alpha(), pos=-1)
    with model.hooks(fwd_hooks=hooks):
        logits = model(tokens)
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformer_lens import HookedTransformer
from transformer_lens.hook_points import HookPoint
from transformer_lens.utilities import get_act_name

Hooks = list[tuple[str, Callable]]
HookFactory = Callable[[Tensor], Hooks]  # last-token index per row -> hooks for the prefill


def z_names(model: HookedTransformer) -> list[str]:
    """The exact hook names of every layer's per-head attention output."""
    return [get_act_name("z", layer) for layer in range(model.cfg.n_layers)]


class AlphaGate(nn.Module):
    """alpha = sigmoid(theta), one scalar per (layer, head); theta starts at ``theta_init``."""

    def __init__(self, n_layers: int, n_heads: int, theta_init: float = 0.0):
        super().__init__()
        self.theta = nn.Parameter(torch.full((n_layers, n_heads), float(theta_init)))

    @staticmethod
    def mix(z: Tensor, t: Tensor, alpha: Tensor) -> Tensor:
        """(1 - alpha) * z + alpha * t, broadcast; the one place SITE's interpolation is written."""
        return torch.lerp(z, t, alpha)

    def alpha(self) -> Float[Tensor, "layer head_index"]:
        return torch.sigmoid(self.theta)

    def forward(
        self, z: Float[Tensor, "*batch layer head_index d_head"], t: Float[Tensor, "layer head_index d_head"]
    ) -> Float[Tensor, "*batch layer head_index d_head"]:
        """Every head's z mixed toward t by its alpha."""
        return self.mix(z, t.to(z.dtype), self.alpha().to(z.dtype)[..., None])

    def hooks(self, model: HookedTransformer, t: Float[Tensor, "layer head_index d_head"], pos) -> Hooks:
        """Injection hooks for one forward pass (differentiable in theta)."""
        return injection_hooks(model, t, self.alpha(), pos)


def gate_hook(
    z: Float[Tensor, "batch pos head_index d_head"],
    hook: HookPoint,
    t: Float[Tensor, "*trows head_index d_head"],
    alpha: Float[Tensor, "*arows head_index"],
    pos: Int[Tensor, " batch"] | int,
) -> Float[Tensor, "batch pos head_index d_head"]:
    """z <- (1 - alpha) z + alpha t at position ``pos`` of each row (an int, or one per row).

    ``t`` and ``alpha`` are one for all rows, or one per row (a leading batch dim);
    they are moved to z's device and dtype.
    """
    rows = torch.arange(z.shape[0], device=z.device)
    if isinstance(pos, int):
        pos = torch.full_like(rows, pos % z.shape[1])
    old = z[rows, pos]  # (batch, head, d_head)
    a = alpha.to(device=z.device, dtype=z.dtype)[..., None]  # (*rows, head, 1)
    new = AlphaGate.mix(old, t.to(device=z.device, dtype=z.dtype), a)
    return z.index_put((rows, pos), new)


def injection_hooks(
    model: HookedTransformer,
    t: Float[Tensor, "*trows layer head_index d_head"],
    alpha: Float[Tensor, "*arows layer head_index"],
    pos: Int[Tensor, " batch"] | int = -1,
) -> Hooks:
    """One ``gate_hook`` per layer, bound to that layer's t and alpha (each one for all rows or one per row)."""
    return [
        (name, partial(gate_hook, t=t.select(-3, layer), alpha=alpha.select(-2, layer), pos=pos))
        for layer, name in enumerate(z_names(model))
    ]
