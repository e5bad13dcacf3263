"""Stage 2 for many tasks in one loop: one theta per task, every task's rows in each step's one batch.

``BatchedAlphaTrainer`` is ``selection.AlphaTrainer``'s fast path (first-token objective)
run for n tasks together. Its parameter is a stacked theta, (task, layer, head); each step
takes every task's next batch from that task's own seeded schedule (``training.schedule``, the
one a single-task fit uses), runs all the rows in one ``PromptCache`` (each prompt's owner is
its task, so each row gets its own task's alpha and t), and sums the tasks' mean losses:
task k's gradient is its own loss's. ``training.train_loop_many`` does one Adam step on the
stacked theta (n independent Adams), validates, keeps each task's best and stops a task
alone at a non-finite loss. Memory: the training prompts' prefixes are cached ``cache_steps``
steps ahead (not the whole schedule's, which for 45 tasks would not fit), and a forward takes
at most ``max_rows`` prompts, shortest first (validation's many prompts go in several). Per
task the numbers are the single-task fit's to float tolerance (tests hold it to that step by
step); a step reads the weights once for n tasks instead of n times.

    trainer = BatchedAlphaTrainer(model, [t_a, t_b], cfg, seed=0)
    histories = trainer.fit([train_a, train_b], [valid_a, valid_b])
    trainer.alpha()                       # (task, layer, head)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from ..config import ConfigError, EngineConfig, SelectionConfig
from ..engine.backend import Backend, backend_for
from ..engine.prompt_cache import PromptCache
from ..tokens import Example
from ..types import Model
from .training import TrainHistory, frozen, schedule, train_loop_many


class BatchedAlphaTrainer:
    """Trains one SITE gate per task embedding in ``ts``, all in one loop (see the module docstring).

    Example:
        >>> import site_lens as sl
        >>> from site_lens.tokens import Example
        >>> model = sl.tiny_model()
        >>> t = sl.build_task_embedding(model, [[1, 5, 7, 2, 9, 4], [3, 5, 8, 2, 6]])
        >>> a = [Example(tokens=[1, 5], target=7), Example(tokens=[3, 5], target=8)]  # prompt, answer token
        >>> b = [Example(tokens=[2, 6, 4], target=9)]
        >>> trainer = BatchedAlphaTrainer(model, [t, -t], sl.SelectionConfig(steps=4, eval_every=2), seed=0)
        >>> histories = trainer.fit([a, b], valids=[a, b])
        >>> trainer.alpha().shape, [len(h.loss) for h in histories]
        (torch.Size([2, 2, 4]), [4, 4])
    """

    def __init__(
        self,
        model: Model,
        ts: Sequence[Float[Tensor, "layer head_index d_head"]],
        cfg: SelectionConfig | None = None,
        seed: int = 0,
        engine: EngineConfig | None = None,
    ):
        self.model = model
        self.cfg = cfg or SelectionConfig()
        self.engine = engine or EngineConfig()
        if self.cfg.objective != "first_token" or not self.engine.fast:
            raise ConfigError(
                "the batched fit runs the fast path on the first answer token only, "
                f"got objective {self.cfg.objective!r}, fast={self.engine.fast}"
            )
        if not ts:
            raise ValueError("BatchedAlphaTrainer needs at least one task embedding")
        self.seed = seed
        c = model.cfg
        self.t = torch.stack([t.to(device=c.device, dtype=c.dtype) for t in ts])  # (task, layer, head, d_head)
        self.theta = nn.Parameter(
            torch.full((len(ts), c.n_layers, c.n_heads), float(self.cfg.theta_init), device=c.device)
        )
        self.histories: list[TrainHistory] = []
        self.backend_used: Backend | None = None
        self.cache_steps = 50  # training prompts' prefixes are cached this many steps ahead
        self.max_rows = 64  # prompts in one forward (validation's many prompts go in several)

    def alpha(self) -> Float[Tensor, "task layer head_index"]:
        """Every task's alpha = sigmoid(theta)."""
        return torch.sigmoid(self.theta)

    def task_losses(self, cache: PromptCache, rows: Sequence[Sequence[int]]) -> Float[Tensor, " task"]:
        """Each task's mean first-token CE over its cache rows ``rows[k]`` (0 where empty), in one cache call."""
        n = self.theta.shape[0]
        device = self.model.cfg.device
        # shortest prompts first, at most max_rows in a forward: little padding, bounded memory
        idx = sorted((i for part in rows for i in part), key=lambda i: len(cache.examples[i].tokens))
        sums = torch.zeros(n, device=device)
        if idx:
            alpha = self.alpha()
            assert cache.owners is not None
            for at in range(0, len(idx), self.max_rows):
                for group, logits in cache.logits(idx[at : at + self.max_rows], alpha, self.t):
                    target = torch.tensor([cache.examples[i].target for i in group], device=logits.device)
                    ce = F.cross_entropy(logits.float(), target, reduction="none")
                    sums = sums.index_add(0, cache.owners[group].to(device), ce.to(device))
        counts = torch.tensor([max(1, len(part)) for part in rows], device=device, dtype=sums.dtype)
        return sums / counts

    def fit(
        self,
        trains: Sequence[Sequence[Example]],
        valids: Sequence[Sequence[Example]] = (),
        progress: Callable[[int, list[float]], None] | None = None,
    ) -> list[TrainHistory]:
        """Train every task's theta; returns one history per task, ``theta`` left at each task's best (or last)."""
        cfg, n = self.cfg, self.theta.shape[0]
        if len(trains) != n or (valids and len(valids) != n):
            raise ValueError(
                f"one training (and valid) set per task: {n} tasks, {len(trains)} train, {len(valids)} valid"
            )
        if any(not tr for tr in trains):
            raise ValueError("BatchedAlphaTrainer.fit needs at least one training example per task")
        valids = [list(v)[: cfg.max_valid] for v in valids] if valids else [[] for _ in range(n)]
        validate = bool(cfg.eval_every) and any(valids)  # a task without valid items does not validate
        plans = [schedule(len(tr), cfg.steps, cfg.batch_size, self.seed) for tr in trains]
        with frozen(self.model):
            backend = self.backend_used = backend_for(self.model, self.engine.backend)
            window: dict[str, Any] = {"step": 0}

            def cache_from(first: int) -> None:
                """One cache of every task's prompts for steps first .. first + cache_steps - 1 (memory: that
                many steps' prefixes, not the whole schedule's); task k's rows follow task k - 1's."""
                used = [sorted({i for b in plan[first : first + self.cache_steps] for i in b}) for plan in plans]
                start = [sum(len(u) for u in used[:k]) for k in range(n)]
                window["remap"] = [{i: start[k] + j for j, i in enumerate(u)} for k, u in enumerate(used)]
                window["cache"] = None  # the last window's prefixes freed before the next are made
                window["cache"] = PromptCache(
                    self.model,
                    [trains[k][i] for k, u in enumerate(used) for i in u],
                    backend=backend,
                    owners=[k for k, u in enumerate(used) for _ in u],
                    ragged=True,
                )
            va_cache = va_rows = None
            if validate:
                va_cache = PromptCache(
                    self.model,
                    [e for v in valids for e in v],
                    backend=backend,
                    owners=[k for k, v in enumerate(valids) for _ in v],
                    ragged=True,
                )
                va_start = [sum(len(v) for v in valids[:k]) for k in range(n)]
                va_rows = [list(range(va_start[k], va_start[k] + len(v))) for k, v in enumerate(valids)]

            def step_losses(batches: list[Sequence[int] | None]) -> Tensor:
                if window["step"] % self.cache_steps == 0:
                    cache_from(window["step"])
                window["step"] += 1
                remap = window["remap"]
                rows = [[] if b is None else [remap[k][i] for i in b] for k, b in enumerate(batches)]
                return self.task_losses(window["cache"], rows)

            def valid_losses(live: list[bool]) -> list[float | None]:
                assert va_cache is not None and va_rows is not None
                with torch.no_grad():
                    vl = self.task_losses(va_cache, [r if on else [] for r, on in zip(va_rows, live)]).tolist()
                return [v if r else None for v, r in zip(vl, va_rows)]

            self.histories = train_loop_many(
                self.theta,
                plans,
                step_losses,
                valid_losses if validate else None,
                lr=cfg.lr,
                eval_every=cfg.eval_every,
                keep_best=cfg.keep_best,
                progress=progress,
            )
        return self.histories
