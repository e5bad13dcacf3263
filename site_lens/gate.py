"""SITE's gate: z <- (1 - alpha) z + alpha t, written once.

``AlphaGate`` holds theta, one scalar per (layer, head), with alpha =
sigmoid(theta), in the spirit of pyvene's ``SigmoidMaskIntervention``:
parameter and math in one object. ``AlphaGate.mix`` is the interpolation
itself; every path that mixes a head's ``hook_z`` toward a source calls it at
run time: the injection hook here (stage 3, the naive and hooked training
paths, patching, MTV), and the packed last-token engine (``engine.packed``).
Patching a head is the same mix with alpha in {0, 1}.

    gate = AlphaGate(n_layers, n_heads)
    hooks = injection_hooks(model, t, gate.alpha(), pos=-1)
    with model.hooks(fwd_hooks=hooks):
        logits = model(tokens)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint
from transformer_lens.utilities import get_act_name

from .types import HookFactory, Hooks, Model

__all__ = ["GATE_KINDS", "AlphaGate", "GateSpec", "HardConcreteGate", "HookFactory", "Hooks", "Injection",
           "gate_hook", "injection_hooks", "stretch_clip", "z_names"]  # fmt: skip


def z_names(model: Model) -> list[str]:
    """The exact hook names of every layer's per-head attention output."""
    return [get_act_name("z", layer) for layer in range(model.cfg.n_layers)]


class AlphaGate(nn.Module):
    """alpha = sigmoid(theta), one scalar per (layer, head); theta starts at ``theta_init``.

    Example:
        >>> gate = AlphaGate(n_layers=2, n_heads=4)   # theta = 0: every alpha starts at 0.5
        >>> gate.alpha()
        tensor([[0.5000, 0.5000, 0.5000, 0.5000],
                [0.5000, 0.5000, 0.5000, 0.5000]], grad_fn=<SigmoidBackward0>)
        >>> [name for name, _ in gate.named_parameters()]   # theta is what AlphaTrainer trains
        ['theta']
    """

    def __init__(self, n_layers: int, n_heads: int, theta_init: float = 0.0):
        super().__init__()
        self.theta = nn.Parameter(torch.full((n_layers, n_heads), float(theta_init)))

    @staticmethod
    def mix(z: Tensor, t: Tensor, alpha: Tensor) -> Tensor:
        """(1 - alpha) * z + alpha * t, broadcast; the one place SITE's interpolation is written."""
        return torch.lerp(z, t, alpha)

    def alpha(self) -> Float[Tensor, "layer head_index"]:
        return torch.sigmoid(self.theta)

    def hooks(self, model: Model, t: Float[Tensor, "layer head_index d_head"], pos) -> Hooks:
        """Injection hooks for one forward pass (differentiable in theta)."""
        return injection_hooks(model, t, self.alpha(), pos)

    def train_alpha(self, generator: torch.Generator | None = None) -> Float[Tensor, "layer head_index"]:
        """The alpha a training step injects: SITE's is ``alpha()`` itself."""
        return self.alpha()

    def open_heads(self) -> Tensor:
        """How many heads the gate opens, differentiably: the L1 norm of alpha (alpha >= 0)."""
        return self.alpha().sum()

    def spec(self) -> GateSpec:
        """How an adapter turns this gate's theta into alpha."""
        return GateSpec()


class HardConcreteGate(AlphaGate):
    """An L0 gate (Louizos, Welling and Kingma 2018): a stretched, clipped concrete variable per head.

    Training draws ``u ~ U(0, 1)`` and injects
    ``min(1, max(0, sigmoid((logit(u) + theta) / beta) * (high - low) + low))``, which is exactly
    0 or 1 with positive probability; ``open_heads`` is the expected number of non-zero gates,
    ``sum sigmoid(theta - beta * log(-low / high))``. At inference the gate is deterministic:
    ``alpha = min(1, max(0, sigmoid(theta) * (high - low) + low))`` (exact zeros and ones).
    theta = 0 gives alpha = 0.5, where SITE starts.
    """

    def __init__(
        self,
        n_layers: int,
        n_heads: int,
        theta_init: float = 0.0,
        beta: float = 2 / 3,
        low: float = -0.1,
        high: float = 1.1,
    ):
        super().__init__(n_layers, n_heads, theta_init)
        if not (beta > 0 and low < 0 and high > 1):
            raise ValueError(f"hard-concrete gate needs beta > 0 and low < 0 < 1 < high, got {beta}, {low}, {high}")
        self.beta, self.low, self.high = float(beta), float(low), float(high)

    def alpha(self) -> Float[Tensor, "layer head_index"]:
        return stretch_clip(torch.sigmoid(self.theta), self.low, self.high)

    def train_alpha(self, generator: torch.Generator | None = None) -> Float[Tensor, "layer head_index"]:
        u = torch.rand(self.theta.shape, generator=generator, device=self.theta.device).clamp(1e-6, 1 - 1e-6)
        s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + self.theta) / self.beta)
        return stretch_clip(s, self.low, self.high)

    def open_heads(self) -> Tensor:
        return torch.sigmoid(self.theta - self.beta * math.log(-self.low / self.high)).sum()

    def spec(self) -> GateSpec:
        return GateSpec("hard_concrete", self.low, self.high)


