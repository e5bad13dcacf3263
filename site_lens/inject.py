"""Stage 3: injection hooks on hook_z, and greedy generation with the KV cache.

The one intervention SITE makes is, at one position p of each row,

    z[b, p_b, h] <- (1 - alpha[l, h]) * z[b, p_b, h] + alpha[l, h] * t[l, h]

on ``blocks.{l}.attn.hook_z`` for every layer l. ``gate_hook`` is that
function; everything else here runs the model with it attached for one call.
Generation injects only during the prefill pass (at the last prompt token);
the generated tokens reuse the cached keys and values and are never injected.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer
from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache
from transformer_lens.hook_points import HookPoint
from transformer_lens.utilities import get_act_name

from .tasks import answer_sep

Hooks = list[tuple[str, Callable]]


class PromptTooLongError(ValueError):
    """A prompt (plus generated tokens) does not fit the model's context."""


def z_names(model: HookedTransformer) -> list[str]:
    """The exact hook names of every layer's per-head attention output."""
    return [get_act_name("z", layer) for layer in range(model.cfg.n_layers)]


# ---------------------------------------------------------------- tokens


def encode(model: HookedTransformer, texts: Sequence[str]) -> list[list[int]]:
    """Tokenise with the model's tokenizer and its own special-token convention."""
    if model.tokenizer is None:
        raise ValueError("this model has no tokenizer; pass token ids instead")
    out = [list(model.tokenizer(t)["input_ids"]) for t in texts]
    for t, ids in zip(texts, out):
        if not ids:
            raise ValueError(f"prompt {t!r} encodes to no tokens")
    return out


def answer_ids(model: HookedTransformer, prompt: str, answer: str) -> list[int]:
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


# Attention scores one forward pass may hold (rows * heads * padded length^2); ~0.5 GiB
# in float32. Batches of long prompts are cut to fit it (10-shot squad_val, ~3,000
# tokens, took 18 GiB at 64 rows and was killed); short prompts keep their full batch.
# Batching never changes results (rows are padded and masked).
ATTN_CELLS = 2**27


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


def pad_id(model: HookedTransformer) -> int:
    tok = model.tokenizer
    if tok is None:
        return 0
    for cand in (tok.pad_token_id, tok.eos_token_id, 0):
        if cand is not None:
            return int(cand)
    return 0


def check_context(model: HookedTransformer, lengths: Sequence[int], extra: int = 0) -> None:
    longest = max(lengths)
    if longest + extra > model.cfg.n_ctx:
        raise PromptTooLongError(
            f"a prompt of {longest} tokens (+{extra} to generate) exceeds the model's context of {model.cfg.n_ctx} tokens; "
            "use fewer shots or shorter examples"
        )


# ---------------------------------------------------------------- hooks


def gate_hook(
    z: Float[Tensor, "batch pos head_index d_head"],
    hook: HookPoint,
    t: Float[Tensor, "head_index d_head"],
    alpha: Float[Tensor, " head_index"],
    pos: Int[Tensor, " batch"] | int,
) -> Float[Tensor, "batch pos head_index d_head"]:
    """z <- (1 - alpha) z + alpha t at position ``pos`` of each row (an int, or one per row)."""
    rows = torch.arange(z.shape[0], device=z.device)
    if isinstance(pos, int):
        pos = torch.full_like(rows, pos % z.shape[1])
    old = z[rows, pos]  # (batch, head, d_head)
    a = alpha.to(z.dtype)[:, None]  # (head, 1)
    new = (1 - a) * old + a * t.to(z.dtype)
    return z.index_put((rows, pos), new)


def injection_hooks(
    model: HookedTransformer,
    t: Float[Tensor, "layer head_index d_head"],
    alpha: Float[Tensor, "layer head_index"],
    pos: Int[Tensor, " batch"] | int = -1,
) -> Hooks:
    """One ``gate_hook`` per layer, bound to that layer's t and alpha."""
    return [
        (name, partial(gate_hook, t=t[layer], alpha=alpha[layer], pos=pos)) for layer, name in enumerate(z_names(model))
    ]


