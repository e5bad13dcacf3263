"""The last-token seam: run the last token(s) of prompts against their frozen prefixes, and decode.

SITE changes one position, the last prompt token, so everything before it is
computed once and kept (a *prefix*: per-layer keys and values); training,
CIE, MTV's rewards, the choice of layer for FV/TV, patching and transfer then
run one token per prompt against it, and greedy generation runs one token per
row per step. Two backends do that with the same results:

* ``HookedBackend`` (``hooked_backend``): the HookedTransformer itself with a
  frozen TransformerLens KV cache. Every hook fires; this is the reference.
* ``PackedBackend``: ``packed.LastToken``, the same computation from packed
  weights without the hook machinery.
* ``BridgeBackend`` (``bridge_backend``): a TransformerBridge (``models.engines``),
  every hook firing, prefixes in a Hugging Face KV cache (checked once per model
  against the full forward; re-run where that disagrees): a bridge's reference.
  Its packed backend is ``LastToken`` packed from the transformers weights
  (``bridge_pack.pack_bridge``) for the architectures that covers.

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
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from ..gate import Hooks
from ..models.engines import architecture, is_bridge, weights_stamp
from ..types import Model
from .bridge_backend import BridgeBackend, BridgeDecoder
from .bridge_backend import forget as forget_bridge
from .bridge_backend import hook_points as bridge_points
from .hooked_backend import HookedBackend, HookedDecoder, hooked_prefill, last_logits, logits_at
from .hooked_pack import decode_from_hooked_cache, pack_hooked
from .packed import LastToken, ResidEdits
from .packed_layer import unsupported
from .prefix import DecodeCache, Prefix
from .probe import agreement, probe_inputs, tolerance

# the seam's API; the hooked model's forwards (``hooked_backend``) are reached from here too
__all__ = [
    "Backend",
    "Decoder",
    "HookedBackend",
    "PackedBackend",
    "ResidEdits",
    "backend_for",
    "describe",
    "forget",
    "last_logits",
    "logits_at",
    "packed_blocker",
    "probe_check",
    "use_backend",
]

log = logging.getLogger(__name__)

# Architectures (TransformerLens ``original_architecture``) whose packed path the tests hold to the
# hooked model: Llama-style blocks (SmolLM2 and the tiny test models) and Gemma 3.
PACKED_ARCHITECTURES = frozenset({"LlamaForCausalLM", "Gemma3ForCausalLM"})
BACKENDS = ("auto", "hooked", "packed")


def _hooks_attached(model: Model) -> bool:
    points = _engine(model).hook_points(model)
    return any(hp._forward_hooks or hp._backward_hooks for hp in points.values())


class PackedBackend:
    """``LastToken`` from packed weights: a snapshot of the weights at the first use.

    ``backend_for`` checks the weights each time it hands a backend out (once per fit, CIE,
    generation ...) and gives a new snapshot when they changed; nothing is checked per token.
    """

    name = "packed"
    kv_cache = True
    ragged = True  # prefixes of many lengths in one forward (Prefix.pad)

    def __init__(self, model: Model, reason: str = ""):
        self._model = weakref.ref(model)
        self.reason = reason
        self._runner: LastToken | None = None

    @property
    def model(self) -> Model:
        model = self._model()
        assert model is not None, "the model is gone"
        return model

    @property
    def runner(self) -> LastToken:
        """The packed weights, packed on first use."""
        if self._runner is None:
            self._runner = _engine(self.model).pack(self.model)
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

    def prefill(
        self, tokens: Tensor, mask: Tensor, last: Tensor, hooks: Hooks, max_new: int
    ) -> tuple[Tensor, Decoder | None]:
        """(logits at each row's last prompt token, a decoder for the ``max_new - 1`` steps after it): the hooked
        prefill, packed decode steps taking over its cache (a bridge prefills and decodes against its own)."""
        return _engine(self.model).prefill(self, tokens, mask, last, hooks, max_new)


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


Backend = HookedBackend | PackedBackend | BridgeBackend

Decoder = HookedDecoder | PackedDecoder | BridgeDecoder


# ---------------------------------------------------------------- the model class, asked once


@dataclass(frozen=True)
class _Engine:
    """What the seam needs from a model class (HookedTransformer or TransformerBridge), so that it asks which one
    it has in one place (``_engine``) and nowhere else."""

    reference: type  # the backend every hook fires on
    reference_name: str  # what the probe compares the packed weights with
    hook_points: Callable[[Any], dict]  # name -> HookPoint
    blocker: Callable[[Any], str | None]  # why the packed weights cannot run the model
    pack: Callable[[Any], LastToken]  # the packed weights
    prefill: Callable[..., tuple[Tensor, Any]]  # PackedBackend.prefill
    pack_errors_fall_back: bool  # a packing error on the probe selects the reference (else it is raised)
    padded_window: Callable[[Any], int | None]  # a sliding window whose mask counts cache slots, pads included


def _hooked_blocker(model: Model) -> str | None:
    arch = model.cfg.original_architecture
    if arch not in PACKED_ARCHITECTURES:
        return (
            f"architecture {arch} is not one the packed path is tested on ({', '.join(sorted(PACKED_ARCHITECTURES))})"
        )
    return unsupported(model)


def _hooked_pack(model: Model) -> LastToken:
    return LastToken(pack_hooked(model))


def _hooked_packed_prefill(backend: PackedBackend, tokens, mask, last, hooks, max_new):
    """The hooked prefill; packed decode steps take over its cache."""
    logits, cache = hooked_prefill(backend.model, tokens, mask, last, hooks)
    if max_new <= 1:
        return logits, None
    runner = backend.runner
    return logits, PackedDecoder(runner, decode_from_hooked_cache(runner, cache, mask, max_new), mask.shape[0])


def _bridge_blocker(model: Model) -> str | None:
    from .bridge_pack import bridge_unsupported

    return bridge_unsupported(model)


def _bridge_pack(model: Model) -> LastToken:
    from .bridge_pack import pack_bridge

    return LastToken(pack_bridge(model))  # the same packed model, over the transformers weights


def _bridge_packed_prefill(backend: PackedBackend, tokens, mask, last, hooks, max_new):
    """A bridge prefills and decodes against its own cache."""
    return BridgeBackend(backend.model).prefill(tokens, mask, last, hooks, max_new)


def _hooked_window(model: Model) -> int | None:
    """TransformerLens masks local attention by cache slot (query slot minus key slot under the window), so a
    right-padded row's decode steps sit past its pads and see fewer of its own tokens than it would alone."""
    c = model.cfg
    return c.window_size if c.use_local_attn and "local" in (c.attn_types or ["local"]) else None


_HOOKED_ENGINE = _Engine(
    HookedBackend,
    "the hooked model",
    lambda m: m.hook_dict,
    _hooked_blocker,
    _hooked_pack,
    _hooked_packed_prefill,
    False,
    _hooked_window,
)
_BRIDGE_ENGINE = _Engine(  # a bridge rebuilds hook_dict per call: its points are read from the modules
    BridgeBackend,
    "the bridge's own forward",
    bridge_points,
    _bridge_blocker,
    _bridge_pack,
    _bridge_packed_prefill,
    True,
    lambda m: None,  # the bridge's masks are built from positions (bridge_backend.attention_masks)
)


def _engine(model: Model) -> _Engine:
    """The one place the seam asks which model class it has."""
    return _BRIDGE_ENGINE if is_bridge(model) else _HOOKED_ENGINE


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


def padded_window(model: Model) -> int | None:
    """The smallest sliding window of the model's cached decoding that counts pads (None: none does). Right-padded
    rows decode as they would alone while a batch's longest prompt plus its new tokens fits in it."""
    return _engine(model).padded_window(model)


def packed_blocker(model: Model) -> str | None:
    """Why the packed backend cannot run this model (None when it can, before the probe check)."""
    return _engine(model).blocker(model)


def probe_check(model: Model, packed: PackedBackend) -> float:
    """Max |packed - reference| logit, relative to the largest logit, on one seeded prompt under a random gate
    (last token and a span); the reference is the hooked model, or a bridge's own forward."""
    tokens, alpha, t = probe_inputs(model)
    reference = _engine(model).reference(model)
    with torch.no_grad():  # t on the scale of real head outputs
        scale = reference.prefix(tokens[:, :-1]).values[0].abs().mean().clamp(min=1e-3)
    return agreement(packed, reference, tokens, alpha, scale * t)


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
    engine = _engine(model)
    reference = engine.reference  # every hook fires on it
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
                if not engine.pack_errors_fall_back:
                    raise
                err = float("inf")
                log.warning("bridge: the packed engine cannot pack this model (%s: %s)", type(e).__name__, e)
            if err <= tolerance(model.cfg.dtype):
                packed.reason = (
                    f"{architecture(model)}, agrees with {engine.reference_name} to {err:.1e} on a probe prompt"
                )
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
