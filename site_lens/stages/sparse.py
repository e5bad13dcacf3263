"""Sparse SITE: SITE's loss plus a price on every head the gate opens.

    fit = fit_sparse(model, task, SparsityConfig("l0", weight=0.01), t=dense.adapter.t)
    fit.mask()                                # the heads left after thresholding, (layer, head) bool
    path = sparse_path(model, task, [0.001, 0.003, 0.01], dense=dense.adapter)   # warm-started sweep

Two penalties, each ``weight`` nats per open head added to the first-token loss:

* ``l1``: SITE's own gate, alpha = sigmoid(theta), with the L1 norm of alpha
  (alpha >= 0, so its sum). Weight 0 is SITE exactly. Alphas shrink but are
  never exactly 0, so the head set depends on the mask threshold.
* ``l0`` (default): a hard-concrete gate per head (Louizos, Welling and Kingma,
  "Learning Sparse Neural Networks through L0 Regularization", ICLR 2018;
  ``gate.HardConcreteGate``), with the expected number of non-zero gates as the
  penalty. Its deterministic alpha has exact zeros, so the head set is what the
  gate itself closes, not a threshold's choice. It is the published way to
  train exact zeros by gradient, and the one pruning studies of attention heads
  use (Voita et al., ACL 2019).

``fit_sparse`` trains one weight from scratch, like a SITE fit. ``sparse_path``
trains a sweep of weights in increasing order, each starting from the previous
one's theta (warm starts along the regularisation path), the first from dense
SITE's; each point costs ``steps`` optimiser steps instead of 400.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from ..adapter import Adapter
from ..config import ConfigError, EngineConfig, SelectionConfig, SiteConfig, SparsityConfig
from ..gate import AlphaGate, GateSpec, HardConcreteGate
from ..models import model_identity
from ..tasks import Task
from ..tokens import Example
from ..types import Model
from .embeddings import task_embedding
from .objectives import train_valid_examples
from .selection import AlphaTrainer
from .training import TrainHistory

HeadMask = Bool[Tensor, "layer head_index"]


class SparseTrainer(AlphaTrainer):
    """``AlphaTrainer`` with ``weight`` x (open heads) added to every loss; the gate is L1's or L0's."""

    def __init__(
        self,
        model: Model,
        t: Float[Tensor, "layer head_index d_head"],
        cfg: SelectionConfig | None = None,
        sparsity: SparsityConfig | None = None,
        seed: int = 0,
        theta: Float[Tensor, "layer head_index"] | None = None,
        engine: EngineConfig | None = None,
    ):
        cfg, engine = cfg or SelectionConfig(), engine or EngineConfig()
        self.sparsity = sparsity or SparsityConfig()
        n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
        if self.sparsity.penalty == "l0":
            if not engine.fast:
                raise ConfigError("the l0 penalty trains on the fast path only (its gate draws noise per step)")
            gate: AlphaGate = HardConcreteGate(n_layers, n_heads, cfg.theta_init, beta=self.sparsity.beta)
        else:
            gate = AlphaGate(n_layers, n_heads, cfg.theta_init)
        if theta is not None:
            with torch.no_grad():
                gate.theta.copy_(theta)
        super().__init__(model, t, cfg, seed, gate=gate, engine=engine)
        self.generator = torch.Generator(device=model.cfg.device).manual_seed(seed)

    def penalty(self) -> Tensor:
        """weight x the gate's open heads (L1: sum of alpha; L0: expected non-zero gates)."""
        return self.sparsity.weight * self.gate.open_heads()


@dataclass
class SparseFit:
    """One sparse-SITE point: its gate (as an adapter), the binary mask, and how it was trained."""

    adapter: Adapter  # its gate says how theta becomes alpha
    sparsity: SparsityConfig
    history: TrainHistory
    seconds: float

    @property
    def alpha(self) -> Float[Tensor, "layer head_index"]:
        return self.adapter.alpha

    def mask(self, threshold: float | None = None) -> HeadMask:
        """The heads whose alpha is above ``threshold`` (default: the config's)."""
        return self.alpha > (self.sparsity.threshold if threshold is None else threshold)

    def summary(self) -> dict:
        """Weight, penalty, heads with alpha > 0.5, heads with alpha > 0, heads in the mask."""
        a = self.alpha
        return {
            "penalty": self.sparsity.penalty,
            "weight": self.sparsity.weight,
            "threshold": self.sparsity.threshold,
            "n_open": int((a > 0.5).sum()),
            "n_nonzero": int((a > 0).sum()),
            "n_mask": int(self.mask().sum()),
            "steps": len(self.history.step),
            "best_step": self.history.best_step,
            "seconds": self.seconds,
        }


def hard_concrete_theta(theta: Float[Tensor, "layer head_index"], low: float = -0.1, high: float = 1.1) -> Tensor:
    """Hard-concrete logits whose deterministic alpha equals sigmoid(theta) (a dense SITE gate's alpha)."""
    s = (torch.sigmoid(theta.float()) - low) / (high - low)  # in (1/12, 11/12) for the default stretch
    return torch.log(s) - torch.log1p(-s)


