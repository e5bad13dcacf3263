"""The last-token seam: run the last token(s) of prompts against their frozen prefixes, and decode.

SITE changes one position, the last prompt token, so everything before it is
computed once and kept (a *prefix*: per-layer keys and values); training,
CIE, MTV's rewards, the choice of layer for FV/TV, patching and transfer then
run one token per prompt against it, and greedy generation runs one token per
row per step. Two backends do that with the same results:

* ``HookedBackend``: the HookedTransformer itself with a frozen
  TransformerLens KV cache. Every hook fires; this is the reference.
* ``PackedBackend``: ``packed.LastToken``, the same computation from packed
  weights without the hook machinery (several times faster on CPU).
* ``BridgeBackend`` (``bridge_backend``): a TransformerBridge (``models.engines``),
  every hook firing, prefixes in a Hugging Face KV cache (checked once per model
  against the full forward; re-run where that disagrees): a bridge's reference.
  Its packed backend is ``LastToken`` packed from the transformers weights
  (``bridge_pack.BridgePack``) for the architectures that covers.

``backend_for(model)`` chooses once per model (and again when its weights
change): packed only for the architectures the tests cover
(``PACKED_ARCHITECTURES`` on HookedTransformer, ``bridge_pack``'s list on a
bridge) that pass the structural checks and agree with the reference backend
on a probe prompt when the packed weights are built (a mismatch is logged and
the reference used). Hooks attached to the model when a backend is asked for
also select the reference, so they fire. ``use_backend(model, "hooked")``
forces the reference ("packed" asks for the packed one: an error where it
cannot run, the reference while hooks are attached). Callers never branch:
they ask for a backend and call ``prefix`` / ``logits`` / ``span_logits`` /
``prefill``, or use ``prompt_cache.PromptCache`` for many prompts.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache
from transformer_lens.utilities import get_act_name

from ..gate import Hooks, injection_hooks
from ..models.engines import Model, architecture, is_bridge, weights_stamp
from .bridge_backend import BridgeBackend, BridgeDecoder, attached, logits_at_positions
from .bridge_backend import forget as forget_bridge
from .bridge_backend import hook_points as bridge_points
from .packed import LastToken, unsupported
from .prefix import DecodeCache, Prefix, check_rows

log = logging.getLogger(__name__)

# Architectures (TransformerLens ``original_architecture``) whose packed path the tests hold to the
# hooked model: Llama-style blocks (SmolLM2 and the tiny test models) and Gemma 3.
PACKED_ARCHITECTURES = frozenset({"LlamaForCausalLM", "Gemma3ForCausalLM"})
BACKENDS = ("auto", "hooked", "packed")
PROBE_TOL = 1e-4  # probe check: max |packed - hooked| logit over max |logit|, plus this absolute

ResidEdits = dict[int, Callable[[Tensor], Tensor]]


def logits_at(
    model: Model,
    tokens: Int[Tensor, "batch pos"],
    positions: Int[Tensor, "batch width"],
    *,
    hooks: Hooks = (),
    attention_mask: Int[Tensor, "batch pos"] | None = None,
    past_kv_cache: TransformerLensKeyValueCache | None = None,
) -> Float[Tensor, "batch width d_vocab"]:
    """Logits at ``positions`` of each row through the hooked model, unembedding only those positions.

    On a TransformerBridge the native model unembeds every position (no KV cache is taken).
    """
    if is_bridge(model):
        if past_kv_cache is not None:
            raise ValueError("a TransformerBridge takes no TransformerLens KV cache")
        with attached(model, list(hooks)):
            return logits_at_positions(model, tokens, positions.to(tokens.device), attention_mask=attention_mask)
    with model.hooks(fwd_hooks=list(hooks)):
        resid = model(
            tokens, stop_at_layer=model.cfg.n_layers, attention_mask=attention_mask, past_kv_cache=past_kv_cache
        )  # (batch, pos, d_model)
        rows = torch.arange(tokens.shape[0], device=resid.device)[:, None]
        r = resid[rows, positions]  # (batch, width, d_model)
        if model.cfg.normalization_type is not None:
            r = model.ln_final(r)
        logits = model.unembed(r)  # (batch, width, d_vocab)
    cap = getattr(model.cfg, "output_logits_soft_cap", -1.0) or -1.0
    if cap > 0:
        logits = cap * torch.tanh(logits / cap)
    return logits


def last_logits(
    model: Model,
    tokens: Int[Tensor, "batch pos"],
    last: Int[Tensor, " batch"],
    *,
    hooks: Hooks = (),
    attention_mask: Int[Tensor, "batch pos"] | None = None,
    past_kv_cache: TransformerLensKeyValueCache | None = None,
) -> Float[Tensor, "batch d_vocab"]:
    """Logits at one position per row through the hooked model, without unembedding every position."""
    return logits_at(
        model, tokens, last[:, None], hooks=list(hooks), attention_mask=attention_mask, past_kv_cache=past_kv_cache
    )[:, 0]


def hooked_prefill(
    model: Model, tokens: Tensor, mask: Tensor, last: Tensor, hooks: Hooks
) -> tuple[Tensor, TransformerLensKeyValueCache]:
    """Right-padded prompts through the hooked model into a new TransformerLens cache; logits at ``last``."""
    cache = TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, tokens.shape[0])
    return last_logits(model, tokens, last, hooks=hooks, attention_mask=mask, past_kv_cache=cache), cache


def _hooks_attached(model: Model) -> bool:
    points = bridge_points(model) if is_bridge(model) else model.hook_dict  # a bridge rebuilds hook_dict per call
    return any(hp._forward_hooks or hp._backward_hooks for hp in points.values())


# ---------------------------------------------------------------- the two backends


class HookedBackend:
    """The reference: the hooked model against a frozen TransformerLens KV cache; every hook fires."""

    name = "hooked"
    kv_cache = True  # generation prefills a TransformerLens cache and decodes against it

    def __init__(self, model: Model, reason: str = ""):
        self.model, self.reason = model, reason

    @torch.no_grad()  # not inference_mode: these tensors enter autograd graphs later
    def prefix(self, tokens: Int[Tensor, "batch pos"]) -> Prefix:
        """Keys and values of equal-length prompt prefixes (TransformerLens's layout, unrotated)."""
        cache = TransformerLensKeyValueCache.init_cache(self.model.cfg, self.model.cfg.device, tokens.shape[0])
        self.model(tokens, attention_mask=torch.ones_like(tokens), past_kv_cache=cache, return_type=None)
        # (batch, pos, kv_head, d_head) stored as (batch, kv_head, pos, d_head) views, the Prefix layout
        return Prefix(
            [e.past_keys.transpose(1, 2) for e in cache.entries], [e.past_values.transpose(1, 2) for e in cache.entries]
        )

    def frozen_cache(self, prefix: Prefix, batch: int) -> TransformerLensKeyValueCache:
        """A frozen TransformerLens cache holding ``prefix`` for ``batch`` rows (later tokens attend to it)."""
        model = self.model
        cache = TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, batch)
        for entry, k, v in zip(cache.entries, prefix.keys, prefix.values):
            entry.past_keys = k.transpose(1, 2).expand(batch, -1, -1, -1)
            entry.past_values = v.transpose(1, 2).expand(batch, -1, -1, -1)
        cache.previous_attention_mask = torch.ones((batch, prefix.length), dtype=torch.long, device=model.cfg.device)
        cache.freeze()
        return cache

    def logits(
        self,
        tokens: Int[Tensor, " batch"],
        prefix: Prefix,
        alpha: Float[Tensor, "*arows layer head_index"] | None = None,
        t: Float[Tensor, "*trows layer head_index d_head"] | None = None,
        resid_edits: ResidEdits | None = None,
    ) -> Float[Tensor, "batch d_vocab"]:
        """Logits of the token after each row's prefix (see ``LastToken.logits`` for the arguments)."""
        B = tokens.shape[0]
        check_rows(B, prefix, alpha)
        hooks: Hooks = []
        if alpha is not None and t is not None:
            hooks += injection_hooks(self.model, t, alpha, 0)
        for layer, edit in (resid_edits or {}).items():
            hooks.append((get_act_name("resid_pre", layer), lambda r, hook, edit=edit: edit(r[:, 0])[:, None]))
        zero = torch.zeros(B, dtype=torch.long, device=tokens.device)
        one = tokens[:, None]  # (batch, 1)
        cache = self.frozen_cache(prefix, B)
        return last_logits(self.model, one, zero, hooks=hooks, attention_mask=torch.ones_like(one), past_kv_cache=cache)

    def span_logits(
        self,
        tokens: Int[Tensor, "batch n"],
        prefix: Prefix,
        alpha: Float[Tensor, "*arows layer head_index"] | None = None,
        t: Float[Tensor, "*trows layer head_index d_head"] | None = None,
    ) -> Float[Tensor, "batch n d_vocab"]:
        """Logits after each of n tokens following each row's prefix, the gate at the first (``LastToken.span_logits``)."""
        B = tokens.shape[0]
        check_rows(B, prefix, alpha)
        hooks = injection_hooks(self.model, t, alpha, 0) if alpha is not None and t is not None else []
        cache = self.frozen_cache(prefix, B)
        return self.model.run_with_hooks(
            tokens, attention_mask=torch.ones_like(tokens), past_kv_cache=cache, fwd_hooks=hooks
        )

    def run(self, tokens: Int[Tensor, "batch n"], prefix: Prefix, hooks: Hooks) -> Float[Tensor, "batch n d_vocab"]:
        """Logits of n tokens after each row's prefix, with ``hooks`` (positions counted from the first new token)."""
        B, n = tokens.shape
        positions = torch.arange(n, device=tokens.device).expand(B, -1)
        cache = self.frozen_cache(prefix, B)
        return logits_at(
            self.model, tokens, positions, hooks=hooks, attention_mask=torch.ones_like(tokens), past_kv_cache=cache
        )

    def decoder(self, cache: TransformerLensKeyValueCache, mask: Tensor, max_new: int) -> Decoder:
        """Greedy decode steps after a prefill into ``cache`` (TransformerLens's own cache)."""
        return HookedDecoder(self.model, cache)

    def prefill(self, tokens: Tensor, mask: Tensor, last: Tensor, hooks: Hooks, max_new: int) -> tuple[Tensor, Decoder]:
        """(logits at each row's last prompt token, a decoder): the hooked model fills TransformerLens's cache."""
        logits, cache = hooked_prefill(self.model, tokens, mask, last, hooks)
        return logits, (self.decoder(cache, mask, max_new) if max_new > 1 else None)


