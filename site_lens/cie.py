"""Causal indirect effect (CIE) of each head, as in Function Vectors (Todd et al., 2024).

On *shuffled-label* N-shot prompts (the demonstrations' outputs permuted among
themselves, so the prompt no longer says what the task is), replace one head's
``hook_z`` at the last token by its task-conditioned mean ``t[layer, head]``
(the task embedding: mean over clean N-shot prompts, ``embeddings.build_task_embedding``)
and measure how much the probability of the correct answer's first token rises:

    CIE(l, h) = mean over prompts of  P(y | z[l, h] <- t[l, h]) - P(y | corrupted)

Only the last token changes, so each prompt's earlier keys and values are
computed once and every head's patched run is a one-token forward pass against
them: for Llama-style models all heads of a prompt in one batched run of
``lasttoken.LastToken`` (the gate with a one-hot alpha per row), otherwise one
hooked run per head against a frozen TransformerLens KV cache.

    cie = causal_indirect_effect(model, task, adapter.t)       # (layer, head)
    stats = alpha_cie_correlation(adapter.alpha, cie)           # pearson, spearman
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer
from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache

from .inject import answer_ids, check_context, encode, fit_batches, gate_hook, last_logits, pad_id, pad_right, z_names
from .lasttoken import LastToken, unsupported
from .tasks import Pair, Task, build_prompt, check_enough

log = logging.getLogger(__name__)


def shuffled_label_prompts(
    task: Task, n_prompts: int = 25, n_shots: int = 10, seed: int = 0, query_split: str = "valid"
) -> list[tuple[str, str]]:
    """FV's corrupted prompts: train demonstrations with their outputs shuffled, and a query from ``query_split``."""
    rng = random.Random(seed)
    check_enough(task.train, n_shots, f"task '{task.name}' split 'train' ({n_shots} shots)")
    queries = list(task.split(query_split)) or list(task.train)
    queries = [queries[i % len(queries)] for i in range(n_prompts)]
    out = []
    for x, y in queries:
        demos = rng.sample([p for p in task.train if p[0] != x] or list(task.train), n_shots)
        labels = [d[1] for d in demos]
        rng.shuffle(labels)
        out.append((build_prompt([(d[0], lab) for d, lab in zip(demos, labels)], x), y))
    return out


@dataclass
class LastTokenBatch:
    """Prompts split into a frozen KV cache of all but the last token, plus the last token."""

    cache: TransformerLensKeyValueCache
    last_tok: Int[Tensor, "batch 1"]
    targets: Int[Tensor, " batch"]
    index: list[int]  # rows of the original prompt list


@torch.inference_mode()
def last_token_batches(
    model: HookedTransformer, token_lists: Sequence[Sequence[int]], targets: Sequence[int], batch_size: int = 8
) -> list[LastTokenBatch]:
    """Cache every prompt's prefix once (right-padded, masked), frozen for repeated last-token runs."""
    if any(len(t) < 2 for t in token_lists):
        raise ValueError("every prompt needs at least two tokens (a prefix and a last token)")
    check_context(model, [len(t) for t in token_lists])
    device = model.cfg.device
    order = sorted(range(len(token_lists)), key=lambda i: len(token_lists[i]))  # less padding
    out = []
    for idx in fit_batches(order, [len(t) - 1 for t in token_lists], batch_size, model.cfg.n_heads):
        tokens, mask, _ = pad_right([token_lists[i][:-1] for i in idx], pad_id(model), device)
        cache = TransformerLensKeyValueCache.init_cache(model.cfg, device, len(idx))
        model(tokens, attention_mask=mask, past_kv_cache=cache, return_type=None)
        cache.freeze()
        last_tok = torch.tensor([[token_lists[i][-1]] for i in idx], device=device)  # (batch, 1)
        tgt = torch.tensor([targets[i] for i in idx], device=device)
        out.append(LastTokenBatch(cache, last_tok, tgt, idx))
    return out


def run_last_token(model: HookedTransformer, batch: LastTokenBatch, hooks=()) -> Float[Tensor, "batch d_vocab"]:
    """Logits at the last token, with ``hooks`` acting on that one position (index 0)."""
    zero = torch.zeros(batch.last_tok.shape[0], dtype=torch.long, device=batch.last_tok.device)
    return last_logits(
        model,
        batch.last_tok,
        zero,
        hooks=list(hooks),
        attention_mask=torch.ones_like(batch.last_tok),
        past_kv_cache=batch.cache,
    )


