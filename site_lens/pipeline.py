"""The three stages end to end on one task, plus zero-shot and ICL baselines.

    adapter, history = fit_site(model, task)             # stages 1 and 2
    result = evaluate(model, task, "site", adapter)      # stage 3, scored
    results = run_task(model, task)                      # all of it, as results.json
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformer_lens import HookedTransformer

from .config import EmbeddingConfig, EvalConfig, SiteConfig
from .embeddings import build_task_embedding
from .gate import injection_hooks
from .inject import generate_greedy
from .io import Adapter
from .metrics import score
from .models import model_identity
from .selection import AlphaTrainer
from .tasks import Task, check_enough, sample_icl_prompts, zero_shot_prompts
from .tokens import answer_ids, encode, make_examples
from .training import TrainHistory

log = logging.getLogger(__name__)
METHODS = ("zero_shot", "icl", "site")


def embedding_prompts(task: Task, cfg: EmbeddingConfig, seed: int) -> list[tuple[str, str]]:
    """The M N-shot prompts (demonstrations and query all from train) for stage 1."""
    check_enough(task.train, cfg.n_shots + 1, f"task '{task.name}' split 'train' ({cfg.n_shots} shots + 1 query)")
    return sample_icl_prompts(task.train, cfg.n_prompts, cfg.n_shots, random.Random(seed))


def fit_site(
    model: HookedTransformer,
    task: Task,
    cfg: SiteConfig | None = None,
    progress: Callable[[int, float], None] | None = None,
) -> tuple[Adapter, TrainHistory, dict[str, float]]:
    """Stages 1 and 2: the task embedding, then theta trained on zero-shot train prompts."""
    cfg = cfg or SiteConfig()
    assert cfg.embedding is not None and cfg.selection is not None
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    prompts = embedding_prompts(task, cfg.embedding, cfg.seed)
    t = build_task_embedding(model, [p for p, _ in prompts], batch_size=cfg.embedding.batch_size)
    seconds["embedding"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    train = make_examples(model, zero_shot_prompts(task.train))
    valid = make_examples(model, zero_shot_prompts(task.valid))
    trainer = AlphaTrainer(model, t, cfg.selection, seed=cfg.seed)
    gate = trainer.fit(train, valid, progress=progress)
    seconds["selection"] = time.perf_counter() - t0
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
        },
    )
    return adapter, trainer.history, seconds


def predict(
    model: HookedTransformer,
    prompts: Sequence[str],
    adapter: Adapter | None = None,
    cfg: EvalConfig | None = None,
) -> tuple[list[str], torch.Tensor]:
    """Greedy generations (and first-step logits) for prompt strings, with SITE injected if an adapter is given."""
    cfg = cfg or EvalConfig()
    hooks = None
    if adapter is not None:
        t = adapter.t.to(device=model.cfg.device, dtype=model.cfg.dtype)
        alpha = adapter.alpha.to(device=model.cfg.device, dtype=model.cfg.dtype)

        def hooks(last: torch.Tensor):
            return injection_hooks(model, t, alpha, last)

    tokens = encode(model, prompts)
    new, first = generate_greedy(
        model,
        tokens,
        max_new_tokens=cfg.max_new_tokens,
        prefill_hooks=hooks,
        batch_size=cfg.batch_size,
        stop_ids=None if cfg.stop_at_newline else {-1},
    )
    return [model.tokenizer.decode(n) for n in new], first


def evaluate(
    model: HookedTransformer,
    task: Task,
    method: str,
    adapter: Adapter | None = None,
    cfg: EvalConfig | None = None,
    n_shots: int = 10,
    seed: int = 0,
    split: str = "test",
) -> dict[str, Any]:
    """Score one method on a split: first-token accuracy, exact match, strict match."""
    cfg = cfg or EvalConfig()
    if method not in METHODS:
        raise ValueError(f"unknown method '{method}'; use one of {METHODS}")
    pairs = task.split(split)[: cfg.max_test]
    if method == "icl":
        prompts = sample_icl_prompts(task.train, 0, n_shots, random.Random(seed + 1), queries=pairs)
    else:
        prompts = zero_shot_prompts(pairs)
    if method == "site" and adapter is None:
        raise ValueError("method 'site' needs an adapter (from fit_site or load_adapter)")
    t0 = time.perf_counter()
    preds, first = predict(model, [p for p, _ in prompts], adapter if method == "site" else None, cfg)
    seconds = time.perf_counter() - t0
    targets = torch.tensor([answer_ids(model, p, a)[0] for p, a in prompts])
    res = score(preds, [a for _, a in prompts], bool(task.case_sensitive))
    return {
        "first_token_acc": float((first.argmax(-1) == targets).float().mean()),
        **res,
        "n": len(pairs),
        "seconds": seconds,
        "ms_per_query": 1000 * seconds / max(1, len(pairs)),
        "predictions": [{"prompt_tail": p.split("\n\n")[-1], "target": a, "output": o} for (p, a), o in zip(prompts, preds)],
    }


def run_task(
    model: HookedTransformer,
    task: Task,
    cfg: SiteConfig | None = None,
    methods: Sequence[str] = METHODS,
    progress: Callable[[int, float], None] | None = None,
) -> tuple[dict[str, Any], Adapter | None]:
    """Fit SITE and score zero-shot, 10-shot ICL and SITE on the test split."""
    cfg = cfg or SiteConfig()
    assert cfg.eval is not None and cfg.embedding is not None
    out: dict[str, Any] = {
        "model": model_identity(model)["name"],
        "model_identity": model_identity(model),
        "task": task.name,
        "task_source": task.source,
        "n_test": len(task.test[: cfg.eval.max_test]),
        "config": cfg.to_dict(),
        "seconds": {},
    }
    adapter = None
    if "site" in methods:
        adapter, history, secs = fit_site(model, task, cfg, progress)
        out["seconds"].update(secs)
        out["history"] = history.to_dict()
    for m in methods:
        r = evaluate(model, task, m, adapter, cfg.eval, n_shots=cfg.embedding.n_shots, seed=cfg.seed)
        out[m] = r
        out["seconds"][f"eval_{m}"] = r["seconds"]
    return out, adapter