class PackedBackend:
    """``LastToken`` from packed weights: a snapshot of the weights at the first use.

    ``backend_for`` checks the weights each time it hands a backend out (once per fit, CIE,
    generation ...) and gives a new snapshot when they changed; nothing is checked per token
    (checking 300 parameters costs about 1 ms, a training step 50).
    """

    name = "packed"
    kv_cache = True

    def __init__(self, model: Model, reason: str = ""):
        self._model = weakref.ref(model)
        self.reason = reason
        self._runner: LastToken | None = None

    @property
    def runner(self) -> LastToken:
        """The packed weights, packed on first use."""
        if self._runner is None:
            model = self._model()
            assert model is not None, "the model is gone"
            if is_bridge(model):
                from .bridge_pack import BridgePack

                self._runner = BridgePack(model)  # the same engine, packed from the transformers weights
            else:
                self._runner = LastToken(model)
        return self._runner

    def prefix(self, tokens: Int[Tensor, "batch pos"]) -> Prefix:
        """Keys (rotated) and values of equal-length prompt prefixes."""
        return self.runner.prefix(tokens)

    def logits(self, tokens, prefix, alpha=None, t=None, resid_edits=None) -> Tensor:
        """Logits of the token after each row's prefix (``LastToken.logits``)."""
        return self.runner.logits(tokens, prefix, alpha, t, resid_edits=resid_edits)

    def span_logits(self, tokens, prefix, alpha=None, t=None) -> Tensor:
        """Logits after each of n tokens following each row's prefix, the gate at the first (``LastToken.span_logits``)."""
        return self.runner.span_logits(tokens, prefix, alpha, t)

    def prefill(self, tokens: Tensor, mask: Tensor, last: Tensor, hooks: Hooks, max_new: int) -> tuple[Tensor, Decoder]:
        """(logits at each row's last prompt token, a decoder): the hooked prefill, packed decode steps after it
        (a bridge prefills and decodes against its own KV cache)."""
        if is_bridge(self.model):
            return BridgeBackend(self.model).prefill(tokens, mask, last, hooks, max_new)
        logits, cache = hooked_prefill(self.model, tokens, mask, last, hooks)
        return logits, (self.decoder(cache, mask, max_new) if max_new > 1 else None)

    @property
    def model(self) -> Model:
        model = self._model()
        assert model is not None, "the model is gone"
        return model

    def decoder(self, cache: TransformerLensKeyValueCache, mask: Tensor, max_new: int) -> Decoder:
        """Greedy decode steps from packed weights, taking over the prefilled TransformerLens cache."""
        if is_bridge(self.model):
            raise ValueError("a bridge has no TransformerLens cache to decode from: use prefill()")
        runner = self.runner
        return PackedDecoder(runner, runner.decode_cache(cache, mask, max_new), mask.shape[0])


