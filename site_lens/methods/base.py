"""The interface every benchmarked method implements, and what they share.

A ``Method`` is fitted on a task's train (and valid) split, then scored on
test prompts. At inference it can change the model in two ways, both as
TransformerLens hooks attached for one generation call only:

* ``prefill_hooks(model)``: a factory ``last -> hooks`` run once, on the
  prompt pass, where ``last`` holds each row's last prompt index (SITE, FV,
  TV, MTV: an intervention at the last prompt token);
* ``persistent_hooks(model)``: hooks active on every forward pass, prompt and
  generated tokens alike (I2CL, LoRA, (IA)3: a change to every position).

``Method.predict`` is the one prediction function (greedy, up to 20 tokens,
stopping at a newline) and ``score_method`` the one evaluation, for every
method alike. ``fit_and_score`` fits and scores one: a ``Row``, the record
``run`` (results.json) and ``bench`` (rows/, rows.csv) both write.
``train_params`` runs the continuous-parameter baselines through the training
loop SITE uses (``training.train_loop``): Adam on the cross-entropy of the
answer's first token over zero-shot train prompts, keeping the parameters
with the lowest valid loss.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypedDict

import torch
from torch import Tensor, nn

from ..config import TEACHER_FORCED, EmbeddingConfig, EvalConfig, TrainConfig
from ..engine.prompt_cache import PromptCache
from ..gate import HookFactory, Hooks
from ..metrics import first_token_accuracy, score
from ..stages.embeddings import embedding_prompts, task_embedding
from ..stages.generation import generate_greedy
from ..stages.objectives import sequence_loss
from ..stages.options import option_accuracy, option_logprobs
from ..stages.training import first_token_loss, frozen, schedule, train_loop
from ..tasks import Task, category, zero_shot_prompts
from ..threads import adaptive_threads
from ..tokens import Example, answer_ids, encode, fit_batches, pad_id, pad_right
from ..types import Model

log = logging.getLogger(__name__)


def sum_last_hook(
    act: Tensor,
    hook,
    store: dict[str, Tensor],
    last: Tensor,
    key: str,
    transform: Callable[[Tensor], Tensor] = lambda a: a,
) -> None:
    """Store the sum over rows of ``transform(act)`` at each row's last real token, under ``key`` (the name asked for)."""
    rows = torch.arange(act.shape[0], device=act.device)
    store[key] = transform(act[rows, last].float()).sum(0).cpu()  # (d_model,)


@torch.inference_mode()
def sum_last_token(
    model: Model,
    prompts: Sequence[str],
    names: Sequence[str],
    batch_size: int = 10,
    transform: Callable[[Tensor], Tensor] = lambda a: a,
    stop_at_layer: int | None = None,
) -> Tensor:
    """``transform(act)`` at each prompt's last token, summed over prompts, for each hook name: (name, ...)."""
    toks = encode(model, prompts)
    total: Tensor | None = None
    for idx in fit_batches(range(len(toks)), [len(t) for t in toks], batch_size, model.cfg.n_heads):
        tokens, _, last = pad_right([toks[i] for i in idx], pad_id(model), model.cfg.device)
        store: dict[str, Tensor] = {}
        hooks = [(n, partial(sum_last_hook, store=store, last=last, key=n, transform=transform)) for n in names]
        with model.hooks(fwd_hooks=hooks):
            model(tokens, stop_at_layer=stop_at_layer or model.cfg.n_layers)
        batch = torch.stack([store[n] for n in names])
        total = batch if total is None else total + batch
    if total is None:
        raise ValueError("sum_last_token needs at least one prompt")
    return total


def method_seed(seed: int, name: str) -> int:
    """A per-(seed, method) RNG seed, so a method's result never depends on what ran before it."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**31)


class NotFittedError(RuntimeError):
    """A fitted method's hooks asked for before ``fit``."""


