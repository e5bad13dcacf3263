"""Stage 1: the task embedding t[layer, head] = mean of hook_z at the last prompt token.

Only the last real token's ``hook_z`` is kept from each forward pass (a
capture hook per layer, the last-position equivalent of
``run_with_cache(names_filter=[...])``), so memory is (batch, layer, head,
d_head) whatever the prompt length. Prompts are right-padded; with causal
attention, pads after the last real token cannot change it.

    t = task_embedding(model, task, EmbeddingConfig(), seed=0)   # SITE's t; FV's and MTV's mean head outputs
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import partial

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens.hook_points import HookPoint

from ..config import EmbeddingConfig
from ..gate import z_names
from ..tasks import Task, check_enough, sample_icl_prompts
from ..threads import adapt, adaptive_threads
from ..tokens import check_context, encode, fit_batches, pad_id, pad_right
from ..types import Model


def capture_last_hook(
    z: Float[Tensor, "batch pos head_index d_head"],
    hook: HookPoint,
    store: dict[str, Tensor],
    last: Int[Tensor, " batch"],
    key: str,
) -> None:
    """Store z at each row's last real token under ``key`` (the name asked for: a bridge reports its alias's target)."""
    rows = torch.arange(z.shape[0], device=z.device)
    store[key] = z[rows, last].detach()  # (batch, head, d_head)


@adaptive_threads()
@torch.inference_mode()
def last_token_z(
    model: Model, token_lists: Sequence[Sequence[int]], batch_size: int = 10
) -> Float[Tensor, "prompt layer head_index d_head"]:
    """hook_z of every layer and head at each prompt's last token."""
    check_context(model, [len(t) for t in token_lists])
    names = z_names(model)
    order = sorted(range(len(token_lists)), key=lambda i: len(token_lists[i]))  # less padding
    out = torch.empty(len(token_lists), model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)
    for idx in fit_batches(order, [len(t) for t in token_lists], batch_size, model.cfg.n_heads):
        adapt()
        tokens, _, last = pad_right([token_lists[i] for i in idx], pad_id(model), model.cfg.device)
        store: dict[str, Tensor] = {}
        hooks = [(n, partial(capture_last_hook, store=store, last=last, key=n)) for n in names]
        with model.hooks(fwd_hooks=hooks):
            model(tokens, stop_at_layer=model.cfg.n_layers)
        out[idx] = torch.stack([store[n] for n in names], dim=1).float().cpu()  # (batch, layer, head, d_head)
    return out


def build_task_embedding(
    model: Model, prompts: Sequence[str] | Sequence[Sequence[int]], batch_size: int = 10
) -> Float[Tensor, "layer head_index d_head"]:
    """Mean over prompts of hook_z at the last prompt token, for every layer and head.

    ``prompts`` are N-shot prompt strings (see ``tasks.sample_icl_prompts``) or
    token-id lists.

    Example:
        >>> import site_lens as sl
        >>> model = sl.tiny_model()
        >>> prompts = [[1, 5, 7, 2, 9, 4], [3, 5, 8, 2, 6]]   # token ids of N-shot prompts (or prompt strings)
        >>> t = build_task_embedding(model, prompts)
        >>> t.shape                                       # (layer, head, d_head)
        torch.Size([2, 4, 8])
    """
    if len(prompts) == 0:
        raise ValueError("build_task_embedding needs at least one prompt")
    token_lists = encode(model, prompts) if isinstance(prompts[0], str) else prompts  # type: ignore[arg-type]
    return last_token_z(model, token_lists, batch_size).mean(dim=0)


def embedding_prompts(task: Task, cfg: EmbeddingConfig, seed: int) -> list[tuple[str, str]]:
    """The M N-shot prompts of stage 1 (demonstrations and query all from train), fixed by the seed."""
    check_enough(task.train, cfg.n_shots + 1, f"task '{task.name}' split 'train' ({cfg.n_shots} shots + 1 query)")
    return sample_icl_prompts(task.train, cfg.n_prompts, cfg.n_shots, random.Random(seed))


def task_embedding(
    model: Model, task: Task, cfg: EmbeddingConfig, seed: int
) -> Float[Tensor, "layer head_index d_head"]:
    """Stage 1 on a task: ``build_task_embedding`` over its ``embedding_prompts``."""
    return build_task_embedding(model, [p for p, _ in embedding_prompts(task, cfg, seed)], cfg.batch_size)
