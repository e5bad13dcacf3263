"""Attribution patching: every head's effect of writing t into it, from one gradient.

Writing the task embedding into head (layer l, head h) at the last token of a
zero-shot prompt replaces z[l, h] by t[l, h]. To first order (attribution
patching: Nanda 2023; AtP, Kramar et al. 2024) the change of a metric m of the
last-token logits (by default the log-probability of the answer's first token) is

    effect[l, h] ~ (t[l, h] - z[l, h]) . dm/dz[l, h]

SITE's gate computes exactly that product: with z <- lerp(z, t, alpha), the
derivative of m in alpha[l, h] at alpha = 0 is (t - z) . dm/dz. So a forward
pass with alpha = 0 (the plain model: one alpha per row, a leaf needing grad)
and one backward pass give every head's estimate for every prompt of a batch.

Cost: one forward and one backward pass per batch of prompts, whatever the
number of heads; measuring each head's effect (``exact_head_effects``, like
``analysis.cie``) costs one last-token run per head and prompt after each
prompt's prefix. The estimate is exact where m is linear in the head's z (a
one-layer attention-only model without a final norm, scored by the answer's
logit); otherwise its error falls as the square of |t - z|.

    scores = attribution_scores(model, zero_shot_examples(model, task), t)   # (layer, head)
    exact = exact_head_effects(model, zero_shot_examples(model, task), t)    # the same, measured
    stats.spearman(scores, exact)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from ..engine.backend import backend_for, last_logits
from ..gate import injection_hooks
from ..stages.training import frozen
from ..tasks import Task, zero_shot_prompts
from ..tokens import GRAD_CELLS, Example, check_context, fit_batches, make_examples, pad_id, pad_right
from ..types import Model

log = logging.getLogger(__name__)

# (last-token logits, answer first tokens) -> one value per row, differentiable in the logits
Metric = Callable[[Tensor, Tensor], Tensor]
Source = Float[Tensor, "layer head_index d_head"] | Float[Tensor, "prompt layer head_index d_head"]


def _wide(x: Tensor) -> Tensor:
    """x in float32, or in its own dtype where that is wider (float64 stays float64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def answer_logprob(logits: Float[Tensor, "batch d_vocab"], targets: Int[Tensor, " batch"]) -> Float[Tensor, " batch"]:
    """Log-probability of each row's target token (in float32 or wider)."""
    rows = torch.arange(logits.shape[0], device=logits.device)
    return _wide(logits).log_softmax(-1)[rows, targets]


def answer_logit(logits: Float[Tensor, "batch d_vocab"], targets: Int[Tensor, " batch"]) -> Float[Tensor, " batch"]:
    """Logit of each row's target token (in float32 or wider)."""
    rows = torch.arange(logits.shape[0], device=logits.device)
    return _wide(logits)[rows, targets]


def zero_shot_examples(model: Model, task: Task, split: str = "test", max_items: int | None = 50) -> list[Example]:
    """The first ``max_items`` items of ``split`` as zero-shot prompts and answer first tokens (None: all)."""
    pairs = task.split(split)[:max_items]
    if not pairs:
        raise ValueError(f"task '{task.name}' split '{split}' has no items")
    return make_examples(model, zero_shot_prompts(pairs))


def _examples(model: Model, prompts_or_examples: Sequence[Example] | Sequence[tuple[str, str]]) -> list[Example]:
    items = list(prompts_or_examples)
    if not items:
        raise ValueError("attribution needs at least one prompt")
    if all(isinstance(e, Example) for e in items):
        return items
    return make_examples(model, items)


def _check_source(model: Model, t: Tensor, n_prompts: int) -> None:
    c = model.cfg
    if tuple(t.shape[-3:]) != (c.n_layers, c.n_heads, c.d_head):
        raise ValueError(
            f"t must end in (layer, head, d_head) = {(c.n_layers, c.n_heads, c.d_head)}, got {tuple(t.shape)}"
        )
    if t.dim() == 4 and t.shape[0] != n_prompts:
        raise ValueError(f"a t per prompt needs {n_prompts} rows (one per prompt), got {t.shape[0]}")


def attribution_per_prompt(
    model: Model,
    prompts_or_examples: Sequence[Example] | Sequence[tuple[str, str]],
    t: Source,
    *,
    metric: Metric = answer_logprob,
    batch_size: int = 16,
) -> Float[Tensor, "prompt layer head_index"]:
    """Each prompt's first-order effect on ``metric`` of writing t into each head, one at a time.

    ``prompts_or_examples``: zero-shot (prompt, answer) strings or ``tokens.Example``s. ``t`` is
    one for every prompt or one per prompt. One forward and one backward pass per batch of up to
    ``batch_size`` right-padded prompts (fewer where long prompts would exceed ``GRAD_CELLS``).
    On CPU, in float32 (float64 for a float64 model).
    """
    examples = _examples(model, prompts_or_examples)
    _check_source(model, t, len(examples))
    c = model.cfg
    lengths = [len(e.tokens) for e in examples]
    check_context(model, lengths)
    t = t.to(device=c.device, dtype=c.dtype)
    out = torch.empty(len(examples), c.n_layers, c.n_heads, dtype=torch.promote_types(c.dtype, torch.float32))
    order = sorted(range(len(examples)), key=lengths.__getitem__)  # less padding
    with frozen(model), torch.enable_grad():
        for idx in fit_batches(order, lengths, batch_size, c.n_heads, GRAD_CELLS // c.n_layers):
            tokens, mask, last = pad_right([examples[i].tokens for i in idx], pad_id(model), c.device)
            rows_t = t[torch.tensor(idx, device=t.device)] if t.dim() == 4 else t
            alpha = torch.zeros(len(idx), c.n_layers, c.n_heads, device=c.device, dtype=c.dtype, requires_grad=True)
            hooks = injection_hooks(model, rows_t, alpha, last)  # alpha = 0: the plain forward pass
            logits = last_logits(model, tokens, last, hooks=hooks, attention_mask=mask)  # (batch, d_vocab)
            targets = torch.tensor([examples[i].target for i in idx], device=logits.device)
            (grad,) = torch.autograd.grad(metric(logits, targets).sum(), alpha)  # (batch, layer, head)
            out[idx] = grad.detach().to(out.dtype).cpu()
    log.info("attribution over %d prompts and %d heads", len(examples), c.n_layers * c.n_heads)
    return out


def attribution_scores(
    model: Model,
    prompts_or_examples: Sequence[Example] | Sequence[tuple[str, str]],
    t: Source,
    *,
    metric: Metric = answer_logprob,
    batch_size: int = 16,
) -> Float[Tensor, "layer head_index"]:
    """Mean over prompts of ``attribution_per_prompt``: every head's estimated effect of patching t into it.

    Example:
        A tiny random model with a byte-level tokenizer stands in for a real one: its answers are
        noise, but the calls and what they return are those of a real run.

        >>> import site_lens as sl
        >>> model = sl.tiny_model("bytes")  # a byte-level tokenizer, built offline; or sl.load_model("smollm2-135m")
        >>> cfg = sl.SiteConfig(embedding=sl.EmbeddingConfig(n_prompts=2, n_shots=2),   # a few seconds' budget
        ...                     selection=sl.SelectionConfig(steps=2, eval_every=2, max_valid=2),
        ...                     eval=sl.EvalConfig(max_new_tokens=3, max_test=2))
        >>> task = sl.load_task("uppercase")
        >>> fit = sl.fit_site(model, task, cfg)
        >>> prompts = [(sl.format_query(x), y) for x, y in task.valid[:4]]   # zero-shot prompts and answers
        >>> scores = attribution_scores(model, prompts, fit.adapter.t)
        >>> scores.shape                                  # one estimated effect per (layer, head)
        torch.Size([2, 4])
    """
    return attribution_per_prompt(model, prompts_or_examples, t, metric=metric, batch_size=batch_size).mean(0)


@torch.inference_mode()
def exact_head_effects(
    model: Model,
    prompts_or_examples: Sequence[Example] | Sequence[tuple[str, str]],
    t: Source,
    *,
    metric: Metric = answer_logprob,
    rows_per_call: int = 136,
) -> Float[Tensor, "layer head_index"]:
    """Mean over prompts of metric(t written into one head, alpha = 1) - metric(plain), for every head.

    Each prompt's prefix runs once on the model's backend (``backend.backend_for``); every head's
    patched last token then runs against it, ``rows_per_call`` heads per call (memory, not results).
    On CPU, in float32 (float64 for a float64 model).
    """
    examples = _examples(model, prompts_or_examples)
    _check_source(model, t, len(examples))
    if any(len(e.tokens) < 2 for e in examples):
        raise ValueError("every prompt needs at least two tokens (a prefix and a last token)")
    check_context(model, [len(e.tokens) for e in examples])
    c = model.cfg
    t = t.to(device=c.device, dtype=c.dtype)
    backend = backend_for(model)
    n = c.n_layers * c.n_heads
    gates = torch.cat([torch.zeros(1, n), torch.eye(n)]).view(1 + n, c.n_layers, c.n_heads)  # row 0: plain
    gates = gates.to(device=c.device, dtype=c.dtype)
    total = torch.zeros(n, dtype=torch.float64)
    for i, ex in enumerate(examples):
        prefix = backend.prefix(torch.tensor([ex.tokens[:-1]], device=c.device))  # one row, shared by every gate
        src = t[i] if t.dim() == 4 else t
        values = []
        for g in gates.split(rows_per_call):
            last = torch.full((len(g),), ex.tokens[-1], device=c.device)
            logits = backend.logits(last, prefix, g, src)  # (rows, d_vocab)
            values.append(metric(logits, torch.full_like(last, ex.target)))
        v = torch.cat(values).double().cpu()  # (1 + heads,)
        total += v[1:] - v[0]
    log.info("exact single-head effects over %d prompts and %d heads (%s backend)", len(examples), n, backend.name)
    wide = torch.promote_types(c.dtype, torch.float32)
    return (total / len(examples)).to(wide).view(c.n_layers, c.n_heads)