def fit_sparse(
    model: Model,
    task: Task,
    sparsity: SparsityConfig | None = None,
    cfg: SiteConfig | None = None,
    t: Float[Tensor, "layer head_index d_head"] | None = None,
    theta: Float[Tensor, "layer head_index"] | None = None,
    examples: tuple[list[Example], list[Example]] | None = None,
) -> SparseFit:
    """Train one sparse gate on ``task`` (t given, or built as SITE's stage 1 with ``cfg``'s seed).

    ``theta`` starts the gate elsewhere than theta_init (a warm start, in the gate's own
    parameterisation); ``examples`` lends ready (train, valid) examples.

    Example:
        A tiny random model with a byte-level tokenizer stands in for a real one: its answers are
        noise, but the calls and what they return are those of a real run.

        >>> import site_lens as sl
        >>> model = sl.tiny_model("bytes")  # a byte-level tokenizer, built offline; or sl.load_model("smollm2-135m")
        >>> cfg = sl.SiteConfig(embedding=sl.EmbeddingConfig(n_prompts=2, n_shots=2),   # a few seconds' budget
        ...                     selection=sl.SelectionConfig(steps=2, eval_every=2, max_valid=2),
        ...                     eval=sl.EvalConfig(max_new_tokens=3, max_test=2))
        >>> sparse = fit_sparse(model, sl.load_task("uppercase"), sl.SparsityConfig(penalty="l0", weight=0.03), cfg)
        >>> sparse.alpha.shape, sparse.mask().dtype       # the gate; the heads it keeps open
        (torch.Size([2, 4]), torch.bool)
    """
    cfg = cfg or SiteConfig()
    sparsity = sparsity or cfg.sparsity or SparsityConfig()
    if cfg.selection.objective != "first_token":
        raise ConfigError(
            f"sparse SITE trains on the first answer token only, got objective {cfg.selection.objective!r}"
        )
    if t is None:
        t = task_embedding(model, task, cfg.embedding, cfg.seed)
    train, valid = examples or train_valid_examples(model, task)
    t0 = time.perf_counter()
    trainer = SparseTrainer(model, t, cfg.selection, sparsity, seed=cfg.seed, theta=theta, engine=cfg.engine)
    gate = trainer.fit(train, valid)
    seconds = time.perf_counter() - t0
    adapter = Adapter(
        t=t.detach().float().cpu(),
        theta=gate.theta.detach().float().cpu(),
        model=model_identity(model),
        meta={
            "task": task.name,
            "task_source": task.source,
            "seed": cfg.seed,
            "embedding": cfg.embedding.to_dict(),
            "selection": cfg.selection.to_dict(),
            "sparsity": sparsity.to_dict(),
            "history": trainer.history.to_dict(),
        },
        gate=gate.spec(),
    )
    return SparseFit(adapter, sparsity, trainer.history, seconds)


def sparse_path(
    model: Model,
    task: Task,
    weights: Sequence[float],
    dense: Adapter,
    penalty: str = "l0",
    steps: int = 100,
    cfg: SiteConfig | None = None,
    threshold: float = 0.5,
) -> list[SparseFit]:
    """One fit per weight in increasing order, each warm-started from the last (the first from ``dense``).

    ``dense`` is a SITE adapter of the same task and seed (its t is used throughout); every
    point trains ``steps`` steps with a fresh Adam and keeps its best valid (penalised) loss.

    Example:
        A tiny random model with a byte-level tokenizer stands in for a real one: its answers are
        noise, but the calls and what they return are those of a real run.

        >>> import site_lens as sl
        >>> model = sl.tiny_model("bytes")  # a byte-level tokenizer, built offline; or sl.load_model("smollm2-135m")
        >>> cfg = sl.SiteConfig(embedding=sl.EmbeddingConfig(n_prompts=2, n_shots=2),   # a few seconds' budget
        ...                     selection=sl.SelectionConfig(steps=2, eval_every=2, max_valid=2),
        ...                     eval=sl.EvalConfig(max_new_tokens=3, max_test=2))
        >>> task = sl.load_task("uppercase")
        >>> dense = sl.fit_site(model, task, cfg).adapter
        >>> path = sparse_path(model, task, [0.01, 0.1], dense, penalty="l0", steps=4, cfg=cfg)
        >>> [fit.sparsity.weight for fit in path]
        [0.01, 0.1]
        >>> [int(fit.mask().sum()) <= 8 for fit in path]   # heads left open at each weight
        [True, True]
    """
    if list(weights) != sorted(weights) or any(not math.isfinite(w) or w < 0 for w in weights):
        raise ConfigError(f"sparse_path needs finite weights >= 0 in increasing order, got {list(weights)}")
    if dense.gate != GateSpec():
        raise ConfigError(f"sparse_path starts from a dense SITE adapter, got one with a {dense.gate.kind} gate")
    cfg = cfg or SiteConfig(seed=int(dense.meta.get("seed", 0)))
    point_cfg = dataclasses.replace(cfg, selection=dataclasses.replace(cfg.selection, steps=steps))
    theta = dense.theta.float()
    if penalty == "l0":
        theta = hard_concrete_theta(theta)
    examples = train_valid_examples(model, task)
    fits = []
    for w in weights:
        fit = fit_sparse(model, task, SparsityConfig(penalty, float(w), threshold), point_cfg, dense.t, theta, examples)
        fits.append(fit)
        theta = fit.adapter.theta
    return fits
