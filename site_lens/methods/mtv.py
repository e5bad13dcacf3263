"""Multimodal task vectors (Huang et al., NeurIPS 2024), for text.

Mean head outputs (hook_z at the last token over 10-shot prompts, shared with
SITE's stage 1). A Bernoulli policy, p = sigmoid(phi) with one logit per
(layer, head), chooses which heads to replace by their mean at the last
prompt token. phi is trained with REINFORCE: each step samples a head mask,
the reward is minus the first-token cross-entropy on a batch of zero-shot
train prompts with those heads replaced, and a running-mean baseline reduces
the variance. At inference the heads with p > 0.5 are replaced (the
deterministic mode of the policy). The replacement is SITE's gate
(``gate.AlphaGate.mix``) with alpha in {0, 1}; rewards are computed like
SITE's training loss, on the last prompt token against cached prefixes
(``prompt_cache.PromptCache``).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch
from torch import Tensor

from ..config import ConfigError, TrainConfig
from ..engine.prompt_cache import PromptCache
from ..gate import HookFactory, injection_hooks
from ..stages.objectives import train_valid_examples
from ..tasks import Task
from ..types import Model
from .base import Method, TaskContext, method_seed


@dataclass
class MTVConfig(TrainConfig):
    """REINFORCE budget (modest, for CPU): the training loop's fields with MTV's defaults, and its baseline."""

    steps: int = 200  # policy updates
    lr: float = 0.1  # Adam on the logits phi
    batch_size: int = 8  # zero-shot train prompts per reward
    eval_every: int = 50  # keep the phi whose p > 0.5 mask has the lowest valid loss
    max_valid: int = 50  # valid items for that choice
    baseline_decay: float = 0.9  # running-mean reward baseline

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.objective != "first_token":
            raise ConfigError(f"MTVConfig.objective must be first_token (its reward is the first token's loss), got {self.objective!r}")
        if not 0 <= self.baseline_decay < 1:
            raise ConfigError(f"MTVConfig.baseline_decay must be in [0, 1), got {self.baseline_decay}")


class MultimodalTaskVector(Method):
    """Heads chosen by a REINFORCE-trained Bernoulli policy get their mean output at the last token."""

    name = "mtv"

    def __init__(self, cfg: MTVConfig | None = None):
        super().__init__()
        self.cfg = cfg or MTVConfig()
        self.mean_z: Tensor | None = None
        self.mask: Tensor | None = None  # (layer, head) in {0, 1}

    @property
    def n_trainable(self) -> int:
        """One policy logit per (layer, head)."""
        return 0 if self.mask is None else self.mask.numel()

    def _loss(self, model: Model, cache: PromptCache, idx, mask: Tensor) -> float:
        """First-token CE of the cached prompts ``idx`` with the masked heads replaced, against cached prefixes."""
        m = mask.to(device=model.cfg.device, dtype=model.cfg.dtype)
        with torch.inference_mode():
            return float(cache.loss(idx, m, self.mean_z))

    def fit(self, model: Model, task: Task, seed: int, ctx: TaskContext | None = None) -> None:
        ctx = ctx or TaskContext(task, seed)
        cfg = self.cfg
        self.mean_z = ctx.mean_z(model).to(device=model.cfg.device, dtype=model.cfg.dtype)
        train, valid = train_valid_examples(model, task)
        valid = valid[: cfg.max_valid] if cfg.eval_every else []  # eval_every 0: never validate, keep the last phi
        gen = torch.Generator().manual_seed(method_seed(seed, self.name))
        rng = random.Random(seed)
        plan = [rng.sample(range(len(train)), min(cfg.batch_size, len(train))) for _ in range(cfg.steps)]
        used = sorted({i for b in plan for i in b})
        remap = {i: j for j, i in enumerate(used)}
        tr_cache = PromptCache(model, [train[i] for i in used])
        va_cache = PromptCache(model, valid) if valid else None
        phi = torch.zeros(model.cfg.n_layers, model.cfg.n_heads, requires_grad=True)
        opt = torch.optim.Adam([phi], lr=cfg.lr)
        baseline, rewards = None, []
        best = (math.inf, 0, torch.zeros_like(phi))
        for step, batch in enumerate(plan, start=1):
            p = torch.sigmoid(phi)
            mask = torch.bernoulli(p.detach(), generator=gen)
            reward = -self._loss(model, tr_cache, [remap[i] for i in batch], mask)
            baseline = reward if baseline is None else cfg.baseline_decay * baseline + (1 - cfg.baseline_decay) * reward
            logp = (mask * torch.log(p + 1e-8) + (1 - mask) * torch.log(1 - p + 1e-8)).sum()
            opt.zero_grad()
            (-(reward - baseline) * logp).backward()
            opt.step()
            rewards.append(reward)
            if va_cache is not None and (step % cfg.eval_every == 0 or step == cfg.steps):
                vl = self._loss(model, va_cache, range(len(valid)), (torch.sigmoid(phi) > 0.5).float())
                if vl < best[0]:
                    best = (vl, step, phi.detach().clone())
        phi_best = best[2] if valid else phi.detach()
        self.mask = (torch.sigmoid(phi_best) > 0.5).float()
        self.info = {
            "best_step": best[1],
            "best_valid_loss": best[0],
            "n_heads_selected": int(self.mask.sum()),
            "rewards": rewards[-10:],
        }

    def prefill_hooks(self, model: Model) -> HookFactory | None:
        self._fitted(self.mask)
        t, m = self.mean_z, self.mask.to(device=model.cfg.device, dtype=model.cfg.dtype)
        return lambda last: injection_hooks(model, t, m, last)