def stretch_clip(s: Tensor, low: float, high: float) -> Tensor:
    """s in (0, 1) stretched to (low, high) and clipped to [0, 1]."""
    return (s * (high - low) + low).clamp(0.0, 1.0)


GATE_KINDS = ("sigmoid", "hard_concrete")


@dataclass(frozen=True)
class GateSpec:
    """How a saved gate's theta becomes alpha: SITE's sigmoid or a hard-concrete gate, or a binary mask of either.

    ``alpha(theta)`` is sigmoid(theta), or for ``hard_concrete`` sigmoid(theta) stretched to
    (low, high) and clipped to [0, 1]; with a ``threshold`` it is 1 where that alpha exceeds the
    threshold, else 0 (sparse SITE's masks).
    """

    kind: Literal["sigmoid", "hard_concrete"] = "sigmoid"
    low: float = -0.1  # hard_concrete: the stretch interval (Louizos et al. 2018)
    high: float = 1.1
    threshold: float | None = None  # a binary mask of the gate at this alpha

    def __post_init__(self) -> None:
        if self.kind not in GATE_KINDS:
            raise ValueError(f"unknown gate kind {self.kind!r}; known: {', '.join(GATE_KINDS)}")

    def alpha(self, theta: Float[Tensor, "layer head_index"]) -> Float[Tensor, "layer head_index"]:
        a = torch.sigmoid(theta)
        if self.kind == "hard_concrete":
            a = stretch_clip(a, self.low, self.high)
        return a if self.threshold is None else (a > self.threshold).to(theta.dtype)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> GateSpec:
        """``to_dict``'s form, or the older ``{"kind": "mask", "threshold": x, "of": inner}`` (None: sigmoid)."""
        d = dict(d or {})
        if d.get("kind") == "mask":
            inner = cls.from_dict(d.get("of"))
            if inner.threshold is not None:  # a mask of a mask: no single threshold means the same
                raise ValueError(f"{d} is a mask of a mask, which no gate of this version is")
            return dataclasses.replace(inner, threshold=float(d["threshold"]))
        kind, unknown = d.get("kind", "sigmoid"), d.keys() - {f.name for f in dataclasses.fields(cls)}
        if kind not in GATE_KINDS or unknown or (kind == "hard_concrete" and not {"low", "high"} <= d.keys()):
            raise ValueError(f"{d} is no gate (kinds: {', '.join(GATE_KINDS)}; hard_concrete needs low and high)")
        threshold = None if d.get("threshold") is None else float(d["threshold"])
        return cls(kind, float(d.get("low", cls.low)), float(d.get("high", cls.high)), threshold)


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

    Example:
        >>> import torch
        >>> from transformer_lens.hook_points import HookPoint
        >>> z = torch.zeros(1, 3, 4, 8)                  # one layer's hook_z: (batch, pos, head, d_head)
        >>> t = torch.ones(4, 8)                         # that layer's task embedding
        >>> alpha = torch.tensor([0.0, 0.25, 1.0, 0.0])  # one gate per head
        >>> out = gate_hook(z, HookPoint(), t, alpha, pos=-1)
        >>> out[0, -1, :, 0]
        tensor([0.0000, 0.2500, 1.0000, 0.0000])
        >>> bool(out[0, :-1].eq(0).all())                # the other positions are untouched
        True
    """
    rows = torch.arange(z.shape[0], device=z.device)
    if isinstance(pos, int):
        pos = torch.full_like(rows, pos % z.shape[1])
    old = z[rows, pos]  # (batch, head, d_head)
    a = alpha.to(device=z.device, dtype=z.dtype)[..., None]  # (*rows, head, 1)
    new = AlphaGate.mix(old, t.to(device=z.device, dtype=z.dtype), a)
    return z.index_put((rows, pos), new)


@dataclass(frozen=True, eq=False)
class Injection:
    """SITE's intervention as one record (pyvene's shape: a source, a weight, a mix and a place).

    ``t`` is mixed into every layer's ``hook_z`` with weight ``alpha``, ``(1 - alpha) z + alpha t``
    (``AlphaGate.mix``, in ``gate_hook``), at ``at``: each row's last prompt token, as its position in
    the sequence (one int for every row or one per row; a negative int counts from the end of the
    forward). A forward that runs the positions ``start`` onward of each row (after a cached prefix
    of that length) finds it at ``at - start`` (``where``); where that is before its first position,
    as in every decode step after the prefill, it injects nothing (a negative ``at`` means the end of
    every forward instead, as ``gate_hook``'s ``pos=-1`` does). The one rule every path reads
    here: the hooks of either model class, the cached and re-run backends, generation (its cached
    and uncached decoders) and the Hugging Face hooks (``models.hf``); the packed forward
    (``engine.packed``) mixes at its first new token, the last prompt token after a cached prefix.

    Example:
        >>> import torch
        >>> inj = Injection(torch.zeros(2, 4, 8), torch.full((2, 4), 0.5), at=6)  # t, alpha, last prompt token
        >>> inj.where(start=0), inj.where(start=6), inj.where(start=7)  # a whole prompt, its last token, a decode step
        (6, 0, None)
    """

    t: Tensor  # (*trows, layer, head, d_head)
    alpha: Tensor  # (*arows, layer, head)
    at: Tensor | int = -1  # the last prompt token: its position, one for all rows (int) or one per row

    def where(self, start: int = 0) -> Tensor | int | None:
        """The injection's position among the forward's own, which begin at ``start``; None: not in this forward."""
        if isinstance(self.at, int):
            if self.at < 0:
                return self.at  # from the end of whatever runs
            return self.at - start if self.at >= start else None
        if start == 0:
            return self.at  # a whole sequence: each row's own position (a negative one from the end)
        if bool((self.at < 0).any()):
            raise ValueError(f"positions counted from the end cannot be placed in a forward from position {start}")
        rel = self.at - start
        inside = rel >= 0
        if bool(inside.all()):
            return rel
        if bool(inside.any()):
            raise ValueError(f"some rows' last prompt token is before position {start} and some after it")
        return None

    def layer(self, layer: int) -> tuple[Tensor, Tensor]:
        """That layer's t (*trows, head, d_head) and alpha (*arows, head)."""
        return self.t.select(-3, layer), self.alpha.select(-2, layer)

    def hooks(self, model: Model, start: int = 0) -> Hooks:
        """One ``gate_hook`` per layer for a forward over positions ``start`` onward (none where the last prompt
        token is not among them)."""
        pos = self.where(start)
        if pos is None:
            return []
        return [
            (name, partial(gate_hook, t=t, alpha=alpha, pos=pos))
            for name, (t, alpha) in zip(z_names(model), map(self.layer, range(model.cfg.n_layers)))
        ]


def injection_hooks(
    model: Model,
    t: Float[Tensor, "*trows layer head_index d_head"],
    alpha: Float[Tensor, "*arows layer head_index"],
    pos: Int[Tensor, " batch"] | int = -1,
) -> Hooks:
    """One ``gate_hook`` per layer, bound to that layer's t and alpha (each one for all rows or one per row), at
    ``pos`` of the forward (``Injection(t, alpha, pos).hooks(model)``).

    Example:
        >>> import torch
        >>> import site_lens as sl
        >>> model = sl.tiny_model()
        >>> t = torch.randn(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)
        >>> alpha = torch.full((model.cfg.n_layers, model.cfg.n_heads), 0.5)
        >>> hooks = injection_hooks(model, t, alpha, pos=-1)
        >>> [name for name, _ in hooks]
        ['blocks.0.attn.hook_z', 'blocks.1.attn.hook_z']
        >>> with model.hooks(fwd_hooks=hooks):             # t mixed into the last token's heads
        ...     logits = model(torch.tensor([[1, 5, 7]]))
        >>> logits.shape
        torch.Size([1, 3, 50])
    """
    return Injection(t, alpha, pos).hooks(model)