Backend = HookedBackend | PackedBackend | BridgeBackend


# ---------------------------------------------------------------- decoding


class HookedDecoder:
    """One token per row through the hooked model and TransformerLens's cache."""

    def __init__(self, model: Model, cache: TransformerLensKeyValueCache):
        self.model, self.cache = model, cache

    def step(self, nxt: Int[Tensor, " batch"], done: Tensor) -> Int[Tensor, " batch"]:
        """Next greedy token of every row (finished rows too; the caller ignores them)."""
        one = nxt[:, None]
        zero = torch.zeros(len(nxt), dtype=torch.long, device=nxt.device)
        return last_logits(self.model, one, zero, attention_mask=torch.ones_like(one), past_kv_cache=self.cache).argmax(
            -1
        )


class PackedDecoder:
    """Decode steps from packed weights, dropping finished rows from the batch as it goes."""

    def __init__(self, runner: LastToken, state: DecodeCache, batch: int):
        self.runner, self.state = runner, state
        self.live = torch.arange(batch)  # rows still decoded, in the order of state's rows

    def step(self, nxt: Int[Tensor, " batch"], done: Tensor) -> Int[Tensor, " batch"]:
        """Next token of every row (finished rows keep theirs); compacts once a quarter of the live rows are done."""
        running = ~done[self.live]
        if int(running.sum()) <= 0.75 * len(self.live):  # their keys/values are copied out once; fewer rows per step
            keep = running.nonzero()[:, 0]
            self.state, self.live = self.state.select(keep.to(self.state.pos.device)), self.live[keep]
        out = nxt.clone()
        out[self.live] = self.runner.decode(nxt[self.live], self.state).argmax(-1)
        return out


