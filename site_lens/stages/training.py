"""The one training loop every trained method uses (SITE, I2CL, LoRA, (IA)3), its many-task form, and the whole-prompt loss.

``train_loop`` runs Adam on a few parameters of a frozen model: a seeded
schedule of training batches (one permutation of the examples, cycled),
validation every ``eval_every`` steps and at the last one, keeping the
parameters with the lowest valid loss, and stopping at the first non-finite
loss or parameter (the last finite parameters are kept and the reason is
recorded in ``TrainHistory.stopped_early``). Methods differ only in the loss
they hand it. ``train_loop_many`` runs the same loop for many tasks at once, one
parameter row per task, each task stopping, validating and keeping its best alone.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..engine.backend import last_logits
from ..gate import HookFactory, Hooks
from ..threads import adapt, adaptive_threads
from ..tokens import GRAD_CELLS, Example, fit_batches, pad_id, pad_right
from ..types import Model

log = logging.getLogger(__name__)


@dataclass
class TrainHistory:
    step: list[int] = field(default_factory=list)  # steps at which the train loss was logged
    loss: list[float] = field(default_factory=list)
    valid_step: list[int] = field(default_factory=list)
    valid_loss: list[float] = field(default_factory=list)
    best_step: int | None = None
    best_valid_loss: float | None = None
    stopped_early: str | None = None  # why training stopped before its last step
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def schedule(n_train: int, steps: int, batch_size: int, seed: int) -> list[list[int]]:
    """Indices of the training examples for each step: a permutation seeded by ``seed``, cycled."""
    rng = random.Random(seed)
    out: list[list[int]] = []
    pool: list[int] = []
    for _ in range(steps):
        batch = []
        for _ in range(batch_size):
            if not pool:
                pool = list(range(n_train))
                rng.shuffle(pool)
            batch.append(pool.pop())
        out.append(batch)
    return out


@contextmanager
def frozen(model: Model) -> Iterator[None]:
    """The model's parameters require no gradient inside the block; their flags are restored after it."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    model.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


@adaptive_threads()
def train_loop(
    params: Sequence[nn.Parameter],
    plan: Sequence[Sequence[int]],
    step_loss: Callable[[Sequence[int]], Tensor],
    valid_loss: Callable[[], float] | None,
    *,
    lr: float,
    eval_every: int,
    keep_best: bool = True,
    progress: Callable[[int, float], None] | None = None,
    what: str = "theta",
) -> TrainHistory:
    """Adam on ``params``, one step per batch of ``plan``; returns the history, params left at the best (or last).

    ``step_loss(batch)`` returns the batch's mean loss: differentiable (the loop back-propagates
    it) or detached with the gradients already accumulated (memory-capped chunks).
    ``valid_loss()`` runs every ``eval_every`` steps and at the last step (None or 0: never).
    ``what`` names the parameters in the stop message (SITE's are theta).
    """
    t0 = time.perf_counter()
    hist = TrainHistory()
    opt = torch.optim.Adam(params, lr=lr)
    best: tuple[float, int | None, list[Tensor] | None] = (math.inf, None, None)
    last_good = [p.detach().clone() for p in params]

    def restore(values: list[Tensor]) -> None:
        with torch.no_grad():
            for p, v in zip(params, values):
                p.copy_(v)

    for step, batch in enumerate(plan, start=1):
        adapt()
        opt.zero_grad(set_to_none=True)
        loss = step_loss(batch)
        if not torch.isfinite(loss):
            hist.stopped_early = f"non-finite loss ({loss.item()}) at step {step}; kept the {what} of step {step - 1}"
            log.error(hist.stopped_early)
            restore(last_good)
            break
        if loss.requires_grad:
            loss.backward()
        opt.step()
        if not all(bool(torch.isfinite(p).all()) for p in params):
            hist.stopped_early = f"non-finite {what} after step {step}; kept the {what} of step {step - 1}"
            log.error(hist.stopped_early)
            restore(last_good)
            break
        last_good = [p.detach().clone() for p in params]
        hist.step.append(step)
        hist.loss.append(loss.item())
        if valid_loss is not None and eval_every and (step % eval_every == 0 or step == len(plan)):
            vl = valid_loss()
            hist.valid_step.append(step)
            hist.valid_loss.append(vl)
            if vl < best[0]:
                best = (vl, step, [v.clone() for v in last_good])
        if progress is not None:
            progress(step, hist.loss[-1])
    if keep_best and best[2] is not None:
        restore(best[2])
        hist.best_step, hist.best_valid_loss = best[1], best[0]
    hist.seconds = time.perf_counter() - t0
    return hist