class Method:
    """Base class: zero-shot prompts, no hooks, nothing to fit."""

    name = "base"

    def _fitted(self, *state: Any) -> None:
        """NotFittedError unless every piece of ``state`` (what ``fit`` sets) is there: a check ``python -O`` keeps."""
        if any(x is None for x in state):
            raise NotFittedError(f"{self.name}: call fit() before asking for its hooks")

    def __init__(self) -> None:
        self.info: dict[str, Any] = {}  # what fit chose (layers, heads, losses), saved with the row

    @property
    def n_trainable(self) -> int:
        """Scalars fitted by gradient descent or a policy (0 for training-free methods)."""
        return 0

    def fit(self, model: Model, task: Task, seed: int, ctx: TaskContext | None = None) -> None:
        """Fit on ``task.train`` (model selection on ``task.valid``); the default does nothing."""

    def prompts(self, task: Task, pairs: Sequence[tuple[str, str]], seed: int) -> list[tuple[str, str]]:
        """(prompt, answer) for each query pair: zero-shot by default."""
        return zero_shot_prompts(pairs)

    def prefill_hooks(self, model: Model) -> HookFactory | None:
        """Hooks for the prompt pass only, given each row's last prompt index."""
        return None

    def persistent_hooks(self, model: Model) -> Hooks:
        """Hooks for every forward pass, prompt and generated tokens."""
        return []

    def predict(self, model: Model, prompts: Sequence[str], cfg: EvalConfig | None = None) -> tuple[list[str], Tensor]:
        """Greedy generations and first-step logits with this method's hooks attached."""
        cfg = cfg or EvalConfig()
        with model.hooks(fwd_hooks=self.persistent_hooks(model)):
            new, first = generate_greedy(
                model,
                encode(model, prompts),
                max_new_tokens=cfg.max_new_tokens,
                prefill_hooks=self.prefill_hooks(model),
                batch_size=cfg.batch_size,
                stop_ids=None if cfg.stop_at_newline else {-1},
            )
        return [model.tokenizer.decode(n) for n in new], first


# ---------------------------------------------------------------- shared work per task


class TaskContext:
    """Work several methods share on one (task, seed): stage 1's prompts and their mean hook_z."""

    def __init__(self, task: Task, seed: int, embedding: EmbeddingConfig | None = None):
        self.task, self.seed = task, seed
        self.embedding = embedding or EmbeddingConfig()
        self._mean_z: Tensor | None = None

    def icl_prompts(self) -> list[tuple[str, str]]:
        """The M N-shot prompts of SITE's stage 1 (queries from train), fixed by the seed."""
        return embedding_prompts(self.task, self.embedding, self.seed)

    def mean_z(self, model: Model) -> Tensor:
        """Mean hook_z at the last token over ``icl_prompts`` (SITE's t; FV's and MTV's mean head outputs)."""
        if self._mean_z is None:
            self._mean_z = task_embedding(model, self.task, self.embedding, self.seed)
        return self._mean_z


# ---------------------------------------------------------------- scoring: the one evaluation, the one record


class Score(TypedDict):
    """A fitted method's scores on one split (``score_method``)."""

    first_token_acc: float  # the first generated token is the answer's first token
    exact_match: float  # prefix match (metrics.exact_match)
    strict_match: float
    option_acc: float | None  # the gold option has the highest log-probability; multiple-choice tasks only
    n_test: int  # items scored
    eval_seconds: float  # wall clock of the generations
    ms_per_query: float
    predictions: list[dict[str, str]]  # per item: the prompt's last block, the target, the answer given


class Row(Score):
    """One method fitted on one (task, seed) and scored on test (``fit_and_score``)."""

    task: str
    category: str
    method: str
    seed: int
    n_trainable: int  # Method.n_trainable
    fit_seconds: float
    info: dict[str, Any]  # Method.info: what fit chose


def score_method(
    model: Model, method: Method, task: Task, seed: int, cfg: EvalConfig | None = None, split: str = "test"
) -> Score:
    """First-token accuracy, exact and strict match of a fitted method on a split.

    Items that list accepted answers (``tasks.Choice``) match any of them; on a multiple-choice
    task (every item lists options) ``option_acc`` is the share of items whose gold option has the
    highest summed log-probability under the method (``options.option_logprobs``), else None.
    """
    cfg = cfg or EvalConfig()
    pairs = task.split(split)[: cfg.max_test]
    choices = (task.split_choices(split) or [])[: cfg.max_test] or None
    prompts = method.prompts(task, pairs, seed)
    t0 = time.perf_counter()
    preds, first = method.predict(model, [p for p, _ in prompts], cfg)
    seconds = time.perf_counter() - t0
    targets = torch.tensor([answer_ids(model, p, a)[0] for p, a in prompts])
    option_acc = None
    if choices is not None and all(c.options for c in choices):
        with model.hooks(fwd_hooks=method.persistent_hooks(model)):
            lp = option_logprobs(
                model, [p for p, _ in prompts], [c.options for c in choices], method.prefill_hooks(model)
            )
        option_acc = option_accuracy(lp, [c.options.index(a) for (_, a), c in zip(pairs, choices)])
    accepted = [c.answers for c in choices] if choices is not None else None
    matches = score(preds, [a for _, a in prompts], bool(task.case_sensitive), accepted=accepted)
    return Score(
        first_token_acc=first_token_accuracy(first, targets),
        exact_match=matches["exact_match"],
        strict_match=matches["strict_match"],
        option_acc=option_acc,
        n_test=len(pairs),
        eval_seconds=round(seconds, 3),
        ms_per_query=round(1000 * seconds / max(1, len(pairs)), 3),
        predictions=[
            {"prompt_tail": p.split("\n\n")[-1], "target": a, "output": o} for (p, a), o in zip(prompts, preds)
        ],
    )


