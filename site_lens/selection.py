"""Stage 2: the alpha gate and its trainer.

``AlphaGate`` holds one parameter theta per (layer, head); alpha = sigmoid(theta)
mixes each head's zero-shot ``hook_z`` with the task embedding at the last
prompt token. ``AlphaTrainer.fit`` trains theta alone (the model is frozen)
with Adam on the cross-entropy of the answer's first token, validating every
``eval_every`` steps and keeping the theta with the lowest valid loss.

Fast path (default): the injection only changes the last prompt token, so every
earlier position's keys and values do not depend on alpha. They are computed
once per prompt (TransformerLens's KV cache, frozen), and each step runs only
the last token against them: from packed weights (``lasttoken.LastToken``) for
Llama-style models, through the hooked model with a frozen cache otherwise.
The naive path (``fast=False``) runs whole prompts through the hooked model;
tests check all three agree.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens import HookedTransformer
from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache

from .config import SelectionConfig
from .inject import HookFactory, Hooks, fit_batches, injection_hooks, last_logits, pad_id, pad_right
from .lasttoken import LastToken, Prefix, unsupported

log = logging.getLogger(__name__)


class AlphaGate(nn.Module):
    """alpha = sigmoid(theta), one scalar per (layer, head); theta starts at ``theta_init``."""

    def __init__(self, n_layers: int, n_heads: int, theta_init: float = 0.0):
        super().__init__()
        self.theta = nn.Parameter(torch.full((n_layers, n_heads), float(theta_init)))

    def alpha(self) -> Float[Tensor, "layer head_index"]:
        return torch.sigmoid(self.theta)

    def hooks(self, model: HookedTransformer, t: Float[Tensor, "layer head_index d_head"], pos) -> Hooks:
        """Injection hooks for one forward pass (differentiable in theta)."""
        return injection_hooks(model, t, self.alpha(), pos)


@dataclass
class Example:
    """A zero-shot prompt as tokens and the id of its answer's first token."""

    tokens: list[int]
    target: int


@dataclass
class TrainHistory:
    step: list[int] = field(default_factory=list)  # steps at which the train loss was logged
    loss: list[float] = field(default_factory=list)
    valid_step: list[int] = field(default_factory=list)
    valid_loss: list[float] = field(default_factory=list)
    best_step: int | None = None
    best_valid_loss: float | None = None
    stopped_early: str | None = None  # why training stopped before ``steps``
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class _PrefixCache:
    """Frozen keys/values of every prompt's tokens except the last, grouped by length.

    With a ``runner`` (``LastToken``) the groups hold its ``Prefix`` (rotated keys,
    attention layout); without, TransformerLens cache tensors for the hooked model.
    """

    def __init__(
        self,
        model: HookedTransformer,
        examples: Sequence[Example],
        batch_size: int = 32,
        runner: LastToken | None = None,
    ):
        self.model = model
        self.runner = runner
        self.where: dict[int, tuple[int, int]] = {}  # example index -> (prefix length, row in group)
        self.groups: dict[int, list[tuple[Tensor, Tensor]]] = {}  # length -> per layer (keys, values)
        self.prefixes: dict[int, Prefix] = {}  # length -> runner's prefix of the group
        by_len: dict[int, list[int]] = {}
        for i, ex in enumerate(examples):
            by_len.setdefault(len(ex.tokens) - 1, []).append(i)
        device = model.cfg.device
        for length, idx in by_len.items():
            for row, i in enumerate(idx):
                self.where[i] = (length, row)
            if runner is not None:
                self.prefixes[length] = Prefix.cat(
                    [
                        runner.prefix(torch.tensor([examples[i].tokens[:-1] for i in idx[s : s + batch_size]], device=device))
                        for s in range(0, len(idx), batch_size)
                    ]
                )
                continue
            parts: list[list[tuple[Tensor, Tensor]]] = []
            for s in range(0, len(idx), batch_size):
                chunk = idx[s : s + batch_size]
                tokens = torch.tensor([examples[i].tokens[:-1] for i in chunk], device=device)
                cache = TransformerLensKeyValueCache.init_cache(model.cfg, device, len(chunk))
                with torch.no_grad():  # not inference_mode: these tensors enter autograd graphs later
                    model(tokens, attention_mask=torch.ones_like(tokens), past_kv_cache=cache, return_type=None)
                parts.append([(e.past_keys, e.past_values) for e in cache.entries])
            self.groups[length] = [
                (torch.cat([p[layer][0] for p in parts]), torch.cat([p[layer][1] for p in parts]))
                for layer in range(model.cfg.n_layers)
            ]

    def batch(self, indices: Sequence[int]) -> list[tuple[int, list[int], TransformerLensKeyValueCache | Prefix]]:
        """Split ``indices`` by prefix length: (length, indices, frozen cache or Prefix of their prefixes)."""
        by_len: dict[int, list[int]] = {}
        for i in indices:
            by_len.setdefault(self.where[i][0], []).append(i)
        out: list[tuple[int, list[int], TransformerLensKeyValueCache | Prefix]] = []
        for length, idx in by_len.items():
            rows = torch.tensor([self.where[i][1] for i in idx], device=self.model.cfg.device)
            if self.runner is not None:
                out.append((length, idx, self.prefixes[length].select(rows)))
                continue
            cache = TransformerLensKeyValueCache.init_cache(self.model.cfg, self.model.cfg.device, len(idx))
            for entry, (k, v) in zip(cache.entries, self.groups[length]):
                entry.past_keys = k.index_select(0, rows)
                entry.past_values = v.index_select(0, rows)
            cache.previous_attention_mask = torch.ones((len(idx), length), dtype=torch.long, device=self.model.cfg.device)
            cache.freeze()
            out.append((length, idx, cache))
        return out