def _prompts_and_targets(model, task_or_prompts, n_prompts, n_shots, seed) -> tuple[list[list[int]], list[int]]:
    if isinstance(task_or_prompts, Task):
        pairs: Sequence[Pair] = shuffled_label_prompts(task_or_prompts, n_prompts, n_shots, seed)
    else:
        pairs = list(task_or_prompts)
    if not pairs:
        raise ValueError("causal_indirect_effect needs at least one prompt")
    tokens = encode(model, [p for p, _ in pairs])
    targets = [answer_ids(model, p, a)[0] for p, a in pairs]
    return tokens, targets


@torch.inference_mode()
def causal_indirect_effect(
    model: HookedTransformer,
    task_or_prompts: Task | Sequence[tuple[str, str]],
    t: Float[Tensor, "layer head_index d_head"],
    *,
    n_prompts: int = 25,
    n_shots: int = 10,
    seed: int = 0,
    batch_size: int = 8,
) -> Float[Tensor, "layer head_index"]:
    """Average causal indirect effect of every head (FV, Todd et al. 2024, eq. 3-4).

    Args:
        model: the frozen HookedTransformer.
        task_or_prompts: a ``Task`` (``n_prompts`` shuffled-label ``n_shots``-shot
            prompts are built from it, queries from its valid split; see
            ``shuffled_label_prompts``) or ready (prompt, answer) string pairs,
            already corrupted as you wish.
        t: mean ``hook_z`` at the last token of clean prompts, (layer, head, d_head);
            e.g. ``adapter.t`` or ``build_task_embedding(...)``.
        seed: seeds the prompt sampling and label shuffling.
        batch_size: prompts per cached batch (memory, not results).

    Returns:
        CIE[layer, head] = mean over prompts of P(answer's first token | head
        patched to t) - P(answer's first token | corrupted prompt), on CPU, float32.
    """
    tokens, targets = _prompts_and_targets(model, task_or_prompts, n_prompts, n_shots, seed)
    t = t.to(device=model.cfg.device, dtype=model.cfg.dtype)
    if any(len(x) < 2 for x in tokens):
        raise ValueError("every prompt needs at least two tokens (a prefix and a last token)")
    check_context(model, [len(x) for x in tokens])
    if unsupported(model) is None:
        cie = _cie_packed(model, tokens, targets, t)
    else:
        cie = _cie_hooked(model, tokens, targets, t, batch_size)
    log.info("CIE over %d prompts and %d heads", len(tokens), cie.numel())
    return cie


def _cie_hooked(model, tokens, targets, t, batch_size: int) -> Tensor:
    """CIE through the hooked model: one patched one-token run per (batch of prompts, head)."""
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    names = z_names(model)
    total = torch.zeros(n_layers, n_heads)
    for batch in last_token_batches(model, tokens, targets, batch_size):
        rows = torch.arange(len(batch.index), device=batch.targets.device)
        base = run_last_token(model, batch).float().softmax(-1)[rows, batch.targets]  # (batch,)
        for layer in range(n_layers):
            for head in range(n_heads):
                onehot = torch.zeros(n_heads, device=t.device, dtype=t.dtype)
                onehot[head] = 1
                hook = (names[layer], partial(gate_hook, t=t[layer], alpha=onehot, pos=0))
                p = run_last_token(model, batch, [hook]).float().softmax(-1)[rows, batch.targets]
                total[layer, head] += float((p - base).sum())
    return total / len(tokens)


def _cie_packed(model, tokens, targets, t, rows_per_call: int = 136) -> Tensor:
    """The same CIE from packed weights: per prompt, one prefix and one batched run over every head's patch."""
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    runner = LastToken.for_model(model)
    n = n_layers * n_heads
    gates = torch.cat([torch.zeros(1, n), torch.eye(n)]).view(1 + n, n_layers, n_heads)  # row 0: unpatched
    gates = gates.to(device=t.device, dtype=t.dtype)
    total = torch.zeros(n)
    for toks, y in zip(tokens, targets):
        prefix = runner.prefix(torch.tensor([toks[:-1]], device=t.device))
        p = torch.cat(
            [
                runner.logits(torch.full((len(g),), toks[-1], device=t.device), prefix, g, t).float().softmax(-1)[:, y]
                for g in gates.split(rows_per_call)
            ]
        )  # (1 + heads,)
        total += (p[1:] - p[0]).cpu()
    return (total / len(tokens)).view(n_layers, n_heads)


def alpha_cie_correlation(
    alpha: Float[Tensor, "layer head_index"], cie: Float[Tensor, "layer head_index"]
) -> dict[str, float]:
    """Pearson and Spearman correlation between SITE's alpha and FV's CIE over all heads."""
    from .overlap import pearson, spearman

    a, c = alpha.detach().float().flatten().cpu(), cie.detach().float().flatten().cpu()
    return {"pearson": pearson(a, c), "spearman": spearman(a, c), "n_heads": int(a.numel())}
