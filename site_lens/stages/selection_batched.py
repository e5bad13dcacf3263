"""Stage 2 for many tasks in one loop: one theta per task, every task's rows in each step's one batch.

``BatchedAlphaTrainer`` is ``selection.AlphaTrainer``'s fast path (first-token objective)
run for n tasks together. Its parameter is a stacked theta, (task, layer, head); each step
takes every task's next batch from that task's own seeded schedule (``training.schedule``, the
one a single-task fit uses), runs all the rows in one ``PromptCache`` (each row under its own task's alpha and t; tasks
given the same example lists, one task's seeds, share its prompts' prefixes), and sums the tasks' mean losses:
task k's gradient is its own loss's. ``training.train_loop_many`` does one Adam step on the
stacked theta (n independent Adams), validates, keeps each task's best and stops a task
alone at a non-finite loss. Memory: the training prompts' prefixes are cached ``cache_steps``
steps ahead (the whole schedule where its keys and values fit ``cache_bytes``; for 45 tasks they
would not, and 50 steps are), and a forward takes at most ``max_rows`` prompts, shortest first (validation's many prompts go in several). Per
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
        seeds: Sequence[int] | None = None,
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
        # each task's training order: its own seed (the seeds of one task side by side), else ``seed`` for all
        self.seeds = [seed] * len(ts) if seeds is None else [int(s) for s in seeds]
        if len(self.seeds) != len(ts):
            raise ValueError(f"{len(self.seeds)} seeds for {len(ts)} task embeddings")
        c = model.cfg
        self.t = torch.stack([t.to(device=c.device, dtype=c.dtype) for t in ts])  # (task, layer, head, d_head)
        self.theta = nn.Parameter(
            torch.full((len(ts), c.n_layers, c.n_heads), float(self.cfg.theta_init), device=c.device)
        )
        self.histories: list[TrainHistory] = []
        self.backend_used: Backend | None = None
        # training prompts' prefixes are cached this many steps ahead: None chooses the longest window (the whole
        # schedule, 200, 100 steps) whose keys and values stay within cache_bytes, else 50
        self.cache_steps: int | None = None
        self.cache_bytes = 3 * 2**30
        self.max_rows = 64  # prompts in one forward (validation's many prompts go in several)

    def alpha(self) -> Float[Tensor, "task layer head_index"]:
        """Every task's alpha = sigmoid(theta)."""
        return torch.sigmoid(self.theta)

    def task_losses(self, cache: PromptCache, rows: Sequence[Sequence[int]]) -> Float[Tensor, " task"]:
        """Each task's mean first-token CE over its cache rows ``rows[k]`` (0 where empty), in one cache call."""
        n = self.theta.shape[0]
        device = self.model.cfg.device
        # (prompt, task) pairs, shortest prompts first, at most max_rows in a forward: little padding, bounded
        # memory; a prompt two tasks share (the seeds of one task) is cached once and run once for each
        pairs = sorted(((i, k) for k, part in enumerate(rows) for i in part), key=lambda p: len(cache.examples[p[0]].tokens))
        sums = torch.zeros(n, device=device)
        if pairs:
            alpha = self.alpha()
            for at in range(0, len(pairs), self.max_rows):
                idx, own = zip(*pairs[at : at + self.max_rows])
                for pos, logits in cache.logits_as(idx, own, alpha, self.t):
                    target = torch.tensor([cache.examples[idx[p]].target for p in pos], device=logits.device)
                    ce = F.cross_entropy(logits.float(), target, reduction="none")
                    sums = sums.index_add(0, torch.tensor([own[p] for p in pos], device=device), ce.to(device))
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
        # tasks given the same list of examples (one task's seeds) share its prompts' cached prefixes
        pool, va_pool = _pools(trains), _pools(valids) if valids else list(range(n))
        valids = [list(v)[: cfg.max_valid] for v in valids] if valids else [[] for _ in range(n)]
        validate = bool(cfg.eval_every) and any(valids)  # a task without valid items does not validate
        plans = [schedule(len(tr), cfg.steps, cfg.batch_size, s) for tr, s in zip(trains, self.seeds)]
        ahead = self.cache_steps or self._window(plans, pool, trains)
        with frozen(self.model):
            backend = self.backend_used = backend_for(self.model, self.engine.backend)
            window: dict[str, Any] = {"step": 0}

            def cache_from(first: int) -> None:
                """One cache of every task's prompts for steps first .. first + cache_steps - 1 (memory: that
                many steps' prefixes, not the whole schedule's); each pool's prompts follow the last pool's."""
                used = [set() for _ in range(max(pool) + 1)]
                for k, plan in enumerate(plans):
                    used[pool[k]].update(i for b in plan[first : first + ahead] for i in b)
                order = [sorted(u) for u in used]
                start = [sum(len(u) for u in order[:q]) for q in range(len(order))]
                at = [{i: start[q] + j for j, i in enumerate(u)} for q, u in enumerate(order)]
                window["remap"] = [at[pool[k]] for k in range(n)]
                window["cache"] = None  # the last window's prefixes freed before the next are made
                first_of = {q: pool.index(q) for q in set(pool)}  # a task holding each pool's examples
                window["cache"] = PromptCache(
                    self.model, [trains[first_of[q]][i] for q, u in enumerate(order) for i in u], backend=backend, ragged=True
                )
            va_cache = va_rows = None
            if validate:
                firsts = sorted({va_pool.index(q) for q in set(va_pool)})  # one task's valid list per pool
                va_cache = PromptCache(self.model, [e for k in firsts for e in valids[k]], backend=backend, ragged=True)
                va_start = {va_pool[k]: sum(len(valids[j]) for j in firsts[:i]) for i, k in enumerate(firsts)}
                va_rows = [list(range(va_start[va_pool[k]], va_start[va_pool[k]] + len(v))) for k, v in enumerate(valids)]

            def step_losses(batches: list[Sequence[int] | None]) -> Tensor:
                if window["step"] % ahead == 0:
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

    def _window(self, plans: list[list[list[int]]], pool: list[int], trains: Sequence[Sequence[Example]]) -> int:
        """The longest cache window (steps) whose prefixes' keys and values fit ``cache_bytes``: one window of
        the whole schedule runs each prompt's prefix once however often it is drawn, and once for all of a
        task's seeds that draw it. The estimate leaves out the valid prompts' cache; 50 steps is the floor."""
        c = self.model.cfg
        kv_heads = getattr(c, "n_key_value_heads", None) or c.n_heads
        per_token = c.n_layers * 2 * kv_heads * c.d_head * torch.tensor([], dtype=c.dtype).element_size()
        steps = len(plans[0])
        if steps == 0:  # nothing to train: no window to cache
            return 1
        first_of = {q: pool.index(q) for q in set(pool)}
        for ahead in (steps, 200, 100):
            worst = 0
            for first in range(0, steps, ahead):
                used: dict[int, set[int]] = {}
                for k, plan in enumerate(plans):
                    used.setdefault(pool[k], set()).update(i for b in plan[first : first + ahead] for i in b)
                tokens = sum(len(trains[first_of[q]][i].tokens) - 1 for q, u in used.items() for i in u)
                worst = max(worst, tokens * per_token)
            if worst <= self.cache_bytes:
                return ahead
        return 50


def _pools(lists: Sequence[Sequence[Example]]) -> list[int]:
    """For each task, the pool of its examples: tasks given the very same list share one."""
    first: dict[int, int] = {}
    return [first.setdefault(id(x), len(first)) for x in lists]
