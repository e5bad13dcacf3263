"""SITE (Park et al., 2026) as a benchmarked method: a thin wrapper over ``pipeline.fit_site``."""

from __future__ import annotations

from transformer_lens import HookedTransformer

from ..config import EmbeddingConfig, SelectionConfig, SiteConfig
from ..gate import HookFactory, injection_hooks
from ..io import Adapter
from ..pipeline import fit_site
from ..tasks import Task
from .base import Method, TaskContext


class Site(Method):
    """Mean hook_z (50 ten-shot prompts), one gate per head trained 400 steps; injected at prefill."""

    name = "site"

    def __init__(self, embedding: EmbeddingConfig | None = None, selection: SelectionConfig | None = None):
        super().__init__()
        self.embedding = embedding or EmbeddingConfig()
        self.selection = selection or SelectionConfig()
        self.adapter: Adapter | None = None
        self._shape = (0, 0)

    @property
    def n_trainable(self) -> int:
        """One theta per (layer, head)."""
        return self._shape[0] * self._shape[1]

    def fit(self, model: HookedTransformer, task: Task, seed: int, ctx: TaskContext | None = None) -> None:
        cfg = SiteConfig(seed=seed, embedding=self.embedding, selection=self.selection)
        self.adapter, history, seconds = fit_site(model, task, cfg)
        self._shape = (model.cfg.n_layers, model.cfg.n_heads)
        self.info = {"best_step": history.best_step, "best_valid_loss": history.best_valid_loss, "seconds": seconds}

    def prefill_hooks(self, model: HookedTransformer) -> HookFactory | None:
        assert self.adapter is not None, "fit first"
        t = self.adapter.t.to(device=model.cfg.device, dtype=model.cfg.dtype)
        alpha = self.adapter.alpha.to(device=model.cfg.device, dtype=model.cfg.dtype)
        return lambda last: injection_hooks(model, t, alpha, last)