def gated_prefix_loss(
    model: HookedTransformer,
    examples: Sequence[Example],
    cache: _PrefixCache,
    indices: Sequence[int],
    alpha: Float[Tensor, "layer head_index"] | None,
    t: Float[Tensor, "layer head_index d_head"] | None,
    resid_edits: dict | None = None,
) -> Tensor:
    """Mean first-token CE of ``examples[indices]`` with z gated toward t at the last token, against cached prefixes.

    ``resid_edits`` (packed prefixes only; see ``LastToken.logits``) changes the last token's residual
    at a layer's input instead of, or as well as, the gate.
    """
    total = torch.zeros((), device=model.cfg.device)
    device = model.cfg.device
    for _, idx, kv in cache.batch(indices):
        last_tok = torch.tensor([[examples[i].tokens[-1]] for i in idx], device=device)
        if isinstance(kv, Prefix):
            assert cache.runner is not None
            logits = cache.runner.logits(last_tok[:, 0], kv, alpha, t, resid_edits=resid_edits)
        else:
            if resid_edits or alpha is None or t is None:
                raise ValueError("residual edits and a missing gate need packed prefixes (a LastToken runner)")
            zero = torch.zeros(len(idx), dtype=torch.long, device=device)
            logits = last_logits(
                model,
                last_tok,
                zero,
                hooks=injection_hooks(model, t, alpha, 0),
                attention_mask=torch.ones_like(last_tok),
                past_kv_cache=kv,
            )
        target = torch.tensor([examples[i].target for i in idx], device=device)
        total = total + F.cross_entropy(logits.float(), target, reduction="sum")
    return total / len(indices)


# Attention cells one differentiable pass may keep for backward, summed over layers
# (rows * heads * padded length^2 * layers): ~1 GiB per float32 tensor kept. A batch of
# 8 zero-shot squad_val prompts (up to ~830 tokens) took 17 GiB and was killed; the other
# 44 FV tasks' batches of 8 (longest: ag_news, 273 tokens) stay whole.
GRAD_CELLS = 2**28


def first_token_loss(
    model: HookedTransformer,
    examples: Sequence[Example],
    hooks: Hooks = (),
    prefill: HookFactory | None = None,
    batch_size: int = 32,
    backward: bool = False,
) -> Tensor:
    """Mean cross-entropy of the answer's first token over whole zero-shot prompts (differentiable).

    Chunks of up to ``batch_size`` rows are cut to fit ``ATTN_CELLS`` (``GRAD_CELLS`` over all
    layers while gradients are on). With ``backward`` each chunk's share of the mean is
    back-propagated at once (gradient accumulation: one chunk's graph alive at a time) and
    the mean comes back detached.
    """
    cells = GRAD_CELLS // model.cfg.n_layers if torch.is_grad_enabled() else None
    lengths = [len(e.tokens) for e in examples]
    total = torch.zeros((), device=model.cfg.device)
    for idx in fit_batches(range(len(examples)), lengths, batch_size, model.cfg.n_heads, cells):
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


def packed_runner(model: HookedTransformer) -> LastToken | None:
    """A ``LastToken`` for the model, or None (logged) when it needs the hooked path."""
    why = unsupported(model)
    if why is not None:
        log.info("last-token fast path through the hooked model (packed path unavailable: %s)", why)
        return None
    return LastToken.for_model(model)


