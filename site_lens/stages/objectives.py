"""The answer-sequence objective: every answer token and the end of the answer, teacher-forced.

SITE's default loss is the cross-entropy of the answer's first token. The sequence
objective (``SelectionConfig.objective = "sequence"``) scores the whole answer and the
token that ends it: for the prompt ``Q: x\\nA:`` and answer ``y``, the targets are the
tokens of ``' y'`` followed by the end of the answer, all as they are tokenised in
context in a demonstration (``Q: x\\nA: y\\n\\n``): the targets run up to and including
the first token whose text holds a newline. That token is one of generation's stop
tokens (``tokens.generation_stop_ids``: every token with a newline), so a model trained
on it learns to stop where generation stops. Which token that is depends on the
tokenizer (``"\\n\\n"`` after words and digits alike on both embedded models, ``"\\n"``
on a character-level one); any newline token ends the answer.

The injection stays where SITE puts it at inference: once, at the last prompt token;
the answer positions after it see the injection only through attention. Each
example's loss is the mean over its targets; the batch loss is the mean over examples.

    examples = sequence_examples(model, [("Q: hot\\nA:", "cold")])   # Example.continuation: targets
    loss = sequence_loss(model, examples, prefill=lambda last: hooks(last))   # whole prompts
    cache = SequenceCache(model, examples); cache.loss([0], alpha, t)          # cached prefixes

The option-token objective (``objective = "option_token"``), for multiple-choice tasks whose
options share their first tokens (every lettered answer ``(A)`` starts with `` (``), scores one
token: the first where the item's options differ (the letter). The shared tokens before it
are teacher-forced, unscored; items without options fall back to their first answer token.

    examples = objective_examples(model, task, "train", "option_token")
    train, valid = train_valid_examples(model, task, "first_token")   # both splits: every trained method's examples

The cached path computes each prompt's prefix (all tokens but the last) once, then
runs the last prompt token and the answer tokens against it each step, on the model's
backend (``span_logits``: packed weights where the model allows, the hooked model
otherwise); prompts with prefixes of one length run as one batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from ..config import OBJECTIVES
from ..engine.backend import Backend, logits_at
from ..engine.prompt_cache import PromptCache
from ..gate import HookFactory, Hooks
from ..tasks import Task, answer_sep, zero_shot_prompts
from ..tokens import GRAD_CELLS, Example, encode, fit_batches, make_examples, newline_ids, pad_id, pad_right
from ..types import Model

DEMO_END = "\n\n"  # what follows an answer in a demonstration (tasks.format_demo)


def answer_sequence(model: Model, prompt: str, answer: str) -> list[int]:
    """The answer's tokens and the token that ends it, as they follow ``prompt`` in a demonstration."""
    p = encode(model, [prompt])[0]
    full = encode(model, [prompt + answer_sep(answer) + answer + DEMO_END])[0]
    if full[: len(p)] != p or len(full) <= len(p):
        raise ValueError(f"prompt {prompt!r} is not a token prefix of its demonstration; cannot align the answer")
    rest = full[len(p) :]
    ends = newline_ids(model)
    cut = next((i for i, tok in enumerate(rest) if tok in ends), None)
    if cut is None or cut == 0:
        raise ValueError(f"answer {answer!r}: no answer token before a newline token in context")
    return rest[: cut + 1]


def sequence_examples(model: Model, prompts: Sequence[tuple[str, str]]) -> list[Example]:
    """(prompt, answer) strings -> Examples whose ``continuation`` holds the answer and its end."""
    out = []
    for (p, a), ids in zip(prompts, encode(model, [p for p, _ in prompts])):
        seq = answer_sequence(model, p, a)
        out.append(Example(tokens=ids, target=seq[0], continuation=tuple(seq)))
    return out


def option_token_sequence(model: Model, prompt: str, answer: str, options: Sequence[str]) -> list[int]:
    """The answer's tokens in context up to and including the first one where the options' tokens differ."""
    seqs = [answer_sequence(model, prompt, o) for o in options if o != answer]
    gold = answer_sequence(model, prompt, answer)
    for i, tok in enumerate(gold):
        if any(len(s) <= i or s[i] != tok for s in seqs):
            return gold[: i + 1]
    raise ValueError(f"answer {answer!r}: its tokens in context equal another option's")


def option_token_examples(
    model: Model, prompts: Sequence[tuple[str, str]], options: Sequence[Sequence[str]]
) -> list[Example]:
    """Examples scored on the first token where each item's options differ (``scored_from`` marks it)."""
    out = []
    for (p, a), opts, ids in zip(prompts, options, encode(model, [p for p, _ in prompts])):
        seq = option_token_sequence(model, p, a, opts) if opts else answer_sequence(model, p, a)[:1]
        out.append(Example(tokens=ids, target=seq[0], continuation=tuple(seq), scored_from=len(seq) - 1))
    return out


def objective_examples(model: Model, task: Task, split: str, objective: str) -> list[Example]:
    """A split's zero-shot prompts as the Examples ``objective`` trains on."""
    prompts = zero_shot_prompts(task.split(split))
    if objective == "sequence":
        return sequence_examples(model, prompts)
    if objective == "option_token":
        choices = task.split_choices(split)
        return option_token_examples(model, prompts, [c.options for c in choices] if choices else [()] * len(prompts))
    if objective == "first_token":
        return make_examples(model, prompts)
    raise ValueError(f"unknown objective {objective!r}; valid: {', '.join(OBJECTIVES)}")