@adaptive_threads()
def train_loop_many(
    theta: nn.Parameter,
    plans: Sequence[Sequence[Sequence[int]]],
    step_losses: Callable[[list[Sequence[int] | None]], Tensor],
    valid_losses: Callable[[list[bool]], list[float | None]] | None,
    *,
    lr: float,
    eval_every: int,
    keep_best: bool = True,
    progress: Callable[[int, list[float]], None] | None = None,
    what: str = "theta",
) -> list[TrainHistory]:
    """``train_loop`` for n tasks at once: ``theta[k]`` is task k's parameter, ``plans[k]`` its schedule.

    ``step_losses(batches)`` takes each task's batch of the step (None for a task that has stopped)
    and returns the n tasks' mean losses, (task,), differentiable; their sum is back-propagated once.
    One Adam over the stacked theta is n independent Adams (its update is elementwise and every
    task starts at step 0). Per task, as ``train_loop``: a non-finite loss or theta stops that task
    alone with the theta of its last finite step; ``valid_losses(live)`` (one float per task, read
    where ``live``; None: a task that does not validate) runs every ``eval_every`` steps and at the last, and each task keeps its own best.
    ``progress(step, losses)`` gets each task's loss (NaN for a task that has stopped).
    """
    t0 = time.perf_counter()
    n = theta.shape[0]
    if len(plans) != n or len({len(p) for p in plans}) > 1:
        raise ValueError(f"train_loop_many needs one plan per task, all of one length: {n} tasks, plans {[len(p) for p in plans]}")
    steps = len(plans[0]) if plans else 0
    hists = [TrainHistory() for _ in range(n)]
    opt = torch.optim.Adam([theta], lr=lr)
    live = [True] * n
    best: list[tuple[float, int | None, Tensor | None]] = [(math.inf, None, None)] * n
    last_good = theta.detach().clone()

    def stop(k: int, why: str) -> None:
        live[k] = False
        hists[k].stopped_early = why
        log.error("task %d: %s", k, why)

    for step in range(1, steps + 1):
        adapt()
        opt.zero_grad(set_to_none=True)
        losses = step_losses([plans[k][step - 1] if live[k] else None for k in range(n)])  # (task,)
        values = losses.detach().tolist()
        for k in range(n):
            if live[k] and not math.isfinite(values[k]):
                stop(k, f"non-finite loss ({values[k]}) at step {step}; kept the {what} of step {step - 1}")
        if not any(live):
            break
        keep = torch.tensor(live, device=losses.device)
        total = torch.where(keep, losses, torch.zeros_like(losses)).sum()
        if total.requires_grad:
            total.backward()
        if theta.grad is not None:  # a stopped task's rows may still carry NaN through the batched backward
            theta.grad[~keep.to(theta.device)] = 0
        opt.step()
        with torch.no_grad():
            for k in range(n):
                if live[k] and not bool(torch.isfinite(theta[k]).all()):
                    stop(k, f"non-finite {what} after step {step}; kept the {what} of step {step - 1}")
                if not live[k]:
                    theta[k] = last_good[k]  # a stopped task's theta stays where it stopped
        last_good = theta.detach().clone()
        for k in (k for k in range(n) if live[k]):
            hists[k].step.append(step)
            hists[k].loss.append(values[k])
        if valid_losses is not None and eval_every and (step % eval_every == 0 or step == steps) and any(live):
            vl = valid_losses(list(live))
            for k in (k for k in range(n) if live[k] and vl[k] is not None):
                hists[k].valid_step.append(step)
                hists[k].valid_loss.append(vl[k])
                if vl[k] < best[k][0]:
                    best[k] = (vl[k], step, last_good[k].clone())
        if progress is not None:
            progress(step, [values[k] if live[k] else math.nan for k in range(n)])
    with torch.no_grad():
        for k, (vl, at, value) in enumerate(best):
            if keep_best and value is not None:
                theta[k] = value
                hists[k].best_step, hists[k].best_valid_loss = at, vl
    for h in hists:
        h.seconds = time.perf_counter() - t0  # the loop's time, shared by its tasks
    return hists


def first_token_loss(
    model: Model,
    examples: Sequence[Example],
    hooks: Hooks = (),
    prefill: HookFactory | None = None,
    batch_size: int = 32,
    backward: bool = False,
) -> Tensor:
    """Mean cross-entropy of the answer's first token over whole prompts through the hooked model.

    Chunks of up to ``batch_size`` rows are cut to fit ``ATTN_CELLS`` (``GRAD_CELLS`` over all
    layers while gradients are on). With ``backward`` each chunk's share of the mean is
    back-propagated at once (gradient accumulation: one chunk's graph alive at a time) and
    the mean comes back detached.
    """
    cells = GRAD_CELLS // model.cfg.n_layers if torch.is_grad_enabled() else None
    lengths = [len(e.tokens) for e in examples]
    total = torch.zeros((), device=model.cfg.device)
    for idx in fit_batches(range(len(examples)), lengths, batch_size, model.cfg.n_heads, cells):
        adapt()
        chunk = [examples[i] for i in idx]
        tokens, mask, last = pad_right([e.tokens for e in chunk], pad_id(model), model.cfg.device)
        with model.hooks(fwd_hooks=list(hooks)):
            logits = last_logits(model, tokens, last, hooks=prefill(last) if prefill else [], attention_mask=mask)
        target = torch.tensor([e.target for e in chunk], device=logits.device)
        part = F.cross_entropy(logits.float(), target, reduction="sum")
        if backward:
            (part / len(examples)).backward()
            part = part.detach()
        total = total + part
    return total / len(examples)