class AlphaTrainer:
    """Trains an ``AlphaGate`` for one task embedding on a frozen model."""

    def __init__(
        self,
        model: HookedTransformer,
        t: Float[Tensor, "layer head_index d_head"],
        cfg: SelectionConfig | None = None,
        seed: int = 0,
    ):
        self.model = model
        self.cfg = cfg or SelectionConfig()
        self.seed = seed
        self.t = t.to(device=model.cfg.device, dtype=model.cfg.dtype)
        model.requires_grad_(False)  # the model is frozen: only theta is trained
        torch.manual_seed(seed)
        self.gate = AlphaGate(model.cfg.n_layers, model.cfg.n_heads, self.cfg.theta_init).to(model.cfg.device)
        self.history = TrainHistory()

    # ------------------------------------------------------------ losses

    def loss_naive(self, examples: Sequence[Example], backward: bool = False) -> Tensor:
        """Mean first-token CE with whole prompts run through the model (the reference).

        Memory-capped chunks as in ``first_token_loss``; with ``backward`` the gradient is
        accumulated chunk by chunk and the loss comes back detached.
        """
        return first_token_loss(
            self.model,
            examples,
            prefill=lambda last: self.gate.hooks(self.model, self.t, last),
            batch_size=max(1, len(examples)),
            backward=backward,
        )

    def loss_fast(self, examples: Sequence[Example], cache: _PrefixCache, indices: Sequence[int]) -> Tensor:
        """The same loss, running only the last prompt token against cached prefixes."""
        return gated_prefix_loss(self.model, examples, cache, indices, self.gate.alpha(), self.t)

    def runner(self) -> LastToken | None:
        """The packed-weight last-token runner, when the config asks for it and the model allows."""
        if not (self.cfg.fast and self.cfg.fused):
            return None
        return packed_runner(self.model)

    # ------------------------------------------------------------ training

    def schedule(self, n_train: int) -> list[list[int]]:
        """Indices of the training examples for each step: a seeded permutation, cycled."""
        rng = random.Random(self.seed)
        out: list[list[int]] = []
        pool: list[int] = []
        for _ in range(self.cfg.steps):
            batch = []
            for _ in range(self.cfg.batch_size):
                if not pool:
                    pool = list(range(n_train))
                    rng.shuffle(pool)
                batch.append(pool.pop())
            out.append(batch)
        return out

    def valid_loss(self, valid: Sequence[Example], cache: _PrefixCache | None) -> float:
        with torch.no_grad():
            if cache is not None:
                return float(self.loss_fast(valid, cache, range(len(valid))))
            return float(self.loss_naive(valid))

    def fit(self, train: Sequence[Example], valid: Sequence[Example] = (), progress=None) -> AlphaGate:
        """Train theta; returns the gate holding the best (or last) theta."""
        if not train:
            raise ValueError("AlphaTrainer.fit needs at least one training example")
        t0 = time.perf_counter()
        cfg = self.cfg
        valid = list(valid)[: cfg.max_valid]
        plan = self.schedule(len(train))
        used = sorted({i for b in plan for i in b})
        fast = cfg.fast
        runner = self.runner() if fast else None
        tr_cache = _PrefixCache(self.model, [train[i] for i in used], runner=runner) if fast and used else None
        remap = {i: j for j, i in enumerate(used)}
        used_examples = [train[i] for i in used]
        va_cache = _PrefixCache(self.model, valid, runner=runner) if fast and valid and cfg.eval_every else None
        opt = torch.optim.Adam(self.gate.parameters(), lr=cfg.lr)
        best = (math.inf, None, None)  # (valid loss, step, theta)
        last_good = self.gate.theta.detach().clone()
        for step, batch in enumerate(plan, start=1):
            opt.zero_grad(set_to_none=True)
            if fast:
                loss = self.loss_fast(used_examples, tr_cache, [remap[i] for i in batch])
            else:  # whole prompts: gradients accumulated over memory-capped chunks
                loss = self.loss_naive([train[i] for i in batch], backward=True)
            if not torch.isfinite(loss):
                self.history.stopped_early = f"non-finite loss ({loss.item()}) at step {step}; kept the theta of step {step - 1}"
                log.error(self.history.stopped_early)
                with torch.no_grad():
                    self.gate.theta.copy_(last_good)
                break
            if fast:
                loss.backward()
            opt.step()
            if not torch.isfinite(self.gate.theta).all():
                self.history.stopped_early = f"non-finite theta after step {step}; kept the theta of step {step - 1}"
                log.error(self.history.stopped_early)
                with torch.no_grad():
                    self.gate.theta.copy_(last_good)
                break
            last_good = self.gate.theta.detach().clone()
            self.history.step.append(step)
            self.history.loss.append(loss.item())
            if valid and cfg.eval_every and (step % cfg.eval_every == 0 or step == len(plan)):
                vl = self.valid_loss(valid, va_cache)
                self.history.valid_step.append(step)
                self.history.valid_loss.append(vl)
                if vl < best[0]:
                    best = (vl, step, last_good.clone())
            if progress is not None:
                progress(step, self.history.loss[-1])
        if cfg.keep_best and best[2] is not None:
            with torch.no_grad():
                self.gate.theta.copy_(best[2])
            self.history.best_step, self.history.best_valid_loss = best[1], best[0]
        self.history.seconds = time.perf_counter() - t0
        return self.gate


def make_examples(model: HookedTransformer, prompts: Sequence[tuple[str, str]]) -> list[Example]:
    """(prompt, answer) strings -> Examples (prompt tokens, first answer token)."""
    from .inject import answer_ids, encode

    toks = encode(model, [p for p, _ in prompts])
    out = []
    for (p, a), ids in zip(prompts, toks):
        ans = answer_ids(model, p, a)
        if not ans:
            raise ValueError(f"answer {a!r} encodes to no tokens")
        out.append(Example(tokens=ids, target=ans[0]))
    return out
