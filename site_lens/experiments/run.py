"""One task end to end, as ``site-lens run`` does it: the benchmark's rows for zero-shot, ICL and SITE.

    fit = fit_site(model, task)                                  # stages 1 and 2 (methods.site)
    result = evaluate(model, task, "site", fit.adapter)          # stage 3, scored
    results, adapter = run_task(model, task)                     # all of it, as results.json
    answers = predict(model, ["river", "candle"], fit.adapter)   # raw inputs, as site-lens predict

Every method here is the benchmark's (``methods``), fitted and scored by
``methods.fit_and_score`` as the benchmark does it, so ``run`` and ``bench``
give the same numbers; each method's entry of results.json is its bench row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..adapter import Adapter
from ..config import ConfigError, EvalConfig, SiteConfig
from ..methods import ICL, Method, Score, Site, TaskContext, ZeroShot, configured, fit_and_score, score_method
from ..models import model_identity
from ..tasks import Task, category, format_query
from ..types import Model

RUN_METHODS = ("zero_shot", "icl", "site")


def answer_line(generation: str) -> str:
    """A generation's answer as ``predict`` and ``site-lens predict`` give it: its first line, stripped."""
    return generation.strip().split("\n")[0].strip()


def predict(
    model: Model,
    inputs: Sequence[str],
    adapter: Adapter | None = None,
    cfg: EvalConfig | None = None,
    *,
    formatted: bool = False,
) -> list[str]:
    """The model's answers to raw inputs, with SITE injected if an adapter is given; as ``site-lens predict``.

    Each input x goes into the zero-shot prompt ``format_query(x)``, 'Q: {x}\\nA:', unless ``formatted``
    is True: then the inputs are whole prompts already (from ``format_query`` or ``build_prompt``).
    Generation is greedy, ``cfg.max_new_tokens`` tokens at most (``EvalConfig()``: 20), and each answer
    is its generation's first line, stripped (``answer_line``). ``predict_with_logits`` gives the raw
    generations and the first-step logits.

        sl.predict(model, ["river", "candle"], adapter)   # -> e.g. ['RIVER', 'CANDLE']

    Example:
        A tiny random model with a byte-level tokenizer stands in for a real one: its answers are
        noise, but the calls and what they return are those of a real run.

        >>> import site_lens as sl
        >>> model = sl.tiny_model("bytes")  # a byte-level tokenizer, built offline; or sl.load_model("smollm2-135m")
        >>> cfg = sl.SiteConfig(embedding=sl.EmbeddingConfig(n_prompts=2, n_shots=2),   # a few seconds' budget
        ...                     selection=sl.SelectionConfig(steps=2, eval_every=2, max_valid=2),
        ...                     eval=sl.EvalConfig(max_new_tokens=3, max_test=2))
        >>> fit = sl.fit_site(model, sl.load_task("uppercase"), cfg)
        >>> answers = predict(model, ["river", "candle"], fit.adapter, cfg.eval)   # SITE injected
        >>> len(answers), all(isinstance(a, str) for a in answers)
        (2, True)
        >>> len(predict(model, ["river"], cfg=cfg.eval))   # zero-shot: no adapter
        1
    """
    if isinstance(inputs, str):
        raise TypeError("predict takes a list of inputs, not one string: predict(model, [x], ...)")
    prompts = list(inputs) if formatted else [format_query(x) for x in inputs]
    gens, _ = predict_with_logits(model, prompts, adapter, cfg)
    return [answer_line(g) for g in gens]