# ---------------------------------------------------------------- forward helpers


def last_logits(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    last: Int[Tensor, " batch"],
    *,
    hooks: Hooks = (),
    attention_mask: Int[Tensor, "batch pos"] | None = None,
    past_kv_cache: TransformerLensKeyValueCache | None = None,
) -> Float[Tensor, "batch d_vocab"]:
    """Logits at one position per row, without unembedding every position."""
    with model.hooks(fwd_hooks=list(hooks)):
        resid = model(
            tokens, stop_at_layer=model.cfg.n_layers, attention_mask=attention_mask, past_kv_cache=past_kv_cache
        )  # (batch, pos, d_model)
        rows = torch.arange(tokens.shape[0], device=resid.device)
        r = resid[rows, last][:, None]  # (batch, 1, d_model)
        if model.cfg.normalization_type is not None:
            r = model.ln_final(r)
        logits = model.unembed(r)[:, 0]  # (batch, d_vocab)
    cap = getattr(model.cfg, "output_logits_soft_cap", -1.0) or -1.0
    if cap > 0:
        logits = cap * torch.tanh(logits / cap)
    return logits


# ---------------------------------------------------------------- generation

HookFactory = Callable[[Tensor], Hooks]  # last-token index per row -> hooks for the prefill


def _newline_ids(model: HookedTransformer) -> set[int]:
    cached = getattr(model, "_site_lens_newline_ids", None)
    if cached is not None:
        return cached
    tok = model.tokenizer
    ids: set[int] = set()
    if tok is not None:
        ids = {i for t, i in tok.get_vocab().items() if "\n" in tok.convert_tokens_to_string([t])}
    model._site_lens_newline_ids = ids  # type: ignore[attr-defined]
    return ids


@torch.inference_mode()
def generate_greedy(
    model: HookedTransformer,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int = 20,
    prefill_hooks: HookFactory | None = None,
    stop_ids: set[int] | None = None,
    batch_size: int = 16,
    use_cache: bool = True,
    packed: bool = True,
) -> tuple[list[list[int]], Float[Tensor, "batch d_vocab"]]:
    """Greedy continuation of token prompts; returns (new tokens per prompt, first-step logits).

    ``prefill_hooks(last)`` gives the hooks for the prompt pass (``last`` holds
    each row's last prompt index): with the KV cache they run once, at prefill;
    without it (the reference path) they run on every full re-forward, always at
    those same absolute positions. Rows stop at any of ``stop_ids``. Prompts are
    sorted by length and right-padded; an explicit attention mask gives the
    rotary positions and masks the pads, so batching does not change results.
    With the cache, steps after the first run from packed weights
    (``lasttoken.LastToken.decode``) when ``packed`` and the model allows it
    (Llama-style or Gemma 3, no hooks attached while decoding); otherwise through the
    hooked model. Tests check all three paths give the same tokens.
    """
    check_context(model, [len(p) for p in prompts], max_new_tokens)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    outs: list[list[int]] = [[] for _ in prompts]
    first = torch.empty(len(prompts), model.cfg.d_vocab)
    stop = stop_ids if stop_ids is not None else _newline_ids(model) | {pad_id(model)}
    lengths = [len(p) + max_new_tokens for p in prompts]  # the KV cache grows while decoding
    for idx in fit_batches(order, lengths, batch_size, model.cfg.n_heads):
        batch = [prompts[i] for i in idx]
        if use_cache:
            gen, logits0 = _generate_cached(model, batch, max_new_tokens, prefill_hooks, stop, packed)
        else:
            gen, logits0 = _generate_uncached(model, batch, max_new_tokens, prefill_hooks, stop)
        for j, i in enumerate(idx):
            outs[i] = gen[j]
            first[i] = logits0[j].float().cpu()
    return outs, first


