"""Causal indirect effect (CIE) of each head, as in Function Vectors (Todd et al., 2024).

On *shuffled-label* N-shot prompts (the demonstrations' outputs permuted among
themselves, so the prompt no longer says what the task is), replace one head's
``hook_z`` at the last token by its task-conditioned mean ``t[layer, head]``
(the task embedding: mean over clean N-shot prompts, ``embeddings.build_task_embedding``)
and measure how much the probability of the correct answer's first token rises:

    CIE(l, h) = mean over prompts of  P(y | z[l, h] <- t[l, h]) - P(y | corrupted)

Only the last token changes, so each prompt's earlier keys and values are
computed once and every head's patched run is a one-token forward pass against
them: all heads of a prompt in batched runs on the model's backend (SITE's gate
with a one-hot alpha per row; ``backend.backend_for``).

    cie = causal_indirect_effect(model, task, adapter.t)       # (layer, head)
    stats = alpha_cie_correlation(adapter.alpha, cie)           # pearson, spearman
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from ..engine.backend import backend_for
from ..progress import Progress
from ..stats import pearson, spearman
from ..tasks import Pair, Task, build_prompt, check_enough
from ..tokens import answer_ids, check_context, encode
from ..types import Model

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
    model: Model,
    task_or_prompts: Task | Sequence[tuple[str, str]],
    t: Float[Tensor, "layer head_index d_head"],
    *,
    n_prompts: int = 25,
    n_shots: int = 10,
    seed: int = 0,
    rows_per_call: int = 136,
) -> Float[Tensor, "layer head_index"]:
    """Average causal indirect effect of every head (FV, Todd et al. 2024, eq. 3-4).

    Args:
        model: the frozen model (HookedTransformer or TransformerBridge).
        task_or_prompts: a ``Task`` (``n_prompts`` shuffled-label ``n_shots``-shot
            prompts are built from it, queries from its valid split; see
            ``shuffled_label_prompts``) or ready (prompt, answer) string pairs,
            already corrupted as you wish.
        t: mean ``hook_z`` at the last token of clean prompts, (layer, head, d_head);
            e.g. ``adapter.t`` or ``build_task_embedding(...)``.
        seed: seeds the prompt sampling and label shuffling.
        rows_per_call: patched heads per one-token run (memory, not results).

    Returns:
        CIE[layer, head] = mean over prompts of P(answer's first token | head
        patched to t) - P(answer's first token | corrupted prompt), on CPU, float32.
    """
    tokens, targets = _prompts_and_targets(model, task_or_prompts, n_prompts, n_shots, seed)
    t = t.to(device=model.cfg.device, dtype=model.cfg.dtype)
    if any(len(x) < 2 for x in tokens):
        raise ValueError("every prompt needs at least two tokens (a prefix and a last token)")
    check_context(model, [len(x) for x in tokens])
    backend = backend_for(model)
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    n = n_layers * n_heads
    gates = torch.cat([torch.zeros(1, n), torch.eye(n)]).view(1 + n, n_layers, n_heads)  # row 0: unpatched
    gates = gates.to(device=t.device, dtype=t.dtype)
    total = torch.zeros(n)
    with Progress(len(tokens), "CIE", unit="prompt", every=0) as progress:  # a bar on the terminal, no lines
        for i, (toks, y) in enumerate(zip(tokens, targets)):
            prefix = backend.prefix(torch.tensor([toks[:-1]], device=t.device))  # one row, shared by every gate
            p = torch.cat(
                [
                    backend.logits(torch.full((len(g),), toks[-1], device=t.device), prefix, g, t).float().softmax(-1)[:, y]
                    for g in gates.split(rows_per_call)
                ]
            )  # (1 + heads,)
            total += (p[1:] - p[0]).cpu()
            progress.done(f"prompt {i + 1}")
    log.info("CIE over %d prompts and %d heads (%s backend)", len(tokens), n, backend.name)
    return (total / len(tokens)).view(n_layers, n_heads)


def alpha_cie_correlation(
    alpha: Float[Tensor, "layer head_index"], cie: Float[Tensor, "layer head_index"]
) -> dict[str, float]:
    """Pearson and Spearman correlation between SITE's alpha and FV's CIE over all heads."""
    a, c = alpha.detach().float().flatten().cpu(), cie.detach().float().flatten().cpu()
    return {"pearson": pearson(a, c), "spearman": spearman(a, c), "n_heads": int(a.numel())}