Decoder = HookedDecoder | PackedDecoder | BridgeDecoder


# ---------------------------------------------------------------- choosing, once per model


@dataclass
class _Choice:
    kind: str = "auto"  # what the user asked for (use_backend)
    stamp: tuple | None = None  # weights the packed backend was checked against
    packed: PackedBackend | None = None
    why_not: str | None = None  # why auto uses the hooked backend (None: packed)


_CHOICES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> _Choice


def use_backend(model: Model, kind: str = "auto") -> None:
    """Set which backend ``backend_for(model)`` gives: 'auto' (default), 'hooked' (your hooks fire) or 'packed'."""
    if kind not in BACKENDS:
        from ..config import ConfigError

        raise ConfigError(f"unknown backend '{kind}'; use one of {', '.join(BACKENDS)}")
    _CHOICES.setdefault(model, _Choice()).kind = kind


def packed_blocker(model: Model) -> str | None:
    """Why the packed backend cannot run this model (None when it can, before the probe check)."""
    if is_bridge(model):
        from .bridge_pack import bridge_unsupported

        return bridge_unsupported(model)
    arch = model.cfg.original_architecture
    if arch not in PACKED_ARCHITECTURES:
        return (
            f"architecture {arch} is not one the packed path is tested on ({', '.join(sorted(PACKED_ARCHITECTURES))})"
        )
    return unsupported(model)


