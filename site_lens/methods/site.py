"""SITE (Park et al., 2026): stages 1 and 2 on a task, and SITE as a scored method.

    fit = fit_site(model, task)                      # SiteFit(adapter, history, seconds, backend)
    method = Site.from_adapter(fit.adapter)          # or Site(cfg); method.fit(model, task, seed)
    score = score_method(model, method, task, seed)  # stage 3, scored like every method
    fits = fit_site_many(model, [task_a, task_b])    # stage 2 of many tasks in one loop, one SiteFit each

Stage 1 averages ``hook_z`` at the last token of M N-shot prompts (all drawn
from train with the run's seed); stage 2 trains one gate per head on
zero-shot train prompts (``selection.AlphaTrainer``). At inference the
adapter is injected once, at prefill (``Adapter.hooks``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..adapter import Adapter
from ..config import ConfigError, SiteConfig
from ..engine.backend import describe
from ..gate import GateSpec, HookFactory
from ..models import model_identity
from ..stages.embeddings import task_embedding
from ..stages.objectives import train_valid_examples
from ..stages.selection import AlphaTrainer
from ..stages.selection_batched import BatchedAlphaTrainer
from ..stages.sparse import SparseTrainer
from ..stages.training import TrainHistory
from ..tasks import Task
from ..types import Model
from .base import Method, TaskContext


@dataclass
class SiteFit:
    """What ``fit_site`` returns: the adapter, its training history, seconds per stage, the backend that trained it.

    Example:
        A tiny random model with a byte-level tokenizer stands in for a real one: its answers are
        noise, but the calls and what they return are those of a real run.

        >>> import site_lens as sl
        >>> model = sl.tiny_model("bytes")  # a byte-level tokenizer, built offline; or sl.load_model("smollm2-135m")
        >>> cfg = sl.SiteConfig(embedding=sl.EmbeddingConfig(n_prompts=2, n_shots=2),   # a few seconds' budget
        ...                     selection=sl.SelectionConfig(steps=2, eval_every=2, max_valid=2),
        ...                     eval=sl.EvalConfig(max_new_tokens=3, max_test=2))
        >>> fit = sl.fit_site(model, sl.load_task("uppercase"), cfg)
        >>> type(fit).__name__, type(fit.adapter).__name__
        ('SiteFit', 'Adapter')
        >>> fit.history.best_step in fit.history.valid_step   # the adapter keeps the best valid theta
        True
    """

    adapter: Adapter
    history: TrainHistory
    seconds: dict[str, float] = field(default_factory=dict)
    backend: dict[str, str] = field(default_factory=dict)  # {'name', 'reason'}


def fit_site(
    model: Model,
    task: Task,
    cfg: SiteConfig | None = None,
    progress: Callable[[int, float], None] | None = None,
    ctx: TaskContext | None = None,
) -> SiteFit:
    """Stages 1 and 2: the task embedding, then theta trained on zero-shot train prompts.

    With ``cfg.sparsity`` set, stage 2 is sparse SITE's (``stages.sparse.SparseTrainer``: a price on
    every open head, the gate L1's or hard-concrete L0's); the adapter records that gate. ``ctx`` (a ``TaskContext`` of the same task, seed and embedding config) lends its
    mean hook_z, which is the same t; FV and MTV use it too.

    Example:
        A tiny random model with a byte-level tokenizer stands in for a real one: its answers are
        noise, but the calls and what they return are those of a real run.

        >>> import site_lens as sl
        >>> model = sl.tiny_model("bytes")  # a byte-level tokenizer, built offline; or sl.load_model("smollm2-135m")
        >>> task = sl.load_task("uppercase")
        >>> cfg = sl.SiteConfig(embedding=sl.EmbeddingConfig(n_prompts=2, n_shots=2),   # a few seconds' budget
        ...                     selection=sl.SelectionConfig(steps=2, eval_every=2, max_valid=2),
        ...                     eval=sl.EvalConfig(max_new_tokens=3, max_test=2))
        >>> fit = fit_site(model, task, cfg)               # stage 1 (t), then stage 2 (theta)
        >>> fit.adapter.t.shape, fit.adapter.alpha.shape
        (torch.Size([2, 4, 8]), torch.Size([2, 4]))
        >>> len(fit.history.loss), sorted(fit.seconds)
        (2, ['embedding', 'selection'])
    """
    cfg = cfg or SiteConfig()
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    if ctx is not None and ctx.task is task and ctx.seed == cfg.seed and ctx.embedding == cfg.embedding:
        t = ctx.mean_z(model)
    else:
        t = task_embedding(model, task, cfg.embedding, cfg.seed)
    seconds["embedding"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    train, valid = train_valid_examples(model, task, cfg.selection.objective)
    if cfg.sparsity is None:
        trainer = AlphaTrainer(model, t, cfg.selection, seed=cfg.seed, engine=cfg.engine)
    else:
        trainer = SparseTrainer(model, t, cfg.selection, cfg.sparsity, seed=cfg.seed, engine=cfg.engine)
    gate = trainer.fit(train, valid, progress=progress)
    seconds["selection"] = time.perf_counter() - t0
    backend = describe(trainer.backend_used)
    sparse = {} if cfg.sparsity is None else {"sparsity": cfg.sparsity.to_dict()}
    # the gate's spec says how theta becomes alpha (sigmoid; hard-concrete for sparse SITE's l0)
    adapter = _adapter(model, task, cfg, t, gate.theta.detach(), trainer.history, backend, gate.spec(), **sparse)
    return SiteFit(adapter, trainer.history, seconds, backend)


def _adapter(
    model: Model,
    task: Task,
    cfg: SiteConfig,
    t,
    theta,
    history: TrainHistory,
    backend: dict,
    gate: GateSpec | None = None,
    **meta,
) -> Adapter:
    """A fitted task's adapter: t and theta, the model's identity, and what the fit used and recorded."""
    return Adapter(
        t=t.detach().float().cpu(),
        theta=theta.float().cpu(),
        model=model_identity(model),
        meta={
            "task": task.name,
            "task_source": task.source,
            "seed": cfg.seed,
            "embedding": cfg.embedding.to_dict(),
            "selection": cfg.selection.to_dict(),
            "engine": cfg.engine.to_dict(),
            "history": history.to_dict(),
            "backend": backend,
            **meta,
        },
        gate=gate or GateSpec(),
    )


def fit_site_many(
    model: Model,
    tasks: Sequence[Task],
    cfg: SiteConfig | None = None,
    progress: Callable[[int, list[float]], None] | None = None,
    seeds: Sequence[int] | None = None,
) -> list[SiteFit]:
    """``fit_site`` for every task in ``tasks``, stage 2 for all of them in one loop; one ``SiteFit`` per task, in order.

    ``seeds`` (one per entry of ``tasks``; default ``cfg.seed`` for all) fits one task at several
    seeds: give the same ``Task`` once per seed. Its seeds then share the cached prefixes of the
    training prompts they both draw and of its valid prompts, each prompt's prefix run once.

    Stage 1 runs per task. Stage 2 (``selection_batched.BatchedAlphaTrainer``) trains each task's
    own theta on its own schedule, its rows beside the other tasks' in each step's one batch: each
    task's theta, history and best step are those ``fit_site(model, task, cfg)`` gives (fast path,
    first-token objective, to float tolerance); each step reads the weights once for every task.
    ``seconds['selection']`` is each task's share of the shared loop; ``progress(step, losses)``
    gets every task's loss.

    Example:
        >>> import site_lens as sl
        >>> model = sl.tiny_model("bytes")
        >>> cfg = sl.SiteConfig(embedding=sl.EmbeddingConfig(n_prompts=2, n_shots=2),
        ...                     selection=sl.SelectionConfig(steps=2, eval_every=2, max_valid=2))
        >>> fits = fit_site_many(model, [sl.load_task("uppercase"), sl.load_task("opposites")], cfg)
        >>> [f.adapter.meta["task"] for f in fits], fits[0].adapter.alpha.shape
        (['uppercase', 'opposites'], torch.Size([2, 4]))
    """
    cfg = cfg or SiteConfig()
    if cfg.sparsity is not None:
        raise ConfigError("the batched fit trains SITE's dense gates: fit sparse SITE one task at a time (fit_site)")
    seeds = [cfg.seed] * len(tasks) if seeds is None else [int(s) for s in seeds]
    if len(seeds) != len(tasks):
        raise ValueError(f"{len(seeds)} seeds for {len(tasks)} tasks")
    ts, embed_seconds, trains, valids = [], [], [], []
    examples: dict[int, tuple] = {}  # one list of examples per task object: its seeds share its prefixes
    for task, seed in zip(tasks, seeds):
        t0 = time.perf_counter()
        ts.append(task_embedding(model, task, cfg.embedding, seed))
        embed_seconds.append(time.perf_counter() - t0)
        if id(task) not in examples:
            examples[id(task)] = train_valid_examples(model, task, cfg.selection.objective)
        train, valid = examples[id(task)]
        trains.append(train)
        valids.append(valid)
    t0 = time.perf_counter()
    trainer = BatchedAlphaTrainer(model, ts, cfg.selection, seed=cfg.seed, engine=cfg.engine, seeds=seeds)
    histories = trainer.fit(trains, valids, progress=progress)
    share = (time.perf_counter() - t0) / len(ts)
    assert trainer.backend_used is not None
    backend = describe(trainer.backend_used)
    fits = []
    together = [o.name for o in tasks] if len(set(seeds)) == 1 else [f"{o.name}/seed{s}" for o, s in zip(tasks, seeds)]
    for task, seed, t, theta, hist, seconds in zip(tasks, seeds, ts, trainer.theta.detach(), histories, embed_seconds):
        # trained_with: the tasks (and seeds) whose stage 2 shared one loop
        one = dataclasses.replace(cfg, seed=seed)
        adapter = _adapter(model, task, one, t, theta, hist, backend, trained_with=together)
        fits.append(SiteFit(adapter, hist, {"embedding": seconds, "selection": share}, backend))
    return fits


SPARSE_TOGETHER = "--task-batch fits SITE's dense gates: sparse SITE (--sparse-*) runs one task at a time (--task-batch 1)"


def sparse_refusal(cfg: SiteConfig, methods: Sequence[str], task_batch: int = 1) -> str | None:
    """Why sparse SITE (``cfg.sparsity``) cannot run with these bench methods and task batch; None where it can."""
    if cfg.sparsity is None:
        return None
    if task_batch > 1 and "site" in methods:
        return SPARSE_TOGETHER
    other = [m for m in methods if m.startswith("site_")]
    if other:
        return f"sparse SITE (--sparse-*) trains on the first answer token only: {', '.join(other)} cannot take it"
    return None


class Site(Method):
    """Mean hook_z (50 ten-shot prompts), one gate per head trained 400 steps; injected at prefill."""

    name = "site"

    def __init__(self, cfg: SiteConfig | None = None, progress: Callable[[int, float], None] | None = None):
        super().__init__()
        self.cfg = cfg or SiteConfig()  # its seed and eval are not used: fit takes the seed, scoring its own config
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

    @classmethod
    def from_fit(cls, fit: SiteFit, cfg: SiteConfig | None = None) -> Site:
        """A fitted SITE method from a ``fit_site`` or ``fit_site_many`` result (its info as ``fit`` records it)."""
        method = cls(cfg)
        method._take(fit)
        return method

    def fit(self, model: Model, task: Task, seed: int, ctx: TaskContext | None = None) -> None:
        self._take(fit_site(model, task, dataclasses.replace(self.cfg, seed=seed), self.progress, ctx))

    def _take(self, fit: SiteFit) -> None:
        self.result = fit
        self.adapter = fit.adapter
        h = fit.history
        self.info = {
            "best_step": h.best_step,
            "best_valid_loss": h.best_valid_loss,
            "seconds": self.result.seconds,
            "backend": self.result.backend,
            "theta": self.adapter.theta.tolist(),  # (layer, head): the heads chosen, for analyses across seeds
        }

    def prefill_hooks(self, model: Model) -> HookFactory | None:
        self._fitted(self.adapter)
        adapter = self.adapter
        return lambda last: adapter.hooks(model, last)
