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

The cached path computes each prompt's prefix (all tokens but the last) once, then
runs the last prompt token and the answer tokens against it each step, on the hooked
model (the packed engine runs one token at a time and is not used here).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor
from transformer_lens import HookedTransformer

from .backend import HookedBackend, Prefix
from .config import OBJECTIVES
from .gate import HookFactory, Hooks, injection_hooks
from .tasks import Task, answer_sep, zero_shot_prompts
from .tokens import Example, encode, make_examples, newline_ids, pad_id, pad_right

DEMO_END = "\n\n"  # what follows an answer in a demonstration (tasks.format_demo)


def answer_sequence(model: HookedTransformer, prompt: str, answer: str) -> list[int]:
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


def sequence_examples(model: HookedTransformer, prompts: Sequence[tuple[str, str]]) -> list[Example]:
    """(prompt, answer) strings -> Examples whose ``continuation`` holds the answer and its end."""
    out = []
    for (p, a), ids in zip(prompts, encode(model, [p for p, _ in prompts])):
        seq = answer_sequence(model, p, a)
        out.append(Example(tokens=ids, target=seq[0], continuation=tuple(seq)))
    return out


def option_token_sequence(model: HookedTransformer, prompt: str, answer: str, options: Sequence[str]) -> list[int]:
    """The answer's tokens in context up to and including the first one where the options' tokens differ."""
    seqs = [answer_sequence(model, prompt, o) for o in options if o != answer]
    gold = answer_sequence(model, prompt, answer)
    for i, tok in enumerate(gold):
        if any(len(s) <= i or s[i] != tok for s in seqs):
            return gold[: i + 1]
    raise ValueError(f"answer {answer!r}: its tokens in context equal another option's")


def option_token_examples(
    model: HookedTransformer, prompts: Sequence[tuple[str, str]], options: Sequence[Sequence[str]]
) -> list[Example]:
    """Examples scored on the first token where each item's options differ (``scored_from`` marks it)."""
    out = []
    for (p, a), opts, ids in zip(prompts, options, encode(model, [p for p, _ in prompts])):
        seq = option_token_sequence(model, p, a, opts) if opts else answer_sequence(model, p, a)[:1]
        out.append(Example(tokens=ids, target=seq[0], continuation=tuple(seq), scored_from=len(seq) - 1))
    return out


def objective_examples(model: HookedTransformer, task: Task, split: str, objective: str) -> list[Example]:
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
    model: HookedTransformer,
    examples: Sequence[Example],
    prefill: HookFactory | None = None,
    backward: bool = False,
    hooks: Hooks = (),
) -> Tensor:
    """Mean over examples of the teacher-forced CE of each continuation, whole prompts through the hooked model.

    ``prefill(last)`` gives the hooks for each row's last prompt index (SITE's injection); ``hooks``
    act at every position (I2CL, LoRA). One row at a time; with ``backward`` each row's share is
    back-propagated at once (gradient accumulation) and the mean comes back detached.
    """
    _check(examples)
    total = torch.zeros((), device=model.cfg.device)
    for e in examples:
        seq = [*e.tokens, *e.continuation[:-1]]
        tokens, mask, _ = pad_right([seq], pad_id(model), model.cfg.device)
        last = torch.tensor([len(e.tokens) - 1], device=model.cfg.device)
        at_last = prefill(last) if prefill else []
        logits = model.run_with_hooks(tokens, attention_mask=mask, fwd_hooks=[*hooks, *at_last])  # (1, pos, d_vocab)
        n = len(e.continuation)
        target = torch.tensor([e.continuation], device=logits.device)
        part = _mean_ce(logits[:, len(e.tokens) - 1 :], target, [n], [e.scored_from])
        if backward:
            (part / len(examples)).backward()
            part = part.detach()
        total = total + part
    return total / len(examples)


class SequenceCache:
    """Each prompt's prefix computed once; ``loss`` runs its last token and answer tokens against it."""

    def __init__(self, model: HookedTransformer, examples: Sequence[Example]):
        _check(examples)
        if any(len(e.tokens) < 2 for e in examples):
            raise ValueError("every prompt needs at least two tokens (a prefix and a last token)")
        self.model, self.examples = model, list(examples)
        self.backend = HookedBackend(model)
        device = model.cfg.device
        self.prefixes: list[Prefix] = [
            self.backend.prefix(torch.tensor([e.tokens[:-1]], device=device)) for e in examples
        ]

    def __len__(self) -> int:
        return len(self.examples)

    def loss(
        self,
        indices: Sequence[int],
        alpha: Float[Tensor, "layer head_index"] | None = None,
        t: Float[Tensor, "layer head_index d_head"] | None = None,
    ) -> Tensor:
        """Mean over ``indices`` of the teacher-forced CE, the gate applied at the last prompt token."""
        model, device = self.model, self.model.cfg.device
        total = torch.zeros((), device=device)
        for i in indices:
            e = self.examples[i]
            chunk = torch.tensor([[e.tokens[-1], *e.continuation[:-1]]], device=device)  # (1, 1 + answer)
            hooks = injection_hooks(model, t, alpha, 0) if alpha is not None and t is not None else []
            cache = self.backend.frozen_cache(self.prefixes[i], 1)
            logits = model.run_with_hooks(
                chunk, attention_mask=torch.ones_like(chunk), past_kv_cache=cache, fwd_hooks=hooks
            )
            target = torch.tensor([e.continuation], device=logits.device)
            total = total + _mean_ce(logits, target, [len(e.continuation)], [e.scored_from]).to(device)
        return total / len(indices)
