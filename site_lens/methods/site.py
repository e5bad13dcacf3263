"""SITE (Park et al., 2026): stages 1 and 2 on a task, and SITE as a scored method.

    fit = fit_site(model, task)                      # SiteFit(adapter, history, seconds, backend)
    method = Site.from_adapter(fit.adapter)          # or Site(); method.fit(model, task, seed)
    row = score_method(model, method, task, seed)    # stage 3, scored like every method

Stage 1 averages ``hook_z`` at the last token of M N-shot prompts (all drawn
from train with the run's seed); stage 2 trains one gate per head on
zero-shot train prompts (``selection.AlphaTrainer``). At inference the
adapter is injected once, at prefill (``Adapter.hooks``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..adapter import Adapter
from ..config import EmbeddingConfig, SelectionConfig, SiteConfig
from ..engine.backend import describe
from ..gate import HookFactory
from ..models import model_identity
from ..models.engines import Model
from ..stages.embeddings import build_task_embedding
from ..stages.objectives import objective_examples
from ..stages.selection import AlphaTrainer
from ..stages.training import TrainHistory
from ..tasks import Task, check_enough, sample_icl_prompts
from .base import Method, TaskContext


@dataclass
class SiteFit:
    """What ``fit_site`` returns: the adapter, its training history, seconds per stage, the backend that trained it."""

    adapter: Adapter
    history: TrainHistory
    seconds: dict[str, float] = field(default_factory=dict)
    backend: dict[str, str] = field(default_factory=dict)  # {'name', 'reason'}


def embedding_prompts(task: Task, cfg: EmbeddingConfig, seed: int) -> list[tuple[str, str]]:
    """The M N-shot prompts (demonstrations and query all from train) for stage 1."""
    check_enough(task.train, cfg.n_shots + 1, f"task '{task.name}' split 'train' ({cfg.n_shots} shots + 1 query)")
    return sample_icl_prompts(task.train, cfg.n_prompts, cfg.n_shots, random.Random(seed))


def fit_site(
    model: Model,
    task: Task,
    cfg: SiteConfig | None = None,
    progress: Callable[[int, float], None] | None = None,
    ctx: TaskContext | None = None,
) -> SiteFit:
    """Stages 1 and 2: the task embedding, then theta trained on zero-shot train prompts.

    ``ctx`` (a ``TaskContext`` of the same task, seed and embedding config) lends its
    mean hook_z, which is the same t; FV and MTV use it too.
    """
    cfg = cfg or SiteConfig()
    assert cfg.embedding is not None and cfg.selection is not None
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    if ctx is not None and ctx.task is task and ctx.seed == cfg.seed and ctx.embedding == cfg.embedding:
        t = ctx.mean_z(model)
    else:
        prompts = embedding_prompts(task, cfg.embedding, cfg.seed)
        t = build_task_embedding(model, [p for p, _ in prompts], batch_size=cfg.embedding.batch_size)
    seconds["embedding"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    train = objective_examples(model, task, "train", cfg.selection.objective)
    valid = objective_examples(model, task, "valid", cfg.selection.objective)
    trainer = AlphaTrainer(model, t, cfg.selection, seed=cfg.seed)
    gate = trainer.fit(train, valid, progress=progress)
    seconds["selection"] = time.perf_counter() - t0
    backend = describe(trainer.backend_used)
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
            "history": trainer.history.to_dict(),
            "backend": backend,
        },
    )
    return SiteFit(adapter, trainer.history, seconds, backend)


class Site(Method):
    """Mean hook_z (50 ten-shot prompts), one gate per head trained 400 steps; injected at prefill."""

    name = "site"

    def __init__(
        self,
        embedding: EmbeddingConfig | None = None,
        selection: SelectionConfig | None = None,
        progress: Callable[[int, float], None] | None = None,
    ):
        super().__init__()
        self.embedding = embedding or EmbeddingConfig()
        self.selection = selection or SelectionConfig()
        self.progress = progress
        self.adapter: Adapter | None = None
        self.result: SiteFit | None = None

    @classmethod
    def from_adapter(cls, adapter: Adapter) -> Site:
        """A fitted SITE method from a saved or freshly trained adapter."""
        method = cls()
        method.adapter = adapter
        return method

    @property
    def n_trainable(self) -> int:
        """One theta per (layer, head)."""
        return 0 if self.adapter is None else self.adapter.theta.numel()

    def fit(self, model: Model, task: Task, seed: int, ctx: TaskContext | None = None) -> None:
        cfg = SiteConfig(seed=seed, embedding=self.embedding, selection=self.selection)
        self.result = fit_site(model, task, cfg, self.progress, ctx)
        self.adapter = self.result.adapter
        h = self.result.history
        self.info = {
            "best_step": h.best_step,
            "best_valid_loss": h.best_valid_loss,
            "seconds": self.result.seconds,
            "backend": self.result.backend,
        }

    def prefill_hooks(self, model: Model) -> HookFactory | None:
        assert self.adapter is not None, "fit first"
        adapter = self.adapter
        return lambda last: adapter.hooks(model, last)