def predict_with_logits(
    model: Model,
    prompts: Sequence[str],
    adapter: Adapter | None = None,
    cfg: EvalConfig | None = None,
) -> tuple[list[str], torch.Tensor]:
    """Raw greedy generations and the first-step logits [batch, d_vocab] for whole prompt strings.

    The prompts are used as given (no formatting); SITE is injected if an adapter is given.

    Example:
        A tiny random model with a byte-level tokenizer stands in for a real one: its answers are
        noise, but the calls and what they return are those of a real run.

        >>> import site_lens as sl
        >>> model = sl.tiny_model("bytes")  # a byte-level tokenizer, built offline; or sl.load_model("smollm2-135m")
        >>> prompt = sl.format_query("river")            # the zero-shot prompt; or a whole N-shot prompt
        >>> texts, logits = predict_with_logits(model, [prompt], cfg=sl.EvalConfig(max_new_tokens=3))
        >>> len(texts), logits.shape                     # raw generations; first-step logits (batch, d_vocab)
        (1, torch.Size([1, 257]))
    """
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
) -> Score:
    """Score zero_shot, icl or site (given its adapter) on a split: first-token accuracy, exact and strict match.

    Example:
        A tiny random model with a byte-level tokenizer stands in for a real one: its answers are
        noise, but the calls and what they return are those of a real run.

        >>> import site_lens as sl
        >>> model = sl.tiny_model("bytes")  # a byte-level tokenizer, built offline; or sl.load_model("smollm2-135m")
        >>> task = sl.load_task("uppercase")
        >>> cfg = sl.SiteConfig(embedding=sl.EmbeddingConfig(n_prompts=2, n_shots=2),   # a few seconds' budget
        ...                     selection=sl.SelectionConfig(steps=2, eval_every=2, max_valid=2),
        ...                     eval=sl.EvalConfig(max_new_tokens=3, max_test=2))
        >>> fit = sl.fit_site(model, task, cfg)
        >>> score = evaluate(model, task, "site", fit.adapter, cfg.eval)   # or "zero_shot", "icl"
        >>> score["n_test"], sorted(k for k in score if k.endswith(("_acc", "_match")))
        (2, ['exact_match', 'first_token_acc', 'option_acc', 'strict_match'])
        >>> score["predictions"][0]["target"], type(score["predictions"][0]["output"]).__name__
        ('EAST', 'str')
    """
    if method not in RUN_METHODS:
        raise ConfigError(f"unknown method '{method}'; use one of {RUN_METHODS} (or methods.score_method for the others)")
    if method == "site" and adapter is None:
        raise ConfigError("method 'site' needs an adapter (from fit_site or load_adapter)")
    m: Method = ZeroShot() if method == "zero_shot" else ICL(n_shots) if method == "icl" else Site.from_adapter(adapter)
    return score_method(model, m, task, seed, cfg, split)


def run_task(
    model: Model,
    task: Task,
    cfg: SiteConfig | None = None,
    methods: Sequence[str] = RUN_METHODS,
    progress: Callable[[int, float], None] | None = None,
) -> tuple[dict[str, Any], Adapter | None]:
    """Fit and score zero-shot, N-shot ICL and SITE on the test split: (results.json's dict, SITE's adapter).

    Example:
        A tiny random model with a byte-level tokenizer stands in for a real one: its answers are
        noise, but the calls and what they return are those of a real run.

        >>> import site_lens as sl
        >>> model = sl.tiny_model("bytes")  # a byte-level tokenizer, built offline; or sl.load_model("smollm2-135m")
        >>> cfg = sl.SiteConfig(embedding=sl.EmbeddingConfig(n_prompts=2, n_shots=2),   # a few seconds' budget
        ...                     selection=sl.SelectionConfig(steps=2, eval_every=2, max_valid=2),
        ...                     eval=sl.EvalConfig(max_new_tokens=3, max_test=2))
        >>> results, adapter = run_task(model, sl.load_task("uppercase"), cfg)
        >>> results["task"], results["n_test"], results["site"]["exact_match"] <= 1
        ('uppercase', 2, True)
        >>> adapter.theta.shape
        torch.Size([2, 4])
    """
    cfg = cfg or SiteConfig()
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
        out[name] = row = fit_and_score(model, method, task, cfg.seed, ctx, cfg.eval)
        if isinstance(method, Site):
            assert method.result is not None
            adapter = method.adapter
            out["seconds"].update(method.result.seconds)
            out["history"] = method.result.history.to_dict()
            out["backend"] = method.result.backend
        out["seconds"][f"eval_{name}"] = row["eval_seconds"]
    return out, adapter
