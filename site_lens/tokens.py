"""Tokenisation, padding and batching: what every stage needs before a forward pass.

    ids = encode(model, ["Q: hot\\nA:"])                   # the model's own BOS convention
    target = answer_ids(model, "Q: hot\\nA:", "cold")[0]    # the first token scored and trained on
    tokens, mask, last = pad_right(ids, pad_id(model))     # right-padded batch, last real index per row

Batches of long prompts are cut by ``fit_batches`` so that one forward pass's
attention scores stay within ``ATTN_CELLS``; batching never changes results
(rows are padded and masked).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Int
from torch import Tensor

from .tasks import answer_sep
from .types import Model


class PromptTooLongError(ValueError):
    """A prompt (plus generated tokens) does not fit the model's context."""


def encode(model: Model, texts: Sequence[str]) -> list[list[int]]:
    """Tokenise with the model's tokenizer and its own special-token convention."""
    if model.tokenizer is None:
        raise ValueError("this model has no tokenizer; pass token ids instead")
    out = [list(model.tokenizer(t)["input_ids"]) for t in texts]
    for t, ids in zip(texts, out):
        if not ids:
            raise ValueError(f"prompt {t!r} encodes to no tokens")
    return out


def answer_ids(model: Model, prompt: str, answer: str) -> list[int]:
    """Tokens of ' {answer}' (no space before a numeric answer) as they follow ``prompt`` (see tasks.py)."""
    text = answer_sep(answer) + answer
    p = encode(model, [prompt])[0]
    full = encode(model, [prompt + text])[0]
    if full[: len(p)] == p and len(full) > len(p):
        return full[len(p) :]
    # the space merged across the boundary: tokenise the answer on its own
    ids = model.tokenizer(text, add_special_tokens=False)["input_ids"]
    return list(ids)


def pad_right(
    seqs: Sequence[Sequence[int]], pad_id: int, device: str | torch.device = "cpu"
) -> tuple[Int[Tensor, "batch pos"], Int[Tensor, "batch pos"], Int[Tensor, " batch"]]:
    """Right-pad to one length: (tokens, attention_mask, index of each row's last real token)."""
    n = max(len(s) for s in seqs)
    tokens = torch.full((len(seqs), n), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), n), dtype=torch.long)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = torch.tensor(list(s), dtype=torch.long)
        mask[i, : len(s)] = 1
    last = torch.tensor([len(s) - 1 for s in seqs], dtype=torch.long)
    return tokens.to(device), mask.to(device), last.to(device)


# Attention scores one forward pass may hold (rows * heads * padded length^2): 2^27 cells,
# 0.5 GiB in float32. Batches of long prompts (10-shot prompts of long-input tasks run to
# thousands of tokens) are cut to fit it; short prompts keep their full batch.
ATTN_CELLS = 2**27

# Attention cells one differentiable pass may keep for backward, summed over layers
# (rows * heads * padded length^2 * layers): 1 GiB per float32 tensor kept. Only prompts of
# hundreds of tokens (zero-shot reading-comprehension tasks) have their training batches cut.
GRAD_CELLS = 2**28


def by_length(lengths: Iterable[int]) -> dict[int, list[int]]:
    """Indices grouped by their length (groups in order of first appearance): rows of one group share a forward."""
    out: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        out.setdefault(n, []).append(i)
    return out


def fit_batches(
    order: Sequence[int], lengths: Sequence[int], max_rows: int, n_heads: int, cells: int | None = None
) -> list[list[int]]:
    """Cut ``order`` into consecutive batches of at most ``max_rows`` rows whose padded attention fits ``cells``.

    ``cells`` defaults to ``ATTN_CELLS``; a prompt too long for it alone still forms a batch of one.
    """
    cells = ATTN_CELLS if cells is None else cells
    out: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in order:
        n = max(longest, lengths[i])
        if cur and (len(cur) >= max_rows or (len(cur) + 1) * n_heads * n * n > cells):
            out.append(cur)
            cur, n = [], lengths[i]
        cur.append(i)
        longest = n
    if cur:
        out.append(cur)
    return out


def tokenizer_pad_id(tok) -> int:
    """A tokenizer's pad id, else its EOS id, else 0."""
    for cand in (tok.pad_token_id, tok.eos_token_id, 0):
        if cand is not None:
            return int(cand)
    return 0


def pad_id(model: Model) -> int:
    """The model tokenizer's pad id, else its EOS id, else 0 (also with no tokenizer)."""
    return 0 if model.tokenizer is None else tokenizer_pad_id(model.tokenizer)


def check_context(model: Model, lengths: Sequence[int], extra: int = 0) -> None:
    """Raise PromptTooLongError if the longest prompt plus ``extra`` tokens exceeds the model's context."""
    longest = max(lengths)
    if longest + extra > model.cfg.n_ctx:
        raise PromptTooLongError(
            f"a prompt of {longest} tokens (+{extra} to generate) exceeds the model's context of {model.cfg.n_ctx} tokens; "
            "use fewer shots or shorter examples"
        )


_NEWLINE_IDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> ids


def tokenizer_newline_ids(tok) -> set[int]:
    """Every token id whose text contains a newline; computed once per tokenizer."""
    ids = _NEWLINE_IDS.get(tok)
    if ids is None:
        ids = {i for t, i in tok.get_vocab().items() if "\n" in tok.convert_tokens_to_string([t])}
        _NEWLINE_IDS[tok] = ids
    return set(ids)


def newline_ids(model: Model) -> set[int]:
    """Every token id of the model's tokenizer whose text contains a newline (none without a tokenizer)."""
    return set() if model.tokenizer is None else tokenizer_newline_ids(model.tokenizer)


def tokenizer_stop_ids(tok) -> set[int]:
    """Where generation stops: every token whose text holds a newline (an answer's end), and the pad / EOS token."""
    return tokenizer_newline_ids(tok) | {tokenizer_pad_id(tok)}


def generation_stop_ids(model: Model) -> set[int]:
    """``tokenizer_stop_ids`` of the model's tokenizer (the pad id alone without one)."""
    return newline_ids(model) | {pad_id(model)}


@dataclass
class Example:
    """A prompt as tokens, the id of its answer's first token, and (for the sequence objective) the answer and its end."""

    tokens: list[int]
    target: int
    continuation: tuple[int, ...] = ()  # objectives.answer_sequence: answer tokens, then the end-of-answer token
    scored_from: int = 0  # the first continuation token in the loss (objectives.option_token_examples)


def make_examples(model: Model, prompts: Sequence[tuple[str, str]]) -> list[Example]:
    """(prompt, answer) strings -> Examples (prompt tokens, first answer token)."""
    toks = encode(model, [p for p, _ in prompts])
    out = []
    for (p, a), ids in zip(prompts, toks):
        ans = answer_ids(model, p, a)
        if not ans:
            raise ValueError(f"answer {a!r} encodes to no tokens")
        out.append(Example(tokens=ids, target=ans[0]))
    return out