@adaptive_threads()
def fit_and_score(model: Model, method: Method, task: Task, seed: int, ctx: TaskContext | None, cfg: EvalConfig) -> Row:
    """Fit ``method`` on ``task`` (train, valid) with ``seed``, then score it on test: one row."""
    t0 = time.perf_counter()
    method.fit(model, task, seed, ctx)
    return scored_row(model, method, task, seed, cfg, time.perf_counter() - t0)


def scored_row(model: Model, method: Method, task: Task, seed: int, cfg: EvalConfig, fit_seconds: float) -> Row:
    """A fitted method's row: scored on test, with what fitting it cost."""
    return Row(
        task=task.name,
        category=category(task),
        method=method.name,
        seed=seed,
        **score_method(model, method, task, seed, cfg),
        n_trainable=method.n_trainable,
        fit_seconds=round(fit_seconds, 3),
        info=method.info,
    )


# ---------------------------------------------------------------- first-token losses and training


def train_params(
    model: Model,
    params: Sequence[nn.Parameter],
    hooks: Callable[[], Hooks],
    train: Sequence[Example],
    valid: Sequence[Example],
    cfg: TrainConfig,
    seed: int,
) -> dict[str, Any]:
    """Adam on ``params`` (the model frozen) over whole prompts; restores the best-valid parameters.

    The loss is ``cfg.objective``'s: the answer's first token (``training.first_token_loss``), or
    every answer token and its end (``objectives.sequence_loss``; ``train`` and ``valid`` then need
    continuations, as ``train_valid_examples(..., "sequence")`` gives them).

    The loop is ``training.train_loop``, SITE's: validation every ``eval_every`` steps and at the
    last, none before the first step; a non-finite loss stops training with the last finite values.
    """
    valid = list(valid)[: cfg.max_valid]

    def loss(examples: Sequence[Example], backward: bool = False) -> Tensor:
        if cfg.objective in TEACHER_FORCED:
            return sequence_loss(model, examples, hooks=hooks(), backward=backward)
        return first_token_loss(model, examples, hooks(), backward=backward)

    def step_loss(batch: Sequence[int]) -> Tensor:
        return loss([train[i] for i in batch], backward=True)

    def valid_loss() -> float:
        with torch.no_grad():
            return float(loss(valid))

    with frozen(model):
        history = train_loop(
            list(params),
            schedule(len(train), cfg.steps, cfg.batch_size, seed),
            step_loss,
            valid_loss if valid and cfg.eval_every else None,
            lr=cfg.lr,
            eval_every=cfg.eval_every,
            what="parameters",
        )
    return history.to_dict()


def choose_layer(
    model: Model,
    valid: Sequence[Example],
    edit: Callable[[int], Callable[[Tensor], Tensor]],
    layers: Sequence[int],
) -> tuple[int, list[float]]:
    """The layer whose edit of the last token's residual (at that layer's input) gives the lowest first-token valid loss.

    ``edit(layer)`` maps the token's (batch, d_model) residual, as a hook on
    ``blocks.{layer}.hook_resid_pre`` at the last prompt position would; every layer is scored
    against cached prefixes, one token per prompt (``prompt_cache.PromptCache``).
    """
    losses = []
    with torch.inference_mode():
        cache = PromptCache(model, valid)
        for layer in layers:
            losses.append(float(cache.loss(range(len(valid)), resid_edits={layer: edit(layer)})))
    best = min(range(len(layers)), key=lambda i: losses[i])
    return layers[best], losses