def train_valid_examples(
    model: Model, task: Task, objective: str = "first_token"
) -> tuple[list[Example], list[Example]]:
    """The train and valid splits' ``objective_examples``: what every trained method fits and selects on."""
    return objective_examples(model, task, "train", objective), objective_examples(model, task, "valid", objective)


def _check(examples: Sequence[Example]) -> None:
    if any(not e.continuation for e in examples):
        raise ValueError("the sequence objective needs Examples with a continuation (sequence_examples)")


def _mean_ce(logits: Tensor, targets: Tensor, lengths: Sequence[int], starts: Sequence[int]) -> Tensor:
    """Sum over rows of each row's mean CE over its targets ``starts[row]`` to ``lengths[row] - 1``."""
    ce = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none").view(targets.shape)
    pos = torch.arange(targets.shape[1], device=ce.device)[None]
    keep = (pos < torch.tensor(lengths, device=ce.device)[:, None]) & (pos >= torch.tensor(starts, device=ce.device)[:, None])
    return ((ce * keep).sum(1) / keep.sum(1)).sum()


def sequence_loss(
    model: Model,
    examples: Sequence[Example],
    prefill: HookFactory | None = None,
    backward: bool = False,
    hooks: Hooks = (),
    batch_size: int = 32,
) -> Tensor:
    """Mean over examples of the teacher-forced CE of each continuation, whole prompts through the hooked model.

    ``prefill(last)`` gives the hooks for each row's last prompt index (SITE's injection); ``hooks``
    act at every position (I2CL, LoRA). Rows run in right-padded chunks of up to ``batch_size``
    cut to the attention budget, as in ``training.first_token_loss``; with ``backward`` each
    chunk's share is back-propagated at once (gradient accumulation) and the mean comes back
    detached.
    """
    _check(examples)
    cells = GRAD_CELLS // model.cfg.n_layers if torch.is_grad_enabled() else None
    seqs = [[*e.tokens, *e.continuation[:-1]] for e in examples]  # the prompt, then the answer teacher-forced
    device = model.cfg.device
    total = torch.zeros((), device=device)
    for idx in fit_batches(range(len(examples)), [len(q) for q in seqs], batch_size, model.cfg.n_heads, cells):
        chunk = [examples[i] for i in idx]
        tokens, mask, _ = pad_right([seqs[i] for i in idx], pad_id(model), device)
        last = torch.tensor([len(e.tokens) - 1 for e in chunk], device=device)
        at_last = prefill(last) if prefill else []
        width = max(len(e.continuation) for e in chunk)
        pos = (last[:, None] + torch.arange(width, device=device)[None]).clamp(max=tokens.shape[1] - 1)  # (rows, width)
        scored = logits_at(model, tokens, pos, hooks=[*hooks, *at_last], attention_mask=mask)  # (rows, width, d_vocab)
        target, _, _ = pad_right([list(e.continuation) for e in chunk], pad_id(model), device)
        part = _mean_ce(scored, target, [len(e.continuation) for e in chunk], [e.scored_from for e in chunk])
        if backward:
            (part / len(examples)).backward()
            part = part.detach()
        total = total + part
    return total / len(examples)


class SequenceCache(PromptCache):
    """Each prompt's prefix computed once; ``loss`` runs its last token and answer tokens against it.

    The prefixes are ``prompt_cache.PromptCache``'s (grouped by length, one forward per group), on
    ``backend`` (``backend_for(model)`` by default: the packed engine where the model allows,
    so hooks attached to the model later do not fire; pass ``HookedBackend(model)`` for them); ``loss`` runs each group's rows together (their chunks right-padded;
    causal attention keeps the padding out of every real position), so validating over many
    prompts costs a few batched forwards instead of one per prompt.
    """

    def __init__(
        self, model: Model, examples: Sequence[Example], batch_size: int = 16, backend: Backend | None = None
    ):
        _check(examples)
        super().__init__(model, examples, batch_size, backend=backend)
        self.batch_size = batch_size

    def loss(
        self,
        indices: Sequence[int],
        alpha: Float[Tensor, "layer head_index"] | None = None,
        t: Float[Tensor, "layer head_index d_head"] | None = None,
    ) -> Tensor:
        """Mean over ``indices`` of the teacher-forced CE, the gate applied at the last prompt token.

        One gate for every prompt: ``alpha`` (layer, head), ``t`` (layer, head, d_head).
        """
        if (alpha is not None and alpha.dim() != 2) or (t is not None and t.dim() != 3):
            raise ValueError("SequenceCache.loss takes one gate for all prompts: alpha (layer, head), t (layer, head, d_head)")
        model, device = self.model, self.model.cfg.device
        total = torch.zeros((), device=device)
        for length, group in self.groups(indices).items():
            for part in [group[k : k + self.batch_size] for k in range(0, len(group), self.batch_size)]:
                exs = [self.examples[i] for i in part]
                chunks = [[e.tokens[-1], *e.continuation[:-1]] for e in exs]  # the last prompt token, then the answer
                chunk, _, _ = pad_right(chunks, pad_id(model), device)  # (rows, 1 + longest answer - 1)
                target, _, _ = pad_right([list(e.continuation) for e in exs], pad_id(model), device)
                rows = torch.tensor([self.where[i][1] for i in part], device=device)
                logits = self.backend.span_logits(chunk, self.prefixes[length].select(rows), alpha, t)
                lens, starts = [len(e.continuation) for e in exs], [e.scored_from for e in exs]
                total = total + _mean_ce(logits, target, lens, starts).to(device)
        return total / len(indices)
