"""The package's implementation of each exercise of notebook 03, with the exercise's signature.

Each function calls the stage it stands for (``build_task_embedding``, ``gate_hook``,
``first_token_loss``, ``train_loop``, ``generate_greedy``, ``site_reference``); the checks in
``teaching`` compare a learner's function with it, and ``fallback`` hands it out in place of
one whose check did not pass. The stages are imported when a function runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

log = logging.getLogger(__name__)


def attn_out_from_z(z: Tensor, W_O: Tensor, b_O: Tensor) -> Tensor:
    """The attention layer's output: each head's z through its slice of W_O, summed over heads, plus b_O."""
    return torch.einsum("bphd,hdm->bpm", z, W_O) + b_O


def mean_hook_z(model, prompts: Sequence[Sequence[int]]) -> Tensor:
    """``embeddings.build_task_embedding`` on token-id prompts."""
    from ..stages.embeddings import build_task_embedding

    return build_task_embedding(model, prompts)


def gate_hook(z: Tensor, hook, t_layer: Tensor, alpha_layer: Tensor) -> Tensor:
    """``gate.gate_hook`` at the last position."""
    from ..gate import gate_hook

    return gate_hook(z, hook, t=t_layer, alpha=alpha_layer, pos=-1)


def site_loss(model, theta: Tensor, t: Tensor, tokens: Tensor, target: int) -> Tensor:
    """``training.first_token_loss`` of one prompt with t injected by alpha = sigmoid(theta) (differentiable in theta)."""
    from ..gate import injection_hooks
    from ..stages.training import first_token_loss
    from ..tokens import Example

    example = Example([int(i) for i in tokens[0]], int(target))
    alpha = torch.sigmoid(theta)
    return first_token_loss(model, [example], prefill=lambda last: injection_hooks(model, t, alpha, last), batch_size=1)


def train_theta(model, t: Tensor, examples: Sequence, plan: Sequence[Sequence[int]], lr: float = 0.2):
    """``training.train_loop`` on an ``AlphaGate`` with the fast (cached-prefix) loss, following ``plan``."""
    from ..engine.prompt_cache import PromptCache
    from ..gate import AlphaGate
    from ..stages.training import frozen, train_loop

    gate = AlphaGate(model.cfg.n_layers, model.cfg.n_heads)
    t = t.to(device=model.cfg.device, dtype=model.cfg.dtype)
    with frozen(model):
        cache = PromptCache(model, list(examples))
        hist = train_loop(
            [gate.theta], plan, lambda b: cache.loss(b, gate.alpha(), t), None, lr=lr, eval_every=0, keep_best=False
        )
    return gate.theta.detach(), hist.loss


def generate_with_injection(model, tokens: Sequence[int], t: Tensor, alpha: Tensor, max_new_tokens: int) -> list[int]:
    """``generation.generate_greedy`` with the injection hooks at prefill, never stopping early."""
    from ..gate import injection_hooks
    from ..stages.generation import generate_greedy

    out, _ = generate_greedy(
        model,
        [list(tokens)],
        max_new_tokens=max_new_tokens,
        prefill_hooks=lambda last: injection_hooks(model, t, alpha, last),
        stop_ids=set(),
    )
    return out[0]


def patch_heads(model, prompts: Sequence[Sequence[int]], targets: Sequence[int], t: Tensor, alpha: Tensor):
    """``patching.site_reference``: (accuracy, mean P(answer's first token)) with t mixed in by alpha."""
    from ..analysis.patching import PatchData, site_reference

    data = PatchData([list(p) for p in prompts], torch.tensor([int(y) for y in targets]))
    return site_reference(model, data, t, alpha)


REFERENCES: dict[str, Callable] = {  # in the notebook's order
    f.__name__: f
    for f in (attn_out_from_z, mean_hook_z, gate_hook, site_loss, train_theta, generate_with_injection, patch_heads)
}
EXERCISES = tuple(REFERENCES)  # each has check_<name> in ``teaching`` and a function <name> in the solutions


def reference(name: str) -> Callable:
    """The package's implementation of exercise ``name``, with the exercise's signature."""
    if name not in REFERENCES:
        raise KeyError(f"no exercise '{name}'; the exercises are {', '.join(EXERCISES)}")
    return REFERENCES[name]


def fallback(fn: Callable, passed: bool) -> Callable:
    """``fn`` if its check passed, else the reference of the same name (so later cells still run)."""
    if passed:
        return fn
    log.info("using the reference implementation of %s", fn.__name__)
    return reference(fn.__name__)
