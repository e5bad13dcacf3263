"""One gate for many tasks: a single alpha trained over several tasks at once, each with its own t.

    fit = fit_shared(model, {"antonym": t_a, "capitalize": t_c}, {"antonym": task_a, "capitalize": task_c})
    fit.alpha                      # (layer, head): the heads every task shares

Each step takes one batch from every task (each task's own seeded schedule,
the one a per-task SITE fit of that task would use) and averages the tasks'
first-token losses, each with its task's t at the last prompt token;
validation averages the tasks' valid losses. Over one task this is that
task's SITE fit, step for step (a test holds it to that).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from ..config import ConfigError, EngineConfig, SelectionConfig
from ..engine.backend import backend_for
from ..engine.prompt_cache import PromptCache
from ..gate import AlphaGate
from ..tasks import Task
from ..types import Model
from .objectives import train_valid_examples
from .training import TrainHistory, frozen, schedule, train_loop


@dataclass
class SharedFit:
    """The shared gate's theta, its tasks, and the training history."""

    theta: Float[Tensor, "layer head_index"]
    tasks: list[str]
    history: TrainHistory
    seconds: float

    @property
    def alpha(self) -> Float[Tensor, "layer head_index"]:
        return torch.sigmoid(self.theta)


def fit_shared(
    model: Model,
    ts: Mapping[str, Float[Tensor, "layer head_index d_head"]],
    tasks: Mapping[str, Task],
    cfg: SelectionConfig | None = None,
    seed: int = 0,
    engine: EngineConfig | None = None,
) -> SharedFit:
    """Train one theta over every task in ``tasks`` (``ts[name]`` is that task's t); fast path only.

    Example:
        A tiny random model with a byte-level tokenizer stands in for a real one: its answers are
        noise, but the calls and what they return are those of a real run.

        >>> import site_lens as sl
        >>> model = sl.tiny_model("bytes")  # a byte-level tokenizer, built offline; or sl.load_model("smollm2-135m")
        >>> cfg = sl.SiteConfig(embedding=sl.EmbeddingConfig(n_prompts=2, n_shots=2),   # a few seconds' budget
        ...                     selection=sl.SelectionConfig(steps=2, eval_every=2, max_valid=2),
        ...                     eval=sl.EvalConfig(max_new_tokens=3, max_test=2))
        >>> tasks = {name: sl.load_task(name) for name in ("uppercase", "opposites")}
        >>> ts = {name: sl.fit_site(model, task, cfg).adapter.t for name, task in tasks.items()}   # each task's own t
        >>> shared = fit_shared(model, ts, tasks, cfg.selection)
        >>> shared.tasks, shared.alpha.shape               # one gate for both
        (['uppercase', 'opposites'], torch.Size([2, 4]))
    """
    cfg = cfg or SelectionConfig()
    if cfg.objective != "first_token":
        raise ConfigError(f"the shared gate trains on the first answer token only, got objective {cfg.objective!r}")
    names = list(tasks)
    if not names or set(names) != set(ts):
        raise ValueError(f"fit_shared needs one t per task: tasks {sorted(tasks)}, t for {sorted(ts)}")
    dev, dt = model.cfg.device, model.cfg.dtype
    t0 = time.perf_counter()
    gate = AlphaGate(model.cfg.n_layers, model.cfg.n_heads, cfg.theta_init).to(dev)
    backend = backend_for(model, (engine or EngineConfig()).backend)
    per_task = []
    with frozen(model):
        for name in names:
            task = tasks[name]
            train, valid = train_valid_examples(model, task)
            valid = valid[: cfg.max_valid]
            if not train:
                raise ValueError(f"task '{name}' has no training examples")
            plan = schedule(len(train), cfg.steps, cfg.batch_size, seed)
            used = sorted({i for b in plan for i in b})
            remap = {i: j for j, i in enumerate(used)}
            cache = PromptCache(model, [train[i] for i in used], backend=backend)
            va = PromptCache(model, valid, backend=backend) if valid and cfg.eval_every else None
            per_task.append((name, [[remap[i] for i in b] for b in plan], cache, va, ts[name].to(device=dev, dtype=dt)))

        def step_loss(step_idx: list[int]) -> Tensor:
            alpha = gate.alpha()
            total = torch.zeros((), device=dev)
            for _, plan, cache, _, t in per_task:
                total = total + cache.loss(plan[step_idx[0]], alpha, t)
            return total / len(per_task)

        def valid_loss() -> float:
            with torch.no_grad():
                alpha = gate.alpha()
                return float(
                    sum(float(va.loss(range(len(va)), alpha, t)) for _, _, _, va, t in per_task) / len(per_task)
                )

        validate = all(va is not None for *_, va, _ in per_task)
        history = train_loop(
            [gate.theta],
            [[s] for s in range(cfg.steps)],
            step_loss,
            valid_loss if validate else None,
            lr=cfg.lr,
            eval_every=cfg.eval_every,
            keep_best=cfg.keep_best,
        )
    return SharedFit(gate.theta.detach().float().cpu(), names, history, time.perf_counter() - t0)