def _finish(gen: list[list[int]], nxt: Tensor, done: Tensor, stop: set[int]) -> None:
    for j, tok in enumerate(nxt.tolist()):
        if not done[j]:
            gen[j].append(tok)
            if tok in stop:
                done[j] = True


def _generate_cached(model, batch, max_new, prefill_hooks, stop, packed=True):
    device = model.cfg.device
    tokens, mask, last = pad_right(batch, pad_id(model), device)
    cache = TransformerLensKeyValueCache.init_cache(model.cfg, device, len(batch))
    hooks = prefill_hooks(last) if prefill_hooks else []
    logits = last_logits(model, tokens, last, hooks=hooks, attention_mask=mask, past_kv_cache=cache)
    logits0 = logits
    gen: list[list[int]] = [[] for _ in batch]
    done = torch.zeros(len(batch), dtype=torch.bool)
    ones = torch.ones((len(batch), 1), dtype=torch.long, device=device)
    zero = torch.zeros(len(batch), dtype=torch.long, device=device)
    decoder = _PackedDecoder.start(model, cache, mask, max_new) if packed and max_new > 1 else None
    nxt = logits.argmax(-1)  # (batch,)
    for step in range(max_new):
        _finish(gen, nxt, done, stop)
        if bool(done.all()) or step == max_new - 1:
            break
        if decoder is not None:
            nxt = decoder.step(nxt, done)
        else:
            nxt = last_logits(model, nxt[:, None], zero, attention_mask=ones, past_kv_cache=cache).argmax(-1)
    return gen, logits0


class _PackedDecoder:
    """Decode steps from packed weights (``lasttoken``), dropping finished rows from the batch as it goes."""

    @classmethod
    def start(cls, model, cache, mask, max_new):
        """A decoder for models ``lasttoken`` runs, with no hooks attached; else None (hooked decoding)."""
        from .lasttoken import LastToken, unsupported

        if unsupported(model) is not None:
            return None
        runner = LastToken.for_model(model)
        return cls(runner, runner.decode_cache(cache, mask, max_new), mask.shape[0])

    def __init__(self, runner, state, batch: int):
        self.runner, self.state = runner, state
        self.live = torch.arange(batch)  # rows still decoded, in the order of state's rows

    def step(self, nxt: Tensor, done: Tensor) -> Tensor:
        """Next token of every row (finished rows keep theirs); compacts once a quarter of the live rows are done."""
        running = ~done[self.live]
        if int(running.sum()) <= 0.75 * len(self.live):  # their keys/values are copied out once; fewer rows per step
            keep = running.nonzero()[:, 0]
            self.state, self.live = self.state.select(keep.to(self.state.pos.device)), self.live[keep]
        out = nxt.clone()
        out[self.live] = self.runner.decode(nxt[self.live], self.state).argmax(-1)
        return out


def _generate_uncached(model, batch, max_new, prefill_hooks, stop):
    """Reference path: re-run the whole sequence every step, injecting at the same positions."""
    device = model.cfg.device
    seqs = [list(s) for s in batch]
    _, _, last0 = pad_right(seqs, pad_id(model), device)
    gen: list[list[int]] = [[] for _ in batch]
    done = torch.zeros(len(batch), dtype=torch.bool)
    logits0 = None
    for step in range(max_new):
        tokens, mask, last = pad_right(seqs, pad_id(model), device)
        hooks = prefill_hooks(last0) if prefill_hooks else []
        logits = last_logits(model, tokens, last, hooks=hooks, attention_mask=mask)
        if logits0 is None:
            logits0 = logits
        nxt = logits.argmax(-1)
        _finish(gen, nxt, done, stop)
        if bool(done.all()):
            break
        for j in range(len(seqs)):
            seqs[j].append(int(nxt[j]))
    return gen, logits0