def probe_check(model: Model, packed: PackedBackend) -> float:
    """Max |packed - reference| logit, relative to the largest logit, on one seeded prompt under a random gate
    (last token and a span); the reference is the hooked model, or a bridge's own forward."""
    c = model.cfg
    gen = torch.Generator().manual_seed(0)
    n = min(8, c.n_ctx)
    tokens = torch.randint(0, c.d_vocab, (1, n), generator=gen).to(c.device)
    alpha = torch.rand(c.n_layers, c.n_heads, generator=gen).to(device=c.device, dtype=c.dtype)
    hooked = BridgeBackend(model) if is_bridge(model) else HookedBackend(model)
    with torch.no_grad():
        prefix = hooked.prefix(tokens[:, :-1])
        scale = prefix.values[0].abs().mean().clamp(min=1e-3)  # t on the scale of real head outputs
        t = scale * torch.randn(c.n_layers, c.n_heads, c.d_head, generator=gen).to(device=c.device, dtype=c.dtype)
        want = hooked.logits(tokens[:, -1], prefix, alpha, t)
        got = packed.logits(tokens[:, -1], packed.prefix(tokens[:, :-1]), alpha, t)
        err = float((got - want).abs().max() / want.abs().max().clamp(min=1.0))
        if n >= 4:  # and a span of three tokens after a shorter prefix (the sequence objective)
            want = hooked.span_logits(tokens[:, -3:], hooked.prefix(tokens[:, :-3]), alpha, t)
            got = packed.span_logits(tokens[:, -3:], packed.prefix(tokens[:, :-3]), alpha, t)
            err = max(err, float((got - want).abs().max() / want.abs().max().clamp(min=1.0)))
    return err


def backend_for(model: Model, kind: str | None = None) -> Backend:
    """The model's backend: ``kind`` ('auto', 'hooked', 'packed'); None or 'auto' defer to ``use_backend``.

    A packed backend is a snapshot of the weights it was packed from (so is a ``prompt_cache.PromptCache``
    built on it): once any parameter has been replaced, moved or written in place, the next
    call packs (and probes) afresh. Writes through ``.data`` are not seen: call
    ``forget(model)`` after them.
    """
    choice = _CHOICES.setdefault(model, _Choice())
    kind = choice.kind if kind in (None, "auto") else kind
    if kind not in BACKENDS:
        from ..config import ConfigError

        raise ConfigError(f"unknown backend '{kind}'; use one of {', '.join(BACKENDS)}")
    reference = BridgeBackend if is_bridge(model) else HookedBackend  # every hook fires on it
    if kind == "hooked":
        return reference(model, "asked for")
    if _hooks_attached(model):  # the packed path would skip them, even when asked for
        if kind == "packed":
            log.warning("hooks are attached to the model: running the hooked backend, not the packed one asked for")
        return reference(model, "hooks are attached to the model")
    stamp = weights_stamp(model)
    if stamp != choice.stamp:  # new or changed weights: a new snapshot, never an old one rebuilt in place
        choice.stamp, choice.packed = stamp, None
        choice.why_not = packed_blocker(model)
        if choice.why_not is None:
            packed = PackedBackend(model)
            try:
                err = probe_check(model, packed)
            except (KeyError, RuntimeError, ValueError, AttributeError) as e:  # a variant the packing does not know
                if not is_bridge(model):
                    raise
                err = float("inf")
                log.warning("bridge: the packed engine cannot pack this model (%s: %s)", type(e).__name__, e)
            if err <= PROBE_TOL:
                ref = "the bridge's own forward" if is_bridge(model) else "the hooked model"
                packed.reason = f"{architecture(model)}, agrees with {ref} to {err:.1e} on a probe prompt"
                choice.packed = packed
            else:
                choice.why_not = f"packed weights differ from the reference backend by {err:.1e} on a probe prompt"
                log.warning("using the hooked backend: %s", choice.why_not)
        if choice.why_not is not None:
            log.info("hooked backend: %s", choice.why_not)
    if choice.packed is not None:
        return choice.packed
    if kind == "packed":
        from ..config import ConfigError

        raise ConfigError(f"the packed backend cannot run this model: {choice.why_not}")
    return reference(model, choice.why_not or "")


def forget(model: Model) -> None:
    """Drop the model's packed snapshot and choice, a bridge's probe verdict and its weights digest (after writing
    weights through ``.data``); keeps ``use_backend``."""
    from ..models.identity import forget_digest

    forget_digest(model)
    forget_bridge(model)
    choice = _CHOICES.get(model)
    if choice is not None:
        choice.stamp, choice.packed, choice.why_not = None, None, None


def describe(backend: Backend) -> dict[str, str]:
    """{'name', 'reason'}: what results.json and adapters record."""
    return {"name": backend.name, "reason": backend.reason}
