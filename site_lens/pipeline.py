"""One task end to end, as ``site-lens run`` does it: the benchmark's rows for zero-shot, ICL and SITE.

    fit = fit_site(model, task)                                  # stages 1 and 2 (methods.site)
    result = evaluate(model, task, "site", fit.adapter)          # stage 3, scored
    results, adapter = run_task(model, task)                     # all of it, as results.json

Every method here is the benchmark's (``methods``): fitted and scored by
``bench.run_row``, so ``run`` and ``bench`` give the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .bench import run_row
from .config import EvalConfig, SiteConfig
from .io import Adapter
from .methods import ICL, Method, Site, TaskContext, ZeroShot, configured, score_method
from .models import model_identity
from .models.engines import Model
from .tasks import Task, category

RUN_METHODS = ("zero_shot", "icl", "site")
RESULT_KEYS = ("first_token_acc", "exact_match", "strict_match")


def predict(
    model: Model,
    prompts: Sequence[str],
    adapter: Adapter | None = None,
    cfg: EvalConfig | None = None,
) -> tuple[list[str], torch.Tensor]:
    """Greedy generations (and first-step logits) for prompt strings, with SITE injected if an adapter is given."""
    method: Method = Site.from_adapter(adapter) if adapter is not None else ZeroShot()
    return method.predict(model, prompts, cfg)


def evaluate(
    model: Model,
    task: Task,
    method: str,
    adapter: Adapter | None = None,
    cfg: EvalConfig | None = None,
    n_shots: int = 10,
    seed: int = 0,
    split: str = "test",
) -> dict[str, Any]:
    """Score zero_shot, icl or site (given its adapter) on a split: first-token accuracy, exact and strict match."""
    from .config import ConfigError

    if method not in RUN_METHODS:
        raise ConfigError(f"unknown method '{method}'; use one of {RUN_METHODS} (or methods.score_method for the others)")
    if method == "site" and adapter is None:
        raise ConfigError("method 'site' needs an adapter (from fit_site or load_adapter)")
    m: Method = {"zero_shot": ZeroShot, "icl": lambda: ICL(n_shots)}[method]() if method != "site" else Site.from_adapter(adapter)
    return score_method(model, m, task, seed, cfg, split)


def run_task(
    model: Model,
    task: Task,
    cfg: SiteConfig | None = None,
    methods: Sequence[str] = RUN_METHODS,
    progress: Callable[[int, float], None] | None = None,
) -> tuple[dict[str, Any], Adapter | None]:
    """Fit and score zero-shot, N-shot ICL and SITE on the test split: (results.json's dict, SITE's adapter)."""
    cfg = cfg or SiteConfig()
    assert cfg.eval is not None and cfg.embedding is not None
    ident = model_identity(model)
    out: dict[str, Any] = {
        "model": ident["name"],
        "model_identity": ident,
        "task": task.name,
        "task_source": task.source,
        "category": category(task),
        "n_test": len(task.test[: cfg.eval.max_test]),
        "config": cfg.to_dict(),
        "seconds": {},
    }
    ctx = TaskContext(task, cfg.seed, cfg.embedding)
    adapter = None
    for name in methods:
        method = configured(name, cfg, progress)
        row = run_row(model, method, task, cfg.seed, ctx, cfg.eval)
        out[name] = {
            **{k: row[k] for k in RESULT_KEYS},
            "n": row["n_test"],
            "seconds": row["eval_seconds"],
            "ms_per_query": row["ms_per_query"],
            "predictions": row["predictions"],
        }
        if isinstance(method, Site):
            assert method.result is not None
            adapter = method.adapter
            out["seconds"].update(method.result.seconds)
            out["history"] = method.result.history.to_dict()
            out["backend"] = method.result.backend
        out["seconds"][f"eval_{name}"] = row["eval_seconds"]
    return out, adapter
